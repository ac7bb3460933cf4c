"""The offline path's first ``model.transcribe`` call against its later ones, in one new process, per variant.

python benchmarks/experiments/first_call_variants.py --model tdt-0.6b --variant baseline

Builds the benchmark's synthetic model and files (:func:`nemo_fastdecode.tools.transcribe_benchmark.prepared`),
switches to ``fast_greedy`` with the offline path, then times ``--calls`` calls of ``model.transcribe`` on the same
files, the GPU synchronised only after each call (no hooks, no profiler). Variants change one suspected first-call
cost at a time:

* ``baseline``: the library as it is;
* ``no-pin``: batches padded into pageable memory (no ``cudaHostAlloc`` on the first call's batches);
* ``no-cudnn-encoder``: the encoder's convolutions on PyTorch's own kernels (no cuDNN plan per new shape);
* ``no-pin+no-cudnn-encoder``: both;
* ``gc-freeze``: ``gc.freeze()`` after the set-up (the model's objects out of the cyclic collector's full passes).

Prints each call's seconds and the time Python's cyclic garbage collector ran during it, per generation.

Run each variant in its own process after one run has filled Triton's on-disk cache; set
``CUDA_MODULE_LOADING=EAGER`` in the environment to see what lazy kernel loading costs.
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import torch

import nemo_fastdecode  # noqa: F401  (registers the strategies)
from nemo_fastdecode.offline import audio_batches, enable_fast_transcribe, fast_path
from nemo_fastdecode.tools import transcribe_benchmark as bench
from nemo_fastdecode.tools.models import apply_decoding
from nemo_fastdecode.tools.timing import synchronize

VARIANTS = ("baseline", "no-pin", "no-cudnn-encoder", "no-pin+no-cudnn-encoder", "gc-freeze")


class _PageableBatches(audio_batches.PrefetchedAudioBatches):
    def __init__(self, *args, **kwargs) -> None:
        kwargs["pin_memory"] = False
        super().__init__(*args, **kwargs)


def _encoder_without_cudnn(encoder: torch.nn.Module) -> None:
    saved: list[bool] = []

    def pre(_module, _args) -> None:
        saved.append(torch.backends.cudnn.enabled)
        torch.backends.cudnn.enabled = False

    def post(_module, _args, _output) -> None:
        torch.backends.cudnn.enabled = saved.pop()

    encoder.register_forward_pre_hook(pre)
    encoder.register_forward_hook(post)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tdt-0.6b", help="a synthetic preset (rnnt-0.6b, tdt-0.6b, tiny-rnnt)")
    parser.add_argument("--calibration", default="trained", help="tokens per frame (a number) or 'trained'")
    parser.add_argument("--seconds", type=float, default=1800.0, help="total audio")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--calls", type=int, default=4, help="calls timed, the first included")
    parser.add_argument("--variant", default="baseline", choices=VARIANTS)
    args = parser.parse_args()
    calibration = args.calibration if args.calibration == "trained" else float(args.calibration)
    synthetic_set = bench.SyntheticSet(args.model, args.seconds, args.batch_size, calibration, True, 10, 0)
    if "no-pin" in args.variant:
        fast_path.PrefetchedAudioBatches = _PageableBatches
    with bench.prepared(synthetic_set) as (model, paths, _):
        device = next(model.parameters()).device
        if "no-cudnn-encoder" in args.variant:
            _encoder_without_cudnn(model.encoder)
        apply_decoding(model, {"strategy": "fast_greedy", "greedy": {"max_symbols": synthetic_set.max_symbols}})
        enable_fast_transcribe(model)
        if args.variant == "gc-freeze":
            gc.collect()
            gc.freeze()
        seconds, collections = [], []
        gc_seconds = _GarbageCollectionTime()
        for _ in range(args.calls):
            synchronize(device)
            gc_seconds.reset()
            start = time.perf_counter()
            bench._transcribe(model, paths, args.batch_size, synthetic_set.bf16)
            synchronize(device)
            seconds.append(time.perf_counter() - start)
            collections.append(gc_seconds.summary())
        loading = os.environ.get("CUDA_MODULE_LOADING", "LAZY (default)")
        calls = " ".join(f"{s:.3f}" for s in seconds)
        print(
            f"=== {args.model} {args.variant} (CUDA_MODULE_LOADING {loading}): calls {calls} s; "
            f"first / best later {seconds[0] / min(seconds[1:]):.2f}x",
            flush=True,
        )
        print(f"    garbage collection per call: {collections}", flush=True)


class _GarbageCollectionTime:
    """Seconds Python's cyclic garbage collector ran, per generation, since :meth:`reset` (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.counts = [0, 0, 0]
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._start
            self.counts[info["generation"]] += 1

    def reset(self) -> None:
        self.seconds, self.counts = [0.0, 0.0, 0.0], [0, 0, 0]

    def summary(self) -> str:
        return " ".join(
            f"gen{g} {n}x {s * 1e3:.0f} ms" for g, (n, s) in enumerate(zip(self.counts, self.seconds, strict=True))
        )


if __name__ == "__main__":
    main()
