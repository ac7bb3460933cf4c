"""The streaming ASR server (nemo_fastdecode/serve) through real sockets on 127.0.0.1: every client gets exactly NeMo's
cache-aware streaming of its own audio alone; every refusal is an ``error`` event with a code (and the close code the
protocol gives it); lifetimes end cleanly (idle timeout, disconnects, slow readers, graceful shutdown) and leave
nothing behind."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import gc
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import tiny_streaming_model
from omegaconf import OmegaConf
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from fastdecode_lab import synthetic as S
from nemo_fastdecode.apps import trained_models
from nemo_fastdecode.apps.loadtest.app import run_point
from nemo_fastdecode.apps.loadtest.client import COMPLETED, connect_session, receive_until, session_update
from nemo_fastdecode.apps.loadtest.report import LoadtestResult, format_markdown, read_result
from nemo_fastdecode.apps.loadtest.server_metrics import histogram_quantiles_ms, metrics_url, scrape_histograms
from nemo_fastdecode.apps.models import load_model
from nemo_fastdecode.apps.options import parse_config
from nemo_fastdecode.apps.streaming_reference import reference_transcript
from nemo_fastdecode.apps.wer import word_error_rate_of
from nemo_fastdecode.serve import LimitsConfig, RealtimeServer, ServeConfig, build_engines
from nemo_fastdecode.streaming import EndpointingOptions, StreamingEngine

pytestmark = pytest.mark.usefixtures("single_thread")

RATE = 16000
KEY = "test-key"
WORD_KEYS = ("word", "start", "end", "start_offset", "end_offset")


class ServerThread:
    """A :class:`RealtimeServer` on 127.0.0.1 (any free port), its event loop in a thread of its own."""

    def __init__(
        self,
        model,
        endpointer=None,
        slots: int = 3,
        limits: dict | None = None,
        model_name: str = "tiny-streaming",
        ready_timeout: float = 30.0,
        **options: Any,
    ):
        self.config = ServeConfig(port=0, slots=slots, limits=LimitsConfig(**(limits or {})), **options)
        engines = build_engines(model, self.config)
        self.server = RealtimeServer(engines, self.config, model_name=model_name, endpointer=endpointer)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self.server.start())
        try:
            self.call(self.server.wait_ready(ready_timeout), timeout=ready_timeout + 30)
        except BaseException:
            self.stop()
            raise
        self.url = f"ws://127.0.0.1:{self.server.port}/v1/realtime"
        self.http = f"http://127.0.0.1:{self.server.port}"

    def call(self, coroutine, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self) -> None:
        if not self.server.shutting_down:
            self.call(self.server.shutdown(5.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def settled(self, timeout: float = 5.0) -> bool:
        """No connection, no admitted slot, no engine stream or item (waits for the engine thread's next cycles)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.server
            loop = s.engine_loop
            if not s.connections and s.admission.admitted == 0 and loop.live_streams == 0 and loop.open_lanes == 0:
                return True
            time.sleep(0.01)
        return False

    def tasks(self) -> int:
        return self.call(_count_tasks())


async def _registered_connections(s: ServerThread, count: int, timeout: float = 10.0) -> list:
    """The server's connections once ``count`` are registered (its handler registers one just after the handshake
    the client has already seen complete)."""
    deadline = time.monotonic() + timeout
    while len(s.server.connections) < count:
        assert time.monotonic() < deadline, f"{len(s.server.connections)} connections registered, expected {count}"
        await asyncio.sleep(0.01)
    return list(s.server.connections.values())


async def _count_tasks() -> int:
    return len(asyncio.all_tasks())


@pytest.fixture(scope="module")
def model():
    return tiny_streaming_model()


@pytest.fixture(scope="module")
def audio() -> list[np.ndarray]:
    signals = S.synthetic_audio([1.9, 2.6, 1.3], seed=11)
    return [np.round(s * 32768).astype(np.int16) for s in signals]


@pytest.fixture(scope="module")
def refs(model, audio):
    out = [reference_transcript(model, pcm) for pcm in audio]
    assert all(r.token_ids for r in out)  # there is something to compare
    return out


@pytest.fixture(scope="module")
def trained_model():
    """The default model of the server and the load generator: the shipped trained cache-aware hybrid."""
    return load_model("trained-streaming")


@pytest.fixture(scope="module")
def examples() -> list[tuple[np.ndarray, str]]:
    """The shipped example utterances: int16 PCM and reference text."""
    import soundfile as sf

    return [(sf.read(e["audio_filepath"], dtype="int16")[0], e["text"]) for e in trained_models.example_entries()]


@pytest.fixture(scope="module")
def server(model):
    s = ServerThread(model, slots=3, api_key=KEY, limits={"max_message_bytes": 64 * 1024})
    yield s
    s.stop()


def run(coroutine, timeout: float = 60.0):
    async def bounded():
        return await asyncio.wait_for(coroutine, timeout)

    return asyncio.run(bounded())


def words_of(words: list[dict]) -> list[dict]:
    return [{k: w[k] for k in WORD_KEYS} for w in words]


def check_completed(event: dict, ref, pcm: np.ndarray) -> None:
    assert event["type"] == COMPLETED
    assert event["transcript"] == ref.text
    assert words_of(event["words"]) == words_of(ref.words)
    assert event["usage"]["seconds"] == len(pcm) / RATE  # every sample sent was transcribed


def check_clients(plans: list[list[np.ndarray]], results: list[list[dict]], expected: list[list]) -> None:
    """Each client's events (``results[i]``, from streaming the items ``plans[i]``): one final per committed item, in
    order and chained by ``previous_item_id``, each NeMo's streaming of that item alone (``expected[i]``), no error,
    and deltas only of those items."""
    for items, events, refs in zip(plans, results, expected, strict=True):
        committed = [e for e in events if e["type"] == "input_audio_buffer.committed"]
        completed = [e for e in events if e["type"] == COMPLETED]
        assert [e["item_id"] for e in completed] == [e["item_id"] for e in committed]
        assert [e["previous_item_id"] for e in committed] == [None] + [e["item_id"] for e in committed[:-1]]
        for event, ref, pcm in zip(completed, refs, items, strict=True):
            check_completed(event, ref, pcm)
        assert not [e for e in events if e["type"] == "error"]
        deltas = [e for e in events if e["type"].endswith(".delta")]
        assert all(e["item_id"] in {c["item_id"] for c in completed} for e in deltas)
        for event in completed:  # a client that builds the text from the deltas gets the final transcript
            assert "".join(e["delta"] for e in deltas if e["item_id"] == event["item_id"]) == event["transcript"]


def append(pcm: np.ndarray | bytes) -> str:
    data = pcm if isinstance(pcm, bytes) else pcm.tobytes()
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(data).decode()})


