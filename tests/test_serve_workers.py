"""The streaming server with network worker processes (``network_workers: 2``) through real sockets on 127.0.0.1:
two processes serve the port, the engine runs in this one. Every client gets exactly NeMo's cache-aware streaming of
its own audio alone whichever worker it lands on; the slots count across workers; refusals, health, readiness and
metrics are those of one process; a worker that dies takes only its own clients with it (their slots free, a new
worker takes its place); shutdown still delivers every final."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import test_serve
from test_serve import (
    KEY,
    RATE,
    ServerThread,
    append,
    check_completed,
    run,
    session_once_a_slot_frees,
    shut_down_with_two_clients,
    start_serve_process,
    three_concurrent_clients,
)
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from nemo_fastdecode.apps.loadtest.client import COMPLETED, connect_session, receive_until
from nemo_fastdecode.serve import ServeConfig
from nemo_fastdecode.serve.workers import ID_BITS

pytestmark = pytest.mark.usefixtures("single_thread")

WORKERS = 2

# the tiny model, the audio and NeMo's references of the one-process server's tests (module-scoped fixtures: one
# instance per module that uses them)
model, audio, refs = test_serve.model, test_serve.audio, test_serve.refs


@pytest.fixture(scope="module")
def server(model):
    s = ServerThread(
        model, slots=3, api_key=KEY, network_workers=WORKERS, limits={"max_message_bytes": 64 * 1024}, ready_timeout=120
    )
    yield s
    s.stop()


def worker_of(created: dict) -> int:
    """The incarnation of the worker that serves a connection (the high bits of its id, in the session id)."""
    return int(created["session"]["id"].removeprefix("sess_")) >> ID_BITS


async def one_per_worker(s: ServerThread, key: str | None = KEY) -> list:
    """A connection on each worker (the kernel picks the worker of a new connection: connect until each has one)."""
    held: dict[int, object] = {}
    for _ in range(200):
        ws, created = await connect_session(s.url, key, rate=RATE)
        if created["type"] == "error" and created["error"]["code"] == "server_at_capacity":
            await asyncio.sleep(0.05)  # the server has yet to release the slot of one just closed
            continue
        assert created["type"] == "session.created", created
        worker = worker_of(created)
        if worker in held:
            await ws.close()
        else:
            held[worker] = ws
        if len(held) == WORKERS:
            return [held[w] for w in sorted(held)]
    raise AssertionError(f"200 connections reached workers {sorted(held)} only")


async def receive_forever(ws) -> None:
    while True:
        await ws.recv()


def test_network_workers_is_checked():
    with pytest.raises(ValueError, match="network_workers must be 0"):
        ServeConfig(network_workers=-1)
    for bad in (-1.0, 101, "2"):
        with pytest.raises(ValueError, match=r"network_batch_ms must be in \[0, 100\] milliseconds, got"):
            ServeConfig(network_batch_ms=bad)


@pytest.mark.parametrize("interval_ms", [0.0, 20.0])
def test_a_worker_sends_its_commands_at_most_once_an_interval(interval_ms):
    """A worker's engine port: each turn's commands in one message, and no two messages closer than the interval
    (the commands of the turns between wait for the next one); every command is sent once, in order."""
    from nemo_fastdecode.serve.engine_loop import Finish
    from nemo_fastdecode.serve.workers import EngineProxy

    async def main():
        loop = asyncio.get_running_loop()
        sent: list[tuple[float, list]] = []
        proxy = EngineProxy(lambda message: sent.append((loop.time(), message[1])), interval_ms / 1000)
        commands = [Finish((c, 0), 0.0) for c in range(30)]
        for turn in range(10):  # three commands a turn, a turn every 5 ms
            for command in commands[3 * turn : 3 * turn + 3]:
                proxy.submit(command)
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        return commands, sent

    commands, sent = asyncio.run(main())
    assert [c for _, batch in sent for c in batch] == commands
    gaps = np.diff([t for t, _ in sent])
    if interval_ms:
        assert len(sent) < 10 and (gaps >= interval_ms / 1000 - 1e-3).all()
    else:
        assert len(sent) == 10  # one a turn


def test_metric_families_of_several_processes_are_summed():
    """What ``/metrics`` shows with workers: counters, histograms and gauges summed over the processes, the earliest
    ``_created``, each family once."""
    from nemo_fastdecode.serve.metrics import ServerMetrics
    from nemo_fastdecode.serve.workers import _merge, _plain

    main, first, second = ServerMetrics(), ServerMetrics(), ServerMetrics()
    main.cycle_seconds.observe(0.003)
    for k, worker in enumerate((first, second)):
        worker.refused("invalid_api_key")
        worker.connections.set(k + 1)
        worker.chunk_latency_seconds.observe(0.02 * (k + 1))
    merged = _merge([family for p in (main, first, second) for family in _plain(p.registry.collect())])
    assert len({m.name for m in merged}) == len(merged) == len(list(main.registry.collect()))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in merged for s in m.samples}
    assert samples[("nemo_fastdecode_refusals_total", (("reason", "invalid_api_key"),))] == 2
    assert samples[("nemo_fastdecode_connections", ())] == 3
    assert samples[("nemo_fastdecode_cycle_seconds_count", ())] == 1
    assert samples[("nemo_fastdecode_chunk_latency_seconds_count", ())] == 2
    assert samples[("nemo_fastdecode_chunk_latency_seconds_bucket", (("le", "0.025"),))] == 1
    assert samples[("nemo_fastdecode_chunk_latency_seconds_bucket", (("le", "0.05"),))] == 2
    created = [
        s.value
        for p in (main, first, second)
        for m in p.registry.collect()
        for s in m.samples
        if s.name == "nemo_fastdecode_cycle_seconds_created"
    ]
    assert len(created) == 3 and samples[("nemo_fastdecode_cycle_seconds_created", ())] == min(created)


def test_a_workers_pushes_cross_as_columns_and_apply_as_they_came(model, audio, refs):
    """A worker's turn crosses the pipe with each run of pushes as one ``PushBatch`` (a few arrays and one bytes
    object), in order; the engine loop applies the batches exactly as the pushes one by one: the same finals, NeMo's
    streaming of each item alone, also for a second item queued behind its connection's first."""
    import itertools
    import pickle

    from nemo_fastdecode.serve.engine_loop import EngineLoop, Finish, Push, PushBatch, batched
    from nemo_fastdecode.serve.metrics import ServerMetrics
    from nemo_fastdecode.streaming import StreamingEngine, StreamOptions

    options = StreamOptions()
    items = {(0, 0): audio[0].tobytes(), (1, 0): audio[1].tobytes(), (1, 1): audio[2].tobytes()}
    per_item = [
        [Push(key, data[k : k + 1999], float(k), options) for k in range(0, len(data), 1999)] + [Finish(key, 0.0)]
        for key, data in items.items()  # odd byte counts: samples split between pushes
    ]
    # the items interleaved, each in its order (the second item's audio waits behind its connection's first)
    commands = [c for turn in itertools.zip_longest(*per_item) for c in turn if c is not None]
    crossed = pickle.loads(pickle.dumps(batched(commands)))
    kinds = [type(c) for c in crossed]
    assert kinds.count(Finish) == 3 and PushBatch in kinds and Push not in kinds
    assert all(len(c.options) == 1 for c in crossed if isinstance(c, PushBatch))
    assert [p for c in crossed for p in (c.pushes() if isinstance(c, PushBatch) else [c])] == commands

    def finals(sequence: list) -> dict:
        loop = EngineLoop(StreamingEngine(model, 2, use_cuda_graphs=False), lambda d: None, ServerMetrics())
        out = {}
        for command in sequence:
            deliveries = loop._apply(command)
            while loop.engine.busy:
                deliveries += loop._cycle()
            out.update({d.key: d.event.token_ids for d in deliveries if d.event is not None and d.event.is_last})
        return out

    direct = finals(commands)
    assert direct == {(0, 0): refs[0].token_ids, (1, 0): refs[1].token_ids, (1, 1): refs[2].token_ids}
    assert all(direct.values())  # there is something to compare
    assert finals(crossed) == direct


