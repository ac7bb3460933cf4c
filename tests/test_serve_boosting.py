"""Phrase boosting through the server (``session.update`` ``transcription.boosting``), real sockets on 127.0.0.1: a
boosted item's final transcript and word timestamps equal NeMo's per-stream boosting of that audio alone with the
same phrases (the reference of test_streaming_boosting.py), with ``decoding: beam`` NeMo's beam search fusing them
(that of test_streaming_beam_boosting.py); bad boosting settings get ``error`` events naming the field and the value,
and the session goes on."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_serve import RATE, ServerThread, run, words_of
from test_streaming_boosting import WEIGHT, bpe_streaming_model, reference

from fastdecode_lab import synthetic as S
from nemo_fastdecode.apps.loadtest.client import COMPLETED, connect_session, receive_until

pytestmark = pytest.mark.usefixtures("single_thread")

PHRASES = ["the quick", "brown"]


@pytest.fixture(scope="module")
def model():
    return bpe_streaming_model()


@pytest.fixture(scope="module")
def pcm() -> np.ndarray:
    return np.round(S.synthetic_audio([4.0], seed=5)[0] * 32768).astype(np.int16)


def update(boosting, where: str = "audio") -> str:
    """``session.update`` with ``transcription.boosting`` (GA shape: ``audio.input.transcription``; beta:
    ``input_audio_transcription``), PCM16 at 16 kHz, commits by the client."""
    transcription = {"model": "tiny", "boosting": boosting}
    session = {"type": "transcription", "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}}}}
    session["audio"]["input"]["turn_detection"] = None
    if where == "audio":
        session["audio"]["input"]["transcription"] = transcription
    else:
        session["input_audio_transcription"] = transcription
    return json.dumps({"type": "session.update", "session": session})


def test_a_boosted_item_is_nemo_per_stream_boosting_and_null_turns_it_off(model, pcm):
    boosted, plain = reference(model, pcm, PHRASES), reference(model, pcm, None)
    assert boosted[0] and boosted[0] != plain[0], "boosting changes nothing here: the comparison could not fail"
    s = ServerThread(model, slots=2, phrase_boosting=True)
    try:

        async def scenario():
            ws, _ = await connect_session(s.url, rate=RATE)
            async with ws:
                replies, finals = [], []
                for boosting, where in (({"phrases": PHRASES, "weight": WEIGHT}, "audio"), (None, "beta")):
                    await ws.send(update(boosting, where))
                    replies.append(json.loads(await ws.recv()))
                    await ws.send(pcm.tobytes())
                    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                    events = await receive_until(ws, lambda e: e["type"] == COMPLETED, 60)
                    assert not [e for e in events if e["type"] == "error"], events
                    finals.append(events[-1])
                return replies, finals

        replies, finals = run(scenario(), 120)
    finally:
        s.stop()
    reported = replies[0]["session"]["audio"]["input"]["transcription"]["boosting"]
    assert reported["phrases"] == PHRASES and reported["weight"] == WEIGHT and reported["depth_scaling"] == 2.0
    assert replies[1]["session"]["audio"]["input"]["transcription"]["boosting"] is None
    for final, (_, text, words) in zip(finals, (boosted, plain), strict=True):
        assert final["transcript"] == text
        assert words_of(final["words"]) == words_of(words)


def test_keywords_are_boosted_at_the_servers_keywords_weight(model, pcm):
    """OpenAI's ``transcription.keywords``: the item is NeMo's per-stream boosting of those phrases at the server's
    ``keywords_weight``; ``[]`` turns it off; bad keywords get an error naming the one at fault."""
    boosted, plain = reference(model, pcm, PHRASES), reference(model, pcm, None)
    assert boosted[0] and boosted[0] != plain[0], "boosting changes nothing here: the comparison could not fail"
    s = ServerThread(model, slots=1, keywords_weight=WEIGHT, limits={"max_boost_phrase_chars": 20})
    where = "session.audio.input.transcription.keywords"
    try:

        async def scenario():
            ws, _ = await connect_session(s.url, rate=RATE)
            async with ws:
                replies, finals = [], []
                for keywords in (PHRASES, ["x" * 21], []):
                    transcription = {"keywords": keywords}
                    message = {
                        "type": "session.update",
                        "session": {"audio": {"input": {"transcription": transcription}}},
                    }
                    await ws.send(json.dumps(message))
                    replies.append(json.loads(await ws.recv()))
                    if replies[-1]["type"] == "session.updated":
                        await ws.send(pcm.tobytes())
                        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                        finals.append((await receive_until(ws, lambda e: e["type"] == COMPLETED, 60))[-1])
                return replies, finals

        replies, finals = run(scenario(), 120)
    finally:
        s.stop()
    reported = replies[0]["session"]["audio"]["input"]["transcription"]
    assert reported["keywords"] == PHRASES and reported["boosting"]["weight"] == WEIGHT
    assert replies[1]["error"]["param"] == f"{where}.0" and "keywords[0]" in replies[1]["error"]["message"]
    assert replies[2]["session"]["audio"]["input"]["transcription"]["keywords"] is None
    assert [f["transcript"] for f in finals] == [boosted[1], plain[1]]


def test_a_model_without_a_tokenizer_refuses_keywords(pcm):
    """Phrase boosting needs the model's tokenizer: a server whose model has none refuses keywords when they are set,
    naming the field, rather than failing the items later."""
    from conftest import tiny_streaming_model

    s = ServerThread(tiny_streaming_model(), slots=1)
    try:

        async def scenario():
            ws, _ = await connect_session(s.url)
            async with ws:
                transcription = {"keywords": ["hello"]}
                await ws.send(
                    json.dumps(
                        {"type": "session.update", "session": {"audio": {"input": {"transcription": transcription}}}}
                    )
                )
                return json.loads(await ws.recv())

        error = run(scenario(), 60)
    finally:
        s.stop()
    assert error["type"] == "error" and error["error"]["code"] == "invalid_value"
    assert error["error"]["param"] == "session.audio.input.transcription.keywords"
    assert "no tokenizer" in error["error"]["message"]


def test_bad_boosting_settings_get_error_events_naming_the_field(model, pcm):
    where = "session.audio.input.transcription.boosting"
    bad = [
        ({"phrases": []}, "invalid_value", f"{where}.phrases", "has 0 phrases; valid: 1 to 3 phrases"),
        ({"phrases": ["a", "b", "c", "d"]}, "invalid_value", f"{where}.phrases", "has 4 phrases"),
        ({"phrases": ["a", "  "]}, "invalid_value", f"{where}.phrases.1", "phrases[1]='  ' is empty"),
        ({"phrases": ["x" * 21]}, "invalid_value", f"{where}.phrases.0", "has 21 characters; valid: at most 20"),
        ({"phrases": ["a"], "boost": 2}, "invalid_value", f"{where}.boost", "unknown boosting option 'boost'"),
        (
            {"phrases": ["a"], "key_phrases_file": "/etc/passwd"},
            "invalid_value",
            f"{where}.key_phrases_file",
            "'key_phrases_file' (a phrases file; give the phrases as a list) is not supported",
        ),  # fmt: skip
        ({"phrases": ["a"], "model_path": "t.nemo"}, "invalid_value", f"{where}.model_path", "'model_path'"),
        ({"phrases": "brown"}, "invalid_event", f"{where}.phrases", "valid list"),
        ({"phrases": ["a", 3]}, "invalid_event", f"{where}.phrases.1", "valid string"),
        ({"phrases": ["a"], "weight": "heavy"}, "invalid_event", f"{where}.weight", "valid number"),
        ({"phrases": ["a"], "weight": float("inf")}, "invalid_event", f"{where}.weight", "finite"),
    ]
    s = ServerThread(model, slots=1, limits={"max_boost_phrases": 3, "max_boost_phrase_chars": 20})
    try:

        async def scenario():
            ws, _ = await connect_session(s.url, rate=RATE)
            async with ws:
                errors = []
                for boosting, *_ in bad:
                    await ws.send(update(boosting))
                    errors.append(json.loads(await ws.recv()))
                await ws.send(update(None))  # the session goes on, plain
                assert json.loads(await ws.recv())["type"] == "session.updated"
                await ws.send(pcm.tobytes())
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                return errors, await receive_until(ws, lambda e: e["type"] == COMPLETED, 60)

        errors, events = run(scenario(), 120)
    finally:
        s.stop()
    for error, (boosting, code, param, text) in zip(errors, bad, strict=True):
        assert error["type"] == "error" and error["error"]["code"] == code, (boosting, error)
        assert error["error"]["param"] == param, (boosting, error)
        assert text in error["error"]["message"], (boosting, error)
    assert events[-1]["transcript"] == reference(model, pcm, None)[1]


def test_a_boosted_item_with_beam_search_is_nemo_beam_search_fusing_its_phrases(model, pcm):
    """``decoding: beam``: a session's ``transcription.boosting`` reaches the engine as with greedy decoding (each item
    one stream with its own tree); the final transcript and words are NeMo's beam search of that audio alone fusing the
    phrases (the reference of test_streaming_beam_boosting.py)."""
    from test_streaming_beam_boosting import BEAM, beam_reference, final_of

    from nemo_fastdecode.streaming import BoostingOptions

    weight = 1.0
    boosted = final_of(model, beam_reference(model, pcm, BoostingOptions(phrases=tuple(PHRASES), weight=weight)))
    plain = final_of(model, beam_reference(model, pcm, None))
    assert boosted[0] and boosted[0] != plain[0], "boosting changes nothing here: the comparison could not fail"
    s = ServerThread(model, slots=1, decoding="beam", beam_size=BEAM)
    try:

        async def scenario():
            ws, _ = await connect_session(s.url, rate=RATE)
            async with ws:
                await ws.send(update({"phrases": PHRASES, "weight": weight}))
                assert json.loads(await ws.recv())["type"] == "session.updated"
                await ws.send(pcm.tobytes())
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                return await receive_until(ws, lambda e: e["type"] == COMPLETED, 60)

        events = run(scenario(), 120)
    finally:
        s.stop()
    assert not [e for e in events if e["type"] == "error"], events
    assert events[-1]["transcript"] == boosted[1]
    assert words_of(events[-1]["words"]) == words_of(boosted[2])