async def stream_items(url: str, items: list[np.ndarray], seed: int, key: str | None = KEY) -> list[dict]:
    """One client: each item in random pieces (base64 and binary frames, odd byte counts), then a commit; returns
    every event after ``session.updated``, up to the last item's ``completed``."""
    rng = np.random.default_rng(seed)
    ws, created = await connect_session(url, key, rate=RATE)
    async with ws:
        assert created["type"] == "session.created"
        assert created["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}  # OpenAI's
        await ws.send(session_update(RATE))
        assert json.loads(await ws.recv())["type"] == "session.updated"
        receiver = asyncio.create_task(
            receive_until(ws, lambda e: e["type"] == COMPLETED and e["item_id"].endswith(f"_{len(items) - 1}"), 60)
        )
        for pcm in items:
            data = pcm.tobytes()
            cuts = np.sort(rng.choice(np.arange(1, len(data)), size=12, replace=False))
            for k, piece in enumerate(np.split(np.frombuffer(data, np.uint8), cuts)):
                await ws.send(piece.tobytes() if k % 2 else append(piece.tobytes()))
                await asyncio.sleep(float(rng.uniform(0, 0.03)))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        return await receiver


# ----------------------------------------------------------------------------------------------
# exactness


SPLIT = 17000  # where the second client's audio is cut into two items


async def session_once_a_slot_frees(url: str, key: str | None) -> Any:
    """A session on ``url`` as soon as the server admits one again (a slot frees just after its client closes):
    retried for up to about 2 s; its WebSocket."""
    for _ in range(100):
        ws, first = await connect_session(url, key, rate=RATE)
        if first["type"] == "session.created":
            return ws
        await asyncio.sleep(0.02)
    raise AssertionError(f"no session once a slot was freed; the last answer: {first}")


def three_concurrent_clients(url: str, model, audio, refs) -> list[list[dict]]:
    """Three clients at once on ``url``, the second with two items (``audio[1]`` cut at :data:`SPLIT`); checks that each
    final is NeMo's streaming of that audio alone (:func:`check_clients`); returns each client's events."""
    head, tail = audio[1][:SPLIT], audio[1][SPLIT:]
    part_refs = [reference_transcript(model, head), reference_transcript(model, tail)]
    plans = [[audio[0]], [head, tail], [audio[2]]]

    async def clients():
        return await asyncio.gather(*(stream_items(url, items, seed) for seed, items in enumerate(plans)))

    results = run(clients())
    check_clients(plans, results, [[refs[0]], part_refs, [refs[2]]])
    return results


def test_concurrent_clients_get_exactly_their_own_transcripts(server, model, audio, refs):
    """Three clients at once, one with two items: each final is NeMo's streaming of that audio alone."""
    results = three_concurrent_clients(server.url, model, audio, refs)
    second = [e for e in results[1] if e["type"] == COMPLETED][1]
    assert second["audio_start_ms"] == round(SPLIT / RATE * 1000)  # where item 2 starts in the connection's audio
    assert server.settled()


def test_loadtest_clients_are_exact_end_to_end(server, model, audio, refs):
    """The load generator against the server: paced clients, staggered, every final checked."""
    from nemo_fastdecode.apps.configs import LoadtestConfig

    config = LoadtestConfig(url=server.url, api_key=KEY, clients=3, stagger_seconds=0.3, chunk_ms=100, binary=False)
    point = run_point(config, audio[:2], 3, [[r] for r in refs[:2]])
    assert (point.completed, point.errors, point.refused, point.exact, point.checked) == (3, 0, {}, 3, 3)
    assert point.final_latency_ms[50] > 0 and point.rtf_mean > 0.5
    assert point.partials > 0  # partials were timed
    # the server's own view of the point, from its /metrics: cycles ran and chunks were timed
    assert point.server_ms is not None and point.server_ms["cycle"] is not None and point.server_ms["chunk"] is not None
    assert 0 < point.server_ms["chunk"][50] <= point.server_ms["chunk"][95]
    report = format_markdown(LoadtestResult(config=dataclasses.asdict(config), environment={}, points=[point]))
    assert "the server's /metrics" in report and f"{point.partials} partials timed" in report
    assert server.settled()


def test_loadtest_clients_at_24khz_get_the_finals_of_their_audio_resampled_to_the_models_rate(server, model, audio):
    """``input_rate=24000`` (OpenAI's default): the clients send 24 kHz PCM16, the server resamples it on its device;
    each final equals NeMo's streaming of the client's audio resampled to 16 kHz by scipy's polyphase resampler."""
    from nemo_fastdecode.apps.configs import LoadtestConfig
    from nemo_fastdecode.apps.loadtest.app import resampled

    config = LoadtestConfig(url=server.url, api_key=KEY, clients=2, stagger_seconds=0.2, chunk_ms=100, input_rate=24000)
    inputs = [np.round(resampled(pcm / 32768, RATE, 24000) * 32768).astype(np.int16) for pcm in audio[:2]]
    refs = [reference_transcript(model, resampled(pcm / 32768, 24000, RATE).astype(np.float32)) for pcm in inputs]
    assert all(r.token_ids for r in refs)  # there is something to compare
    point = run_point(config, inputs, 2, [[r] for r in refs])
    assert (point.completed, point.errors, point.refused, point.exact, point.checked) == (2, 0, {}, 2, 2)
    assert server.settled()


def test_g711_clients_get_the_finals_of_their_audio_decoded_and_resampled(trained_model, examples):
    """``audio/pcmu`` and ``audio/pcma`` (G.711 at 8 kHz, as telephony sends): each final equals NeMo's streaming of
    the bytes decoded as the ITU-T tables do (``audioop``) and resampled to 16 kHz by scipy's polyphase resampler."""
    audioop = pytest.importorskip("audioop")  # the reference codec (in the standard library up to Python 3.12)
    from nemo_fastdecode.apps.loadtest.app import resampled

    pcm8 = [np.round(resampled(pcm / 32768, RATE, 8000) * 32767).astype(np.int16) for pcm, _ in examples[:2]]
    cases = [("audio/pcmu", audioop.lin2ulaw, audioop.ulaw2lin), ("audio/pcma", audioop.lin2alaw, audioop.alaw2lin)]
    sent, refs = [], []
    for (_, encode, decode), pcm in zip(cases, pcm8, strict=True):
        sent.append(encode(pcm.tobytes(), 2))
        decoded = np.frombuffer(decode(sent[-1], 2), dtype=np.int16) / 32768
        refs.append(reference_transcript(trained_model, resampled(decoded, 8000, RATE).astype(np.float32)))
    assert all(r.token_ids for r in refs)  # there is something to compare
    s = ServerThread(trained_model, slots=2, model_name="trained-streaming")
    try:

        async def client(audio_format: str, data: bytes) -> list[dict]:
            ws, _ = await connect_session(s.url)
            async with ws:
                update = {"type": "session.update", "session": {"audio": {"input": {"format": {"type": audio_format}}}}}
                await ws.send(json.dumps(update))
                updated = json.loads(await ws.recv())
                assert updated["session"]["audio"]["input"]["format"] == {"type": audio_format}
                for start in range(0, len(data), 1600):  # 200 ms messages, base64 and binary
                    piece = data[start : start + 1600]
                    await ws.send(piece if start % 3200 else append(piece))
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                return await receive_until(ws, lambda e: e["type"] == COMPLETED, 60)

        async def both():
            return await asyncio.gather(*(client(fmt, data) for (fmt, _, _), data in zip(cases, sent, strict=True)))

        for events, ref, data in zip(run(both()), refs, sent, strict=True):
            assert events[-1]["transcript"] == ref.text
            assert words_of(events[-1]["words"]) == words_of(ref.words)
            assert events[-1]["usage"]["seconds"] == len(data) / 8000  # one byte a sample
    finally:
        s.stop()


def test_loadtest_point_says_where_in_their_items_the_timed_partials_fall():
    """A model that emits only at a stream's start would time stream starts only: the point counts the partials
    timed and the share of them past their item's first second."""
    from nemo_fastdecode.apps.configs import LoadtestConfig
    from nemo_fastdecode.apps.loadtest.client import ClientResult
    from nemo_fastdecode.apps.loadtest.report import summarize

    results = [
        ClientResult(0, 0, 3.0, chunk_latency_ms=[10.0, 20.0, 30.0], partial_audio_ms=[480.0, 1000.0, 2400.0]),
        ClientResult(1, 0, 3.0, chunk_latency_ms=[40.0], partial_audio_ms=[1040.0]),
        ClientResult(2, 0, 3.0, refused=1013),
    ]
    point = summarize(3, results, 10.0, None)
    assert (point.partials, point.late_partial_share) == (4, 0.5)
    report = format_markdown(
        LoadtestResult(config=dataclasses.asdict(LoadtestConfig()), environment={}, points=[point])
    )
    assert "3 clients: 4 partials timed, 50.0% of them past their item's first second of audio" in report


def test_loadtest_clients_committing_turn_by_turn_get_each_item_exactly(server, model, audio):
    """``commit_every_seconds``: each client's input goes as several items; each item's final is NeMo's streaming of
    that item's audio alone (the references cut where the clients commit)."""
    from nemo_fastdecode.apps.configs import LoadtestConfig
    from nemo_fastdecode.apps.loadtest.client import item_ends

    config = LoadtestConfig(url=server.url, api_key=KEY, clients=3, stagger_seconds=0.3, commit_every_seconds=0.8)
    cuts = [item_ends(len(pcm), RATE, config.chunk_ms, config.commit_every_seconds) for pcm in audio[:2]]
    assert [len(c) for c in cuts] == [3, 4]  # 1.9 s and 2.6 s in 0.8 s items
    refs = [
        [reference_transcript(model, pcm[a:b]) for a, b in zip([0, *c[:-1]], c, strict=True)]
        for pcm, c in zip(audio, cuts, strict=False)
    ]
    assert all(any(r.token_ids for r in items) for items in refs)  # there is something to compare
    point = run_point(config, audio[:2], 3, refs)
    assert (point.completed, point.errors, point.refused, point.exact, point.checked) == (3, 0, {}, 3, 3)
    assert len(point.final_latency_ms) == 3 and point.final_latency_ms[50] > 0
    assert server.settled()


def test_loadtest_client_processes_start_their_clients_on_schedule(server, audio, refs):
    """With client processes (each takes seconds to import, longer than the stagger), every client still connects
    at its scheduled start: the processes are all up before the first start is fixed, so the load stays staggered
    instead of arriving all at once."""
    from nemo_fastdecode.apps.configs import LoadtestConfig

    config = LoadtestConfig(
        url=server.url, api_key=KEY, clients=3, processes=2, stagger_seconds=1.0, chunk_ms=100, binary=True
    )
    point = run_point(config, audio[:2], 3, [[r] for r in refs[:2]])  # the server has 3 slots
    assert (point.completed, point.errors, point.refused, point.exact, point.checked) == (3, 0, {}, 3, 3)
    assert point.start_lag_ms[50] > 0
    assert point.start_lag_ms[99] < 1500, point.start_lag_ms  # a start after the imports would lag by seconds
    assert server.settled()


def test_the_default_loadtest_streams_the_examples_to_the_trained_model_exactly(trained_model, examples, tmp_path):
    """``nemo-fastdecode loadtest`` with its defaults against a server of the default model: every example utterance
    once, each final NeMo's cache-aware streaming of it alone, and real words (WER against the reference texts)."""
    from nemo_fastdecode.apps.configs import LoadtestConfig
    from nemo_fastdecode.apps.loadtest.app import load_inputs
    from nemo_fastdecode.apps.loadtest.app import run as loadtest

    s = ServerThread(trained_model, slots=len(examples), model_name="trained-streaming")
    try:
        config = LoadtestConfig(url=s.url, stagger_seconds=0.3, output_dir=str(tmp_path))
        inputs, texts = load_inputs(config)
        assert [len(p) for p in inputs] == [len(pcm) for pcm, _ in examples] and texts == [t for _, t in examples]
        result = loadtest(config)
        assert s.settled()
    finally:
        s.stop()
    (point,) = result.points
    assert config.model == "trained-streaming" and point.clients == len(examples)
    assert (point.completed, point.errors, point.refused, point.exact, point.checked) == (6, 0, {}, 6, 6)
    assert result.passed and point.scored == 6 and point.wer is not None and point.wer <= 0.15  # held-out voices
    markdown = format_markdown(result)
    assert f"WER {100 * point.wer:.2f}% of the finals against the reference texts (6 finals)" in markdown
    assert json.loads((tmp_path / "loadtest.json").read_text())["points"][0]["wer"] == point.wer
    assert format_markdown(read_result(tmp_path / "loadtest.json")) == markdown  # the JSON reads back whole


def test_the_deltas_of_an_item_add_up_to_its_final_transcript(trained_model, examples):
    """A client that builds the text from the deltas gets the final transcript: the text of the stream's last chunk
    comes as a last delta before ``completed`` (the trained model on an example utterance, whose final adds words)."""
    s = ServerThread(trained_model, slots=2, model_name="trained-streaming")
    try:
        events = run(stream_items(s.url, [examples[0][0]], seed=3, key=None))
        assert s.settled()
    finally:
        s.stop()
    (completed,) = [e for e in events if e["type"] == COMPLETED]
    deltas = [e["delta"] for e in events if e["type"].endswith(".delta")]
    assert completed["transcript"] == examples[0][1] and len(deltas) > 1  # something to add up
    assert "".join(deltas) == completed["transcript"]
    assert events.index(completed) > max(i for i, e in enumerate(events) if e["type"].endswith(".delta"))


def test_a_synthetic_loadtest_model_gets_synthetic_audio_and_no_wer():
    from nemo_fastdecode.apps.configs import LoadtestConfig
    from nemo_fastdecode.apps.loadtest.app import load_inputs

    inputs, texts = load_inputs(LoadtestConfig(model="tiny-streaming", synthetic_seconds=[1.0, 0.5]))
    assert [len(p) for p in inputs] == [RATE, RATE // 2] and texts == [None, None]
    inputs, texts = load_inputs(LoadtestConfig(max_audio_seconds=2.0))  # cut examples: their texts no longer match
    assert max(len(p) for p in inputs) == 2 * RATE and texts[3] is not None and texts[0] is None


def test_server_histogram_quantiles_are_the_observations_between_two_scrapes():
    before = {"cycle": {0.01: 5.0, 0.05: 5.0, float("inf"): 5.0}, "chunk": {0.01: 0.0, 0.05: 0.0, float("inf"): 0.0}}
    after = {"cycle": {0.01: 5.0, 0.05: 14.0, float("inf"): 15.0}, "chunk": {0.01: 0.0, 0.05: 0.0, float("inf"): 0.0}}
    quantiles = histogram_quantiles_ms(before, after)
    # 10 cycles between the scrapes: 9 in (10, 50] ms, 1 above the last finite bucket
    assert quantiles["cycle"] == {50: 50.0, 95: float("inf")}
    assert quantiles["chunk"] is None  # nothing observed
    assert metrics_url("ws://127.0.0.1:8000/v1/realtime") == "http://127.0.0.1:8000/metrics"
    with pytest.raises(ValueError, match="valid schemes: ws, wss"):
        metrics_url("http://127.0.0.1:8000/v1/realtime")
    assert scrape_histograms("http://127.0.0.1:9/metrics", timeout=1.0) is None  # nothing listens there


# ----------------------------------------------------------------------------------------------
# refusals


def test_health_ready_metrics_and_unknown_paths(server):
    assert urllib.request.urlopen(server.http + "/health").read() == b"ok\n"
    assert urllib.request.urlopen(server.http + "/ready").read() == b"ready\n"
    metrics = urllib.request.urlopen(server.http + "/metrics").read().decode()
    for name in ("open_streams", "cycle_seconds_bucket", "chunk_latency_seconds", "refusals", "gpu_memory_bytes"):
        assert f"nemo_fastdecode_{name}" in metrics
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(server.http + "/v2/elsewhere")


def test_a_full_server_refuses_with_1013_and_an_error_naming_the_capacity(server):
    async def scenario():
        held = [await connect_session(server.url, KEY, rate=RATE) for _ in range(3)]
        assert all(first["type"] == "session.created" for _, first in held)
        ws, first = await connect_session(server.url, KEY, rate=RATE)
        assert first["type"] == "error" and first["error"]["code"] == "server_at_capacity"
        assert "all 3 stream slots" in first["error"]["message"]
        await ws.wait_closed()
        assert ws.close_code == 1013
        await held[0][0].close()  # a slot frees: the next client is served
        ws = await session_once_a_slot_frees(server.url, KEY)
        for w in [ws] + [w for w, _ in held[1:]]:
            await w.close()

    run(scenario())
    assert server.settled()


@pytest.mark.parametrize("how", ["none", "wrong bearer", "wrong subprotocol"])
def test_a_missing_or_wrong_api_key_is_refused_with_1008_before_any_audio(server, how):
    async def scenario():
        headers = {"Authorization": "Bearer nope"} if how == "wrong bearer" else None
        protocols = ["realtime", "openai-insecure-api-key.nope"] if how == "wrong subprotocol" else None
        ws = await connect(server.url, additional_headers=headers, subprotocols=protocols)
        with contextlib.suppress(ConnectionClosed):
            await ws.send(append(b"\x00\x01" * 100))  # never read
        first = json.loads(await ws.recv())
        await ws.wait_closed()
        return first, ws.close_code

    first, code = run(scenario())
    assert (first["type"], first["error"]["code"], code) == ("error", "invalid_api_key", 1008)
    assert server.settled()


def test_the_browser_subprotocol_key_is_accepted(server):
    async def scenario():
        protocols = ["realtime", f"openai-insecure-api-key.{KEY}"]
        async with connect(server.url, subprotocols=protocols) as ws:
            return ws.subprotocol, json.loads(await ws.recv())["type"]

    assert run(scenario()) == ("realtime", "session.created")


def test_bad_messages_get_error_events_and_the_connection_survives(server, audio, refs):
    """Malformed JSON, unknown and unsupported events, bad fields, wrong formats, oversized messages, empty commits:
    one error event each (with its code and the field at fault), and the session goes on, exact."""
    bad = [
        ("{not json", "invalid_json", None),
        ("[1, 2]", "invalid_event", "type"),
        (json.dumps({"type": "input_audio_buffer.explode"}), "unknown_event_type", "type"),
        (json.dumps({"type": "response.create"}), "unsupported_event", "type"),
        (json.dumps({"type": "input_audio_buffer.append"}), "invalid_event", "audio"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "%%%"}), "invalid_audio", "audio"),
        (json.dumps({"type": "input_audio_buffer.commit"}), "input_audio_buffer_commit_empty", None),
        (
            json.dumps({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/opus"}}}}}),
            "unsupported_audio_format",
            "session.audio.input.format.type",
        ),
        (
            json.dumps({"type": "session.update", "session": {"audio": {"input": {"format": {"rate": 11000}}}}}),
            "unsupported_audio_format",
            "session.audio.input.format.rate",
        ),
        (
            json.dumps({"type": "transcription_session.update", "session": {"input_audio_format": "g729"}}),
            "unsupported_audio_format",
            "session.input_audio_format",
        ),
        (
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"audio": {"input": {"format": {"type": "audio/pcmu", "rate": RATE}}}},
                }
            ),
            "unsupported_audio_format",
            "session.audio.input.format.rate",
        ),
        (
            json.dumps(
                {"type": "session.update", "session": {"audio": {"input": {"transcription": {"delay": "now"}}}}}
            ),
            "invalid_value",
            "session.audio.input.transcription.delay",
        ),
        (
            json.dumps(
                {"type": "session.update", "session": {"audio": {"input": {"transcription": {"keywords": [" "]}}}}}
            ),
            "invalid_value",
            "session.audio.input.transcription.keywords",  # this model has no tokenizer: no boosting
        ),
        (
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "audio": {"input": {"transcription": {"keywords": ["a"], "boosting": {"phrases": ["a"]}}}}
                    },
                }
            ),
            "invalid_value",
            "session.audio.input.transcription.keywords",
        ),
        (
            json.dumps({"type": "session.update", "session": {"turn_detection": {"type": "server_vad"}}}),
            "invalid_value",
            "session.turn_detection",
        ),
        (
            json.dumps({"type": "session.update", "session": {"include": ["item.input_audio_transcription.words"]}}),
            "invalid_value",
            "session.include.0",
        ),
        (json.dumps({"type": "session.update", "session": {"voice": "alloy"}}), "invalid_event", "session.voice"),
        (append(b"\x00" * 60_000), "message_too_large", None),  # base64: 80 kB, over the 64 KiB limit
        # 30,000 characters of 3 bytes each: 90 kB of UTF-8, over the 64 KiB limit (a limit in bytes, not characters)
        (
            json.dumps({"type": "session.update", "session": {"x": "\u20ac" * 30_000}}, ensure_ascii=False),
            "message_too_large",
            None,
        ),  # fmt: skip
        # 10 kB nested 5,000 deep: deeper than the JSON parser's recursion limit
        ('{"type": "session.update", "session": ' + "[" * 5_000 + "]" * 5_000 + "}", "invalid_json", None),
    ]

    async def scenario():
        ws, _ = await connect_session(server.url, KEY, rate=RATE)
        async with ws:
            errors = []
            for message, _, _ in bad:
                await ws.send(message)
                errors.append(json.loads(await ws.recv()))
            await ws.send(audio[2].tobytes())
            await ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c1"}))
            events = await receive_until(ws, lambda e: e["type"] == COMPLETED, 30)
            return errors, events

    errors, events = run(scenario())
    for error, (_, code, param) in zip(errors, bad, strict=True):
        assert error["type"] == "error" and error["error"]["code"] == code, error
        assert error["error"]["param"] == param, error
        assert error["error"]["message"]
    assert "valid: 'audio/pcm', 'audio/pcmu', 'audio/pcma'" in errors[7]["error"]["message"]
    assert "16000" in errors[8]["error"]["message"] and "24000" in errors[8]["error"]["message"]  # the rates taken
    assert "8000 Hz" in errors[10]["error"]["message"]  # G.711's rate
    assert "minimal, low, medium, high, xhigh" in errors[11]["error"]["message"]
    check_completed(events[-1], refs[2], audio[2])  # the rejected 60 kB of zeros are not part of the stream
    assert server.settled()


