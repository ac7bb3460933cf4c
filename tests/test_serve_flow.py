"""The server's flow control under bad input, through real sockets on 127.0.0.1 and real websockets clients: a burst of
messages is answered in full (the reader waits for the writer), a client that never reads is caught as a slow reader
(its pong overdue) while the others are served."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from conftest import tiny_streaming_model
from test_serve import ServerThread, run
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from fastdecode_lab import synthetic as S
from nemo_fastdecode.apps.loadtest.client import COMPLETED, connect_session, receive_until
from nemo_fastdecode.serve import LimitsConfig

pytestmark = pytest.mark.usefixtures("single_thread")

CLEAR = json.dumps({"type": "input_audio_buffer.clear"})
COMMIT = json.dumps({"type": "input_audio_buffer.commit"})


@pytest.fixture(scope="module")
def model():
    return tiny_streaming_model()


@pytest.fixture(scope="module")
def audio() -> list[np.ndarray]:
    signals = S.synthetic_audio([1.9, 2.6, 1.3], seed=11)
    return [np.round(s * 32768).astype(np.int16) for s in signals]


@pytest.fixture(scope="module")
def server(model):
    s = ServerThread(model, slots=3)
    yield s
    s.stop()


def refusals(s: ServerThread, reason: str) -> float:
    return s.server.metrics.refusals.labels(reason)._value.get()


async def read_items(ws, count: int, timeout: float = 60.0) -> list[dict]:
    """Events until ``count`` items have their final (``completed`` or ``failed``)."""
    finals = 0

    def done(event: dict) -> bool:
        nonlocal finals
        finals += event["type"] in (COMPLETED, "conversation.item.input_audio_transcription.failed")
        return finals == count

    return await receive_until(ws, done, timeout)


# ----------------------------------------------------------------------------------------------
# replies back-pressure the reader


@pytest.mark.parametrize("count", [300, 1000])
def test_a_burst_of_messages_gets_every_reply_and_no_slow_reader_close(server, audio, count):
    """``count`` clears in one burst (more than ``max_outgoing_events``), then the client reads: every ``cleared``
    comes, in order, and the session goes on (an item after them gets its final)."""
    before = refusals(server, "slow_reader")

    async def scenario():
        ws, created = await connect_session(server.url)
        async with ws:
            assert created["type"] == "session.created"
            for _ in range(count):
                await ws.send(CLEAR)
            events = [json.loads(await asyncio.wait_for(ws.recv(), 30.0)) for _ in range(count)]
            await ws.send(audio[2].tobytes())
            await ws.send(COMMIT)
            events += await read_items(ws, 1)
            return events

    events = run(scenario(), timeout=120)
    assert [e["type"] for e in events[:count]] == ["input_audio_buffer.cleared"] * count
    assert not [e for e in events if e["type"] == "error"]
    assert events[-1]["type"] == COMPLETED
    assert refusals(server, "slow_reader") == before
    assert server.settled()


def test_replies_wait_for_the_writer_and_engine_events_still_count(model, audio):
    """A small queue (8): a burst of 200 clears never holds more than 8 events; the client that reads gets them all."""
    s = ServerThread(model, slots=1, limits={"max_outgoing_events": 8})
    try:

        async def scenario():
            ws, _ = await connect_session(s.url)
            (connection,) = s.server.connections.values()
            most = 0
            async with ws:
                for _ in range(200):
                    await ws.send(CLEAR)
                events = []
                for _ in range(200):
                    events.append(json.loads(await asyncio.wait_for(ws.recv(), 30.0)))
                    most = max(most, connection._out.qsize())
                await ws.send(audio[0].tobytes())
                await ws.send(COMMIT)
                events += await read_items(ws, 1)
            return events, most

        events, most = run(scenario())
        assert [e["type"] for e in events[:200]] == ["input_audio_buffer.cleared"] * 200
        assert events[-1]["type"] == COMPLETED and most <= 8
        assert refusals(s, "slow_reader") == 0
        assert s.settled()
    finally:
        s.stop()


# ----------------------------------------------------------------------------------------------
# a client that never reads


def test_a_client_that_streams_and_never_reads_is_closed_as_a_slow_reader(model, audio):
    """A websockets client that streams items with commits and never calls ``recv()`` (it stops reading its socket
    after ``max_queue`` events, the rest waits in the socket buffers): closed as ``slow_reader`` within a few
    ``slow_reader_seconds``, while a second client on the same server keeps getting its finals."""
    s = ServerThread(model, slots=2, limits={"slow_reader_seconds": 1.0}, idle_timeout_seconds=None)
    try:

        async def silent() -> float:
            ws = await connect(s.url, max_queue=4)  # never reads: its queue fills after 4 events
            start = time.monotonic()
            try:
                while time.monotonic() - start < 30 and not refusals(s, "slow_reader"):
                    for pcm in audio:  # at twice real time: under the rate limit (the server never paces it)
                        for piece in np.array_split(pcm, len(pcm) // 1600):
                            await ws.send(piece.tobytes())
                            await asyncio.sleep(0.05)
                        await ws.send(COMMIT)
            except ConnectionClosed:
                pass
            detected = time.monotonic() - start
            ws.transport.abort()
            return detected

        async def reader() -> list[list[dict]]:
            rounds = []
            for _ in range(3):  # before, while and after the other is caught
                ws, _ = await connect_session(s.url)
                async with ws:
                    for pcm in audio:
                        await ws.send(pcm.tobytes())
                        await ws.send(COMMIT)
                    rounds.append(await read_items(ws, len(audio)))
                await asyncio.sleep(0.5)
            return rounds

        async def both():
            return await asyncio.gather(silent(), reader())

        detected, rounds = run(both(), timeout=120)
        assert refusals(s, "slow_reader") == 1
        print(f"the silent client was caught after {detected:.1f} s")
        assert detected < 20, f"the silent client was caught after {detected:.1f} s"
        for events in rounds:
            assert not [e for e in events if e["type"] == "error"]
            committed = [e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"]
            completed = [e["item_id"] for e in events if e["type"] == COMPLETED]
            assert completed == committed and len(completed) == len(audio)
        assert s.settled(timeout=10)
    finally:
        s.stop()


def test_an_idle_client_that_reads_is_not_a_slow_reader(model):
    """Pings answered (the client's library reads them): no slow reader, however long it waits."""
    s = ServerThread(model, slots=1, limits={"slow_reader_seconds": 0.2}, idle_timeout_seconds=None)
    try:

        async def scenario():
            ws, _ = await connect_session(s.url)
            async with ws:
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(ws.recv(), 2.0)  # reads (and answers pings), nothing comes
                await ws.send(CLEAR)
                return json.loads(await ws.recv())

        assert run(scenario())["type"] == "input_audio_buffer.cleared"
        assert refusals(s, "slow_reader") == 0
    finally:
        s.stop()


def test_slow_reader_seconds_is_checked():
    for bad in (0, -1.0, float("nan"), 1e9, True, "5"):
        with pytest.raises(ValueError, match="slow_reader_seconds"):
            LimitsConfig(slow_reader_seconds=bad)
    assert LimitsConfig(slow_reader_seconds=0.5).slow_reader_seconds == 0.5


def test_a_paced_client_is_not_a_slow_reader(model, audio):
    """Audio faster than the rate limit: the server stops reading it, so its pong waits behind its audio; that time
    does not count, it is not closed however small ``slow_reader_seconds`` is."""
    limits = {"max_audio_rate": 2.0, "max_audio_burst_seconds": 0.3, "slow_reader_seconds": 0.2}
    s = ServerThread(model, slots=1, limits=limits)
    try:

        async def scenario():
            ws, _ = await connect_session(s.url)
            async with ws:
                for piece in np.array_split(np.concatenate(audio), 60):  # 5.8 s at once: ~2.8 s of pacing
                    await ws.send(piece.tobytes())
                await ws.send(COMMIT)
                return await read_items(ws, 1)

        events = run(scenario())
        assert events[-1]["type"] == COMPLETED and not [e for e in events if e["type"] == "error"]
        assert refusals(s, "slow_reader") == 0
    finally:
        s.stop()
