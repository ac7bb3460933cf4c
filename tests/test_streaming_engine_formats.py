"""The streaming engine on streams at other rates and formats than the model's 16 kHz PCM, on the shipped trained
model and its example utterances: a 24 kHz int16 stream (OpenAI Realtime's default ``audio/pcm``) and an 8 kHz G.711
mu-law stream (``audio/pcmu``) transcribe exactly as the same audio resampled to 16 kHz by
``scipy.signal.resample_poly`` and pushed as float32, interleaved in one engine, with the same word times."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.signal import resample_poly

from nemo_fastdecode.apps import trained_models
from nemo_fastdecode.apps.models import load_model
from nemo_fastdecode.streaming import StreamingEngine
from nemo_fastdecode.streaming.events import StreamOptions

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def trained_model():
    return load_model("trained-streaming")


@pytest.fixture(scope="module")
def examples() -> list[np.ndarray]:
    """The shipped example utterances: 16 kHz int16 PCM."""
    import soundfile as sf

    return [sf.read(e["audio_filepath"], dtype="int16")[0] for e in trained_models.example_entries()]


def _to_int16(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x), -32768, 32767).astype("<i2")


def _transcribe(model, streams: list[tuple[bytes, StreamOptions, int]], seed: int) -> list:
    """Every stream's last event, all streams open at once in one engine, each pushed in random pieces of about
    20-200 ms of its own audio (``streams``: bytes, options, bytes per second), cycles polled between pushes."""
    rng = np.random.default_rng(seed)
    engine = StreamingEngine(model, num_slots=len(streams))
    ids = [engine.open(options) for _, options, _ in streams]
    sent = [0] * len(streams)
    finals = {}
    while len(finals) < len(streams):
        for i, (data, _, per_second) in enumerate(streams):
            if sent[i] < len(data):
                size = int(rng.uniform(0.02, 0.2) * per_second) + int(rng.integers(0, 2))  # odd sizes: split samples
                engine.push(ids[i], data[sent[i] : sent[i] + size])
                sent[i] += size
                if sent[i] >= len(data):
                    engine.finish(ids[i])
        for event in engine.poll():
            if event.is_last:
                finals[event.stream_id] = event
    return [finals[i] for i in ids]


def _assert_same(ours: list, theirs: list) -> None:
    for a, b in zip(ours, theirs, strict=True):
        assert a.text and b.text  # something to compare
        assert a.text == b.text and a.token_ids == b.token_ids
        assert [(w["word"], w["start_offset"], w["end_offset"]) for w in a.words] == [
            (w["word"], w["start_offset"], w["end_offset"]) for w in b.words
        ]
        assert a.end == pytest.approx(b.end, abs=1e-9)  # seconds of audio, in the model's time base for both


def test_24khz_int16_streams_transcribe_as_their_16khz_resample(trained_model, examples):
    streams, references = [], []
    for pcm in examples:
        pcm24 = _to_int16(resample_poly(pcm.astype(np.float64), 3, 2))  # 24 kHz audio
        back = resample_poly(pcm24.astype(np.float32) / 32768, 2, 3).astype(np.float32)
        streams.append((pcm24.tobytes(), StreamOptions(sample_rate=24000, sample_format="int16"), 48000))
        references.append((back.tobytes(), StreamOptions(sample_rate=16000, sample_format="float32"), 64000))
    finals = _transcribe(trained_model, streams + references, seed=0)
    _assert_same(finals[: len(examples)], finals[len(examples) :])


def test_8khz_mulaw_streams_transcribe_as_their_decoded_16khz_resample(trained_model, examples):
    audioop = pytest.importorskip("audioop")
    streams, references = [], []
    for pcm in examples:
        pcm8 = _to_int16(resample_poly(pcm.astype(np.float64), 1, 2))  # 8 kHz telephone audio
        codes = audioop.lin2ulaw(pcm8.tobytes(), 2)
        decoded = np.frombuffer(audioop.ulaw2lin(codes, 2), dtype="<i2").astype(np.float32) / 32768
        back = resample_poly(decoded, 2, 1).astype(np.float32)
        streams.append((codes, StreamOptions(sample_rate=8000, sample_format="mulaw"), 8000))
        references.append((back.tobytes(), StreamOptions(sample_format="float32"), 64000))
    finals = _transcribe(trained_model, streams + references, seed=1)
    _assert_same(finals[: len(examples)], finals[len(examples) :])


def test_open_refuses_a_rate_not_taken(trained_model):
    engine = StreamingEngine(trained_model, num_slots=1)
    with pytest.raises(ValueError, match=r"sample rate 96000 Hz is not supported; valid: 8000, .* 48000 Hz"):
        engine.open(StreamOptions(sample_rate=96000))
    with pytest.raises(ValueError, match=r"sample format 'g711' is not supported; valid: 'int16', 'float32', 'mulaw'"):
        engine.open(StreamOptions(sample_format="g711"))
    assert engine.open_streams == []  # nothing was opened


@pytest.fixture(scope="module")
def tiny_model():
    from conftest import tiny_streaming_model

    return tiny_streaming_model()


@pytest.mark.parametrize("rate", [8000, 11025, 22050, 32000, 44100, 48000])
def test_bursts_longer_than_a_cycle_at_every_rate(tiny_model, rate):
    """A stream pushed whole at once (seconds of audio, a small ``max_cycle_seconds``) is fed a cycle's seconds of its
    own audio at a time, within the front end's rings whatever its rate; its transcript and end are those of its
    resample_poly'd 16 kHz float32 stream (a tiny random model: any tokens will do)."""
    rng = np.random.default_rng(rate)
    x = np.clip(0.3 * rng.standard_normal(int(1.7 * rate)), -1, 1)
    pcm = _to_int16(x * 32767)
    g = np.gcd(rate, 16000)
    back = resample_poly(pcm.astype(np.float32) / 32768, 16000 // g, rate // g).astype(np.float32)
    finals = []
    for data, options in (
        (pcm.tobytes(), StreamOptions(sample_rate=rate)),
        (back.tobytes(), StreamOptions(sample_format="float32")),
    ):
        engine = StreamingEngine(tiny_model, num_slots=1, max_cycle_seconds=0.1)
        stream = engine.open(options)
        engine.push(stream, data)
        engine.finish(stream)
        events = []
        while not events or not events[-1].is_last:
            events += engine.poll()
        finals.append(events[-1])
    assert finals[0].token_ids == finals[1].token_ids and finals[0].token_ids
    assert finals[0].end == finals[1].end == len(back) / 16000


def test_push_many_takes_g711_int16_and_float32_pushes_as_pushes_one_at_a_time(tiny_model):
    """A network batch of pushes to G.711, 24 kHz int16 and float32 streams (``push_many``: the G.711 and int16 ones go
    in together) counts every stream's samples and transcribes each as pushing them one at a time does."""
    rng = np.random.default_rng(5)
    x = np.clip(0.3 * rng.standard_normal(16000), -1, 1)
    streams = [  # (bytes, options, bytes per 100 ms)
        (
            bytes(rng.integers(0, 256, 8000, dtype=np.uint8)),
            StreamOptions(sample_rate=8000, sample_format="mulaw"),
            800,
        ),
        (bytes(rng.integers(0, 256, 8000, dtype=np.uint8)), StreamOptions(sample_rate=8000, sample_format="alaw"), 800),
        (_to_int16(x * 32767).tobytes() * 2, StreamOptions(sample_rate=24000), 4800),
        (x.astype("<f4").tobytes(), StreamOptions(sample_format="float32"), 6400),
    ]
    finals = []
    for batched in (True, False):
        engine = StreamingEngine(tiny_model, num_slots=len(streams))
        ids = [engine.open(options) for _, options, _ in streams]
        offsets, rounds, alone = [0] * len(streams), 0, []
        push = engine.push
        engine.push = lambda stream_id, audio, alone=alone, push=push: (
            alone.append(stream_id),
            push(stream_id, audio),
        )[1]
        while any(offset < len(data) for offset, (data, _, _) in zip(offsets, streams, strict=True)):
            pieces = [data[o : o + step] for o, (data, _, step) in zip(offsets, streams, strict=True)]
            if batched:
                stops = np.cumsum([len(p) for p in pieces])
                assert engine.push_many(ids, b"".join(pieces), stops - [len(p) for p in pieces], stops) == len(ids)
            else:
                for stream_id, piece in zip(ids, pieces, strict=True):
                    engine.push(stream_id, piece)
            offsets = [o + len(p) for o, p in zip(offsets, pieces, strict=True)]
            rounds += 1
            engine.poll()
        if batched:  # only the float32 pushes went alone (their samples are checked for NaN)
            assert alone == [ids[3]] * rounds
        slots = [engine.streams.slot_of[i] for i in ids]
        assert engine.pcm.samples[slots].tolist() == [8000, 8000, len(streams[2][0]) // 2, 16000]
        for stream_id in ids:
            engine.finish(stream_id)
        last = {}
        while len(last) < len(ids):
            last.update({e.stream_id: e for e in engine.poll() if e.is_last})
        finals.append([last[i] for i in ids])
    assert all(e.token_ids for e in finals[0])  # something to compare
    assert [(e.token_ids, e.end) for e in finals[0]] == [(e.token_ids, e.end) for e in finals[1]]