def test_a_message_over_the_hard_cap_closes_with_1009(server):
    async def scenario():
        ws, _ = await connect_session(server.url, KEY, rate=RATE)
        async with ws:
            await ws.send(b"\x00" * (4 * 64 * 1024 + 2))
            await ws.wait_closed()
            return ws.close_code

    assert run(scenario()) == 1009
    assert server.settled()


# ----------------------------------------------------------------------------------------------
# lifetimes


def test_a_client_that_disconnects_mid_chunk_frees_its_slot_at_once(server, audio):
    async def scenario():
        ws, _ = await connect_session(server.url, KEY, rate=RATE)
        await ws.send(audio[0][:2500].tobytes())  # under one chunk
        await ws.send(audio[0][2500:2501].tobytes()[:1])  # and half a sample
        for _ in range(200):
            if server.server.engine_loop.live_streams == 1:
                break
            await asyncio.sleep(0.01)
        assert server.server.engine_loop.live_streams == 1
        ws.transport.abort()  # no close frame: the TCP connection just ends

    run(scenario())
    start = time.monotonic()
    assert server.settled(timeout=2.0)
    assert time.monotonic() - start < 1.0


def test_a_connect_disconnect_storm_leaves_no_slots_tasks_or_memory_behind(server, audio):
    """1,000 connections (some with audio, some dropped mid-chunk): afterwards nothing is held."""
    run(_cycles(server, 30))  # warm: lazily created objects exist before the baseline
    assert server.settled()
    gc.collect()
    tasks, objects = server.tasks(), len(gc.get_objects())
    start = time.monotonic()
    run(_cycles(server, 1000), timeout=120)
    elapsed = time.monotonic() - start
    assert server.settled()
    gc.collect()
    assert server.tasks() <= tasks
    assert len(gc.get_objects()) - objects < 5000, "objects grew with the number of connections"
    print(f"1000 connect/disconnect cycles: {elapsed:.1f} s")


