"""The offline path's first ``model.transcribe`` call against its later ones, in one new process, per variant.

python benchmarks/experiments/first_call_variants.py --model tdt-0.6b --variant baseline

Builds the benchmark's synthetic model and files (:func:`fastdecode_lab.benchmarks.transcribe.prepared`),
switches to ``fast_greedy`` with the offline path, then times ``--calls`` calls of ``model.transcribe`` on the same
files, the GPU synchronised only after each call (no hooks, no profiler). Variants change one suspected first-call
cost at a time:

* ``baseline``: the library as it is;
* ``no-pin``: batches padded into pageable memory (no ``cudaHostAlloc`` on the first call's batches);
* ``no-cudnn-encoder``: the encoder's convolutions on PyTorch's own kernels (no cuDNN plan per new shape);
* ``no-pin+no-cudnn-encoder``: both.

Prints each call's seconds and the time Python's cyclic garbage collector ran during it, per generation.
``--timeline``: also each call's timeline, in ms from the call's start: when the host had each batch's audio
(``audio``), the host's time in sizing the decoder (``reserve``), and per batch the GPU span of the preprocessor,
encoder and decoder (CUDA events on the current stream, read after the call: no synchronisation inside it) beside
the host time spent issuing each of them (``host``). A slow first call shows which of them grew.

Run each variant in its own process after one run has filled Triton's on-disk cache; set
``CUDA_MODULE_LOADING=EAGER`` in the environment to see what lazy kernel loading costs.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from typing import Any

import torch
from first_call_set import add_set_arguments, synthetic_set

import nemo_fastdecode  # noqa: F401  (registers the strategies)
from fastdecode_lab.benchmarks import transcribe as bench
from nemo_fastdecode.apps.models import apply_decoding
from nemo_fastdecode.apps.timing import synchronize
from nemo_fastdecode.offline import audio_batches, enable_fast_transcribe, fast_path

VARIANTS = ("baseline", "no-pin", "no-cudnn-encoder", "no-pin+no-cudnn-encoder")


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
    add_set_arguments(parser, model="tdt-0.6b")
    parser.add_argument("--calls", type=int, default=4, help="calls timed, the first included")
    parser.add_argument("--variant", default="baseline", choices=VARIANTS)
    parser.add_argument("--timeline", action="store_true", help="also print each call's timeline")
    args = parser.parse_args()
    test_set = synthetic_set(args, bf16=True)
    if "no-pin" in args.variant:
        fast_path.PrefetchedAudioBatches = _PageableBatches
    with bench.prepared(test_set) as (model, paths, _):
        device = next(model.parameters()).device
        if "no-cudnn-encoder" in args.variant:
            _encoder_without_cudnn(model.encoder)
        apply_decoding(model, {"strategy": "fast_greedy", "greedy": {"max_symbols": test_set.max_symbols}})
        enable_fast_transcribe(model)
        seconds, collections, timelines = [], [], []
        gc_seconds = _GarbageCollectionTime()
        timeline = _Timeline(model) if args.timeline else None
        for _ in range(args.calls):
            synchronize(device)
            gc_seconds.reset()
            if timeline is not None:
                timeline.reset()
            start = time.perf_counter()
            bench._transcribe(model, paths, args.batch_size, "bf16_autocast" if test_set.bf16 else "fp32")
            synchronize(device)
            seconds.append(time.perf_counter() - start)
            collections.append(gc_seconds.summary())
            if timeline is not None:
                timelines.append(timeline.summary())
        loading = os.environ.get("CUDA_MODULE_LOADING", "LAZY (default)")
        calls = " ".join(f"{s:.3f}" for s in seconds)
        print(
            f"=== {args.model} {args.variant} (CUDA_MODULE_LOADING {loading}): calls {calls} s; "
            f"first / best later {seconds[0] / min(seconds[1:]):.2f}x",
            flush=True,
        )
        print(f"    garbage collection per call: {collections}", flush=True)
        for number, lines in enumerate(timelines, 1):
            print(f"    timeline of call {number} (ms from its start):", flush=True)
            for line in lines:
                print(f"      {line}", flush=True)


class _HostEvent:
    """``torch.cuda.Event``'s interface on the host clock, for a run without a GPU."""

    def __init__(self, enable_timing: bool = True) -> None:
        self.time = 0.0

    def record(self) -> None:
        self.time = time.perf_counter()

    def elapsed_time(self, end: _HostEvent) -> float:
        return (end.time - self.time) * 1e3


class _Timeline:
    """Per call: host times of the audio batches and the decoder's sizing, and per stage the GPU span (CUDA events)
    and the host time spent issuing it, all in ms from the call's start (see the module docstring)."""

    STAGES = ("preprocessor", "encoder", "decoder")

    def __init__(self, model: torch.nn.Module) -> None:
        self.event = torch.cuda.Event if torch.cuda.is_available() else _HostEvent
        self.events: list[tuple[str, Any, Any, float, float]] = []
        self.host: list[tuple[str, float, float]] = []
        self._open: dict[str, tuple[Any, float]] = {}
        for name in ("preprocessor", "encoder"):
            module = getattr(model, name)
            module.register_forward_pre_hook(lambda _m, _a, n=name: self._begin(n))
            module.register_forward_hook(lambda _m, _a, _o, n=name: self._end(n))
        decoding = model.decoding
        decode = decoding.rnnt_decoder_predictions_tensor

        def traced_decode(*args, **kwargs):
            self._begin("decoder")
            try:
                return decode(*args, **kwargs)
            finally:
                self._end("decoder")

        decoding.rnnt_decoder_predictions_tensor = traced_decode
        reserve = fast_path._reserve_decoder

        def traced_reserve(*args, **kwargs):
            begin = time.perf_counter()
            try:
                return reserve(*args, **kwargs)
            finally:
                self.host.append(("reserve", begin, time.perf_counter()))

        fast_path._reserve_decoder = traced_reserve
        iterate = audio_batches.PrefetchedAudioBatches.iterate
        host = self.host

        def traced_iterate(loader):
            batches = iterate(loader)
            while True:
                begin = time.perf_counter()
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                host.append(("audio", begin, time.perf_counter()))
                yield batch

        audio_batches.PrefetchedAudioBatches.iterate = traced_iterate
        self.reset()

    def reset(self) -> None:
        self.events.clear()
        self.host.clear()
        self.start = self.event(enable_timing=True)
        self.start.record()
        self.start_host = time.perf_counter()

    def _begin(self, name: str) -> None:
        event = self.event(enable_timing=True)
        event.record()
        self._open[name] = (event, time.perf_counter())

    def _end(self, name: str) -> None:
        event = self.event(enable_timing=True)
        event.record()
        begin_event, begin_host = self._open.pop(name)
        self.events.append((name, begin_event, event, begin_host, time.perf_counter()))

    def summary(self) -> list[str]:
        def ms(t: float) -> float:
            return (t - self.start_host) * 1e3

        lines = [
            " ".join(f"{name} {ms(a):.0f}-{ms(b):.0f}" for name, a, b in self.host if name == kind)
            for kind in ("audio", "reserve")
        ]
        for stage in self.STAGES:
            spans = [
                f"{self.start.elapsed_time(a):.0f}-{self.start.elapsed_time(b):.0f} (host {ms(h0):.0f}-{ms(h1):.0f})"
                for name, a, b, h0, h1 in self.events
                if name == stage
            ]
            lines.append(f"{stage}: " + ", ".join(spans))
        return lines


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