def test_pushes_that_come_while_a_cycle_steps_apply_inside_it_in_order(model, audio, refs):
    """Commands that come while the engine steps (three per cycle here, as a worker's turn lands mid-cycle): the
    pushes to open streams apply inside the cycle, a finish or the first push of an item waiting behind its
    connection's first holds itself and everything after it for the cycle's end; the finals are NeMo's of each item
    alone, the same as with every command applied between cycles."""
    from nemo_fastdecode.serve.engine_loop import EngineLoop, Finish, Push, batched
    from nemo_fastdecode.serve.metrics import ServerMetrics
    from nemo_fastdecode.streaming import StreamingEngine, StreamOptions

    options = StreamOptions()
    items = {(0, 0): audio[0].tobytes(), (1, 0): audio[1].tobytes(), (1, 1): audio[2].tobytes()}
    commands = []
    for k in range(0, max(map(len, items.values())), 2560):  # 80 ms pieces, the items side by side
        commands += [Push(key, data[k : k + 2560], float(k), options) for key, data in items.items() if k < len(data)]
    commands += [Finish(key, 0.0) for key in items]
    finals, inside = {}, []

    def deliver(deliveries):
        finals.update({d.key: d.event.token_ids for d in deliveries if d.event is not None and d.event.is_last})

    loop = EngineLoop(StreamingEngine(model, 2, use_cuda_graphs=False), deliver, ServerMetrics())
    poll, push, waiting = loop.engine.poll, loop.engine.push, list(commands)

    def poll_while_commands_come(while_stepping=None):
        loop.submit_many(batched(waiting[:3]))  # they come while this cycle runs
        del waiting[:3]
        return poll(while_stepping=while_stepping)

    def push_noting_when(stream, pcm):
        push(stream, pcm)
        inside.append(loop.engine._stepping)

    push_many = loop.engine.push_many

    def push_many_noting_when(stream_ids, *args):  # a batch's pushes to open streams go in together
        applied = push_many(stream_ids, *args)
        inside.extend([loop.engine._stepping] * applied)
        return applied

    loop.engine.poll, loop.engine.push = poll_while_commands_come, push_noting_when
    loop.engine.push_many = push_many_noting_when
    loop.submit(commands[0])
    del waiting[:1]
    for _ in range(10_000):
        if len(finals) == len(items):
            break
        if not loop.engine.busy and waiting:  # nothing to step: the next commands come now
            loop.submit_many(batched(waiting[:3]))
            del waiting[:3]
        assert loop._turn()
    assert finals == {(0, 0): refs[0].token_ids, (1, 0): refs[1].token_ids, (1, 1): refs[2].token_ids}
    assert all(finals.values()) and not waiting and not loop._held
    assert sum(inside) > len(inside) / 2 and not all(inside)  # most pushes applied while stepping, not all