async def _cycles(s: ServerThread, n: int, at_once: int = 3) -> None:
    pcm = np.zeros(1200, dtype=np.int16).tobytes()

    async def one(k: int) -> None:
        ws, first = await connect_session(s.url, KEY, rate=RATE)
        assert first["type"] == "session.created"
        if k % 4 == 1:
            await ws.send(pcm)
        if k % 4 == 2:
            await ws.send(pcm)
            ws.transport.abort()
            return
        await ws.close()

    for base in range(0, n, at_once):
        await asyncio.gather(*(one(k) for k in range(base, min(n, base + at_once))))
        for _ in range(1000):  # the server's side of the closes: slots back before the next batch
            if s.server.admission.admitted == 0:
                break
            await asyncio.sleep(0.001)


def test_idle_connections_get_the_final_of_their_audio_then_close(model, audio, refs):
    s = ServerThread(model, slots=1, idle_timeout_seconds=0.8)
    try:

        async def scenario():
            ws, _ = await connect_session(s.url, rate=RATE)
            async with ws:
                await ws.send(audio[2].tobytes())  # never committed
                events = await receive_until(ws, lambda e: e["type"] == "error", 30)
                await ws.wait_closed()
                return events, ws.close_code

        events, code = run(scenario())
        kinds = [e["type"] for e in events if not e["type"].endswith(".delta")]
        assert kinds == ["input_audio_buffer.committed", COMPLETED, "error"]
        check_completed(events[-2], refs[2], audio[2])
        assert events[-1]["error"]["code"] == "idle_timeout" and code == 1000
        assert s.settled()
    finally:
        s.stop()


