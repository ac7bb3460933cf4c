"""Split our decoders' wall time per pass into the search (inputs in, the loop, synchronised) and everything
after it (hypotheses out, per-row states, NeMo's packing), on the synthetic 1-hour set.

python benchmarks/experiments/host_breakdown.py tdt-0.6b "fast_greedy_label_loop[full_graph,fast_math]" ...
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time

import torch

import nemo_fastdecode  # noqa: F401  (registers the strategies)
from fastdecode_lab.benchmarks.decoder import decoder_factories, prepare_synthetic_set
from nemo_fastdecode.apps.comparison import decode_all


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class _Timed:
    def __init__(self, inner, call):
        self._inner, self._call = inner, call

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def main(preset: str, names: list[str]) -> None:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model, _, batches, _, _ = prepare_synthetic_set(preset, float(os.environ.get("SECONDS_OF_AUDIO", 3600)), 32)
    factories = decoder_factories(model, 10)
    for name in names:
        decoder = factories[name]()
        computer = decoder.computer
        search = computer._decode if hasattr(computer, "_decode") else computer.__call__
        spent = [0.0]

        def timed(*args, _search=search, **kwargs):
            _sync()
            start = time.perf_counter()
            out = _search(*args, **kwargs)
            _sync()
            spent[0] += time.perf_counter() - start
            return out

        if hasattr(computer, "_decode"):  # greedy: the loop; its __call__ also builds the hypotheses
            computer._decode = timed
        else:  # beam: the computer's call is the search; the infer object exports
            decoder.computer = _Timed(computer, timed)
        decode_all(decoder, batches)  # warm-up
        for _ in range(3):
            spent[0] = 0.0
            _sync()
            start = time.perf_counter()
            decode_all(decoder, batches)
            _sync()
            total = time.perf_counter() - start
            print(f"{preset} {name}: total {total:.3f} s, search {spent[0]:.3f} s, rest {total - spent[0]:.3f} s "
                  f"({len(batches)} batches)", flush=True)  # fmt: skip
        if os.environ.get("CPROFILE"):  # where the host time goes in one pass (the search's inside included)
            profiler = cProfile.Profile()
            profiler.enable()
            decode_all(decoder, batches)
            _sync()
            profiler.disable()
            stats = pstats.Stats(profiler)
            stats.sort_stats("tottime").print_stats(30)
            stats.sort_stats("cumulative").print_stats(45)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
