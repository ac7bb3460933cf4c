"""Decode, time and compare strategies on the same encoder outputs (used by the benchmark and the demo)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
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


def profile_pass(
    decoder: Any, batches: Batches, timeline: list[tuple[str, float, float]] | None = None
) -> tuple[float, dict[str, list[float]]]:
    """Wall seconds of one pass (CUDA) under torch.profiler and, per GPU kernel name, ``[count, total us]``.

    Kernels replayed from CUDA graphs count too (not those inside conditional WHILE nodes, which CUPTI does not
    see); memcpy/memset entries are included under their names. ``timeline``: extended with every GPU event's
    ``(name, start_us, end_us)`` (for :func:`idle_gaps`).
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
    if timeline is not None:
        timeline.extend(kernel_intervals(prof))
    return wall, kernels


@dataclass(frozen=True)
class IdleGaps:
    """The GPU's idle time between consecutive kernels of a timeline (see :func:`idle_gaps`), in microseconds."""

    busy_us: float  # time with at least one kernel running
    short_gaps_us: float  # idle stretches shorter than the threshold: launch gaps inside a graph or a step
    short_gaps: int
    long_gaps_us: float  # longer ones: host work, synchronisation, time between steps
    before: list[tuple[str, float, int]]  # (kernel name, short idle time after it, count), largest first
    long_between: list[tuple[str, str, float, int]]  # (kernel before, kernel after, long idle time, count), largest


def idle_gaps(kernels: Sequence[tuple[str, float, float]], short_us: float = 50.0, top: int = 10) -> IdleGaps:
    """Split a GPU timeline's idle time into short gaps (between kernels of one launch sequence) and long ones.

    Args:
        kernels: ``(name, start_us, end_us)`` of every kernel (or memcpy/memset), any order, one device.
        short_us: gaps shorter than this count as launch gaps.
        top: how many kernel names to list in ``before``.
    """
    busy = short = long = 0.0
    count = 0
    after: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    between: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    end, last = None, None
    for name, start, stop in sorted(kernels, key=lambda k: (k[1], k[2])):
        if end is None or start >= end:
            busy += stop - start
            if end is not None:
                gap = start - end
                if gap < short_us:
                    short, count = short + gap, count + 1
                    after[last][0] += gap
                    after[last][1] += 1
                else:
                    long += gap
                    between[last, name][0] += gap
                    between[last, name][1] += 1
        elif stop > end:  # overlaps the running stretch
            busy += stop - end
        if end is None or stop >= end:
            end, last = stop, name
    ranked = sorted(((name, total, int(n)) for name, (total, n) in after.items()), key=lambda r: -r[1])
    ranked_long = sorted(((a, b, total, int(n)) for (a, b), (total, n) in between.items()), key=lambda r: -r[2])
    return IdleGaps(busy, short, count, long, ranked[:top], ranked_long[:top])


def kernel_intervals(prof: Any) -> list[tuple[str, float, float]]:
    """``(name, start_us, end_us)`` of the GPU events (kernels, memcpy, memset) of a finished ``torch.profiler`` run."""
    return [
        (event.name, event.time_range.start, event.time_range.end)
        for event in prof.events()
        if event.device_type == torch.autograd.DeviceType.CUDA
    ]