def test_a_slow_reader_is_told_and_closed_with_bounded_buffering(model):
    """A client that never reads: at most ``max_outgoing_events`` wait for it (the server stops reading it once half
    of them wait: the replies to its messages back-pressure it), then its pong is overdue: an error and the close."""
    limits = {"max_outgoing_events": 8, "write_buffer_bytes": 1024, "slow_reader_seconds": 1.0}
    s = ServerThread(model, slots=1, limits=limits)
    slow = s.server.metrics.refusals.labels("slow_reader")
    try:

        async def scenario():
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small TCP window
            sock.connect(("127.0.0.1", s.server.port))
            ws = await connect(s.url, sock=sock, max_queue=1)
            (connection,) = await _registered_connections(s, 1)
            connection.ws.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            sent, most_queued = 0, 0
            deadline = time.monotonic() + 20
            with contextlib.suppress(ConnectionClosed):
                while time.monotonic() < deadline and not slow._value.get():
                    try:  # each one an error event it does not read
                        await asyncio.wait_for(ws.send("{not json"), 0.2)
                    except asyncio.TimeoutError:  # the server no longer reads it: TCP holds the sends back
                        continue
                    finally:
                        most_queued = max(most_queued, connection._out.qsize())
                    sent += 1
                    await asyncio.sleep(0)
            events = []  # now it reads: what was sent before the close, then the close
            with contextlib.suppress(ConnectionClosed):
                while True:
                    events.append(json.loads(await asyncio.wait_for(ws.recv(), 10.0)))
            return sent, most_queued, events, ws.close_code

        sent, most_queued, events, code = run(scenario())
        assert most_queued <= 8
        assert slow._value.get() == 1
        assert events[0]["type"] == "session.created"
        assert {e["error"]["code"] for e in events[1:]} <= {"invalid_json", "slow_reader"}
        assert code in (1008, 1006)  # 1006: the close frame could not be written either, the socket was dropped
        if code == 1008:
            assert events[-1]["error"]["code"] == "slow_reader"
        assert s.settled()
    finally:
        s.stop()


