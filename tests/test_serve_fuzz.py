"""A protocol fuzz test of the streaming server: Hypothesis writes sequences of client messages (valid events, wrong
types, missing and extra fields, unknown types, sizes, nesting, non-UTF-8 text frames, binary frames of odd length,
non-base64 audio) and sends each in one burst to one real server on 127.0.0.1; the server must answer every invalid
message with an ``error`` event (or the documented close: 1007 for a text frame that is not UTF-8, 1009 for a message
over 4x ``limits.max_message_bytes``), every valid one with its reply (``cleared``, ``session.updated``, ...), in
order, and every committed item with its final, while a second connection keeps being served throughout.

Bounded (250 examples, about 20-40 s on a 2-core CPU) and reproducible: ``derandomize=True``.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import threading
import time
from typing import Any

import numpy as np
import pytest
from conftest import tiny_streaming_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_serve import ServerThread, run
from websockets.exceptions import ConnectionClosed

from fastdecode_lab import synthetic as S
from nemo_fastdecode.apps.loadtest.client import COMPLETED, connect_session

pytestmark = pytest.mark.usefixtures("single_thread")

LIMIT = 16 * 1024  # limits.max_message_bytes of the server under test
FAILED = "conversation.item.input_audio_transcription.failed"
DELTA = "conversation.item.input_audio_transcription.delta"
VALID_TYPES = (
    "session.update",
    "transcription_session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
)


@dataclasses.dataclass(frozen=True)
class Message:
    """One client message and what the server answers it with.

    ``reply``: the event type the reader answers with at once (``error``, ``input_audio_buffer.cleared``,
    ``session.updated``, ...), ``None`` for none; ``audio``: it appends audio (the buffer then holds some);
    ``commit``: a commit (``committed`` + a final when the buffer holds audio, else an ``error``); ``clear``: a clear;
    ``close``: the close code it ends the connection with (sent last, after every reply came)."""

    payload: str | bytes
    reply: str | None = None
    audio: bool = False
    commit: bool = False
    clear: bool = False
    close: int | None = None
    text_bytes: bool = False  # ``payload`` (bytes) goes in a text frame

    def __repr__(self) -> str:
        shown = (
            self.payload
            if len(self.payload) <= 80
            else self.payload[:80] + (b"..." if isinstance(self.payload, bytes) else "...")
        )
        return f"Message({shown!r}, reply={self.reply}, close={self.close})"


def dumps(value: Any) -> str:
    return json.dumps(value)


event_ids = st.none() | st.text(max_size=20)
pcm_bytes = st.binary(min_size=0, max_size=4000)


def _with_id(event: dict, event_id: str | None) -> dict:
    return event if event_id is None else {**event, "event_id": event_id}


@st.composite
def valid_messages(draw) -> Message:
    kind = draw(st.sampled_from(["append", "binary", "commit", "clear", "update", "beta_update"]))
    event_id = draw(event_ids)
    if kind == "append":
        pcm = draw(pcm_bytes)
        event = _with_id({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}, event_id)
        return Message(dumps(event), audio=bool(pcm))
    if kind == "binary":  # raw PCM16, odd lengths too (a sample split over two frames)
        return Message(draw(st.binary(min_size=1, max_size=4001)), audio=True)
    if kind == "commit":
        return Message(dumps(_with_id({"type": "input_audio_buffer.commit"}, event_id)), commit=True)
    if kind == "clear":
        return Message(
            dumps(_with_id({"type": "input_audio_buffer.clear"}, event_id)), "input_audio_buffer.cleared", clear=True
        )
    session = draw(
        st.sampled_from(
            [
                {},
                {"type": "transcription"},
                {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}},  # the default: no change
                {"audio": {"input": {"transcription": {"delay": "high", "languages": ["en"]}}}},
                {"audio": {"input": {"turn_detection": None, "transcription": {"language": "en"}}}},
                {"input_audio_format": "pcm16", "turn_detection": None},
                {"input_audio_transcription": {"model": "x", "prompt": "p"}},
            ]
        )
    )
    if draw(st.booleans()):  # nested (not too deep) in a field whose extra keys are kept
        depth = draw(st.integers(1, 30))
        session = {**session, "input_audio_transcription": {"extra": json.loads("[" * depth + "]" * depth)}}
    if kind == "update":
        return Message(dumps(_with_id({"type": "session.update", "session": session}, event_id)), "session.updated")
    event = _with_id({"type": "transcription_session.update", "session": session}, event_id)
    return Message(dumps(event), "transcription_session.updated")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)


@st.composite
def invalid_messages(draw) -> Message:
    kind = draw(
        st.sampled_from(
            [
                "not_json", "not_object", "type_not_string", "unknown_type", "conversation_type", "missing_audio",
                "audio_wrong_type", "not_base64", "extra_field", "session_wrong_type", "session_extra",
                "event_id_wrong_type", "too_deep", "oversized_text", "oversized_binary", "wrong_format",
            ]
        )
    )  # fmt: skip
    event_id = draw(event_ids)
    if kind == "not_json":
        text = draw(st.sampled_from(["{", "{not json", "", "nul", '{"type": "input_audio_buffer.clear"', "[1,,]"]))
        return Message(text, "error")
    if kind == "not_object":
        return Message(dumps(draw(st.lists(json_values, max_size=3) | st.integers() | st.text() | st.none())), "error")
    if kind == "type_not_string":
        return Message(dumps({"type": draw(json_values.filter(lambda v: not isinstance(v, str)))}), "error")
    if kind == "unknown_type":
        kind_text = draw(st.text(max_size=100).filter(lambda t: t not in VALID_TYPES))
        return Message(dumps(_with_id({"type": kind_text}, event_id)), "error")
    if kind == "conversation_type":
        kind_text = draw(st.sampled_from(["response.create", "conversation.item.create", "output_audio_buffer.clear"]))
        return Message(dumps({"type": kind_text}), "error")
    if kind == "missing_audio":
        return Message(dumps(_with_id({"type": "input_audio_buffer.append"}, event_id)), "error")
    if kind == "audio_wrong_type":
        audio = draw(json_values.filter(lambda v: not isinstance(v, str)))
        return Message(dumps({"type": "input_audio_buffer.append", "audio": audio}), "error")
    if kind == "not_base64":  # a character outside base64's alphabet, or a bad length
        text = draw(st.text(alphabet="ABCD=+/%!é -_", min_size=1, max_size=50).filter(_not_base64))
        return Message(dumps({"type": "input_audio_buffer.append", "audio": text}), "error")
    if kind == "extra_field":
        base = draw(st.sampled_from(VALID_TYPES[2:]))
        event = {"type": base, "audio": ""} if base == "input_audio_buffer.append" else {"type": base}
        key = draw(st.text(min_size=1, max_size=10).filter(lambda k: k not in ("type", "audio", "event_id")))
        return Message(dumps({**event, key: draw(json_values)}), "error")
    if kind == "session_wrong_type":
        value = draw(json_values.filter(lambda v: not isinstance(v, dict)))
        return Message(dumps({"type": draw(st.sampled_from(VALID_TYPES[:2])), "session": value}), "error")
    if kind == "session_extra":
        key = draw(st.sampled_from(["voice", "instructions", "tools", "zzz"]))
        return Message(dumps({"type": "session.update", "session": {key: draw(json_values)}}), "error")
    if kind == "event_id_wrong_type":
        value = draw(
            json_values.filter(lambda v: v is not None and not isinstance(v, str)) | st.text(min_size=129, max_size=200)
        )
        return Message(dumps({"type": "input_audio_buffer.clear", "event_id": value}), "error")
    if kind == "too_deep":  # deeper than the JSON parser's recursion limit
        depth = draw(st.integers(3000, 6000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        return Message(
            '{"type": "session.update", "session": '
            + opener * depth
            + "1" * (opener == '{"a":')
            + closer * depth
            + "}",
            "error",
        )
    if kind == "oversized_text":
        size = draw(st.integers(LIMIT + 1, 2 * LIMIT))
        return Message(dumps({"type": "input_audio_buffer.append", "audio": "A" * size}), "error")
    if kind == "oversized_binary":
        return Message(b"\x00" * draw(st.integers(LIMIT + 1, 3 * LIMIT)), "error")
    fmt = draw(
        st.sampled_from(
            [
                {"type": "audio/opus"},
                {"rate": 96000},
                {"type": "audio/pcmu", "rate": 16000},
                {"type": "g711_alaw", "rate": 1},
            ]
        )
    )
    return Message(dumps({"type": "session.update", "session": {"audio": {"input": {"format": fmt}}}}), "error")


def _not_base64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except ValueError:
        return True
    return False


@st.composite
def closing_messages(draw) -> Message:
    """The messages the WebSocket layer ends the connection for (the documented closes)."""
    if draw(st.booleans()):  # a text frame that is not UTF-8
        payload = draw(st.sampled_from([b"\xff", b'{"type": "\xc3"}', b"\xed\xa0\x80", b"ok\x80"]))
        return Message(payload, close=1007, text_bytes=True)
    return Message(b"\x01" * draw(st.integers(4 * LIMIT + 1, 4 * LIMIT + 4000)), close=1009)


#: a pause between two messages (to vary how they interleave with the engine's events)
PAUSE = Message(b"", reply=None)
single = st.one_of(valid_messages(), valid_messages(), invalid_messages(), st.just(PAUSE)).map(lambda m: [m])
#: one message many times in a row (more replies at once than ``limits.max_outgoing_events``: the reader must wait)
bursts = st.tuples(
    st.one_of(valid_messages().filter(lambda m: not m.audio), invalid_messages()),  # no audio: not paced
    st.integers(50, 400),
).map(lambda t: [t[0]] * t[1])
sequences = st.tuples(
    st.lists(st.one_of(single, single, single, bursts), min_size=1, max_size=25).map(lambda parts: sum(parts, [])),
    st.one_of(st.none(), st.none(), closing_messages()),  # a third of them end with a close
)


@pytest.fixture(scope="module")
def model():
    return tiny_streaming_model()


@pytest.fixture(scope="module")
def audio() -> np.ndarray:
    (signal,) = S.synthetic_audio([1.3], seed=11)
    return np.round(signal * 32768).astype(np.int16)


class Witness:
    """A second client on the same server, in a thread of its own: item after item (audio, commit, its final),
    until told to stop; counts the items served and keeps what went wrong."""

    def __init__(self, url: str, pcm: np.ndarray):
        self.url, self.pcm = url, pcm
        self.served, self.problems = 0, []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.thread.start()

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                ws, created = await connect_session(self.url)
                async with ws:
                    assert created["type"] == "session.created", created
                    while not self._stop.is_set():
                        for piece in np.array_split(self.pcm, 8):  # under limits.max_message_bytes
                            await ws.send(piece.tobytes())
                        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                        while True:
                            event = json.loads(await asyncio.wait_for(ws.recv(), 30))
                            assert event["type"] not in ("error", FAILED), event
                            if event["type"] == COMPLETED:
                                break
                        self.served += 1
                        await asyncio.sleep(0.2)
            except Exception as error:  # noqa: BLE001 -- kept for the test to report
                self.problems.append(repr(error))
                await asyncio.sleep(0.5)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(40)


@pytest.fixture(scope="module")
def served(model, audio):
    s = ServerThread(model, slots=3, limits={"max_message_bytes": LIMIT}, idle_timeout_seconds=None)
    witness = Witness(s.url, audio)
    deadline = time.monotonic() + 30
    while witness.served == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield s, witness
    witness.stop()
    s.stop()


async def exchange(url: str, messages: list[Message], closing: Message | None) -> tuple[list[dict], int | None]:
    """Send ``messages`` in one burst, read until every reply and final came, then send ``closing`` (if any) and
    wait for the close; the events after ``session.created``, and the close code (``None``: still open)."""
    ws, created = await connect_session(url)
    assert created["type"] == "session.created"
    replies = sum(m.reply is not None for m in messages)
    has_audio, commits = False, 0
    for m in messages:
        replies += m.commit and not has_audio  # an empty commit: an error
        commits += m.commit and has_audio
        has_audio = (has_audio or m.audio) and not (m.commit or m.clear)
    tail = [Message(json.dumps({"type": "input_audio_buffer.clear"}), "input_audio_buffer.cleared", clear=True)]
    replies += 1  # the tail's clear: no item left open after the test
    events: list[dict] = []
    for m in messages + tail:
        if m is PAUSE:
            await asyncio.sleep(0.01)
        else:
            await ws.send(m.payload)
    finals = 0

    def pending() -> bool:
        got = sum(e["type"] not in ("input_audio_buffer.committed", DELTA, COMPLETED, FAILED) for e in events)
        return got < replies or finals < commits

    try:
        while pending():
            events.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
            finals += events[-1]["type"] in (COMPLETED, FAILED)
        if closing is None:
            await ws.close()
            return events, None
        await ws.send(closing.payload, text=True if closing.text_bytes else None)
        while True:
            events.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
    except ConnectionClosed:
        await ws.wait_closed()
        return events, ws.close_code


@settings(
    max_examples=250,
    deadline=None,
    derandomize=True,  # the same examples every run (CI), no example database
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(sequence=sequences)
def test_every_message_is_answered_and_every_committed_item_gets_its_final(served, sequence):
    s, witness = served
    messages, closing = sequence
    events, close_code = run(exchange(s.url, messages, closing), timeout=60)
    expected: list[str] = []
    has_audio = False
    for m in messages:
        if m.commit and not has_audio:
            expected.append("error")
        elif m.reply is not None:
            expected.append(m.reply)
        has_audio = (has_audio or m.audio) and not (m.commit or m.clear)
    expected.append("input_audio_buffer.cleared")
    engine = ("input_audio_buffer.committed", DELTA, COMPLETED, FAILED)
    assert [e["type"] for e in events if e["type"] not in engine] == expected
    committed = [e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"]
    finals = [e["item_id"] for e in events if e["type"] in (COMPLETED, FAILED)]
    assert committed == finals and len(committed) == sum(m.commit for m in _non_empty_commits(messages))
    for e in events:
        if e["type"] == "error":
            assert e["error"]["code"] and e["error"]["message"]
    assert close_code == (None if closing is None else closing.close)
    assert not witness.problems, witness.problems


def _non_empty_commits(messages: list[Message]) -> list[Message]:
    out, has_audio = [], False
    for m in messages:
        if m.commit and has_audio:
            out.append(m)
        has_audio = (has_audio or m.audio) and not (m.commit or m.clear)
    return out


def test_the_witness_was_served_throughout_and_nothing_is_left(served):
    s, witness = served
    before = witness.served
    deadline = time.monotonic() + 20
    while witness.served < before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert witness.served >= before + 2 and not witness.problems, witness.problems
    deadline = time.monotonic() + 5
    while len(s.server.connections) > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(s.server.connections) == 1  # the witness's: every fuzzed connection is gone
