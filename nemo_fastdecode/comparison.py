"""Decode, time and compare strategies on the same encoder outputs (used by the benchmark and the demo)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis

Batches = Sequence[tuple[torch.Tensor, torch.Tensor]]  # (encoder output [B, D, T], lengths [B]) per batch


def decode_all(decoder: Any, batches: Batches) -> list[Hypothesis]:
    """Every batch through ``decoder`` (a NeMo greedy infer object); hypotheses in batch order."""
    hyps: list[Hypothesis] = []
    with torch.inference_mode():
        for encoder_output, lengths in batches:
            hyps.extend(decoder(encoder_output=encoder_output, encoded_lengths=lengths)[0])
    return hyps


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_passes(decoder: Any, batches: Batches, repeats: int) -> tuple[list[float], list[Hypothesis]]:
    """Wall-clock seconds of each of ``repeats`` passes (synchronised on a GPU) and the last pass's hypotheses."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    device = batches[0][0].device if len(batches) else torch.device("cpu")
    seconds, hyps = [], []
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        hyps = decode_all(decoder, batches)
        _synchronize(device)
        seconds.append(time.perf_counter() - start)
    return seconds, hyps


def best_time(decoder: Any, batches: Batches, repeats: int) -> tuple[float, list[Hypothesis]]:
    """Best wall-clock seconds of ``repeats`` passes (:func:`timed_passes`) and the last pass's hypotheses."""
    seconds, hyps = timed_passes(decoder, batches, repeats)
    return min(seconds), hyps


def as_int_list(value: Any) -> list[int]:
    """Token ids or frame indices as a list of ints (NeMo gives lists or tensors)."""
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.reshape(-1).tolist()]
    return [int(v) for v in value]


def agreement(reference: Sequence[Hypothesis], hyps: Sequence[Hypothesis]) -> tuple[float, float]:
    """(share of hypotheses with the reference's tokens and frames, largest absolute score difference)."""
    same, worst = 0, 0.0
    for r, h in zip(reference, hyps, strict=True):
        same += as_int_list(r.y_sequence) == as_int_list(h.y_sequence) and as_int_list(r.timestamp) == as_int_list(
            h.timestamp
        )
        worst = max(worst, abs(float(r.score) - float(h.score)))
    return same / max(len(reference), 1), worst


def profile_pass(decoder: Any, batches: Batches) -> tuple[float, dict[str, list[float]]]:
    """Wall seconds of one pass (CUDA) under torch.profiler and, per GPU kernel name, ``[count, total us]``.

    Kernels replayed from CUDA graphs count too; memcpy/memset entries are included under their names.
    """
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        decode_all(decoder, batches)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:  # a kernel (or memcpy/memset) on the GPU
            entry = kernels[event.name[:90]]
            entry[0] += 1
            entry[1] += event.time_range.elapsed_us()
    return wall, kernels
