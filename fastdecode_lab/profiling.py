"""GPU kernel profiles of a decoding pass: time per kernel name, and the GPU's idle gaps between kernels."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nemo_fastdecode.apps.comparison import Batches, decode_all


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


# the label loop launches this kernel once per iteration (it emits each row's label of the iteration)
ITERATION_KERNEL = "_label_emit_kernel"


def per_iteration_lines(walls: dict[str, float], iteration_kernels: dict[str, tuple[int, int, float]]) -> list[str]:
    """A table of each profiled ``no_while_graph`` label loop per iteration (CUPTI sees its kernels) beside its
    ``full_graph`` twin's wall time per iteration (the same loop on the same batches, kernels hidden in WHILE nodes):
    what the full graph spends beyond its kernels' time, between nodes and on the WHILE condition."""
    if not iteration_kernels:
        return []
    lines = [
        "",
        "## Per label-loop iteration",
        "",
        f"Iterations counted as launches of `{ITERATION_KERNEL}` in the no-while-graph pass; the full-graph twin runs "
        "the same iterations.",
        "",
        "| loop | iterations | kernels per iteration | kernel us per iteration | full graph us per iteration | "
        "full graph beyond kernels, us |",
        "|---|---|---|---|---|---|",
    ]
    for name, (iterations, launches, kernel_us) in iteration_kernels.items():
        twin = name.replace("[no_while_graph", "[full_graph")
        per_kernel = kernel_us / iterations
        full = walls.get(twin)
        full_cells = (
            ("-", "-")
            if full is None
            else (f"{full * 1e6 / iterations:.1f}", f"{full * 1e6 / iterations - per_kernel:.1f}")
        )
        lines.append(
            f"| {name} | {iterations} | {launches / iterations:.1f} | {per_kernel:.1f} | {full_cells[0]} | {full_cells[1]} |"
        )
    return lines
