"""Wall-clock timing of decoders and steps on a GPU or the CPU: synchronise, time, keep every pass."""

from __future__ import annotations

import time
from typing import Any

import torch

from nemo_fastdecode.apps.comparison import Batches, decode_all


def synchronize(device: torch.device | None) -> None:
    """Wait for the GPU's queued work (a no-op on the CPU): call before reading a clock."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_passes(decoder: Any, batches: Batches, repeats: int) -> tuple[list[float], list[Any]]:
    """Wall-clock seconds of each of ``repeats`` passes over ``batches`` and the last pass's hypotheses.

    Args:
        decoder: a NeMo transducer infer object (``decoder(encoder_output=..., encoded_lengths=...)``).
        batches: ``(encoder output [B, D, T], lengths [B])`` per batch.
        repeats: timed passes; warm up before calling (graph capture, lazy set-up).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    device = batches[0][0].device if len(batches) else torch.device("cpu")
    seconds: list[float] = []
    hyps: list[Any] = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        hyps = decode_all(decoder, batches)
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    return seconds, hyps


def best_time(decoder: Any, batches: Batches, repeats: int) -> tuple[float, list[Any]]:
    """Best wall-clock seconds of ``repeats`` passes (:func:`timed_passes`) and the last pass's hypotheses."""
    seconds, hyps = timed_passes(decoder, batches, repeats)
    return min(seconds), hyps
