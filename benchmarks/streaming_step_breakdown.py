"""Where the wall time of one streaming step goes (GPU): host packing, the encoder graph, the decoder.

python benchmarks/streaming_step_breakdown.py                       # 17 x 512 hybrid, tf32x3 encoder, 256 of 1024
python benchmarks/streaming_step_breakdown.py fast_math=true        # any scripts/streaming.py override
python benchmarks/streaming_step_breakdown.py config=streaming streams=2 slots=3 repeats=3   # its own options

Builds the model and ``streams`` streams as ``scripts/streaming.py --config-name <config>`` does, steps
their first chunk, then steps them together ``repeats`` times, the same chunks as ``scripts/streaming.py``'s
fixed step (its median is over the first ``fixed_step_repeats`` of these). Each step's phases are timed with a
synchronisation around each: checking and packing the chunks on the host, the encoder bucket's copies + graph
replay, the decoder; with the tokens the step emitted, so that the decoder's time can be read against its work
(a random model emits most of its tokens in the streams' first chunks). The profile
(``benchmarks/profile_streaming.py``) sums kernel times instead.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from fastdecode_lab import streaming_sim as simulation
from nemo_fastdecode.streaming.transcriber import StreamingTranscriber

DEFAULTS = {"config": "streaming_hybrid_17x512", "streams": 256, "slots": 1024, "repeats": 12}
BENCHMARK = ["max_stream_seconds=4", "encoder_matmul=tf32x3"]  # as the streaming benchmark runs (overridable)
CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "streaming"
PHASES = ("step", "host: check + pack", "encoder", "decoder")


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def synchronised(fn: Callable, times: list[float]) -> Callable:
    """``fn`` timed between two synchronisations, its milliseconds appended to ``times``."""

    def timed(*args, **kwargs):
        _synchronize()
        started = time.perf_counter()
        out = fn(*args, **kwargs)
        _synchronize()
        times.append(1e3 * (time.perf_counter() - started))
        return out

    return timed


def main(argv: list[str]) -> None:
    options, cfg, setup, plans = simulation.compose_streams(CONFIGS, DEFAULTS, [*BENCHMARK, *argv])
    streams, repeats = options.streams, options.repeats
    streamer = StreamingTranscriber(
        setup.model, options.slots, dtype=setup.dtype, use_cuda_graphs=cfg.use_cuda_graphs, fast_math=cfg.fast_math,
        encoder_matmul=cfg.encoder_matmul, capture_decoder_step=cfg.capture_decoder_step,
    )  # fmt: skip
    streamer.warm_up()
    slots = [streamer.open() for _ in plans]
    streamer.step(slots, [plan.chunks[0] for plan in plans])
    times: dict[str, list[float]] = defaultdict(list)
    # the phases of StreamingTranscriber.step, each wrapped on this instance only
    streamer._batch_chunks = synchronised(streamer._batch_chunks, times["host: check + pack"])
    streamer.runner.run_padded = synchronised(streamer.runner.run_padded, times["encoder"])
    streamer.decoder.decode = synchronised(streamer.decoder.decode, times["decoder"])
    step = synchronised(streamer.step, times["step"])
    tokens = []
    for r in range(repeats):
        before = int(streamer.decoder.counts.sum())
        step(slots, simulation.fixed_step_chunks(plans, r))
        tokens.append(int(streamer.decoder.counts.sum()) - before)
    print(
        f"{streams} streams stepping together (steps 2..{repeats + 1}), encoder_matmul={cfg.encoder_matmul}, "
        f"fast_math={cfg.fast_math}, capture_decoder_step={cfg.capture_decoder_step}; ms, each phase synchronised:"
    )
    print(f"  {'step':>4s} " + " ".join(f"{name:>20s}" for name in PHASES) + "  tokens")
    for r in range(repeats):
        print(f"  {r + 2:4d} " + " ".join(f"{times[name][r]:20.3f}" for name in PHASES) + f"  {tokens[r]:6d}")
    first = min(cfg.fixed_step_repeats, repeats)
    for label, part in ((f"median of steps 2..{first + 1} (the fixed step's)", slice(0, first)),
                        (f"median of steps {first + 2}..{repeats + 1}", slice(first, repeats))):  # fmt: skip
        if part.start < part.stop:
            print(f"  {label}: " + ", ".join(f"{n} {np.median(times[n][part]):.3f}" for n in PHASES), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
