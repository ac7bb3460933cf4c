"""The official ``openai`` Python SDK against the server (real sockets on 127.0.0.1): both protocol flavours, every
event the server sends valid under the SDK's own types.

* GA: ``client.realtime.connect`` (no beta header); each event must validate under
  ``pydantic.TypeAdapter(openai.types.realtime.RealtimeServerEvent)``, in strict mode.
* Beta: ``client.beta.realtime.connect`` (``OpenAI-Beta: realtime=v1``, ``intent=transcription``); each event under
  the beta union ``openai.types.beta.realtime.RealtimeServerEvent``. The beta union lacks the
  ``transcription_session.created`` event OpenAI's beta server opens with (it has ``.updated`` only; openai-openapi
  issue 568): that one is validated as a ``TranscriptionSessionUpdatedEvent`` of that type.

The sessions use what a client of OpenAI's API sends: 24 kHz ``audio/pcm`` (the default), ``keywords``, ``delay``,
``language``, server VAD, commits, clears, and one refused message (an ``error`` event).
"""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
from pydantic import TypeAdapter
from scipy.signal import resample_poly
from test_serve import KEY, RATE, ServerThread, run

from nemo_fastdecode.apps import trained_models
from nemo_fastdecode.apps.models import load_model

openai = pytest.importorskip("openai")
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent  # noqa: E402
from openai.types.beta.realtime.transcription_session_updated_event import (  # noqa: E402
    TranscriptionSessionUpdatedEvent,
)
from openai.types.realtime import RealtimeServerEvent  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")

COMPLETED = "conversation.item.input_audio_transcription.completed"
GA_EVENTS = TypeAdapter(RealtimeServerEvent)
BETA_EVENTS = TypeAdapter(BetaServerEvent)
BETA_CREATED = TypeAdapter(TranscriptionSessionUpdatedEvent)


def valid_ga(raw: str | bytes) -> dict:
    """The event, after checking it against the GA SDK's server-event union (strict)."""
    GA_EVENTS.validate_json(raw, strict=True)
    return json.loads(raw)


def valid_beta(raw: str | bytes) -> dict:
    """The event, after checking it against the beta SDK's server-event union (strict)."""
    event = json.loads(raw)
    if event["type"] == "transcription_session.created":  # not in the beta union: its payload is .updated's
        BETA_CREATED.validate_python({**event, "type": "transcription_session.updated"}, strict=True)
    else:
        BETA_EVENTS.validate_json(raw, strict=True)
    return event


@pytest.fixture(scope="module")
def server():
    """The shipped trained model (it has a tokenizer: keywords are boosted), Silero VAD for ``server_vad``."""
    s = ServerThread(load_model("trained-streaming"), slots=2, api_key=KEY, vad=True, vad_min_silence_ms=300)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def pcm16() -> np.ndarray:
    """Two of the shipped example utterances with 0.6 s of silence around and between them: int16 at 16 kHz."""
    import soundfile as sf

    utterances = [sf.read(e["audio_filepath"], dtype="int16")[0] for e in trained_models.example_entries()[:2]]
    gap = np.zeros(round(0.6 * RATE), dtype=np.int16)
    return np.concatenate([gap, utterances[0], gap, utterances[1], gap])


@pytest.fixture(scope="module")
def pcm24(pcm16) -> bytes:
    """``pcm16`` at 24 kHz (OpenAI's rate), int16, resampled by scipy's polyphase resampler."""
    pcm = resample_poly(pcm16.astype(np.float64), 3, 2)
    return np.clip(np.round(pcm), -32768, 32767).astype(np.int16).tobytes()


def client(server: ServerThread) -> openai.AsyncOpenAI:
    ws_base = server.url.removesuffix("/realtime")
    return openai.AsyncOpenAI(api_key=KEY, base_url=f"{server.http}/v1", websocket_base_url=ws_base, max_retries=0)


async def read_until(connection, check, done, timeout: float = 60.0) -> list[dict]:
    """Raw events from the SDK connection, each checked by ``check``, up to the first that ``done`` accepts."""
    events = []

    async def loop():
        while True:
            events.append(check(await connection.recv_bytes()))
            if done(events[-1]):
                return

    await asyncio.wait_for(loop(), timeout)
    return events


