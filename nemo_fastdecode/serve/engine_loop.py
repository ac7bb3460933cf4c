"""The engine's own thread: every stream with a full chunk in each cycle, commands in and events out through queues.

The network side (one asyncio loop) never waits for the GPU: it puts :class:`Command` objects on a thread-safe queue
and gets :class:`Delivery` batches back through a callback (the server hands them to its loop with
``call_soon_threadsafe``; with network worker processes, to the thread that sends them to the workers, whose command
batches come in through :meth:`EngineLoop.submit_many`). The thread owns the
:class:`~nemo_fastdecode.streaming.StreamingEngine` (which is not thread-safe): it drains the queue, applies the
commands, runs one :meth:`~StreamingEngine.poll` while the engine has work, and sleeps on the queue when it has none.
Pushes that come while a cycle steps are applied inside it (``poll(while_stepping=...)``): the host's per-push work
overlaps the GPU's step, and the audio waits for the next cycle, as it would have. A network batch's pushes to open
streams go to the engine together (:meth:`~StreamingEngine.push_many`: one copy into its inbox); the first command
that needs more than a push to an open stream, and every later one, wait for the cycle's end, so commands apply in
the order they came.

With an engine per look-ahead (``transcription.delay``, :mod:`~nemo_fastdecode.serve.look_aheads`) the thread owns
them all: each item streams on the engine its pushes name (:attr:`Push.engine`), and each turn runs one cycle of each
engine that has work, in turn (each cycle its own single host-to-device copy of its streams' audio; no other sync is
added). A connection's next item may be on another engine: it opens there once the previous item's final is out.

Each connection is a *lane* of items (an item: the audio between two commits, one engine stream). Only a lane's
first item holds an engine stream; the next one's audio waits here until the first one's final has been built, so a
connection never holds more than one slot (admission counts connections against slots).

Turn detection (an item that asked for ``server_vad``) ends segments mid-stream, each a server commit, two ways: the
engine's own endpointing (Silero VAD, the item's stream opened with it on: its mid-stream finals come from
:meth:`~StreamingEngine.poll`, its speech starts and stops from :attr:`~StreamingEngine.speech_events`), or the
endpointing hook: ``endpointer(events) -> stream ids`` is called after each cycle with its events; each stream it
names (among those whose item asked for turn detection and whose audio is not complete yet) gets
:meth:`~StreamingEngine.end_segment`: a mid-stream final while the stream goes on. The client's own commit of such
an item is acknowledged with its last segment, just before that segment's final (segments may still end before it).
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import numpy as np

from nemo_fastdecode.serve.metrics import ServerMetrics
from nemo_fastdecode.streaming import (
    SpeechEvent,
    StreamEvent,
    StreamingEngine,
    StreamingEngineError,
    StreamOptions,
)
from nemo_fastdecode.streaming.frontend import SampleFormat

__all__ = [
    "Abort",
    "Command",
    "Delivery",
    "Drop",
    "DropRange",
    "EngineLoop",
    "EnginePort",
    "Finish",
    "ItemKey",
    "Push",
    "PushBatch",
    "batched",
]

log = logging.getLogger(__name__)

#: pushes remembered per stream for the chunk latency (the newest; older ones are behind every later partial)
_ARRIVALS_KEPT = 1024

#: ``(connection id, item index)``
ItemKey = tuple[int, int]
#: ``(engine index, engine stream id)``: an open stream among the engines
_StreamKey = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Push:
    """Audio of an item, as it arrived (``received``: monotonic seconds); the first push opens its stream."""

    key: ItemKey
    pcm: bytes
    received: float
    options: StreamOptions
    turn_detection: bool = False
    engine: int = 0  # the engine (look-ahead) the item streams on: its first push's


@dataclasses.dataclass(frozen=True)
class Finish:
    """The item's audio is complete (a commit): its final follows."""

    key: ItemKey
    received: float


@dataclasses.dataclass(frozen=True)
class Abort:
    """Drop the item (a cleared buffer): no final, its slot free at once."""

    key: ItemKey


@dataclasses.dataclass(frozen=True)
class Drop:
    """Drop every item of the connection (it went away)."""

    connection: int


@dataclasses.dataclass(frozen=True)
class DropRange:
    """Drop every item of the connections with ids in ``[first, stop)`` (a network worker process that died)."""

    first: int
    stop: int


