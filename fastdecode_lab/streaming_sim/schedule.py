"""Real-time arrival of many concurrent streams on a virtual clock, and the step with every stream together.

A chunk *arrives* when its last audio sample would have been recorded (its last 10 ms feature frame, counted
from the stream's start). A virtual clock plays a server that, whenever it is free, steps every stream whose
next chunk has arrived, and advances by the measured wall time of that step (encoder + decoding; synchronised
on a GPU). Reported per path: per-chunk latency (completion - arrival) percentiles, step times, batch sizes,
throughput (audio seconds per compute second) and the busy share of the simulated time (< 1: the streams are
served in real time).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from nemo_fastdecode.apps.timing import synchronize
from nemo_fastdecode.streaming.events import BoostingOptions
from nemo_fastdecode.streaming.geometry import StreamingGeometry, split_features

FRAME_SECONDS = 0.01  # NeMo's mel-feature hop


@dataclass
class StreamPlan:
    """One simulated stream: its input, start time, chunks and each chunk's arrival time (seconds), and the phrases
    it opens with to boost (``None``: none)."""

    name: str
    start: float
    chunks: list[torch.Tensor]
    arrivals: list[float]
    boosting: BoostingOptions | None = None

    @property
    def features(self) -> torch.Tensor:
        """The features the stream plays, ``[feat_in, T]``: its chunks joined (a cut and a dropped tail left out)."""
        return torch.cat(self.chunks, dim=1)

    @property
    def audio_seconds(self) -> float:
        return sum(c.shape[1] for c in self.chunks) * FRAME_SECONDS


def plan_streams(
    features: Sequence[torch.Tensor],
    names: Sequence[str],
    geometry: StreamingGeometry,
    num_streams: int,
    stagger_seconds: float,
    seed: int = 0,
    max_stream_seconds: float | None = None,
    boosting: Sequence[BoostingOptions | None] | None = None,
) -> list[StreamPlan]:
    """Stream ``i`` plays ``features[i % len(features)]`` (``[feat_in, T]``), starting at a uniform random time, and
    opens with ``boosting[i]`` (``None``: no boosting for any stream)."""
    rng = random.Random(seed)
    plans = []
    for i in range(num_streams):
        feats = features[i % len(features)]
        if max_stream_seconds is not None:
            feats = feats[:, : max(1, round(max_stream_seconds / FRAME_SECONDS))]
        start = rng.uniform(0.0, stagger_seconds) if stagger_seconds > 0 else 0.0
        chunks = split_features(feats, geometry)
        ends = np.cumsum([c.shape[1] for c in chunks])
        arrivals = [start + e * FRAME_SECONDS for e in ends]
        plans.append(StreamPlan(names[i % len(names)], start, chunks, arrivals, boosting[i] if boosting else None))
    return plans


@dataclass
class PathStats:
    """Measurements of one path over the whole schedule (times in milliseconds unless named seconds)."""

    name: str
    steps: int
    chunks: int
    audio_seconds: float
    compute_seconds: float
    simulated_seconds: float
    latency_p50_ms: float
    latency_p95_ms: float
    latency_p99_ms: float
    latency_max_ms: float
    step_mean_ms: float
    step_p50_ms: float
    step_p95_ms: float
    batch_mean: float
    batch_max: int
    throughput: float  # audio seconds per compute second (RTFx)
    busy_share: float  # compute / simulated time: below 1 the server keeps up with real time
    step_ms_by_batch: dict[str, float] = field(default_factory=dict)  # median step time per batch-size range
    warmup_seconds: float = 0.0  # before the clock started (graph captures, lazy library set-up)


class StreamingPath:
    """What :func:`simulate` needs from a streaming implementation (and how long its warm-up took).

    ``open_(boosting)``: a slot for a new stream with its phrases to boost (``None``: none).
    """

    def __init__(
        self,
        name: str,
        open_: Callable[[BoostingOptions | None], int],
        step: Callable[[list[int], list[torch.Tensor]], Any],
        finish: Callable[[int], list[int]],
        warmup_seconds: float = 0.0,
    ):
        self.name, self.open, self.step, self.finish = name, open_, step, finish
        self.warmup_seconds = warmup_seconds


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def _by_batch(batches: Sequence[int], times: Sequence[float]) -> dict[str, float]:
    """Median step time (ms) per batch-size range 1, 2-3, 4-7, 8-15, ..."""
    groups: dict[int, list[float]] = {}
    for n, t in zip(batches, times, strict=True):
        groups.setdefault(n.bit_length() - 1, []).append(t)
    return {
        (f"{1 << k}" if k == 0 else f"{1 << k}-{(2 << k) - 1}"): round(1000 * float(np.median(v)), 3)
        for k, v in sorted(groups.items())
    }


def simulate(
    path: StreamingPath, plans: Sequence[StreamPlan], num_slots: int, device: torch.device
) -> tuple[PathStats, list[list[int]]]:
    """Serve the schedule on a virtual clock (see the module docstring); returns stats and each stream's tokens."""

    def sync() -> None:
        synchronize(device)

    position = [0] * len(plans)
    slot: dict[int, int] = {}
    tokens: list[list[int]] = [[] for _ in plans]
    remaining = set(range(len(plans)))
    latencies, step_times, batches = [], [], []
    now = 0.0
    while remaining:
        ready = [i for i in sorted(remaining) if plans[i].arrivals[position[i]] <= now]
        free = num_slots - len(slot)
        waiting = [i for i in ready if i not in slot]
        ready = [i for i in ready if i in slot] + waiting[:free]  # a stream without a slot waits for one
        if not ready:
            now = max(now, min(plans[i].arrivals[position[i]] for i in remaining if i in slot or free > 0))
            continue
        for i in ready:
            if i not in slot:
                slot[i] = path.open(plans[i].boosting)
        sync()
        started = time.perf_counter()
        path.step([slot[i] for i in ready], [plans[i].chunks[position[i]] for i in ready])
        sync()
        elapsed = time.perf_counter() - started
        now += elapsed
        step_times.append(elapsed)
        batches.append(len(ready))
        for i in ready:
            latencies.append(now - plans[i].arrivals[position[i]])
            position[i] += 1
            if position[i] == len(plans[i].chunks):
                tokens[i] = path.finish(slot.pop(i))
                remaining.discard(i)

    span = now - min((p.start for p in plans), default=0.0)
    audio = sum(p.audio_seconds for p in plans)
    stats = path_stats(path.name, latencies, step_times, batches, audio, span, path.warmup_seconds)
    return stats, tokens


