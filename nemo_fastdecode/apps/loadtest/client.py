"""One load-test client: connect, stream PCM16 in real time, commit, wait for the final; every timing recorded.

Also the small client the tests and ``scripts/stream_file.py`` use (:func:`connect_session`, :func:`receive_until`).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

__all__ = [
    "ClientResult",
    "check_server",
    "connect_session",
    "item_ends",
    "message_ends",
    "receive_until",
    "run_client",
    "session_update",
]

COMPLETED = "conversation.item.input_audio_transcription.completed"
DELTA = "conversation.item.input_audio_transcription.delta"


@dataclasses.dataclass
class ClientResult:
    """What one client saw (times in seconds, ``time.monotonic`` of the client's process).

    Attributes:
        index: the client's number; ``audio_index``: the input it streamed.
        audio_seconds: audio sent.
        transcripts / words: each item's ``completed`` transcript and words, in commit order.
        chunk_latency_ms: per partial (before the commit): received - sent time of the audio it ends with.
        partial_audio_ms: per partial timed there: where its audio ends in its item (``audio_end_ms``).
        final_latency_ms: per item: ``completed`` received - commit sent.
        scheduled / started / finished: when the client was due to connect, first audio sent, last final received
            (``started - scheduled``: a late start plus the connection's handshake and session).
        refused: the close code when the server refused the connection (1013 capacity, 1008 key).
        errors: ``error`` events (code: message) and failures.
    """

    index: int
    audio_index: int
    audio_seconds: float
    transcripts: list[str] = dataclasses.field(default_factory=list)
    words: list[list[dict[str, Any]]] = dataclasses.field(default_factory=list)
    usage_seconds: list[float] = dataclasses.field(default_factory=list)
    chunk_latency_ms: list[float] = dataclasses.field(default_factory=list)
    partial_audio_ms: list[float] = dataclasses.field(default_factory=list)
    final_latency_ms: list[float] = dataclasses.field(default_factory=list)
    scheduled: float = 0.0
    started: float = 0.0
    finished: float = 0.0
    refused: int | None = None
    errors: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.refused is None and not self.errors


def message_ends(samples: int, rate: int, chunk_ms: float) -> list[int]:
    """Where a client's messages of ``chunk_ms`` audio end (sample indices, the last one ``samples``; none for no
    audio)."""
    step = max(1, round(rate * chunk_ms / 1000))
    return [*range(step, samples, step), samples] if samples > 0 else []


def item_ends(samples: int, rate: int, chunk_ms: float, commit_every_seconds: float | None) -> list[int]:
    """Where a client's items end (sample indices, the last one ``samples``): it commits after the first message
    (:func:`message_ends`) that reaches each multiple of ``commit_every_seconds``, and at the end."""
    messages = message_ends(samples, rate, chunk_ms)
    ends = {samples}
    if commit_every_seconds is not None:
        period = max(1, round(commit_every_seconds * rate))
        for t in range(period, samples, period):  # the first message that reaches t
            ends.add(next(end for end in messages if end >= t))
    return sorted(ends)


def session_update(rate: int) -> str:
    """``session.update`` for a transcription session of PCM16 at ``rate`` Hz, commits by the client."""
    session = {"type": "transcription", "audio": {"input": {"format": {"type": "audio/pcm", "rate": rate}}}}
    session["audio"]["input"]["turn_detection"] = None
    return json.dumps({"type": "session.update", "session": session})


def append_message(pcm: bytes, binary: bool) -> str | bytes:
    """Audio as ``input_audio_buffer.append`` (base64 JSON), or as a raw binary frame."""
    if binary:
        return pcm
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})


def check_server(url: str, timeout: float = 3.0) -> None:
    """Raise ``ConnectionError`` (``no server at ws://...: start it first with `nemo-fastdecode serve```) unless a
    server answers HTTP at ``url``'s host and port (``/health``; any answer will do): a load test without a server
    would time every client out and report nothing but NaNs."""
    import urllib.error
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    scheme = "https" if parts.scheme == "wss" else "http"
    try:
        urllib.request.urlopen(urllib.parse.urlunsplit((scheme, parts.netloc, "/health", "", "")), timeout=timeout)
    except urllib.error.HTTPError:
        return  # a server that answers (503 while it warms up)
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise ConnectionError(
            f"no server at {url} ({reason}): start it first with `nemo-fastdecode serve`"
            + (f" port={parts.port}" if parts.port not in (None, 8000) else "")
            + " in another terminal"
        ) from None


async def connect_session(
    url: str, api_key: str | None = None, *, rate: int | None = None, open_timeout: float = 30.0, **kwargs: Any
) -> tuple[ClientConnection, dict[str, Any]]:
    """Connect (``Authorization: Bearer``) and read the first event (``session.created``, or the refusal's error);
    with ``rate``, then set the session to PCM16 at ``rate`` Hz (:func:`session_update`) and read its
    ``session.updated``."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    ws = await connect(
        url, additional_headers=headers, open_timeout=open_timeout, compression=None, max_size=None, **kwargs
    )
    first = json.loads(await ws.recv())
    if rate is not None and first["type"] == "session.created":
        await ws.send(session_update(rate))
        updated = json.loads(await ws.recv())
        if updated["type"] != "session.updated":
            raise ConnectionError(f"the server refused PCM16 at {rate} Hz: {updated}")
    return ws, first


async def receive_until(
    ws: ClientConnection,
    done: Callable[[dict[str, Any]], bool],
    timeout: float,
    on_event: Callable[[dict[str, Any], float], None] | None = None,
) -> list[dict[str, Any]]:
    """Events until one satisfies ``done`` (included), or the connection closes; ``TimeoutError`` after ``timeout``."""
    events = []

    async def loop() -> None:
        while True:
            try:
                event = json.loads(await ws.recv())
            except ConnectionClosed:
                return
            if on_event is not None:
                on_event(event, time.monotonic())
            events.append(event)
            if done(event):
                return

    await asyncio.wait_for(loop(), timeout)
    return events


async def run_client(
    url: str,
    pcm: np.ndarray,
    *,
    index: int,
    audio_index: int,
    start_at: float,
    rate: int = 16000,
    chunk_ms: float = 80.0,
    realtime: bool = True,
    binary: bool = False,
    commit_every_seconds: float | None = None,
    api_key: str | None = None,
    timeout: float = 120.0,
) -> ClientResult:
    """Stream ``pcm`` (int16 ``[T]``) from ``start_at`` (monotonic), ``chunk_ms`` per message, paced in real time
    (``realtime``) or as fast as the server reads; commit at the end (and every ``commit_every_seconds``).

    Never raises for what the server does: refusals and errors are recorded in the result.
    """
    result = ClientResult(index, audio_index, len(pcm) / rate, scheduled=start_at)
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    try:
        await asyncio.wait_for(
            _stream(url, pcm, result, rate, chunk_ms, realtime, binary, commit_every_seconds, api_key, timeout),
            timeout,
        )
    except (asyncio.TimeoutError, OSError, ConnectionClosed) as error:
        result.errors.append(f"{type(error).__name__}: {error}")
    return result


async def _stream(
    url: str,
    pcm: np.ndarray,
    result: ClientResult,
    rate: int,
    chunk_ms: float,
    realtime: bool,
    binary: bool,
    commit_every: float | None,
    api_key: str | None,
    timeout: float,
) -> None:
    ws, first = await connect_session(url, api_key)
    async with ws:
        if first.get("type") == "error":
            await ws.wait_closed()
            result.refused = ws.close_code
            result.errors.append(f"{first['error']['code']}: {first['error']['message']}")
            return
        await ws.send(session_update(rate))
        bounds = [0, *message_ends(len(pcm), rate, chunk_ms)]
        commit_at = set(item_ends(len(pcm), rate, chunk_ms, commit_every))
        sent: list[tuple[int, float]] = []  # (samples sent in the item so far, when)
        commits: dict[str, float] = {}
        waiting = asyncio.get_running_loop().create_future()
        expected = [0]  # finals still to come
        sending = [True]  # items still to commit: the finals so far are not all

        def on_event(event: dict[str, Any], now: float) -> None:
            kind = event.get("type")
            if kind == DELTA and sent and event["item_id"] not in commits:  # partials before the commit
                end = event["audio_end_ms"] * rate / 1000  # the item's samples the partial accounts for
                when = next((t for n, t in sent if n >= end), sent[-1][1])
                result.chunk_latency_ms.append((now - when) * 1000)
                result.partial_audio_ms.append(event["audio_end_ms"])
            elif kind == "input_audio_buffer.committed":
                commits[event["item_id"]] = pending_commit.pop(0)
            elif kind == COMPLETED:
                result.transcripts.append(event["transcript"])
                result.words.append(event["words"])
                result.usage_seconds.append(event["usage"]["seconds"])
                result.final_latency_ms.append((now - commits.get(event["item_id"], now)) * 1000)
                expected[0] -= 1
                if expected[0] == 0 and not sending[0] and not waiting.done():
                    waiting.set_result(None)
            elif kind == "error":
                result.errors.append(f"{event['error']['code']}: {event['error']['message']}")

        pending_commit: list[float] = []
        receiver = asyncio.create_task(receive_until(ws, lambda e: False, timeout, on_event))
        start = result.started = time.monotonic()
        item_start = 0
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            if realtime:
                await asyncio.sleep(max(0.0, start + a / rate - time.monotonic()))
            await ws.send(append_message(pcm[a:b].tobytes(), binary))
            sent.append((b - item_start, time.monotonic()))
            if b in commit_at:
                expected[0] += 1
                pending_commit.append(time.monotonic())
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                item_start, sent = b, []
        sending[0] = False
        if expected[0] == 0 and not waiting.done():  # every final came in before the last send returned
            waiting.set_result(None)
        done, _ = await asyncio.wait([waiting, receiver], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        result.finished = time.monotonic()
        receiver.cancel()
        if waiting not in done:
            result.errors.append(f"{expected[0]} final(s) missing (connection closed: {ws.close_code})")


def percentiles(values: Sequence[float], qs: Sequence[int] = (50, 95, 99)) -> dict[int, float]:
    """``{q: value}`` (``nan`` without values)."""
    if not values:
        return {q: float("nan") for q in qs}
    return {q: float(np.percentile(np.asarray(values, dtype=np.float64), q)) for q in qs}