@dataclasses.dataclass(frozen=True)
class PushBatch:
    """Consecutive :class:`Push` commands in columns: what a network worker sends for one turn of its event loop.

    One object with a few arrays and one bytes object crosses the process boundary instead of one object per push
    (at thousands of clients, unpickling the pushes one by one cost the engine's process more than applying them).
    Push ``i``: ``keys[i]``, ``audio[offsets[i]:offsets[i + 1]]``, ``received[i]``, ``options[option_of[i]]``,
    ``turn_detection[i]``, ``engines[i]``.
    """

    keys: np.ndarray  # [N, 2] int64: (connection id, item index)
    received: np.ndarray  # [N] float64
    offsets: np.ndarray  # [N + 1] int64
    audio: bytes
    options: list[StreamOptions]  # distinct options, in first-use order
    option_of: np.ndarray  # [N] int64
    turn_detection: np.ndarray  # [N] bool
    engines: np.ndarray  # [N] int64

    @classmethod
    def of(cls, pushes: list[Push]) -> PushBatch:
        """The batch of ``pushes`` (in order)."""
        distinct: dict[object, int] = {}
        options: list[StreamOptions] = []
        option_of = np.empty(len(pushes), dtype=np.int64)
        for i, push in enumerate(pushes):
            try:
                key: object = push.options
                index = distinct.get(key)
            except TypeError:  # options holding a list: unhashable, told apart by identity
                key = id(push.options)
                index = distinct.get(key)
            if index is None:
                index = distinct[key] = len(options)
                options.append(push.options)
            option_of[i] = index
        sizes = np.fromiter((len(p.pcm) for p in pushes), dtype=np.int64, count=len(pushes))
        return cls(
            keys=np.array([p.key for p in pushes], dtype=np.int64).reshape(len(pushes), 2),
            received=np.fromiter((p.received for p in pushes), dtype=np.float64, count=len(pushes)),
            offsets=np.concatenate([[0], np.cumsum(sizes)]),
            audio=b"".join(p.pcm for p in pushes),
            options=options,
            option_of=option_of,
            turn_detection=np.fromiter((p.turn_detection for p in pushes), dtype=bool, count=len(pushes)),
            engines=np.fromiter((p.engine for p in pushes), dtype=np.int64, count=len(pushes)),
        )

    @classmethod
    def joined(cls, batches: list[PushBatch]) -> PushBatch:
        """One batch of the pushes of ``batches``, in order (one copy of their audio)."""
        if len(batches) == 1:
            return batches[0]
        options: list[StreamOptions] = []
        option_of, offsets, base = [], [np.zeros(1, dtype=np.int64)], 0
        for batch in batches:
            option_of.append(batch.option_of + len(options))
            options += batch.options
            offsets.append(batch.offsets[1:] + base)
            base += int(batch.offsets[-1])
        return cls(
            keys=np.concatenate([b.keys for b in batches]),
            received=np.concatenate([b.received for b in batches]),
            offsets=np.concatenate(offsets),
            audio=b"".join(b.audio for b in batches),
            options=options,
            option_of=np.concatenate(option_of),
            turn_detection=np.concatenate([b.turn_detection for b in batches]),
            engines=np.concatenate([b.engines for b in batches]),
        )

    def __len__(self) -> int:
        return len(self.received)

    def pushes(self) -> list[Push]:
        """The pushes, as they were."""
        return [Push(*unit) for unit in _push_units(self)]


def batched(commands: list[Command | PushBatch | None]) -> list[Command | PushBatch | None]:
    """``commands`` with each run of consecutive pushes (:class:`Push` es and :class:`PushBatch` es) as one
    :class:`PushBatch`, the order kept: a worker's turn crosses the pipe in columns, and the engine's cost per batch
    is paid once per turn, however many network messages brought the pushes."""
    out: list[Command | PushBatch | None] = []
    run: list[PushBatch] = []
    singles: list[Push] = []
    for command in [*commands, None]:  # a sentinel ends the last run
        if isinstance(command, Push):
            singles.append(command)
            continue
        if singles:
            run.append(PushBatch.of(singles))
            singles = []
        if isinstance(command, PushBatch):
            run.append(command)
            continue
        if run:
            out.append(PushBatch.joined(run))
            run = []
        out.append(command)
    return out[:-1]


Command = Push | Finish | Abort | Drop | DropRange


class EnginePort(Protocol):
    """What a connection needs of the engine: somewhere to send its commands (an :class:`EngineLoop` in the same
    process, or a network worker's proxy of the one in the main process)."""

    def submit(self, command: Command) -> None: ...