async def read_until_quiet(connection, check, quiet: float, timeout: float = 60.0) -> list[dict]:
    """Raw events from the SDK connection, each checked by ``check``, until none came for ``quiet`` seconds and every
    committed item has its final."""
    import asyncio

    events = []
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        try:
            events.append(check(await asyncio.wait_for(connection.recv_bytes(), quiet)))
        except asyncio.TimeoutError:
            committed = {e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"}
            if committed and committed <= {e["item_id"] for e in events if e["type"] == COMPLETED}:
                return events
    raise AssertionError(f"events still to come after {timeout} s: {[e['type'] for e in events]}")


def audio_pieces(pcm: bytes, count: int = 8) -> list[str]:
    step = -(-len(pcm) // count) // 2 * 2
    return [base64.b64encode(pcm[i : i + step]).decode() for i in range(0, len(pcm), step)]


def test_a_ga_session_through_the_sdk_gets_only_events_the_sdk_types_accept(server, pcm24):
    """GA flavour: ``session.created`` with the 24 kHz default, ``session.updated`` with keywords, delay, language
    and server VAD, speech events, committed, deltas, completed, an error and a clear: all valid (strict)."""

    async def scenario():
        async with client(server).realtime.connect(model="nemo", extra_query={"intent": "transcription"}) as conn:
            created = valid_ga(await conn.recv_bytes())
            await conn.input_audio_buffer.commit()  # nothing to commit: an error event
            error = valid_ga(await conn.recv_bytes())
            session = {
                "type": "transcription",
                "include": ["item.input_audio_transcription.logprobs"],
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": 24000},
                        "transcription": {"model": "nemo", "language": "en", "keywords": ["hello"], "delay": "low"},
                        "turn_detection": {"type": "server_vad", "silence_duration_ms": 300},
                    }
                },
            }
            await conn.session.update(session=session)
            updated = valid_ga(await conn.recv_bytes())
            for piece in audio_pieces(pcm24):
                await conn.input_audio_buffer.append(audio=piece)
            await conn.input_audio_buffer.commit()
            events = await read_until_quiet(conn, valid_ga, quiet=3.0)
            await conn.input_audio_buffer.append(audio=audio_pieces(pcm24)[0])
            await conn.input_audio_buffer.clear()
            events += await read_until(conn, valid_ga, lambda e: e["type"] == "input_audio_buffer.cleared")
            return created, error, updated, events

    created, error, updated, events = run(scenario(), timeout=120)
    assert created["type"] == "session.created"
    assert created["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert error["type"] == "error" and error["error"]["code"] == "input_audio_buffer_commit_empty"
    transcription = updated["session"]["audio"]["input"]["transcription"]
    assert (transcription["keywords"], transcription["delay"], transcription["language"]) == (["hello"], "low", "en")
    assert updated["session"]["include"] == ["item.input_audio_transcription.logprobs"]
    finals = [e for e in events if e["type"] == COMPLETED and e["transcript"]]
    assert finals  # something to check
    for final in finals:  # each token's text and log-probability, spelling the transcript
        assert final["logprobs"] and all(
            p["logprob"] <= 0 and p["bytes"] == list(p["token"].encode()) for p in final["logprobs"]
        )
        assert "".join(p["token"] for p in final["logprobs"]).strip() == final["transcript"].strip()
    kinds = {e["type"] for e in events}
    for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.committed", COMPLETED):
        assert kind in kinds, kinds
    assert events[-1]["type"] == "input_audio_buffer.cleared"


def test_a_beta_session_through_the_sdk_gets_only_events_the_beta_types_accept(server, pcm16, pcm24):
    """Beta flavour (``OpenAI-Beta: realtime=v1``): ``transcription_session.created`` and ``.updated`` in the beta
    session shape (``input_audio_format: pcm16``, 24 kHz), then the item's events: all valid (strict)."""

    async def scenario():
        beta = client(server).beta.realtime
        async with beta.connect(model="nemo", extra_query={"intent": "transcription"}) as conn:
            created = valid_beta(await conn.recv_bytes())
            session = {
                "input_audio_format": "pcm16",
                "input_audio_transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                "turn_detection": None,
            }
            await conn.transcription_session.update(session=session)
            updated = valid_beta(await conn.recv_bytes())
            for piece in audio_pieces(pcm24):
                await conn.input_audio_buffer.append(audio=piece)
            await conn.input_audio_buffer.commit()
            events = await read_until(conn, valid_beta, lambda e: e["type"] == COMPLETED)
            return created, updated, events

    created, updated, events = run(scenario(), timeout=120)
    assert created["type"] == "transcription_session.created"
    assert created["session"]["input_audio_format"] == "pcm16"
    assert updated["type"] == "transcription_session.updated"
    assert updated["session"]["input_audio_transcription"]["model"] == "gpt-4o-transcribe"
    assert updated["session"]["turn_detection"] is None
    assert [e["type"] for e in events].count("input_audio_buffer.committed") == 1
    completed = events[-1]
    assert completed["transcript"] and completed["usage"]["seconds"] == pytest.approx(len(pcm16) / RATE, abs=1e-3)