def test_consecutive_pushes_join_into_one_batch_in_order():
    """A turn's runs of pushes (single ones and network batches) become one batch each, in order; any other command
    ends a run."""
    from nemo_fastdecode.serve.engine_loop import Finish, Push, PushBatch, batched
    from nemo_fastdecode.streaming import StreamOptions

    one, other = StreamOptions(), StreamOptions(partial_words=True)
    pushes = [Push((c, 0), bytes([c]) * (c + 1), float(c), one if c % 2 else other) for c in range(7)]
    commands = [
        PushBatch.of(pushes[0:2]),
        pushes[2],
        PushBatch.of(pushes[3:5]),
        Finish((9, 0), 1.0),
        pushes[5],
        PushBatch.of(pushes[6:7]),
        None,
    ]
    joined = batched(commands)
    assert [type(c) for c in joined] == [PushBatch, Finish, PushBatch, type(None)]
    assert joined[0].pushes() == pushes[:5] and joined[2].pushes() == pushes[5:]
    assert joined[1] is commands[3]
    assert batched([]) == [] and batched([commands[3]]) == [commands[3]]


def _loop_noting_push_many(model, deliver):
    """An engine loop over 4 slots, and the list to which each ``push_many`` call appends its number of pushes."""
    from nemo_fastdecode.serve.engine_loop import EngineLoop
    from nemo_fastdecode.serve.metrics import ServerMetrics
    from nemo_fastdecode.streaming import StreamingEngine

    loop = EngineLoop(StreamingEngine(model, 4, use_cuda_graphs=False), deliver, ServerMetrics())
    together, push_many = [], loop.engine.push_many

    def push_many_noting(stream_ids, *args):
        together.append(len(stream_ids))
        return push_many(stream_ids, *args)

    loop.engine.push_many = push_many_noting
    return loop, together


