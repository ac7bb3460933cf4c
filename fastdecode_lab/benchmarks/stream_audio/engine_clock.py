"""Our engine (:class:`~nemo_fastdecode.streaming.StreamingEngine`, public API) serving PCM that arrives in real time.

On a virtual clock (as :mod:`~fastdecode_lab.streaming_sim.schedule`): stream ``i`` starts at a uniform random
time in ``[0, stagger)`` and its audio arrives in pushes of one chunk period, push ``k`` when its last sample would
have been recorded (``start + (k + 1) * period``, the last one at the stream's end, followed by ``finish``). The
server delivers every push that has arrived, then polls whenever the engine has work; the clock advances by the
poll's wall time (synchronised on a GPU), or jumps to the next arrival when the engine is idle. Pushing is the
clients' side and is not timed.

A chunk's latency runs from the arrival of the push that completed its last feature frame (the samples that frame
reads) to the end of the poll that stepped it, where its partial event comes out; a stream's last chunk runs from
its last push to its final event. :meth:`StreamingEngine.decoded_seconds` says which polls stepped which stream.

:func:`time_cycles` times whole cycles with ``N`` streams stepping together (one chunk period pushed to each, then
one poll), and the front end's share of them.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fastdecode_lab.streaming_sim.schedule import PathStats, path_stats
from nemo_fastdecode.apps.timing import synchronize
from nemo_fastdecode.streaming import StreamingEngine


@dataclass
class PcmStream:
    """One stream of the clock: int16 PCM of input ``file``, starting at ``start`` s, pushed ``push`` samples at a time.

    ``frame_arrivals[f - 1]``: when the samples that feature frames ``0 .. f - 1`` read have all arrived (the
    arrival of the push that completed them); frames that only the stream's end completes arrive with its last push.
    """

    file: int
    start: float
    pcm: np.ndarray
    push: int
    sample_rate: int
    frame_arrivals: np.ndarray

    @property
    def pushes(self) -> int:
        return math.ceil(len(self.pcm) / self.push)

    def arrival(self, k: int) -> float:
        """When push ``k`` (0-based) has arrived: its last sample recorded."""
        return self.start + min((k + 1) * self.push, len(self.pcm)) / self.sample_rate

    @property
    def end(self) -> float:
        return self.start + len(self.pcm) / self.sample_rate

    def chunk_arrival(self, frames: int) -> float:
        """Arrival of the audio that feature frames ``0 .. frames - 1`` need."""
        if frames <= 0:
            return self.start
        return float(self.frame_arrivals[min(frames, len(self.frame_arrivals)) - 1])


def plan_pcm_streams(
    audios: Sequence[np.ndarray],
    num_streams: int,
    push_seconds: float,
    stagger_seconds: float,
    complete_frames: Callable[[np.ndarray], np.ndarray],
    sample_rate: int,
    seed: int = 0,
) -> list[PcmStream]:
    """Stream ``i`` plays ``audios[i % len(audios)]`` (int16), starting at a uniform time in ``[0, stagger_seconds)``.

    ``complete_frames``: the front end's ``samples -> frames complete`` (:meth:`MelSettings.complete_frames`).
    """
    rng = random.Random(seed)
    push = max(1, round(push_seconds * sample_rate))
    streams = []
    for i in range(num_streams):
        pcm = audios[i % len(audios)]
        start = rng.uniform(0.0, stagger_seconds) if stagger_seconds > 0 else 0.0
        pushes = max(1, math.ceil(len(pcm) / push))
        received = np.minimum(np.arange(1, pushes + 1) * push, len(pcm))
        complete = complete_frames(received)  # frames complete after each push (non-decreasing)
        total = int(complete[-1]) if len(complete) else 0
        frames = np.arange(1, total + 1)
        index = np.searchsorted(complete, frames)  # the first push after which frame f - 1 is complete
        arrivals = start + received[np.minimum(index, pushes - 1)] / sample_rate
        streams.append(PcmStream(i % len(audios), start, pcm, push, sample_rate, arrivals))
    return streams


@dataclass
class LatencyParts:
    """Chunk latency p95 (ms) by where the chunk sits in its stream: the first chunk (the stream's opening and its
    first step), the middle ones, the last (its final event, word timestamps included). With every stream starting
    within one stagger window, the first and last chunks of all streams crowd together: this says whether they, or
    the steady state, set the overall p95."""

    first_p95_ms: float
    middle_p95_ms: float
    last_p95_ms: float
    first_chunks: int
    middle_chunks: int
    last_chunks: int


def _p95_ms(values: Sequence[float]) -> float:
    return round(1000 * float(np.percentile(values, 95)), 3) if len(values) else 0.0


def serve_on_clock(
    engine: StreamingEngine, streams: Sequence[PcmStream], device: torch.device, name: str, warmup_seconds: float = 0.0
) -> tuple[PathStats, list[list[int]], LatencyParts]:
    """Serve ``streams`` on the virtual clock (module docstring): stats, each stream's final token ids, and the
    latency split by the chunk's place in its stream.

    The engine needs ``len(streams)`` free slots (every stream is open from its first push to its final event).
    """
    deliveries = sorted((s.arrival(k), i, k) for i, s in enumerate(streams) for k in range(max(s.pushes, 1)))
    ids: dict[int, int] = {}  # stream -> engine id, while open
    of_engine: dict[int, int] = {}
    decoded = np.zeros(len(streams), dtype=np.int64)  # feature frames stepped per stream
    tokens: list[list[int]] = [[] for _ in streams]
    latencies, cycle_times, batches = [], [], []
    parts: dict[str, list[float]] = {"first": [], "middle": [], "last": []}
    hop_seconds = engine.front.settings.hop / engine.front.settings.sample_rate
    now, next_delivery, done = 0.0, 0, 0
    while done < len(streams):
        while next_delivery < len(deliveries) and deliveries[next_delivery][0] <= now:
            _, i, k = deliveries[next_delivery]
            next_delivery += 1
            stream = streams[i]
            if k == 0:
                ids[i] = engine.open()
                of_engine[ids[i]] = i
            engine.push(ids[i], stream.pcm[k * stream.push : (k + 1) * stream.push])
            if k >= stream.pushes - 1:
                engine.finish(ids[i])
        if not engine.busy:
            if next_delivery >= len(deliveries):
                raise RuntimeError("every push was delivered and the engine is idle, but streams have not ended")
            now = max(now, deliveries[next_delivery][0])
            continue
        synchronize(device)
        started = time.perf_counter()
        events = engine.poll()
        synchronize(device)
        elapsed = time.perf_counter() - started
        now += elapsed
        cycle_times.append(elapsed)
        stepped = 0
        for event in events:
            if event.is_last:
                i = of_engine.pop(event.stream_id)
                del ids[i]
                tokens[i] = list(event.token_ids)
                latencies.append(now - streams[i].end)  # the last chunk: from the last push to the final event
                parts["last"].append(latencies[-1])
                stepped, done = stepped + 1, done + 1
        for i, stream_id in ids.items():
            frames = round(engine.decoded_seconds(stream_id) / hop_seconds)
            if frames > decoded[i]:
                latencies.append(now - streams[i].chunk_arrival(frames))
                parts["first" if decoded[i] == 0 else "middle"].append(latencies[-1])
                decoded[i] = frames
                stepped += 1
        batches.append(stepped)
    audio = sum(len(s.pcm) / s.sample_rate for s in streams)
    span = now - min((s.start for s in streams), default=0.0)
    split = LatencyParts(
        *(_p95_ms(parts[k]) for k in ("first", "middle", "last")), *(len(parts[k]) for k in ("first", "middle", "last"))
    )
    return path_stats(name, latencies, cycle_times, batches, audio, span, warmup_seconds), tokens, split


@dataclass
class CycleTiming:
    """:func:`time_cycles`' result: the median whole cycle (ms) with ``streams`` stepping together, the front end's
    median share of a cycle, and the streams that stepped per timed cycle (all of them, or the timing is wrong)."""

    streams: int
    cycle_ms: float
    cycle_p95_ms: float
    frontend_share: float | None
    stepped_per_cycle: float
    repeats: int


def time_cycles(
    engine: StreamingEngine, audios: Sequence[np.ndarray], num_streams: int, repeats: int, device: torch.device
) -> CycleTiming:
    """Whole cycles with ``num_streams`` streams stepping together: each timed cycle pushes one chunk period of audio
    to every stream (not timed), then one :meth:`~StreamingEngine.poll` (timed, synchronised) steps one chunk of each.

    Stream ``j`` plays ``audios[j % len(audios)]`` from its start, wrapping around. The streams' first chunks run
    first (untimed); then ``repeats`` timed cycles; then ``repeats`` more with the front end's calls
    (``engine.inbox.take``, ``engine.front.append_staged`` / ``features``) timed inside the cycle (synchronised around
    them), for its share.
    """
    settings = engine.front.settings
    push = round(engine.geometry.chunk_seconds * settings.sample_rate)
    ids = [engine.open() for _ in range(num_streams)]
    position = [0] * num_streams

    def push_all() -> None:
        for j, stream_id in enumerate(ids):
            pcm = audios[j % len(audios)]
            piece = np.take(pcm, np.arange(position[j], position[j] + push), mode="wrap") if len(pcm) else pcm
            position[j] += push
            engine.push(stream_id, piece)

    def cycle() -> tuple[float, int]:
        before = [engine.decoded_seconds(s) for s in ids]
        synchronize(device)
        started = time.perf_counter()
        engine.poll()
        synchronize(device)
        elapsed = time.perf_counter() - started
        return elapsed, sum(engine.decoded_seconds(s) > b for s, b in zip(ids, before, strict=True))

    push_all()
    while engine.busy:  # the first chunks
        engine.poll()
    times, stepped, shares = [], [], []
    for _ in range(repeats):
        push_all()
        elapsed, count = cycle()
        times.append(elapsed)
        stepped.append(count)
    for _ in range(repeats):
        push_all()
        with _timed_front(engine, device) as spent:
            elapsed, _ = cycle()
        shares.append(spent[0] / elapsed if elapsed > 0 else 0.0)
    for stream_id in ids:
        engine.finish(stream_id)
    while engine.busy:
        engine.poll()
    return CycleTiming(
        streams=num_streams,
        cycle_ms=round(1000 * float(np.median(times)), 3) if times else 0.0,
        cycle_p95_ms=round(1000 * float(np.percentile(times, 95)), 3) if times else 0.0,
        frontend_share=round(float(np.median(shares)), 4) if shares else None,
        stepped_per_cycle=round(float(np.mean(stepped)), 2) if stepped else 0.0,
        repeats=repeats,
    )


@contextlib.contextmanager
def _timed_front(engine: StreamingEngine, device: torch.device) -> Iterator[list[float]]:
    """Time the front end's calls in a cycle (seconds, synchronised before and after each): yields ``[seconds]``.

    The calls: taking the cycle's audio from the engine's inbox, appending it (one copy, the PCM decode) and the
    features. Copying each push into the inbox happens when it arrives (:meth:`StreamingEngine.push`), outside.
    """
    front, inbox, spent = engine.front, engine.inbox, [0.0]

    def timed(method: Callable) -> Callable:
        def call(*args, **kwargs):
            synchronize(device)
            started = time.perf_counter()
            out = method(*args, **kwargs)
            synchronize(device)
            spent[0] += time.perf_counter() - started
            return out

        return call

    inbox.take = timed(inbox.take)  # instance attributes over methods
    front.append_staged, front.features = timed(front.append_staged), timed(front.features)
    try:
        yield spent
    finally:
        del inbox.take, front.append_staged, front.features


def warm_up_engine(engine: StreamingEngine, audios: Sequence[np.ndarray], num_streams: int) -> float:
    """Seconds of warm-up before any clock: every CUDA graph captured (:meth:`StreamingEngine.warm_up`), then a few
    cycles of all streams and of one stream alone (lazy library set-up, Triton kernels' first compilation)."""
    started = time.perf_counter()
    engine.warm_up()
    device = engine.device
    for count in (num_streams, 1):
        time_cycles(engine, audios, count, repeats=1, device=device)
    synchronize(device)
    return time.perf_counter() - started
