"""One client's WebSocket: the transcription session, its audio buffer and items, bounded queues both ways.

A :class:`Connection` runs three tasks on the server's event loop:

* the reader validates every message (:mod:`~nemo_fastdecode.serve.protocol`), applies it (session settings, audio to
  the engine loop, commits, clears) and paces the client to the audio rate limit (it stops reading, so TCP holds the
  client back: nothing is dropped). It also stops reading while the outgoing queue is half full, so that the replies
  to the client's own messages (``cleared``, ``session.updated``, errors) wait for the writer instead of overflowing
  the queue: a burst of messages is answered in full, however many come at once;
* the writer sends the events queued for the client. The queue is bounded: engine events (which never wait) that
  find it full mean a client that does not read; it is told (``slow_reader``) and closed with 1008, so a stalled
  client never holds unbounded memory;
* a watchdog pings the client every ``limits.slow_reader_seconds / 2``: a pong comes back only once the client has
  read everything sent before the ping, so a pong overdue by ``limits.slow_reader_seconds`` is a client that does not
  read (however much the socket buffers still take): ``slow_reader`` and 1008 too. Time the server itself holds the
  client back (the audio rate limit) does not count: the pong waits behind the client's audio then.

Engine events come in through :meth:`Connection.deliver` (called on the event loop, never waiting). An item is the
audio between two commits: one engine stream, whose partials become ``delta`` events and whose final becomes the
``completed`` event. Word timestamps count from the item's start.

With an engine per look-ahead (:mod:`~nemo_fastdecode.serve.look_aheads`) the session's ``delay`` picks the engine of
its next items: an item streams on the engine of the session as it was when its first audio came, so a
``session.update`` changing the delay leaves the buffer's audio (and the committed items still decoding) on their
engine and applies from the next item; nothing is lost or moved. The connection holds an admission slot of each engine
it needs (its session's, and its items' until their finals): an update to a delay whose engine is full is refused
(``server_at_capacity``, naming the engine) and changes nothing.

Idle timeout and graceful shutdown end a connection the same way: the buffer's audio is committed, its final is
waited for (bounded), then the close frame (1000 idle, 1001 shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import Collection
from typing import TYPE_CHECKING

from pydantic import BaseModel
from websockets.exceptions import ConnectionClosed

from nemo_fastdecode.serve.admission import Admission
from nemo_fastdecode.serve.config import LimitsConfig
from nemo_fastdecode.serve.engine_loop import Abort, Delivery, Drop, EnginePort, Finish, Push
from nemo_fastdecode.serve.look_aheads import LookAheads
from nemo_fastdecode.serve.metrics import ServerMetrics
from nemo_fastdecode.serve.protocol import (
    BETA_FORMAT_NAMES,
    DEFAULT_PCM_RATE,
    DELAYS,
    G711_RATE,
    LOGPROBS_INCLUDE,
    PCM,
    SAMPLE_FORMATS,
    AudioAppend,
    AudioClear,
    AudioCommit,
    BetaSession,
    BetaTranscription,
    Boosting,
    Cleared,
    CloseCode,
    Committed,
    ErrorCode,
    ErrorDetail,
    ErrorEvent,
    G711Format,
    LogProb,
    PcmFormat,
    ProtocolError,
    Session,
    SessionAudio,
    SessionAudioInput,
    SessionConfig,
    SessionEvent,
    SessionTranscription,
    SessionUpdate,
    SpeechStarted,
    SpeechStopped,
    Transcription,
    TranscriptionCompleted,
    TranscriptionDelta,
    TranscriptionFailed,
    TurnDetection,
    Usage,
    Word,
    decode_audio,
    format_named,
    oversized,
    parse_client_event,
)
from nemo_fastdecode.streaming import BoostingOptions, EndpointingOptions, SpeechEvent, StreamEvent, StreamOptions
from nemo_fastdecode.streaming.boosting import NEMO_UNSUPPORTED_OPTIONS, TREE_OPTIONS

if TYPE_CHECKING:
    from websockets.asyncio.server import ServerConnection

__all__ = ["Connection", "SessionState"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class SessionState:
    """A connection's effective session settings."""

    model: str
    format: str = PCM  # audio/pcm, audio/pcmu or audio/pcma
    rate: int = DEFAULT_PCM_RATE  # of the audio the client sends
    turn_detection: TurnDetection | None = None
    language: str | None = None
    languages: list[str] | None = None
    prompt: str | None = None
    delay: str | None = None
    include: tuple[str, ...] = ()
    requested_model: str | None = None  # the transcription model the client named
    endpointing: EndpointingOptions | None = None  # the VAD settings ``turn_detection`` asks for (engine VAD only)
    boosting: BoostingOptions | None = None  # the phrases to boost in the next items (keywords or boosting)
    att_context_size: list[int] | None = None  # the look-ahead its next items stream at (the engine of its delay)

    @property
    def itemsize(self) -> int:
        """Bytes per sample of the session's format."""
        return 2 if self.format == PCM else 1

    def describe(self, session_id: str, beta: bool) -> Session | BetaSession:
        """The session as ``session.created`` / ``.updated`` report it: the GA shape, or the beta one."""
        keywords = list(self.boosting.phrases) if self.boosting is not None else None
        if beta:
            return BetaSession(
                id=session_id,
                input_audio_format=BETA_FORMAT_NAMES[self.format],
                input_audio_sample_rate=self.rate,
                input_audio_transcription=BetaTranscription(
                    model=self.requested_model,
                    language=self.language,
                    prompt=self.prompt,
                    served_model=self.model,
                    att_context_size=self.att_context_size,
                ),
                turn_detection=self.turn_detection,
                include=list(self.include),
            )
        audio_format = PcmFormat(rate=self.rate) if self.format == PCM else G711Format(type=self.format)
        return Session(
            id=session_id,
            audio=SessionAudio(
                input=SessionAudioInput(
                    format=audio_format,
                    transcription=SessionTranscription(
                        model=self.model,
                        language=self.language,
                        languages=self.languages,
                        prompt=self.prompt,
                        keywords=keywords,
                        delay=self.delay,
                        boosting=_reported(self.boosting),
                        att_context_size=self.att_context_size,
                    ),
                    turn_detection=self.turn_detection,
                )
            ),
            include=list(self.include),
        )