def path_stats(
    name: str,
    latencies: Sequence[float],
    step_times: Sequence[float],
    batches: Sequence[int],
    audio_seconds: float,
    simulated_seconds: float,
    warmup_seconds: float = 0.0,
) -> PathStats:
    """:class:`PathStats` of a run on the virtual clock, from per-chunk latencies and per-step times (seconds) and
    per-step batch sizes, the audio served and the simulated time from the first start to the last completion."""
    compute = sum(step_times)
    span = max(simulated_seconds, 1e-9)
    return PathStats(
        name=name,
        steps=len(step_times),
        chunks=len(latencies),
        audio_seconds=round(audio_seconds, 3),
        compute_seconds=round(compute, 4),
        simulated_seconds=round(span, 4),
        latency_p50_ms=round(1000 * _percentile(latencies, 50), 3),
        latency_p95_ms=round(1000 * _percentile(latencies, 95), 3),
        latency_p99_ms=round(1000 * _percentile(latencies, 99), 3),
        latency_max_ms=round(1000 * max(latencies, default=0.0), 3),
        step_mean_ms=round(1000 * compute / max(len(step_times), 1), 3),
        step_p50_ms=round(1000 * _percentile(step_times, 50), 3),
        step_p95_ms=round(1000 * _percentile(step_times, 95), 3),
        batch_mean=round(float(np.mean(batches)) if len(batches) else 0.0, 2),
        batch_max=max(batches, default=0),
        throughput=round(audio_seconds / compute, 2) if compute > 0 else 0.0,
        busy_share=round(compute / span, 4),
        step_ms_by_batch=_by_batch(batches, step_times),
        warmup_seconds=round(warmup_seconds, 3),
    )


@dataclass
class FixedStepTiming:
    """What :func:`time_fixed_steps` measured: the median step (ms) and the tokens its streams decoded."""

    ms: float
    tokens: int  # over the streams' first chunk and the timed steps: equal work is visible across paths


def time_fixed_steps(
    path: StreamingPath,
    plans: Sequence[StreamPlan],
    num_streams: int,
    repeats: int,
    device: torch.device,
    around_steps: contextlib.AbstractContextManager | None = None,
) -> FixedStepTiming:
    """Median time (ms) of a step in which ``num_streams`` streams step together, past their first chunk.

    The first ``num_streams`` plans open, step their first chunk, then ``repeats`` later chunks all together
    (stagger 0 at a fixed batch: e.g. 256 active streams out of 1024 slots), then close; the
    tokens their final hypotheses hold are counted. ``around_steps`` (e.g. a profiler) is entered around the
    ``repeats`` steps only.
    """
    streams = list(plans[:num_streams])
    slots = [path.open(p.boosting) for p in streams]
    path.step(slots, [p.chunks[0] for p in streams])
    times = []
    with around_steps if around_steps is not None else contextlib.nullcontext():
        for r in range(repeats):
            chunks = fixed_step_chunks(streams, r)
            synchronize(device)
            started = time.perf_counter()
            path.step(slots, chunks)
            synchronize(device)
            times.append(time.perf_counter() - started)
    tokens = sum(len(path.finish(slot)) for slot in slots)
    return FixedStepTiming(round(1000 * float(np.median(times)), 3) if times else 0.0, tokens)


def fixed_step_chunks(plans: Sequence[StreamPlan], repeat: int) -> list[torch.Tensor]:
    """The chunks of :func:`time_fixed_steps`' ``repeat``-th timed step: a later full-length chunk of each stream,
    cycling. A stream's short last chunk is left out, so that every stream steps a chunk of one length and both
    paths do the same work (NeMo's batched step pads a ragged batch, and decodes the padding). A one-chunk stream
    repeats its first chunk."""
    chunks = []
    for plan in plans:
        later = plan.chunks[1:]
        full = [c for c in later if c.shape[1] == max(c.shape[1] for c in later)] if later else [plan.chunks[0]]
        chunks.append(full[repeat % len(full)])
    return chunks


def served_in_real_time(stats: PathStats, target_ms: float) -> bool:
    """Served in real time: the server keeps up (busy < 1) with p95 chunk latency within the target."""
    return stats.busy_share < 1.0 and stats.latency_p95_ms <= target_ms