def shut_down_with_two_clients(s: ServerThread, sessions, audio, refs) -> None:
    """Two clients (``await sessions()``: their two open sessions) send ``audio[0]`` and ``audio[2]`` without a
    commit, then the server shuts down: each gets the final of its audio (``refs``), then the ``server_shutting_down``
    error and close 1001; afterwards nothing listens."""

    async def client(ws, pcm: np.ndarray, events_out: list) -> int:
        async with ws:
            await ws.send(pcm.tobytes())  # not committed: the shutdown commits it
            events_out += await receive_until(ws, lambda e: e["type"] == "error", 30)
            await ws.wait_closed()
            return ws.close_code

    async def scenario():
        got = [[], []]
        held = await sessions()
        clients = [
            asyncio.create_task(client(ws, audio[i], got[k]))
            for k, (ws, i) in enumerate(zip(held, (0, 2), strict=True))
        ]
        for _ in range(300):
            if s.server.engine_loop.live_streams == 2:
                break
            await asyncio.sleep(0.01)
        shutdown = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(s.server.shutdown(20.0), s.loop))
        codes = await asyncio.gather(*clients)
        await shutdown
        return got, codes

    got, codes = run(scenario())
    assert codes == [1001, 1001]
    for events, i in zip(got, (0, 2), strict=True):
        completed = [e for e in events if e["type"] == COMPLETED]
        assert len(completed) == 1
        check_completed(completed[0], refs[i], audio[i])
        assert events[-1]["error"]["code"] == "server_shutting_down"
    with pytest.raises((OSError, InvalidStatus)):  # no longer listening
        run(connect_session(s.url, rate=RATE), timeout=5)


def test_graceful_shutdown_delivers_every_final_then_closes_1001(model, audio, refs):
    s = ServerThread(model, slots=2)

    async def sessions():
        return [(await connect_session(s.url, rate=RATE))[0] for _ in range(2)]

    try:
        shut_down_with_two_clients(s, sessions, audio, refs)
    finally:
        s.stop()


def test_audio_faster_than_the_rate_limit_is_paced_not_dropped(model, audio, refs):
    s = ServerThread(model, slots=1, limits={"max_audio_rate": 4.0, "max_audio_burst_seconds": 0.5})
    try:

        async def scenario():
            ws, _ = await connect_session(s.url, rate=RATE)
            async with ws:
                start = time.monotonic()
                for piece in np.array_split(audio[1], 26):  # 2.6 s at once
                    await ws.send(piece.tobytes())
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                events = await receive_until(ws, lambda e: e["type"] == COMPLETED, 30)
                return events, time.monotonic() - start

        events, elapsed = run(scenario())
        assert elapsed >= (2.6 - 0.5) / 4.0 - 0.05  # the reads were held back to 4x real time
        check_completed(events[-1], refs[1], audio[1])
    finally:
        s.stop()


def test_clear_drops_the_buffer_and_the_next_item_is_exact(server, audio, refs):
    async def scenario():
        ws, _ = await connect_session(server.url, KEY, rate=RATE)
        async with ws:
            await ws.send(audio[0][:9000].tobytes())
            await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
            cleared = await receive_until(ws, lambda e: e["type"] == "input_audio_buffer.cleared", 10)
            await ws.send(audio[2].tobytes())
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            return cleared, await receive_until(ws, lambda e: e["type"] == COMPLETED, 30)

    cleared, events = run(scenario())
    assert cleared[-1]["type"] == "input_audio_buffer.cleared"
    check_completed(events[-1], refs[2], audio[2])
    assert events[-1]["audio_start_ms"] == 0  # the cleared audio is not part of the stream
    assert server.settled()