def _speaks_beta(ws: ServerConnection) -> bool:
    """Whether the client speaks the beta protocol: its handshake sends ``OpenAI-Beta: realtime=v1`` (as the SDKs'
    ``beta.realtime.connect`` do)."""
    request = getattr(ws, "request", None)
    header = request.headers.get("OpenAI-Beta", "") if request is not None else ""
    return "realtime=v1" in header.replace(" ", "").split(",")


def _logprobs(pairs: list[tuple[str, float]] | None) -> list[LogProb] | None:
    """A final's ``logprobs``: each token's text, log-probability and UTF-8 bytes."""
    if pairs is None:
        return None
    return [LogProb(token=token, logprob=value, bytes=list(token.encode("utf-8"))) for token, value in pairs]


def _reported(options: BoostingOptions | None) -> Boosting | None:
    """The session's boosting as ``session.updated`` reports it: every option, NeMo's defaults filled in."""
    if options is None:
        return None
    return Boosting(**{f.name: getattr(options, f.name) for f in dataclasses.fields(options)})


@dataclasses.dataclass
class _Item:
    """An item of this connection: its id, where its audio starts, and the text its deltas have sent."""

    index: int
    item_id: str
    start_seconds: float  # where its audio starts in the connection's audio
    rate: int  # of its audio (a session's format changes only between items)
    engine: int = 0  # the engine (look-ahead) it streams on
    samples: int = 0
    sent: str = ""

    def segment_id(self, segment: int) -> str:
        """The item id of a segment: the item's own for the first, ``<item>.<n>`` for the ones after it."""
        return self.item_id if segment == 0 else f"{self.item_id}.{segment}"


@dataclasses.dataclass(frozen=True)
class _Close:
    code: CloseCode
    reason: str


class _Overflow(Exception):
    """The client's outgoing queue is full."""