@dataclasses.dataclass(frozen=True)
class Delivery:
    """An engine event of an item; or the error that ended it; or, for a :class:`Finish`, the segment it commits
    (``committed``: 0 unless segments of the stream ended before); or a speech start or stop the VAD heard."""

    key: ItemKey
    event: StreamEvent | None
    error: str | None = None
    committed: int | None = None
    speech: SpeechEvent | None = None


@dataclasses.dataclass
class _Item:
    key: ItemKey
    pushes: list[tuple[bytes, float, StreamOptions, bool]] = dataclasses.field(default_factory=list)
    finish_received: float | None = None
    engine: int = 0  # index of the engine its stream is on
    stream: int | None = None
    turn_detection: bool = False
    rate: int = 16000  # of the item's audio
    itemsize: int = 2  # bytes per sample of the item's audio
    samples: int = 0
    # (samples pushed so far, when the push arrived); a stream without partials (silence) keeps only the newest
    arrivals: collections.deque[tuple[int, float]] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=_ARRIVALS_KEPT)
    )


class EngineLoop:
    """Runs ``engine`` in a thread of its own; :meth:`submit` is thread-safe.

    Args:
        engine: the streaming engine, or the engines (one per look-ahead) that :attr:`Push.engine` indexes (only this
            thread calls them once :meth:`start` ran).
        deliver: called from this thread with each cycle's deliveries, in order (must not block).
        metrics: cycle time, chunk and final latency, open streams.
        endpointer: the endpointing hook (see the module docstring); ``None``: segments end at commits only.
        idle_wait: seconds the thread sleeps on the queue when the engine has nothing to do.
    """

    def __init__(
        self,
        engine: StreamingEngine | Sequence[StreamingEngine],
        deliver: Callable[[list[Delivery]], None],
        metrics: ServerMetrics,
        *,
        endpointer: Callable[[list[StreamEvent]], Iterable[int]] | None = None,
        idle_wait: float = 0.05,
    ):
        self.engines = [engine] if isinstance(engine, StreamingEngine) else list(engine)
        self.engine = self.engines[0]  # the first (the only one without look-aheads)
        self._deliver, self.metrics = deliver, metrics
        self.endpointer = endpointer
        self._idle_wait = idle_wait
        self._commands: queue.SimpleQueue[Command | list[Command | PushBatch] | None] = queue.SimpleQueue()
        self._lanes: dict[int, collections.deque[_Item]] = {}
        self._item_of: dict[_StreamKey, _Item] = {}  # (engine, stream id) -> its item
        self._segmenting: set[_StreamKey] = set()  # streams whose item asked for turn detection
        self._segments: dict[_StreamKey, int] = {}  # segments the endpointer ended, per stream
        self._held: list[Command | PushBatch | None] = []  # taken while a cycle stepped, applied after it
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()
        self.failed: BaseException | None = None
        self.cycles = 0

    # ---- the network side ----------------------------------------------------------------------------------------
    def start(self, warm_up: bool = True) -> None:
        """Start the thread; it warms the engine up first (CUDA graphs), then sets :attr:`ready`."""
        self._thread = threading.Thread(target=self._run, args=(warm_up,), name="engine-loop", daemon=True)
        self._thread.start()

    def submit(self, command: Command) -> None:
        """Queue a command for the next cycle (never blocks)."""
        self._commands.put(command)

    def submit_many(self, commands: list[Command | PushBatch]) -> None:
        """Queue a batch of commands, in order, for the next cycle (one queue operation for the whole batch)."""
        if commands:
            self._commands.put(commands)

    def stop(self, timeout: float | None = None) -> None:
        """End the thread after the commands already queued; streams still open are dropped."""
        self._commands.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def live_streams(self) -> int:
        """Engine streams open now (read from any thread: a snapshot)."""
        return len(self._item_of)

    @property
    def open_lanes(self) -> int:
        """Connections with an item here, open or waiting (read from any thread: a snapshot)."""
        return len(self._lanes)

    # ---- the engine thread ---------------------------------------------------------------------------------------
    def _run(self, warm_up: bool) -> None:
        try:
            if warm_up:
                for engine in self.engines:
                    engine.warm_up()
            # what is alive now (the model, NeMo's and torch's modules: ~10**6 objects) lives as long as the server:
            # frozen, a full collection (every thread stops for it) walks only what serving creates, not all of them
            gc.freeze()
            self.ready.set()
            while self._turn():
                pass
        except BaseException as error:  # a bug or a device failure: every client is told, /health reports it
            log.exception("the engine loop failed; every open item is ended with an error")
            self.failed = error
            failed = [
                Delivery(item.key, None, f"the server's engine failed: {type(error).__name__}")
                for lane in self._lanes.values()
                for item in lane
            ]
            if failed:
                self._deliver(failed)
        finally:
            for item in list(self._item_of.values()):
                self._abort_stream(item)
            self._lanes.clear()
            gc.unfreeze()  # the process's exit then finalises those objects as usual
            self.ready.set()

    def _turn(self) -> bool:
        """Apply the commands that came (waiting for one while the engine is idle), then one cycle if the engine has
        work (pushes that come meanwhile are applied while it steps); ``False`` once told to stop."""
        commands = batched(self._held + self._take(block=not (self.busy or self._held)))
        self._held = []
        stop = None in commands
        deliveries: list[Delivery] = []
        for command in commands:
            if command is not None:
                deliveries += self._apply(command)
        for index, engine in enumerate(self.engines):
            if not stop and engine.busy:
                deliveries += self._cycle(index)
        if deliveries:
            self._deliver(deliveries)
        return not stop

    @property
    def busy(self) -> bool:
        """Whether an engine has work (a cycle to run)."""
        return any(engine.busy for engine in self.engines)

    def _take(self, block: bool) -> list[Command | PushBatch | None]:
        """Every queued command (batches flattened); waits up to ``idle_wait`` for the first one when ``block``."""
        out: list[Command | PushBatch | None] = []
        try:
            entry = self._commands.get(timeout=self._idle_wait) if block else self._commands.get_nowait()
            while True:
                if isinstance(entry, list):
                    out += entry
                else:
                    out.append(entry)
                    if entry is None:
                        break
                entry = self._commands.get_nowait()
        except queue.Empty:
            pass
        return out

    def _apply_push(
        self, key: ItemKey, pcm: bytes, received: float, options: StreamOptions, turn_detection: bool, engine: int = 0
    ) -> list[Delivery]:
        """A push: to its item's stream when that is open, else kept until it opens (on ``engine``)."""
        lane = self._lanes.setdefault(key[0], collections.deque())
        item = next((i for i in lane if i.key == key), None)
        if item is None:
            item = _Item(key)
            lane.append(item)
        item.turn_detection = item.turn_detection or turn_detection
        if item.stream is None:
            item.engine = engine
            item.pushes.append((pcm, received, options, turn_detection))
            return self._start_head(key[0])
        return self._push(item, pcm, received)

    def _apply(self, command: Command | PushBatch) -> list[Delivery]:
        if isinstance(command, Push | PushBatch):  # the pushes to open streams go in together, the rest one by one
            out: list[Delivery] = []
            for push in self._push_to_open_streams(command):
                out += self._apply_push(*_push_units(push)[0])
            return out
        if isinstance(command, Drop | DropRange):
            dropped = (
                [command.connection]
                if isinstance(command, Drop)
                else [c for c in self._lanes if command.first <= c < command.stop]
            )
            for connection in dropped:
                for item in self._lanes.pop(connection, ()):
                    if item.stream is not None:
                        self._abort_stream(item)
            return []
        connection, _ = command.key
        lane = self._lanes.setdefault(connection, collections.deque())
        item = next((i for i in lane if i.key == command.key), None)
        if isinstance(command, Abort):
            if item is not None:
                lane.remove(item)
                if item.stream is not None:
                    self._abort_stream(item)
                return self._start_head(connection)
            return []
        if item is None:
            item = _Item(command.key)
            lane.append(item)
        # Finish: acknowledged with the segment it ends, before the events it leads to; with turn detection segments
        # may still end before the audio is out: acknowledged with the last event then
        item.finish_received = command.received
        committed = (
            []
            if item.turn_detection
            else [Delivery(item.key, None, committed=self._segments.get(_stream_key(item), 0))]
        )
        if item.stream is not None:
            self.engines[item.engine].finish(item.stream)
            return committed
        return committed + self._start_head(connection)

    def _start_head(self, connection: int) -> list[Delivery]:
        """Open the lane's first item in the engine once it has audio (the previous one's final is out)."""
        lane = self._lanes.get(connection)
        if not lane:
            self._lanes.pop(connection, None)
            return []
        item = lane[0]
        if item.stream is not None or not item.pushes:
            return []
        _, _, options, turn_detection = item.pushes[0]
        engine = self.engines[item.engine]
        try:
            item.stream = engine.open(options)
        except (StreamingEngineError, ValueError) as error:
            lane.popleft()
            return [Delivery(item.key, None, str(error)), *self._start_head(connection)]
        item.rate = options.sample_rate or engine.front.settings.sample_rate
        item.itemsize = SampleFormat.parse(options.sample_format).itemsize
        self._item_of[_stream_key(item)] = item
        if turn_detection:
            self._segmenting.add(_stream_key(item))
        self.metrics.open_streams.set(len(self._item_of))
        out = []
        for pcm, received, _, _ in item.pushes:
            out += self._push(item, pcm, received)
        item.pushes.clear()
        if item.finish_received is not None and item.stream is not None:
            engine.finish(item.stream)
        return out

    def _push(self, item: _Item, pcm: bytes, received: float) -> list[Delivery]:
        error = self._push_now(item, pcm, received)
        if error is None:
            return []
        # the checks before the engine rule this out; never take others down
        self._remove(item)
        self._abort_stream(item)
        return [Delivery(item.key, None, str(error)), *self._start_head(item.key[0])]

    def _push_now(self, item: _Item, pcm: bytes, received: float) -> StreamingEngineError | None:
        """Push to the item's open stream; the engine's refusal (nothing changed then), or ``None``."""
        try:
            self.engines[item.engine].push(item.stream, pcm)
        except StreamingEngineError as error:
            return error
        _note_pushed(item, len(pcm), received)
        return None

    def _cycle(self, index: int = 0) -> list[Delivery]:
        """One cycle of the ``index``-th engine: its events as deliveries."""
        engine = self.engines[index]
        start = time.perf_counter()
        events = engine.poll(while_stepping=self._push_while_stepping)
        if self.endpointer is not None and self._segmenting:
            for stream in self.endpointer(events):
                item = self._item_of.get((index, stream))
                if (index, stream) in self._segmenting and item is not None and item.finish_received is None:
                    events.append(engine.end_segment(stream))
        now = time.perf_counter()
        self.metrics.cycle_seconds.observe(now - start)
        self.cycles += 1
        clock = time.monotonic()
        out = []
        for speech in engine.speech_events:  # before the finals they lead to
            item = self._item_of.get((index, speech.stream_id))
            if item is not None:
                out.append(Delivery(item.key, None, speech=speech))
        for event in events:
            stream = (index, event.stream_id)
            item = self._item_of.get(stream)
            if item is None:
                continue
            key = item.key
            if event.is_final and not event.is_last:
                self._segments[stream] = self._segments.get(stream, 0) + 1
            if event.is_last and item.turn_detection:  # the client's commit: the last segment
                out.append(Delivery(key, None, committed=event.segment))
            if event.is_last:
                if item.finish_received is not None:
                    self.metrics.final_latency_seconds.observe(clock - item.finish_received)
                self._remove(item)
                self._forget(stream)
            elif not event.is_final:
                self._observe_chunk_latency(item, event, clock)
            out.append(Delivery(key, event))
            if event.is_last:
                out += self._start_head(key[0])
        return out

    def _push_while_stepping(self) -> None:
        """While the GPU steps the cycle: the queued pushes of connections whose first item has a stream (to it, or
        kept for the item behind it). A push that needs more (it would open a stream, or the engine refuses it) waits
        for the cycle's end, and so does every later command of its connection; so does any other command (a finish,
        an abort, a drop) and its connection's later commands, while the other connections' pushes still go in. Each
        connection's commands thus still apply in the order they came. A dropped range of connections (a network
        worker died, rare) holds everything after it."""
        if self._held:
            return
        commands = batched(self._take(block=False))
        waiting: set[int] = set()  # connections with a command held back
        held: list[Command | PushBatch | None] = []
        for index, command in enumerate(commands):
            if isinstance(command, Push | PushBatch):
                rest = self._push_to_open_streams(command, waiting)
                held += rest
                waiting.update(push.key[0] for push in rest)
            elif isinstance(command, Finish | Abort | Drop):
                held.append(command)
                waiting.add(command.connection if isinstance(command, Drop) else command.key[0])
            else:  # a range drop or the stop: it and everything after it wait
                self._held = held + commands[index:]
                return
        self._held = held

    def _push_to_open_streams(self, command: Push | PushBatch, waiting: set[int] | None = None) -> list[Push]:
        """Apply the command's pushes that can be without opening a stream and that the engine takes, the pushes to
        open streams together (:meth:`~StreamingEngine.push_many`); returns the others, in order, as :class:`Push`
        commands: a push that would open a stream or that the engine refused, and every later push of its connection
        (and of the connections in ``waiting``, which have an earlier push held back)."""
        batch = command if isinstance(command, PushBatch) else PushBatch.of([command])
        keys = batch.keys.tolist()
        blocked = set() if waiting is None else set(waiting)
        fed: list[int] = []  # pushes to their connection's open item
        heads: list[_Item] = []
        kept: list[int] = []  # pushes of an item behind its connection's open item: kept for it
        for i, (connection, index) in enumerate(keys):
            if connection in blocked:
                continue
            lane = self._lanes.get(connection)
            if not lane or lane[0].stream is None:  # this push would open a stream
                blocked.add(connection)
                continue
            head = lane[0]  # the lane's only item with a stream
            if head.key == (connection, index):
                fed.append(i)
                heads.append(head)
            else:
                kept.append(i)
        received, turns = batch.received.tolist(), batch.turn_detection.tolist()
        done: set[int] = set()
        for index, engine in enumerate(self.engines):  # one push_many per engine with pushes
            on = [k for k, head in enumerate(heads) if head.engine == index]
            if not on:
                continue
            fed_on = [fed[k] for k in on]
            order = np.asarray(fed_on, dtype=np.int64)
            starts, stops = batch.offsets[order], batch.offsets[order + 1]
            applied = engine.push_many([heads[k].stream for k in on], batch.audio, starts, stops)
            sizes = (stops[:applied] - starts[:applied]).tolist()
            for i, k, size in zip(fed_on[:applied], on, sizes, strict=False):
                heads[k].turn_detection = heads[k].turn_detection or turns[i]
                _note_pushed(heads[k], size, received[i])
            done.update(fed_on[:applied])
            if applied < len(fed_on):  # the engine refused one: it and its connection's later pushes go the general way
                blocked.update(keys[i][0] for i in fed_on[applied:])
        units = None
        for i in kept:
            if keys[i][0] not in blocked:
                units = units or _push_units(batch)
                self._apply_push(*units[i])
                done.add(i)
        if len(done) == len(batch):
            return []
        units = units or _push_units(batch)
        return [Push(*units[i]) for i in range(len(batch)) if i not in done]

    def _observe_chunk_latency(self, item: _Item, event: StreamEvent, clock: float) -> None:
        """Received -> built, for the audio whose arrival completed the chunk the partial ends with."""
        end = round(event.end * item.rate)
        while item.arrivals and item.arrivals[0][0] < end:
            item.arrivals.popleft()
        if item.arrivals:
            self.metrics.chunk_latency_seconds.observe(clock - item.arrivals[0][1])

    def _remove(self, item: _Item) -> None:
        lane = self._lanes.get(item.key[0])
        if lane is not None and item in lane:
            lane.remove(item)
            if not lane:
                del self._lanes[item.key[0]]

    def _abort_stream(self, item: _Item) -> None:
        self.engines[item.engine].abort(item.stream)
        self._forget(_stream_key(item))

    def _forget(self, stream: _StreamKey) -> None:
        self._item_of.pop(stream, None)
        self._segmenting.discard(stream)
        self._segments.pop(stream, None)
        self.metrics.open_streams.set(len(self._item_of))