def test_a_push_that_opens_a_stream_waits_alone(model, audio, refs):
    """In a batch, a push that would open a stream takes the general way with its connection's later pushes; the
    other connections' pushes, before and after it, still go to the engine together (one ``push_many``), applied
    between cycles and while a cycle steps alike; every item's final is NeMo's of its audio alone."""
    from nemo_fastdecode.serve.engine_loop import Finish, Push, PushBatch
    from nemo_fastdecode.streaming import StreamOptions

    options = StreamOptions()
    data = [pcm.tobytes() for pcm in [*audio, audio[0]]]  # connection c streams data[c]
    sent = [0] * len(data)
    finals = {}

    def deliver(deliveries):
        finals.update({d.key: d.event.token_ids for d in deliveries if d.event is not None and d.event.is_last})

    def batch(connections: list[int]) -> PushBatch:  # the next 40 ms of each named connection, in that order
        pushes = []
        for c in connections:
            pushes.append(Push((c, 0), data[c][sent[c] : sent[c] + 1280], 0.0, options))
            sent[c] += 1280
        return PushBatch.of(pushes)

    loop, together = _loop_noting_push_many(model, deliver)
    loop._apply(batch([0, 1]))  # opens 0 and 1
    together.clear()
    loop._apply(batch([0, 2, 1, 2, 0]))  # between cycles: 2's first push opens its stream
    assert together == [3]  # 0, 1 and 0 together; 2's two pushes went the general way (the first opens its stream)
    assert loop._item_of.keys() == {(0, 0), (0, 1), (0, 2)}  # (engine, stream id)
    # while a cycle steps: the two messages join; connection 3's first push is held with its later one, the others
    # (0, 1 and 2) apply inside the cycle together
    loop.submit(batch([0]))
    loop.submit(batch([3, 1, 3, 2]))
    together.clear()
    loop._push_while_stepping()
    assert together == [3] and [p.key for p in loop._held] == [(3, 0), (3, 0)]
    while loop._held or loop.engine.busy:
        assert loop._turn()
    assert loop._item_of.keys() == {(0, 0), (0, 1), (0, 2), (0, 3)} and not finals
    for c in range(4):
        loop.submit(PushBatch.of([Push((c, 0), data[c][sent[c] :], 0.0, options)]))
        loop.submit(Finish((c, 0), 0.0))
    for _ in range(10_000):
        if len(finals) == 4:
            break
        assert loop._turn()
    assert finals == {(c, 0): refs[c % 3].token_ids for c in range(4)}
    assert all(finals.values())  # there is something to compare


def test_a_finish_while_stepping_holds_its_own_connection_only(model, audio, refs):
    """While a cycle steps, a finish (or abort, or drop) waits for the cycle's end with its connection's later
    commands; the other connections' pushes, before and after it, still go in; every item's final is NeMo's of its
    audio alone."""
    from nemo_fastdecode.serve.engine_loop import Abort, Finish, Push, PushBatch
    from nemo_fastdecode.streaming import StreamOptions

    options = StreamOptions()
    data = [pcm.tobytes() for pcm in audio]  # connection c streams data[c] as item 0; connection 0 then item 1
    sent = [0] * len(data)
    finals = {}

    def deliver(deliveries):
        finals.update({d.key: d.event.token_ids for d in deliveries if d.event is not None and d.event.is_last})

    def push(c: int, size: int | None = None, item: int = 0) -> Push:
        size = len(data[c]) - sent[c] if size is None else size
        pcm = data[c][sent[c] : sent[c] + size]
        sent[c] += size
        return Push((c, item), pcm, 0.0, options)

    loop, together = _loop_noting_push_many(model, deliver)
    loop._apply(PushBatch.of([push(c, 1280) for c in range(3)]))  # opens 0, 1 and 2
    # connection 0 ends its item and starts the next one; connection 2 aborts; 1 keeps streaming throughout
    loop.submit(PushBatch.of([push(0), push(1, 1280)]))
    loop.submit(Finish((0, 0), 0.0))
    loop.submit(Abort((2, 0)))
    loop.submit(PushBatch.of([push(1, 1280), Push((0, 1), data[0][:1280], 0.0, options), push(1, 1280)]))
    together.clear()
    loop._push_while_stepping()
    assert together == [2, 2]  # 0's and 1's pushes, then 1's two after the finish: not 0's next item
    assert [type(c) for c in loop._held] == [Finish, Abort, Push] and loop._held[2].key == (0, 1)
    loop._held.append(Push((0, 1), data[0][1280:], 0.0, options))
    loop._held.append(Finish((0, 1), 0.0))
    loop.submit(PushBatch.of([push(1)]))
    loop.submit(Finish((1, 0), 0.0))
    for _ in range(10_000):
        if len(finals) == 3:
            break
        assert loop._turn()
    assert finals == {(0, 0): refs[0].token_ids, (0, 1): refs[0].token_ids, (1, 0): refs[1].token_ids}
    assert all(finals.values())  # there is something to compare