def test_server_vad_maps_to_the_engine_endpointing_hook(model, audio, refs):
    """With an endpointer, ``server_vad`` is accepted and a segment it ends is a server commit + completed item."""
    ended: set[int] = set()

    def endpointer(events):  # ends each stream's first segment at its first partial
        out = [e.stream_id for e in events if not e.is_final and e.stream_id not in ended]
        ended.update(out)
        return out

    s = ServerThread(model, slots=1, endpointer=endpointer)
    try:

        async def scenario():
            ws, _ = await connect_session(s.url, rate=RATE)
            async with ws:
                update = {"type": "session.update", "session": {"turn_detection": {"type": "server_vad"}}}
                await ws.send(json.dumps(update))
                updated = json.loads(await ws.recv())
                await ws.send(audio[1].tobytes())
                # the hook ends segments of items whose audio is still open: commit after its first segment
                first = await receive_until(ws, lambda e: e["type"] == COMPLETED, 30)
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                done = lambda e: e["type"] == COMPLETED and e["item_id"] == "item_1_0.1"  # noqa: E731
                return updated, first + await receive_until(ws, done, 30)

        updated, events = run(scenario())
        assert updated["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        completed = [e for e in events if e["type"] == COMPLETED]
        committed = [e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"]
        assert [e["item_id"] for e in completed] == committed == ["item_1_0", "item_1_0.1"]  # the server's commit
        assert "".join(e["transcript"] for e in completed).replace(" ", "") == refs[1].text.replace(" ", "")
    finally:
        s.stop()


def vad_pcm() -> np.ndarray:
    """Three voiced utterances with pauses of 0.6 s (int16)."""
    voiced = S.synthetic_voiced_audio([0.9, 0.8, 1.0], seed=6)
    gap = np.zeros(round(0.6 * RATE), dtype=np.float32)
    signal = np.concatenate([gap[:4000], voiced[0], gap, voiced[1], gap, voiced[2], gap[:3000]])
    return np.round(signal * 32768).astype(np.int16)


def engine_alone(model, pcm: np.ndarray, options: EndpointingOptions) -> tuple[list, list]:
    """The engine's finals and speech events of the stream alone (one push)."""
    engine = StreamingEngine(model, 1, endpointing=options)
    stream = engine.open()
    engine.push(stream, pcm)
    engine.finish(stream)
    finals, speech = [], []
    while engine.busy:
        finals += [e for e in engine.poll() if e.is_final]
        speech += engine.speech_events
    return finals, speech


def test_vad_true_serves_server_vad_with_speech_events_and_a_commit_per_utterance(model, audio, refs):
    """``vad=true``: a ``server_vad`` session gets ``speech_started`` / ``speech_stopped`` where silero hears them and
    ``committed`` + ``completed`` per utterance, the engine's segments of the stream alone (their text joined: NeMo's
    streaming of the whole audio); a session without turn detection on the same server gets one exact item."""
    pcm = vad_pcm()
    options = EndpointingOptions(vad=True, min_silence_ms=300)
    finals, speech = engine_alone(model, pcm, options)
    assert len(finals) >= 3 and sum(bool(e.token_ids) for e in finals) >= 2  # utterances with text to compare
    assert len(speech) >= 5
    whole = reference_transcript(model, pcm)
    assert whole.token_ids == sum((e.token_ids for e in finals), [])
    s = ServerThread(model, slots=2, vad=True, vad_min_silence_ms=500)  # the session asks for 300 ms
    last_id = f"item_1_0.{len(finals) - 1}"
    try:

        async def vad_client():
            ws, _ = await connect_session(s.url, rate=RATE)
            async with ws:
                turn = {"type": "server_vad", "silence_duration_ms": 300}
                await ws.send(json.dumps({"type": "session.update", "session": {"turn_detection": turn}}))
                updated = json.loads(await ws.recv())
                receiver = asyncio.create_task(
                    receive_until(ws, lambda e: e["type"] == COMPLETED and e["item_id"] == last_id, 60)
                )
                for piece in np.array_split(pcm, 9):
                    await ws.send(piece.tobytes())
                    await asyncio.sleep(0.02)
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                return updated, await receiver

        async def plain_client():
            return await stream_items(s.url, [audio[0]], seed=5, key=None)

        async def both():
            return await asyncio.gather(vad_client(), plain_client())

        (updated, events), plain = run(both())
    finally:
        s.stop()
    assert updated["session"]["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 300
    completed = [e for e in events if e["type"] == COMPLETED]
    committed = [e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"]
    ids = ["item_1_0"] + [f"item_1_0.{k}" for k in range(1, len(finals))]
    assert [e["item_id"] for e in completed] == committed == ids
    assert [e["transcript"] for e in completed] == [e.text for e in finals]
    assert [e["audio_end_ms"] for e in completed[:-1]] == [round(e.end * 1000) for e in finals[:-1]]
    marks = [e for e in events if e["type"].startswith("input_audio_buffer.speech_")]
    expected = [
        (
            "started" if m.started else "stopped",
            round(m.seconds * 1000),
            "item_1_0" + (f".{m.segment}" * bool(m.segment)),
        )
        for m in speech
    ]
    got = [(e["type"].rsplit("_", 1)[1], e.get("audio_start_ms", e.get("audio_end_ms")), e["item_id"]) for e in marks]
    assert got == expected
    for k, item_id in enumerate(ids[:-1]):  # speech stops, then its utterance is committed
        stopped = next(
            i for i, e in enumerate(events) if e["type"].endswith("speech_stopped") and e["item_id"] == item_id
        )
        assert stopped < events.index(
            next(e for e in events if e.get("item_id") == item_id and "committed" in e["type"])
        ), k
    plain_completed = [e for e in plain if e["type"] == COMPLETED]
    assert len(plain_completed) == 1 and not any("speech_" in e["type"] for e in plain)
    check_completed(plain_completed[0], refs[0], audio[0])


def test_the_server_sets_its_gil_switch_interval_while_it_runs_and_restores_it(model):
    before = sys.getswitchinterval()
    assert before != pytest.approx(0.00025)
    s = ServerThread(model, slots=1, gil_switch_interval_ms=0.25)
    try:
        assert sys.getswitchinterval() == pytest.approx(0.00025)
    finally:
        s.stop()
    assert sys.getswitchinterval() == before
    s = ServerThread(model, slots=1, gil_switch_interval_ms=None)  # Python's own, untouched
    try:
        assert sys.getswitchinterval() == before
    finally:
        s.stop()
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match=rf"gil_switch_interval_ms must be > 0 or null, got {bad}"):
            ServeConfig(gil_switch_interval_ms=bad)


def test_server_vad_settings_are_checked(model):
    """``server_vad`` thresholds out of range get ``invalid_value`` naming the field and the valid values; bad
    ``vad`` settings fail at start naming the setting."""
    s = ServerThread(model, slots=1, vad=True)
    try:

        async def scenario():
            ws, _ = await connect_session(s.url, rate=RATE)
            async with ws:
                replies = []
                for turn in ({"threshold": 1.5}, {"silence_duration_ms": -5}):
                    session = {"turn_detection": {"type": "server_vad", **turn}}
                    await ws.send(json.dumps({"type": "session.update", "session": session}))
                    replies.append(json.loads(await ws.recv()))
                return replies

        replies = run(scenario())
    finally:
        s.stop()
    assert [r["error"]["code"] for r in replies] == ["invalid_value"] * 2
    assert replies[0]["error"]["param"] == "session.turn_detection.threshold"
    assert "threshold=1.5 is not valid; valid: a speech probability, 0 to 1" in replies[0]["error"]["message"]
    assert "silence_duration_ms=-5 is not valid; valid: milliseconds >= 0" in replies[1]["error"]["message"]
    with pytest.raises(ValueError, match=r"vad_threshold=2.0 is not a probability; valid: 0 to 1"):
        ServeConfig(vad=True, vad_threshold=2.0)
    with pytest.raises(ValueError, match=r"vad_min_silence_ms=-1.0; valid: a finite number of ms >= 0"):
        ServeConfig(vad_min_silence_ms=-1.0)
    with pytest.raises(SystemExit, match=r"'maybe' is not a valid bool(.|\n)*full_key: vad"):
        parse_config(ServeConfig, ["vad=maybe"], "t")
    config = parse_config(ServeConfig, ["vad=true", "vad_min_silence_ms=300"], "t")
    assert config.endpointing == EndpointingOptions(vad=True, min_silence_ms=300)


def test_an_engine_failure_fails_the_items_and_health(model, audio):
    """A device error in a cycle: every open item gets a ``failed`` event, /health and /ready turn 503."""
    s = ServerThread(model, slots=1)

    def broken_poll(while_stepping=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    try:
        s.server.engine_loop.engine.poll = broken_poll

        async def scenario():
            ws, _ = await connect_session(s.url, rate=RATE)
            async with ws:
                await ws.send(audio[0].tobytes())
                return await receive_until(ws, lambda e: e["type"].endswith(".failed"), 30)

        events = run(scenario())
        assert events[-1]["error"]["code"] == "stream_error" and "RuntimeError" in events[-1]["error"]["message"]
        for path in ("/health", "/ready"):
            with pytest.raises(urllib.error.HTTPError, match="503"):
                urllib.request.urlopen(s.http + path)
    finally:
        s.stop()


# ----------------------------------------------------------------------------------------------
# configuration


def test_serve_yaml_mirrors_the_config_and_overrides_are_checked():
    from pathlib import Path

    yaml = OmegaConf.load(Path(__file__).parents[1] / "configs" / "serve.yaml")
    schema = OmegaConf.structured(ServeConfig)
    OmegaConf.merge(schema, yaml)  # type-checks every value
    assert OmegaConf.to_container(yaml) == OmegaConf.to_container(schema)  # mirrors every key and default
    config = parse_config(ServeConfig, ["port=9001", "att_context_size=[70,1]", "limits.max_outgoing_events=5"], "t")
    assert (config.port, config.att_context_size, config.limits.max_outgoing_events) == (9001, [70, 1], 5)
    with pytest.raises(SystemExit, match="slotz"):
        parse_config(ServeConfig, ["slotz=3"], "t")
    with pytest.raises(SystemExit, match="slots must be >= 1"):
        parse_config(ServeConfig, ["slots=0"], "t")
    from nemo_fastdecode.apps.configs import LoadtestConfig

    yaml = OmegaConf.load(Path(__file__).parents[1] / "configs" / "loadtest.yaml")
    assert OmegaConf.to_container(yaml) == OmegaConf.to_container(OmegaConf.structured(LoadtestConfig))
    assert ServeConfig().model == LoadtestConfig().model == "trained-streaming"  # the server's and its load's default
    with pytest.raises(ValueError, match="loopback"):
        LoadtestConfig(url="ws://10.0.0.1:8000/v1/realtime")


def start_serve_process(
    args: list[str], ready_within: float, module: str = "nemo_fastdecode"
) -> tuple[subprocess.Popen, str]:
    """``python -m <module> serve *args`` (``fastdecode_lab`` for the lab's synthetic presets) from the repository root, and the line it prints once ready
    (``... ready on ws://...``); fails, the process killed, if it ends first or is not ready within ``ready_within`` s.
    Once it returns, the caller stops the process."""
    server = subprocess.Popen(
        [sys.executable, "-m", module, "serve", *args],
        cwd=Path(__file__).parents[1],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + ready_within
        while time.monotonic() < deadline:
            line = server.stdout.readline()
            assert line, "the server ended before it was ready"
            if "ready on " in line:
                return server, line
        raise AssertionError(f"the server was not ready within {ready_within} s")
    except BaseException:
        server.kill()
        server.wait()
        raise


def test_the_readme_commands_serve_stream_a_file_and_stop_on_sigterm(tmp_path, audio, trained_model, examples):
    """``python -m nemo_fastdecode serve`` (the default model), then ``scripts/stream_file.py`` with no file (the first
    example utterance: NeMo's streaming of it, real words) and with a file; SIGTERM ends the server (exit 0)."""
    import signal

    import soundfile as sf

    root = Path(__file__).parents[1]
    wav = tmp_path / "speech.wav"
    sf.write(wav, audio[0], RATE, subtype="PCM_16")
    server = None
    try:
        server, ready = start_serve_process(["port=0", "slots=2"], ready_within=120)
        url = ready.split("ready on ")[1].split()[0]
        assert url.startswith("ws://127.0.0.1:")

        def stream_file(*args: str) -> str:
            command = [sys.executable, "scripts/stream_file.py", *args, "--url", url, "--fast"]
            out = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            return out.stdout

        pcm, text = examples[0]
        ref = reference_transcript(trained_model, pcm)
        assert ref.text  # there is something to compare
        out = stream_file()
        assert f"example utterance example_00.wav\nreference: {text!r}" in out and f"final: {ref.text!r}" in out
        assert word_error_rate_of([{"text": text, "pred_text": ref.text}]) <= 0.15
        assert "final: " in stream_file(str(wav))
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    finally:
        if server is not None and server.poll() is None:
            server.kill()
            server.wait()
