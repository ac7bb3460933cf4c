"""The server's flow control under bad input, through real sockets on 127.0.0.1 and real websockets clients: a burst of
messages is answered in full (the reader waits for the writer), a client that never reads is caught as a slow reader
(its pong overdue) while the others are served, and ``/ready`` answers 503 while the engine warms up and while the
server drains on shutdown."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import types
import urllib.error
import urllib.request

import numpy as np
import pytest
from conftest import tiny_streaming_model
from test_serve import ServerThread, run
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from fastdecode_lab import synthetic as S
from nemo_fastdecode.apps.loadtest.client import COMPLETED, connect_session, receive_until
from nemo_fastdecode.serve import LimitsConfig, RealtimeServer, ServeConfig, build_engine
from nemo_fastdecode.serve.metrics import ServerMetrics
from nemo_fastdecode.serve.workers import WorkerPool

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
    s = ServerThread(model, slots=1, limits={"slow_reader_seconds": 0.5}, idle_timeout_seconds=None)
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
    limits = {"max_audio_rate": 2.0, "max_audio_burst_seconds": 0.3, "slow_reader_seconds": 0.5}
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


# ----------------------------------------------------------------------------------------------
# /ready while warming up and while draining


def warming_server(model, gate: threading.Event, **options) -> ServerThread:
    """A :class:`ServerThread`'s server whose engine warm-up waits for ``gate`` (started, not waited for)."""
    s = ServerThread.__new__(ServerThread)
    s.config = ServeConfig(port=0, slots=2, **options)
    engine = build_engine(model, s.config)
    warm_up = engine.warm_up

    def gated():
        assert gate.wait(60)
        return warm_up()

    engine.warm_up = gated
    s.server = RealtimeServer(engine, s.config, model_name="tiny-streaming")
    s.loop = asyncio.new_event_loop()
    s.thread = threading.Thread(target=s.loop.run_forever, daemon=True)
    s.thread.start()
    s.call(s.server.start())
    s.url = f"ws://127.0.0.1:{s.server.port}/v1/realtime"
    s.http = f"http://127.0.0.1:{s.server.port}"
    return s


def http_get(url: str) -> tuple[int, str]:
    """Status and body; raises ``OSError`` (``URLError``) when nothing listens."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_while_the_engine_warms_up_health_is_200_ready_503_and_websockets_are_refused(model, audio):
    gate = threading.Event()
    s = warming_server(model, gate)
    try:
        for _ in range(3):
            assert http_get(s.http + "/health") == (200, "ok\n")
            assert http_get(s.http + "/ready") == (503, "not ready\n")
            time.sleep(0.1)

        async def refused():
            with pytest.raises(InvalidStatus) as error:
                await connect(s.url, open_timeout=10)
            return error.value.response

        response = run(refused())
        assert response.status_code == 503 and response.headers["Retry-After"] == "1"
        assert b"warming up" in response.body
        assert s.server.admission.admitted == 0 and not s.server.connections
        gate.set()
        s.call(s.server.wait_ready(30), timeout=40)
        assert http_get(s.http + "/ready") == (200, "ready\n")

        async def served():
            ws, created = await connect_session(s.url)
            async with ws:
                assert created["type"] == "session.created"
                await ws.send(audio[2].tobytes())
                await ws.send(COMMIT)
                return await read_items(ws, 1)

        assert run(served())[-1]["type"] == COMPLETED
    finally:
        gate.set()
        s.stop()


def test_while_shutting_down_ready_is_503_until_the_connections_have_drained(model, audio):
    """A graceful shutdown with a client whose audio is not yet transcribed (the engine slowed down, so that the
    drain takes a while): the port keeps answering, ``/ready`` 503 and ``/health`` 200, a new WebSocket gets
    ``server_shutting_down`` and 1001, the client gets its final then 1001; only then does the port close."""
    s = ServerThread(model, slots=2)
    engine = s.server.engine_loop.engine
    poll = engine.poll

    def slow_poll(*args, **kwargs):
        time.sleep(0.05)
        return poll(*args, **kwargs)

    try:

        async def scenario():
            ws, _ = await connect_session(s.url)
            t0 = time.monotonic()
            async with ws:
                await ws.send(np.concatenate(audio).tobytes())  # not committed: the shutdown commits it
                for _ in range(300):
                    if s.server.engine_loop.live_streams == 1:
                        break
                    await asyncio.sleep(0.01)
                engine.poll = slow_poll
                shutdown = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(s.server.shutdown(20.0), s.loop))
                arrivals: dict[str, float] = {}

                def arrived(event: dict, _: float) -> None:
                    arrivals.setdefault(event["type"], time.monotonic() - t0)

                client = asyncio.create_task(receive_until(ws, lambda e: e["type"] == "error", 60, arrived))
                answers, newcomer = [], None
                while True:
                    try:
                        ready, health = await asyncio.gather(
                            asyncio.to_thread(http_get, s.http + "/ready"),
                            asyncio.to_thread(http_get, s.http + "/health"),
                        )
                    except OSError:  # the port closed
                        closed_at = time.monotonic() - t0
                        break
                    answers.append((time.monotonic() - t0, ready, health))
                    if newcomer is None:
                        other, first = await connect_session(s.url)
                        await other.wait_closed()
                        newcomer = (first, other.close_code)
                    await asyncio.sleep(0.02)
                events = await client
                final_at = arrivals[COMPLETED]
                await ws.wait_closed()
                await shutdown
                return answers, closed_at, newcomer, events, ws.close_code, final_at

        answers, closed_at, newcomer, events, code, final_at = run(scenario())
        assert len(answers) >= 3, answers
        assert all(ready == (503, "not ready\n") and health == (200, "ok\n") for _, ready, health in answers)
        first, other_code = newcomer
        assert first["error"]["code"] == "server_shutting_down" and other_code == 1001
        completed = [e for e in events if e["type"] == COMPLETED]
        assert len(completed) == 1 and events[-1]["error"]["code"] == "server_shutting_down" and code == 1001
        assert answers[0][0] < final_at < closed_at  # /ready said 503 before the final, the port closed after it
        print(
            f"/ready 503 x{len(answers)}, the final delivered by {final_at:.2f} s, the port closed at {closed_at:.2f} s"
        )
    finally:
        engine.poll = poll
        s.stop()


def test_network_workers_take_websockets_once_the_engine_is_warm_and_not_after_it_failed():
    """With network workers the workers' ``serving`` flag follows the engine alone: a worker takes WebSockets while a
    sibling restarts (``/ready`` then waits for every worker), not before the warm-up, not after a failure."""
    engine_loop = types.SimpleNamespace(ready=threading.Event(), failed=None)
    pool = WorkerPool(
        engine_loop, ServeConfig(port=0, network_workers=2), ServerMetrics(), model_name="m", rate=16000,
        segmenting=False, vad=None,
    )  # fmt: skip
    pool._update_flags()
    assert list(pool.flags) == [0, 1, 0]  # [ready, healthy, serving]: warming up
    engine_loop.ready.set()
    pool._update_flags()
    assert list(pool.flags) == [0, 1, 1]  # warm, but not every worker listens: not ready, serving
    engine_loop.failed = RuntimeError("device lost")
    pool._update_flags()
    assert list(pool.flags) == [0, 0, 0]