def test_the_engine_loop_freezes_what_lives_before_it_serves(model):
    """What is alive once the engine is ready (the model, the libraries) is frozen out of the garbage collector's
    full collections, which stop every thread for as long as they walk it (0.3 s in a server's process)."""
    import gc

    from nemo_fastdecode.serve.engine_loop import EngineLoop
    from nemo_fastdecode.serve.metrics import ServerMetrics
    from nemo_fastdecode.streaming import StreamingEngine

    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    loop = EngineLoop(StreamingEngine(model, 1, use_cuda_graphs=False), lambda d: None, ServerMetrics())
    loop.start(warm_up=False)
    try:
        assert loop.ready.wait(30) and loop.failed is None
        assert gc.get_freeze_count() > 10_000
    finally:
        loop.stop(timeout=30)
        gc.unfreeze()


def test_concurrent_clients_on_both_workers_get_exactly_their_own_transcripts(server, model, audio, refs):
    """Three clients at once, one with two items: each final is NeMo's streaming of that audio alone; the
    connections spread over both workers."""
    three_concurrent_clients(server.url, model, audio, refs)

    async def on_each_worker():  # and a client on each worker, for certain
        held = await one_per_worker(server)
        out = []
        for ws in held:
            async with ws:
                await ws.send(audio[2].tobytes())
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                out.append((await receive_until(ws, lambda e: e["type"] == COMPLETED, 30))[-1])
        return out

    for event in run(on_each_worker()):
        check_completed(event, refs[2], audio[2])
    assert server.settled()


def test_the_slots_count_across_workers_1013_when_full(server):
    async def scenario():
        held = await one_per_worker(server)
        ws, first = await connect_session(server.url, KEY, rate=RATE)
        assert first["type"] == "session.created"
        held.append(ws)  # 3 slots taken, on both workers
        for _ in range(4):  # whichever worker gets them
            ws, first = await connect_session(server.url, KEY, rate=RATE)
            assert first["type"] == "error" and first["error"]["code"] == "server_at_capacity"
            assert "all 3 stream slots" in first["error"]["message"]
            await ws.wait_closed()
            assert ws.close_code == 1013
        await held[0].close()  # a slot frees: the next client is served
        ws = await session_once_a_slot_frees(server.url, KEY)
        for w in [ws, *held[1:]]:
            await w.close()

    run(scenario())
    assert server.settled()


def test_a_wrong_api_key_is_refused_with_1008_by_every_worker(server):
    async def attempt():
        ws = await connect(server.url, additional_headers={"Authorization": "Bearer nope"})
        with contextlib.suppress(ConnectionClosed):
            await ws.send(append(b"\x00\x01" * 100))  # never read
        first = json.loads(await ws.recv())
        await ws.wait_closed()
        return first["type"], first["error"]["code"], ws.close_code

    async def scenario():
        return [await attempt() for _ in range(6)]

    assert run(scenario()) == [("error", "invalid_api_key", 1008)] * 6
    assert server.settled()


def test_clients_that_vanish_mid_chunk_free_their_slots_at_once(server, audio):
    async def scenario():
        held = await one_per_worker(server)
        for ws in held:
            await ws.send(audio[0][:2500].tobytes())  # under one chunk
        for _ in range(300):
            if server.server.engine_loop.live_streams == WORKERS:
                break
            await asyncio.sleep(0.01)
        assert server.server.engine_loop.live_streams == WORKERS
        for ws in held:
            ws.transport.abort()  # no close frame: the TCP connection just ends

    run(scenario())
    start = time.monotonic()
    assert server.settled(timeout=2.0)
    assert time.monotonic() - start < 1.0