def _stream_key(item: _Item) -> _StreamKey:
    """An open item's ``(engine, stream id)``."""
    return item.engine, item.stream


def _note_pushed(item: _Item, nbytes: int, received: float) -> None:
    """An item's stream took ``nbytes`` of audio that arrived at ``received``: its samples, and the arrival the chunk
    latency is measured from."""
    item.samples += nbytes // item.itemsize
    item.arrivals.append((item.samples, received))


def _push_units(
    command: Command | PushBatch | None,
) -> list[tuple[ItemKey, bytes, float, StreamOptions, bool, int]] | None:
    """A :class:`Push`'s or a :class:`PushBatch`'s pushes, in order, as ``(key, pcm, received, options,
    turn_detection, engine)``; ``None`` for any other command."""
    if isinstance(command, Push):
        c = command
        return [(c.key, c.pcm, c.received, c.options, c.turn_detection, c.engine)]
    if not isinstance(command, PushBatch):
        return None
    keys, offsets, received = command.keys.tolist(), command.offsets.tolist(), command.received.tolist()
    options, turns, engines = command.options, command.turn_detection.tolist(), command.engines.tolist()
    return [
        (tuple(key), command.audio[offsets[i] : offsets[i + 1]], received[i], options[j], turns[i], engines[i])
        for i, (key, j) in enumerate(zip(keys, command.option_of.tolist(), strict=True))
    ]