class Connection:
    """A client's transcription session over one WebSocket.

    Args:
        ws: the accepted WebSocket.
        connection_id: unique within the server (engine-loop lane and item ids).
        engine_loop: where audio goes: the engine loop, or a network worker's proxy of it.
        metrics: the server's metrics.
        limits: per-connection limits.
        rate: the model's sample rate (a client may send PCM at it, or at any rate the engine resamples from).
        model_name: reported in the session.
        idle_timeout: seconds without a message before the connection is ended; ``None``: never.
        segmenting: whether the engine loop has an endpointer (``server_vad`` is accepted with it).
        vad: the engine's VAD settings when it runs Silero VAD (``server_vad`` is accepted, its ``threshold`` and
            ``silence_duration_ms`` override them per session); ``None``: no VAD.
        pcm_rates: ``audio/pcm`` rates taken besides 24 kHz (OpenAI's) and the model's (the engine resamples them).
        boosting: whether the model can boost phrases (it has a tokenizer); ``False``: keywords are refused.
        keywords_weight: the boosting weight of a session's ``keywords``.
        logprobs: whether the engine decodes greedily (token log-probabilities can be included).
        look_aheads: the engines' look-aheads (a session's ``delay`` picks one); ``None``: one engine.
        admission: the slots per engine, with ``look_aheads``: the connection holds one of its default engine when it
            starts (the listener took it) and gives back what it holds when it ends (:meth:`release`).
    """

    def __init__(
        self,
        ws: ServerConnection,
        connection_id: int,
        engine_loop: EnginePort,
        metrics: ServerMetrics,
        limits: LimitsConfig,
        *,
        rate: int,
        model_name: str,
        idle_timeout: float | None,
        segmenting: bool = False,
        vad: EndpointingOptions | None = None,
        pcm_rates: Collection[int] = (),
        boosting: bool = True,
        keywords_weight: float = 1.0,
        logprobs: bool = True,
        look_aheads: LookAheads | None = None,
        admission: Admission | None = None,
    ):
        self.ws, self.id, self.engine_loop, self.metrics, self.limits = ws, connection_id, engine_loop, metrics, limits
        self.look_aheads, self.admission = look_aheads, admission
        self.engine = look_aheads.default if look_aheads is not None else 0  # the session's engine
        self.held = {self.engine}  # engines whose admission slot this connection holds
        self.session = SessionState(model=model_name, att_context_size=self._look_ahead(self.engine))
        self.session_id = f"sess_{connection_id}"
        self.model_rate, self.boosting_available, self.keywords_weight = rate, boosting, keywords_weight
        self.logprobs_available = logprobs
        self.pcm_rates = tuple(sorted({DEFAULT_PCM_RATE, rate, *pcm_rates}))  # audio/pcm rates taken
        self.beta = _speaks_beta(ws)  # the beta flavour: transcription_session.* events, the beta session shape
        self.idle_timeout, self.vad = idle_timeout, vad
        self.segmenting = segmenting or vad is not None
        self._out: asyncio.Queue[BaseModel | _Close] = asyncio.Queue(maxsize=limits.max_outgoing_events)
        # the reader reads on while fewer events than this wait (the rest of the queue is the engine events' room)
        self._read_bound = max(1, limits.max_outgoing_events // 2)
        self._room = asyncio.Event()  # set while fewer than ``_read_bound`` events wait
        self._room.set()
        self._paced = 0.0  # seconds the reader has been held back by the audio rate limit, in all
        self._watchdog: asyncio.Task | None = None
        self._event_ids = itertools.count()
        self._item_index = itertools.count()
        self._current: _Item | None = None  # the buffer: audio appended since the last commit
        self._pending: dict[int, _Item] = {}  # committed items whose final is to come
        self._finals_done = asyncio.Event()
        self._finals_done.set()
        self._last_item_id: str | None = None
        self._seconds = 0.0  # the connection's audio so far
        self._tokens = limits.max_audio_burst_seconds  # audio seconds the client may send now (rate limit)
        self._refilled = time.monotonic()
        self._reader: asyncio.Task | None = None
        self._waiting = False  # the reader waits for a message
        self._waiting_since = time.monotonic()  # when the reader's current wait for a message began
        self._idle_expired = False  # the idle watchdog cancelled the reader
        self._options: tuple[tuple, StreamOptions] | None = None  # (session facts, the stream options built of them)
        self._writer: asyncio.Task | None = None
        self._closing = False
        self._ending: tuple[CloseCode, str] | None = None  # shutdown asked for

    # ---- lifetime ------------------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Serve the client until it leaves, idles out, reads too slowly, or the server shuts down."""
        self._writer = asyncio.create_task(self._write(), name=f"writer-{self.id}")
        created = "transcription_session.created" if self.beta else "session.created"
        self._send(SessionEvent(event_id=self._event_id(), type=created, session=self._describe(self.beta)))
        self._reader = asyncio.create_task(self._read(), name=f"reader-{self.id}")
        self._watchdog = asyncio.create_task(self._watch_reads(), name=f"watchdog-{self.id}")
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            if self._ending is not None and not self._closing:
                await self._finish_and_close(*self._ending, error=ErrorCode.SHUTTING_DOWN)
            if not self._closing:  # the client went away: nothing more to send
                self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await self._writer
        finally:
            # whatever is left (a client that went away mid-chunk): dropped now, its slot free for the next cycle
            self.engine_loop.submit(Drop(self.id))
            for task in (self._reader, self._writer, self._watchdog):
                if task is not None and not task.done():
                    task.cancel()

    def shut_down(self, code: CloseCode = CloseCode.GOING_AWAY, reason: str = "server shutting down") -> None:
        """Stop reading; the buffer's audio is committed, its final sent, then the connection closed."""
        self._ending = (code, reason)
        if self._reader is not None:
            self._reader.cancel()

    async def _read(self) -> None:
        watchdog = None if self.idle_timeout is None else asyncio.create_task(self._idle_watchdog())
        try:
            while True:
                try:
                    self._waiting, self._waiting_since = True, time.monotonic()
                    message = await self.ws.recv()
                except asyncio.CancelledError:
                    if not self._idle_expired:
                        raise
                    task = asyncio.current_task()
                    if hasattr(task, "uncancel"):  # Python 3.11+: the watchdog's cancel is handled here
                        task.uncancel()
                    self.metrics.refused(ErrorCode.IDLE_TIMEOUT.value)
                    await self._finish_and_close(CloseCode.NORMAL, "idle timeout", error=ErrorCode.IDLE_TIMEOUT)
                    return
                except ConnectionClosed:
                    return
                finally:
                    self._waiting = False
                if not self._handle_message(message):
                    return
                await self._pace()
                if self._out.qsize() >= self._read_bound:
                    await self._wait_for_room()
        finally:
            if watchdog is not None:
                watchdog.cancel()

    async def _idle_watchdog(self) -> None:
        """End the connection once the reader has waited ``idle_timeout`` for a message: one sleeping task per
        connection that checks when the current wait began, rather than a timer per message (tens of thousands a
        second under load). It cancels the reader only while the reader waits (never while the server paces it)."""
        while True:
            remaining = self._waiting_since + self.idle_timeout - time.monotonic()
            if remaining <= 0 and self._waiting:
                self._idle_expired = True
                self._reader.cancel()
                return
            await asyncio.sleep(max(remaining, self.idle_timeout / 8))

    def _handle_message(self, message: str | bytes) -> bool:
        """Handle one client message; whether the reader goes on."""
        try:
            self._handle(message)
        except ProtocolError as error:
            self._refuse(error)
        except _Overflow:
            return False
        return not self._closing

    async def _wait_for_room(self) -> None:
        """Hold the reader (TCP then holds the client) until the writer has sent the queue down below half."""
        while self._out.qsize() >= self._read_bound:
            self._room.clear()
            await self._room.wait()

    async def _watch_reads(self) -> None:
        """Ping the client every ``slow_reader_seconds / 2``; a pong overdue by ``slow_reader_seconds`` (not counting
        time the reader was paced) is a client that does not read what is sent: close it as a slow reader. Ends with
        the reader (idle timeout and shutdown bound the rest of a connection's life)."""
        limit = self.limits.slow_reader_seconds
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ConnectionClosed):
            while True:
                await asyncio.sleep(limit / 2)
                if self._closing or self._reader is None or self._reader.done():
                    return
                sent, paced = loop.time(), self._paced
                ping = asyncio.ensure_future(self.ws.ping())  # its drain waits while the client does not read
                pong: asyncio.Future | None = None
                try:
                    while True:
                        deadline = sent + limit + (self._paced - paced)
                        remaining = deadline - loop.time()
                        if remaining <= 0:
                            break
                        if pong is None:
                            done, _ = await asyncio.wait([ping], timeout=remaining)
                            if done:
                                pong = ping.result()
                            continue
                        done, _ = await asyncio.wait([pong], timeout=remaining)
                        if done:
                            break
                finally:
                    if not ping.done():
                        ping.cancel()
                if self._closing or self._reader.done():
                    return
                if pong is None or not pong.done():
                    overdue = loop.time() - sent
                    log.warning(
                        "connection %d: slow reader: no pong %.1f s after a ping (it does not read what is sent); "
                        "closing with 1008",
                        self.id,
                        overdue,
                    )
                    self._slow_reader(
                        f"the client has not read the events sent {overdue:.0f} s ago (no pong to a ping within "
                        f"{limit:g} s); closing"
                    )
                    return
                pong.result()  # a ConnectionClosed ends the watch

    async def _write(self) -> None:
        while True:
            event = await self._out.get()
            if not self._room.is_set() and self._out.qsize() < self._read_bound:
                self._room.set()
            if isinstance(event, _Close):
                await self.ws.close(event.code, event.reason)
                return
            self.metrics.events.labels(event.type).inc()
            await self.ws.send(event.model_dump_json())

    async def _finish_and_close(self, code: CloseCode, reason: str, error: ErrorCode | None = None) -> None:
        """Commit the buffer, wait for the finals (bounded by the idle timeout or 30 s), say why, close."""
        if self._current is not None:
            self._commit(None)
        try:
            await asyncio.wait_for(self._finals_done.wait(), timeout=self.idle_timeout or 30.0)
        except asyncio.TimeoutError:
            log.warning("connection %d: closing with %d final(s) still to come", self.id, len(self._pending))
        if error is not None:
            self._send_error(error, f"{reason}: the connection is closed; every committed item's final was sent")
        self._close(code, reason)

    def _close(self, code: CloseCode, reason: str) -> None:
        self._closing = True
        try:
            self._out.put_nowait(_Close(code, reason))
        except asyncio.QueueFull:
            limit = self.limits.max_outgoing_events
            self._slow_reader(f"{limit} events wait unread: the client reads too slowly; closing")

    # ---- client messages -----------------------------------------------------------------------------------------
    def _handle(self, message: str | bytes) -> None:
        size = oversized(message, self.limits.max_message_bytes)
        if size is not None:
            raise ProtocolError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"a message of {size} bytes is over the limit of {self.limits.max_message_bytes}; it was "
                "dropped: send audio in smaller pieces",
            )
        if isinstance(message, bytes):  # a binary frame: raw PCM16
            self._append(message)
            return
        event = parse_client_event(message)
        if isinstance(event, AudioAppend):
            self._append(decode_audio(event), event.event_id)
        elif isinstance(event, AudioCommit):
            self._commit(event.event_id)
        elif isinstance(event, AudioClear):
            self._clear()
        else:
            self._update(event)

    def _append(self, pcm: bytes, event_id: str | None = None) -> None:
        if not pcm:
            return
        if self._current is None:
            index = next(self._item_index)
            self._current = _Item(index, f"item_{self.id}_{index}", self._seconds, self.session.rate, self.engine)
            self._finals_done.clear()
        item = self._current
        vad = self.session.turn_detection is not None
        options = self._stream_options()
        self.engine_loop.submit(Push((self.id, item.index), pcm, time.monotonic(), options, vad, item.engine))
        samples = len(pcm) // self.session.itemsize
        item.samples += samples
        seconds = samples / self.session.rate
        self._seconds += seconds
        self._tokens -= seconds
        self.metrics.audio_seconds.inc(seconds)

    def _stream_options(self) -> StreamOptions:
        """The engine stream's options for the session as it is now (built again only when the session changed)."""
        # with an engine VAD, a session without turn detection opens its stream with endpointing off
        endpointing = (self.session.endpointing or EndpointingOptions()) if self.vad is not None else None
        logprobs = LOGPROBS_INCLUDE in self.session.include
        key = (self.session.format, self.session.rate, endpointing, self.session.boosting, logprobs)
        if self._options is None or self._options[0] != key:
            options = StreamOptions(
                sample_rate=self.session.rate,
                sample_format=SAMPLE_FORMATS[self.session.format],
                token_logprobs=logprobs,
                endpointing=endpointing,
                boosting=self.session.boosting,
                partial_token_ids=False,  # deltas are text: partials cross processes without the segment's ids
            )
            self._options = (key, options)
        return self._options[1]

    def _commit(self, event_id: str | None) -> None:
        item = self._current
        if item is None:
            raise ProtocolError(
                ErrorCode.COMMIT_EMPTY,
                "the audio buffer is empty: append audio before committing",
                event_id=event_id,
            )
        self._current = None
        self._pending[item.index] = item  # `committed` follows once the engine loop has it (the segment it ends)
        self.engine_loop.submit(Finish((self.id, item.index), time.monotonic()))

    def _clear(self) -> None:
        item, self._current = self._current, None
        if item is not None:
            self.engine_loop.submit(Abort((self.id, item.index)))
            self._seconds -= item.samples / item.rate  # the cleared audio is not part of the stream
        if not self._pending:
            self._finals_done.set()
        self._release_unused()
        self._send(Cleared(event_id=self._event_id()))

    def _update(self, event: SessionUpdate) -> None:
        """Apply the fields present, all or nothing; reply with the effective session (in the beta shape to a
        ``transcription_session.update`` or on a beta connection)."""
        new = dataclasses.replace(self.session)
        self._apply_session(event.session, new, event.event_id)
        if self._current is not None and (new.format, new.rate) != (self.session.format, self.session.rate):
            raise ProtocolError(
                ErrorCode.INVALID_VALUE,
                "the audio format cannot change while the buffer holds audio: commit or clear it first",
                param="session.audio.input.format",
                event_id=event.event_id,
            )
        self._choose_engine(event, new)
        self.session = new
        self._release_unused()
        beta_event = event.type.startswith("transcription_session")
        kind = "transcription_session.updated" if beta_event else "session.updated"
        self._send(SessionEvent(event_id=self._event_id(), type=kind, session=self._describe(self.beta or beta_event)))

    def _choose_engine(self, event: SessionUpdate, new: SessionState) -> None:
        """The engine of ``new``'s delay for the next items: its admission slot taken (a refusal, naming the engine,
        when it is full: then nothing changes)."""
        if self.look_aheads is None or self.admission is None:
            return
        engine = self.look_aheads.engine_of(new.delay)
        if engine not in self.held:
            refusal = self.admission.admit(engine)
            if refusal is not None:
                beta = event.session.input_audio_transcription is not None
                where = "session.input_audio_transcription" if beta else "session.audio.input.transcription"
                raise ProtocolError(refusal.code, refusal.message, param=f"{where}.delay", event_id=event.event_id)
            self.held.add(engine)
        self.engine, new.att_context_size = engine, self._look_ahead(engine)

    def _look_ahead(self, engine: int) -> list[int] | None:
        """The ``att_context_size`` of an engine, as sessions report it (``None`` without look-aheads)."""
        return list(self.look_aheads.sizes[engine]) if self.look_aheads is not None else None

    def _release_unused(self) -> None:
        """Give back the admission slots of the engines that neither the session nor an item still needs."""
        if self.admission is None:
            return
        needed = {self.engine, *(item.engine for item in self._pending.values())}
        if self._current is not None:
            needed.add(self._current.engine)
        for engine in self.held - needed:
            self.held.discard(engine)
            self.admission.release(engine)

    def release(self) -> None:
        """Give back every admission slot the connection holds (it ended)."""
        if self.admission is not None:
            for engine in self.held:
                self.admission.release(engine)
        self.held.clear()

    def _apply_session(self, update: SessionConfig, new: SessionState, event_id: str | None) -> None:
        audio_input = update.audio.input if update.audio is not None else None
        fields = set(audio_input.model_fields_set) if audio_input is not None else set()
        if audio_input is not None and audio_input.format is not None:
            fmt = audio_input.format
            new.format, new.rate = self._check_format(fmt.type, fmt.rate, "session.audio.input.format", event_id)
        if update.input_audio_format is not None:
            new.format, new.rate = self._check_format(
                update.input_audio_format, None, "session.input_audio_format", event_id
            )
        transcription, param = update.input_audio_transcription, "session.input_audio_transcription"
        if transcription is None and audio_input is not None and audio_input.transcription is not None:
            transcription, param = audio_input.transcription, "session.audio.input.transcription"
        if transcription is not None:
            self._apply_transcription(transcription, new, param, event_id)
        for present, value, param in (
            ("turn_detection" in fields, audio_input.turn_detection if audio_input else None, "audio.input"),
            ("turn_detection" in update.model_fields_set, update.turn_detection, "session"),
        ):
            if present:
                new.turn_detection = self._check_turn_detection(value, f"{param}.turn_detection", event_id)
                new.endpointing = self._vad_options(new.turn_detection, f"{param}.turn_detection", event_id)
        noise = (audio_input.noise_reduction if audio_input else None) or update.input_audio_noise_reduction
        if noise is not None:
            raise ProtocolError(
                ErrorCode.INVALID_VALUE,
                "noise reduction is not available (the model hears the audio as sent): send null",
                param="session.audio.input.noise_reduction",
                event_id=event_id,
            )
        if update.include is not None:
            new.include = self._check_include(update.include, event_id)

    def _check_include(self, include: list[str], event_id: str | None) -> tuple[str, ...]:
        """The session's ``include``: ``[]``, or the token log-probabilities (greedy decoding only)."""
        for i, name in enumerate(include):
            if name != LOGPROBS_INCLUDE:
                raise ProtocolError(
                    ErrorCode.INVALID_VALUE,
                    f"include[{i}]={name!r} is not available; valid: {LOGPROBS_INCLUDE!r}",
                    param=f"session.include.{i}",
                    event_id=event_id,
                )
        if include and not self.logprobs_available:
            raise ProtocolError(
                ErrorCode.INVALID_VALUE,
                "token log-probabilities need greedy decoding; this server runs beam search: send []",
                param="session.include",
                event_id=event_id,
            )
        return tuple(dict.fromkeys(include))

    def _apply_transcription(
        self, transcription: Transcription, new: SessionState, param: str, event_id: str | None
    ) -> None:
        """The fields of ``transcription`` present in the update; ``keywords`` and ``boosting`` both set the phrases
        boosted (``keywords`` at the server's boosting settings)."""
        given = transcription.model_fields_set
        if "keywords" in given and "boosting" in given:
            raise ProtocolError(
                ErrorCode.INVALID_VALUE,
                "give the phrases to boost as keywords or as boosting (the extension with every option), not both",
                param=f"{param}.keywords",
                event_id=event_id,
            )
        if transcription.delay is not None and transcription.delay not in DELAYS:
            raise ProtocolError(
                ErrorCode.INVALID_VALUE,
                f"delay {transcription.delay!r} is not valid; valid: {', '.join(DELAYS)}",
                param=f"{param}.delay",
                event_id=event_id,
            )
        for name in ("language", "languages", "prompt", "delay"):
            if name in given:
                setattr(new, name, getattr(transcription, name))
        if "model" in given:
            new.requested_model = transcription.model
        if "keywords" in given:  # null or []: no boosting
            keywords = transcription.keywords or None
            phrases = None if keywords is None else Boosting(phrases=keywords, weight=self.keywords_weight)
            new.boosting = self._boosting(phrases, f"{param}.keywords", event_id, prefix="keywords")
        if "boosting" in given:  # absent: unchanged; null: off
            new.boosting = self._boosting(transcription.boosting, f"{param}.boosting", event_id)

    def _check_format(self, name: str, rate: int | None, param: str, event_id: str | None) -> tuple[str, int]:
        """The (format, rate) a client names; ``audio/pcm`` is at 24 kHz unless ``rate`` names another rate taken."""
        audio_format = format_named(name)
        if audio_format is None:
            valid = ", ".join(repr(n) for n in (*SAMPLE_FORMATS, *BETA_FORMAT_NAMES.values()))
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
                f"audio format {name!r} is not taken; valid: {valid}",
                param=param if rate is None and param.endswith("input_audio_format") else param + ".type",
                event_id=event_id,
            )
        if audio_format != PCM:
            if rate not in (None, G711_RATE):
                raise ProtocolError(
                    ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
                    f"rate {rate} Hz is not taken for {audio_format}; G.711 audio is at {G711_RATE} Hz",
                    param=param + ".rate",
                    event_id=event_id,
                )
            return audio_format, G711_RATE
        rate = DEFAULT_PCM_RATE if rate is None else rate
        if rate not in self.pcm_rates:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
                f"rate {rate} Hz is not taken for audio/pcm; valid: {', '.join(map(str, self.pcm_rates))} "
                f"(the model's rate is {self.model_rate} Hz)",
                param=param + ".rate",
                event_id=event_id,
            )
        return audio_format, rate

    def _boosting(
        self, value: Boosting | None, param: str, event_id: str | None, prefix: str = "boosting.phrases"
    ) -> BoostingOptions | None:
        """The engine's boosting options of a session's ``transcription.boosting`` (or of its ``keywords``: the
        phrases, ``prefix`` naming them in messages), checked against the limits."""
        if value is None:
            return None

        def refuse(message: str, where: str = "") -> ProtocolError:
            return ProtocolError(ErrorCode.INVALID_VALUE, message, param=param + where, event_id=event_id)

        if not self.boosting_available:
            raise refuse("phrase boosting is not available: this server's model has no tokenizer; send null")

        for name in value.model_extra or {}:
            if name in NEMO_UNSUPPORTED_OPTIONS:
                why = NEMO_UNSUPPORTED_OPTIONS[name][1]
                raise refuse(f"boosting option {name!r} ({why}) is not supported; leave it out", f".{name}")
            valid = ", ".join(["phrases", "weight", *TREE_OPTIONS])
            raise refuse(f"unknown boosting option {name!r}; valid: {valid}", f".{name}")
        phrases, limit, longest = value.phrases, self.limits.max_boost_phrases, self.limits.max_boost_phrase_chars
        # keywords name the list itself (param ends in .keywords); boosting its .phrases field
        where = "" if prefix == "keywords" else ".phrases"
        if not 1 <= len(phrases) <= limit:
            valid = f"1 to {limit} phrases" if limit else "none: this server does not boost phrases"
            raise refuse(f"{prefix} has {len(phrases)} phrases; valid: {valid}", where)
        for i, phrase in enumerate(phrases):
            shown = repr(phrase if len(phrase) <= 40 else phrase[:40] + "...")
            if not phrase.strip():
                raise refuse(f"{prefix}[{i}]={shown} is empty; valid: a non-empty phrase", f"{where}.{i}")
            if len(phrase) > longest:
                raise refuse(
                    f"{prefix}[{i}]={shown} has {len(phrase)} characters; valid: at most {longest}", f"{where}.{i}"
                )
        given = {name: v for name, v in value.model_dump(exclude={"phrases"}).items() if v is not None}
        try:
            return BoostingOptions(phrases=tuple(phrases), **given)
        except (TypeError, ValueError) as error:
            raise refuse(str(error)) from None

    def _check_turn_detection(
        self, value: TurnDetection | None, param: str, event_id: str | None
    ) -> TurnDetection | None:
        if value is None:
            return None
        if value.type != "server_vad":
            raise ProtocolError(
                ErrorCode.INVALID_VALUE,
                f"turn_detection type {value.type!r} is not available; valid: null, 'server_vad'",
                param=param + ".type",
                event_id=event_id,
            )
        if not self.segmenting:
            raise ProtocolError(
                ErrorCode.INVALID_VALUE,
                "server_vad needs voice activity detection or an endpointer, which this server does not have (start "
                "it with vad=true): send turn_detection null and input_audio_buffer.commit at the end of each "
                "utterance",
                param=param,
                event_id=event_id,
            )
        return value

    def _vad_options(self, value: TurnDetection | None, param: str, event_id: str | None) -> EndpointingOptions | None:
        """The engine's VAD settings with the session's ``threshold`` / ``silence_duration_ms`` where given."""
        if value is None or self.vad is None:
            return None
        threshold, silence = value.threshold, value.silence_duration_ms
        for name, given, ok, valid in (
            ("threshold", threshold, threshold is None or 0.0 <= threshold <= 1.0, "a speech probability, 0 to 1"),
            ("silence_duration_ms", silence, silence is None or silence >= 0, "milliseconds >= 0"),
        ):
            if not ok:
                raise ProtocolError(
                    ErrorCode.INVALID_VALUE,
                    f"turn_detection.{name}={given!r} is not valid; valid: {valid}, or leave it out (the server's "
                    "setting)",
                    param=f"{param}.{name}",
                    event_id=event_id,
                )
        changes = {"vad_threshold": threshold, "min_silence_ms": silence}
        return dataclasses.replace(self.vad, **{name: v for name, v in changes.items() if v is not None})

    async def _pace(self) -> None:
        """Hold the reader while the client is over its audio rate (the token bucket refills in real time)."""
        now = time.monotonic()
        rate, burst = self.limits.max_audio_rate, self.limits.max_audio_burst_seconds
        self._tokens = min(burst, self._tokens + (now - self._refilled) * rate)
        self._refilled = now
        if self._tokens < 0:
            self._paced += -self._tokens / rate
            await asyncio.sleep(-self._tokens / rate)

    # ---- engine events -------------------------------------------------------------------------------------------
    def deliver(self, delivery: Delivery) -> None:
        """An engine event of one of this connection's items (on the event loop)."""
        index = delivery.key[1]
        item = self._pending.get(index)
        if item is None and self._current is not None and self._current.index == index:
            item = self._current
        if item is None:  # a cleared item's last partials
            return
        try:
            if delivery.speech is not None:
                self._speech(item, delivery.speech)
            elif delivery.committed is not None:
                self._committed(item.segment_id(delivery.committed))
            elif delivery.event is None:
                self._failed(item, delivery.error or "unknown error")
            else:
                self._transcript(item, delivery.event)
        except _Overflow:
            pass

    def _transcript(self, item: _Item, event: StreamEvent) -> None:
        item_id = item.segment_id(event.segment)
        if not event.is_final:
            text = event.text
            common = len(item.sent) if text.startswith(item.sent) else 0
            item.sent = text
            self._send_delta(item_id, text[common:], event)
            return
        # what the final adds to the deltas sent (the stream's last chunk): one more delta, so that they add up to it
        remainder = event.text[len(item.sent) :] if event.text.startswith(item.sent) else ""
        if not event.is_last:  # a segment the endpointer ended: the server's commit
            self._committed(item_id)
            item.sent = ""
        self._send_delta(item_id, remainder, event)
        start_ms = round((item.start_seconds + event.start) * 1000)
        self._send(
            TranscriptionCompleted(
                event_id=self._event_id(),
                item_id=item_id,
                transcript=event.text,
                usage=Usage(seconds=event.end - event.start),
                logprobs=_logprobs(event.logprobs),
                words=[Word(**word) for word in event.words or []],
                audio_start_ms=start_ms,
                audio_end_ms=start_ms + round((event.end - event.start) * 1000),
            )
        )
        if event.is_last:
            self._done(item)

    def _send_delta(self, item_id: str, delta: str, event: StreamEvent) -> None:
        """``delta`` (the text ``event`` adds to the item's deltas so far), unless empty."""
        if delta:
            self._send(
                TranscriptionDelta(
                    event_id=self._event_id(),
                    item_id=item_id,
                    delta=delta,
                    text=event.text,
                    audio_end_ms=round(event.end * 1000),
                )
            )

    def _speech(self, item: _Item, speech: SpeechEvent) -> None:
        ms = round((item.start_seconds + speech.seconds) * 1000)
        item_id = item.segment_id(speech.segment)
        if speech.started:
            self._send(SpeechStarted(event_id=self._event_id(), audio_start_ms=ms, item_id=item_id))
        else:
            self._send(SpeechStopped(event_id=self._event_id(), audio_end_ms=ms, item_id=item_id))

    def _committed(self, item_id: str) -> None:
        self._send(Committed(event_id=self._event_id(), item_id=item_id, previous_item_id=self._last_item_id))
        self._last_item_id = item_id

    def _failed(self, item: _Item, message: str) -> None:
        detail = ErrorDetail(type="server_error", code=ErrorCode.STREAM_ERROR.value, message=message)
        self._send(TranscriptionFailed(event_id=self._event_id(), item_id=item.item_id, error=detail))
        if self._current is item:
            self._current = None
        self._done(item)

    def _done(self, item: _Item) -> None:
        self._pending.pop(item.index, None)
        if not self._pending and self._current is None:
            self._finals_done.set()
        self._release_unused()

    # ---- outgoing ------------------------------------------------------------------------------------------------
    def _describe(self, beta: bool) -> Session | BetaSession:
        return self.session.describe(self.session_id, beta)

    def _event_id(self) -> str:
        return f"event_{self.id}_{next(self._event_ids)}"

    def _send(self, event: BaseModel) -> None:
        if self._closing:
            return
        try:
            self._out.put_nowait(event)
        except asyncio.QueueFull:
            limit = self.limits.max_outgoing_events
            log.warning("connection %d: slow reader: %d events wait unread; closing with 1008", self.id, limit)
            self._slow_reader(f"{limit} events wait unread: the client reads too slowly; closing")
            raise _Overflow from None

    def _send_error(self, code: ErrorCode, message: str, param: str | None = None, event_id: str | None = None) -> None:
        detail = ErrorDetail(type=code.error_type, code=code.value, message=message, param=param, event_id=event_id)
        self._send(ErrorEvent(event_id=self._event_id(), error=detail))

    def _refuse(self, error: ProtocolError) -> None:
        self.metrics.refused(error.code.value)
        with contextlib.suppress(_Overflow):
            self._send_error(error.code, error.message, error.param, error.event_id)

    def _slow_reader(self, message: str) -> None:
        """The client does not read: drop what is queued, tell it (``message``) if it still can be told, close with
        1008."""
        if self._closing and self._writer is not None and self._writer.done():
            return
        self._closing = True
        self.metrics.refused(ErrorCode.SLOW_READER.value)
        if self._writer is not None:
            self._writer.cancel()
        while not self._out.empty():
            self._out.get_nowait()
        if self._reader is not None:
            self._reader.cancel()
        detail = ErrorDetail(type=ErrorCode.SLOW_READER.error_type, code=ErrorCode.SLOW_READER.value, message=message)
        self._writer = asyncio.create_task(self._last_words(ErrorEvent(event_id=self._event_id(), error=detail)))

    async def _last_words(self, event: ErrorEvent) -> None:
        with contextlib.suppress(asyncio.TimeoutError, ConnectionClosed):
            await asyncio.wait_for(self.ws.send(event.model_dump_json()), timeout=1.0)
        with contextlib.suppress(ConnectionClosed):
            await self.ws.close(CloseCode.POLICY, "slow reader")