def test_health_ready_and_metrics_answer_from_every_worker(server, audio, refs):
    async def stream():
        ws, _ = await connect_session(server.url, KEY, rate=RATE)
        async with ws:
            await ws.send(audio[2].tobytes())
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            return (await receive_until(ws, lambda e: e["type"] == COMPLETED, 30))[-1]

    async def wrong_key():
        ws = await connect(server.url, additional_headers={"Authorization": "Bearer nope"})
        await ws.wait_closed()

    check_completed(run(stream()), refs[2], audio[2])
    for _ in range(2):
        run(wrong_key())
    assert server.settled()
    time.sleep(0.6)  # a snapshot of every worker's metrics has reached the main process
    for _ in range(6):  # new TCP connections: both workers answer some
        assert urllib.request.urlopen(server.http + "/health").read() == b"ok\n"
        assert urllib.request.urlopen(server.http + "/ready").read() == b"ready\n"
        metrics = urllib.request.urlopen(server.http + "/metrics").read().decode()
        for name in ("open_streams", "cycle_seconds_bucket", "chunk_latency_seconds", "refusals", "gpu_memory_bytes"):
            assert f"nemo_fastdecode_{name}" in metrics
        lines = {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line[0] != "#"
        }
        assert lines["nemo_fastdecode_cycle_seconds_count"] > 0  # the engine's, from the main process
        assert lines['nemo_fastdecode_refusals_total{reason="invalid_api_key"}'] >= 2  # the workers', summed
        assert lines['nemo_fastdecode_events_total{type="conversation.item.input_audio_transcription.completed"}'] > 0
        assert lines["nemo_fastdecode_connections"] == 0
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(server.http + "/v2/elsewhere")


def test_a_killed_worker_takes_only_its_own_clients_and_is_replaced(server, audio, refs):
    """SIGKILL one worker while a client of each streams: the other's client gets its final, exact; the killed
    one's slot and engine items free; a new worker takes its place and serves."""
    pool = server.server.workers

    async def scenario():
        survivor, victim = await one_per_worker(server)  # on the lower and the higher incarnation
        for ws in (survivor, victim):
            await ws.send(audio[0][:8000].tobytes())
        for _ in range(300):
            if server.server.engine_loop.live_streams == 2:
                break
            await asyncio.sleep(0.01)
        killed = max(pool.pids)
        os.kill(pool.pids[killed], signal.SIGKILL)
        with pytest.raises(ConnectionClosed):  # (after any partial already on its way)
            await asyncio.wait_for(receive_forever(victim), 30)
        await survivor.send(audio[0][8000:].tobytes())
        await survivor.send(json.dumps({"type": "input_audio_buffer.commit"}))
        events = await receive_until(survivor, lambda e: e["type"] == COMPLETED, 30)
        await survivor.close()
        return killed, events

    killed, events = run(scenario())
    check_completed(events[-1], refs[0], audio[0])
    assert server.settled(timeout=15.0)  # the killed worker's slot and items are gone
    assert pool.deaths == 1
    deadline = time.monotonic() + 120
    while not (pool.ready and len(pool.pids) == WORKERS and killed not in pool.pids):
        assert time.monotonic() < deadline, "no new worker listens"
        time.sleep(0.1)
    assert urllib.request.urlopen(server.http + "/ready").read() == b"ready\n"

    async def both_serve():  # the new worker included
        for ws in await one_per_worker(server):
            await ws.close()

    run(both_serve())
    assert server.settled()


def test_shutdown_delivers_every_final_from_every_worker_then_closes_1001(model, audio, refs):
    s = ServerThread(model, slots=2, network_workers=WORKERS, ready_timeout=120)
    try:
        shut_down_with_two_clients(s, lambda: one_per_worker(s, key=None), audio, refs)
        assert s.server.workers.alive == 0
    finally:
        s.stop()


def test_python_m_serve_with_workers_serves_and_stops_on_sigterm():
    """``python -m nemo_fastdecode serve network_workers=2``: the workers start from a ``-m`` entry point, a client
    gets its final, SIGTERM ends the server and its workers (exit 0)."""
    import subprocess
    from pathlib import Path

    server = None
    try:
        server, ready = start_serve_process(
            ["model=tiny-streaming", "port=0", "slots=2", f"network_workers={WORKERS}"],
            ready_within=150,
            module="fastdecode_lab",
        )
        assert f"{WORKERS} network workers" in ready
        url = ready.split("ready on ")[1].split()[0]

        async def scenario():
            ws, created = await connect_session(url, rate=RATE)
            async with ws:
                assert created["type"] == "session.created"
                await ws.send(np.zeros(16000, np.int16).tobytes())
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                return (await receive_until(ws, lambda e: e["type"] == COMPLETED, 30))[-1]

        assert run(scenario())["usage"]["seconds"] == 1.0
        children = subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True, text=True).stdout.split()
        workers = [pid for pid in children if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
        assert len(workers) == WORKERS
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
        assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]  # exited and reaped
    finally:
        if server is not None and server.poll() is None:
            server.kill()
            server.wait()
