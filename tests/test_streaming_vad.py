"""Batched Silero VAD (streaming/vad.py) against the ``silero-vad`` package on each stream alone: the speech
probabilities of its own model run window by window (fp32 rounding apart), the segments of
``get_speech_timestamps`` and the events of ``VADIterator``, whatever the push pattern and however the streams
interleave in the batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastdecode_lab import synthetic as S
from nemo_fastdecode.streaming.events import EndpointingOptions
from nemo_fastdecode.streaming.frontend import AudioFrontEnd
from nemo_fastdecode.streaming.vad import BatchedVAD, SpeechStateMachine, speech_segments

pytestmark = pytest.mark.usefixtures("single_thread")

RATE = 16000
WINDOW = 512
# batching changes the summation order of a few fp32 kernels (observed: up to 1.5e-6)
PROB_ATOL = 1e-5
# two settings, alternated over the streams (per-slot settings in one batch); the second as VADIterator runs
OPTIONS = [
    EndpointingOptions(vad=True, vad_threshold=0.5, min_silence_ms=300, speech_pad_ms=30, min_speech_ms=250),
    EndpointingOptions(vad=True, vad_threshold=0.4, min_silence_ms=100, speech_pad_ms=60, min_speech_ms=0),
]


@pytest.fixture(scope="module")
def silero():
    """silero's own model (importing the package sets torch's thread count to 1: restored)."""
    threads = torch.get_num_threads()
    silero_vad = pytest.importorskip("silero_vad")
    model = silero_vad.load_silero_vad()
    torch.set_num_threads(threads)
    return silero_vad, model


def vad_audio(seed: int = 5) -> list[np.ndarray]:
    """int16 streams: voiced utterances with silences between them, of odd lengths (a partial last window), one of
    shaped noise (no speech), one shorter than a window, one of exactly two windows."""
    voiced = S.synthetic_voiced_audio([1.6, 0.9, 2.2, 0.7, 1.3], seed=seed)
    noise = S.synthetic_audio([1.1], seed=seed)[0]

    def silence(seconds: float) -> np.ndarray:
        return np.zeros(round(seconds * RATE), dtype=np.float32)

    streams = [
        np.concatenate([silence(0.3), voiced[0], silence(0.8), voiced[1], silence(0.45)])[:-37],
        np.concatenate([voiced[2], silence(0.2), voiced[3], silence(1.0), voiced[4][:9001]]),
        noise,
        voiced[1][:300],
        voiced[3][: 2 * WINDOW],
    ]
    return [np.round(s * 32768).astype(np.int16) for s in streams]


def silero_probabilities(model, pcm: np.ndarray) -> np.ndarray:
    """silero's model on one stream alone, window by window as ``get_speech_timestamps`` runs it."""
    audio = torch.from_numpy(pcm.astype(np.float32) / 32768)
    model.reset_states()
    probs = []
    for start in range(0, len(audio), WINDOW):
        chunk = audio[start : start + WINDOW]
        chunk = torch.nn.functional.pad(chunk, (0, WINDOW - len(chunk)))
        probs.append(model(chunk, RATE).item())
    return np.array(probs, dtype=np.float32)


def run_batched(front: AudioFrontEnd, vad: BatchedVAD, streams: list[np.ndarray], rng, options):
    """Streams open as slots free up, push random pieces, and every cycle does what the engine does: append, features,
    VAD. Returns each stream's probabilities and its segments (padded, unpadded) when it ended."""
    waiting = list(range(len(streams)))
    open_slots: dict[int, int] = {}  # slot -> stream
    sent = [0] * len(streams)
    probs: list[list[np.ndarray]] = [[] for _ in streams]
    results = {}
    batches = []
    while waiting or open_slots:
        for slot in range(front.num_slots):
            if slot not in open_slots and waiting and rng.random() < 0.7:
                stream = waiting.pop(0)
                front.open(slot, sample_rate=RATE)
                vad.open(slot, options[stream % len(options)])
                open_slots[slot] = stream
        pushes, flush = {}, []
        for slot, stream in open_slots.items():
            if sent[stream] >= len(streams[stream]):
                flush.append(slot)
            elif rng.random() < 0.8:
                size = int(rng.choice([1, 7, 511, 512, 513, int(rng.integers(1, 5000))]))
                pushes[slot] = streams[stream][sent[stream] : sent[stream] + size].tobytes()
                sent[stream] += size
        front.append(pushes)
        front.features(flush=flush)
        out = vad.process(np.array(sorted(set(pushes) | set(flush)), dtype=np.int64), np.array(flush))
        batches.append(len(out.slots))
        host = out.probs.cpu().numpy()
        for row, (slot, count) in enumerate(zip(out.slots.tolist(), out.windows.tolist(), strict=True)):
            assert out.first_window[row] == sum(len(p) for p in probs[open_slots[slot]])
            probs[open_slots[slot]].append(host[row, :count])
        for slot in flush:
            results[open_slots[slot]] = (vad.segments(slot), vad.segments(slot, padded=False))
            front.close(slot)
            del open_slots[slot]
    assert max(batches) > 1  # streams at different positions ran in one batch
    return [np.concatenate(p) if p else np.zeros(0, np.float32) for p in probs], results


def test_batched_vad_equals_silero_on_each_stream_alone(silero, preprocessor):
    silero_vad, model = silero
    streams = vad_audio()
    front = AudioFrontEnd(preprocessor, num_slots=3, max_push_seconds=0.5)
    vad = BatchedVAD(front)
    probs, results = run_batched(front, vad, streams, np.random.default_rng(0), OPTIONS)
    found_speech = 0
    for stream, pcm in enumerate(streams):
        options = OPTIONS[stream % len(OPTIONS)]
        alone = silero_probabilities(model, pcm)
        assert probs[stream].shape == alone.shape, stream
        np.testing.assert_allclose(probs[stream], alone, rtol=0, atol=PROB_ATOL, err_msg=f"stream {stream}")
        settings = {
            "threshold": options.vad_threshold,
            "min_silence_duration_ms": options.min_silence_ms,
            "speech_pad_ms": options.speech_pad_ms,
            "min_speech_duration_ms": options.min_speech_ms,
        }
        expected = silero_vad.get_speech_timestamps(torch.from_numpy(pcm.astype(np.float32) / 32768), model, **settings)
        padded, raw = results[stream]
        assert padded == expected, stream
        found_speech += len(expected)
        if options.min_speech_ms == 0:  # VADIterator has no minimum: its events are the same segments, moved by the pad
            assert vad_iterator_events(silero_vad, model, pcm, options) == iterator_view(raw, len(pcm), options)
    assert found_speech >= 5  # the voiced streams have speech and pauses long enough to split it


def vad_iterator_events(silero_vad, model, pcm: np.ndarray, options: EndpointingOptions) -> list[dict]:
    iterator = silero_vad.VADIterator(
        model,
        threshold=options.vad_threshold,
        sampling_rate=RATE,
        min_silence_duration_ms=options.min_silence_ms,
        speech_pad_ms=options.speech_pad_ms,
    )
    audio = torch.from_numpy(pcm.astype(np.float32) / 32768)
    events = []
    for start in range(0, len(audio), WINDOW):
        chunk = torch.nn.functional.pad(audio[start : start + WINDOW], (0, max(0, start + WINDOW - len(audio))))
        event = iterator(chunk)
        if event:
            events.append(event)
    return events


def iterator_view(raw: list[dict], length: int, options: EndpointingOptions) -> list[dict]:
    """VADIterator's events of unpadded segments: a start ``pad`` earlier, an end ``pad`` later (an open segment,
    closed at the stream's length, has its start only)."""
    pad = RATE * options.speech_pad_ms / 1000
    events = []
    for segment in raw:
        events.append({"start": int(max(0, segment["start"] - pad))})
        if segment["end"] < length:
            events.append({"end": int(segment["end"] + pad)})
    return events


class Probabilities:
    """A stand-in for silero's model that returns given probabilities, one per call (for its state machines)."""

    def __init__(self, probs):
        self.probs = list(probs)

    def reset_states(self):
        self.calls = 0

    def __call__(self, x, sampling_rate):
        self.calls += 1
        return torch.tensor([[self.probs[self.calls - 1]]])


def test_state_machine_equals_silero_on_any_probabilities(silero):
    """The vectorised state machine over many streams at once, each with its own settings, on probability sequences
    that dwell around both thresholds (values exactly at them included): silero's segments and VADIterator's events."""
    silero_vad, _ = silero
    rng = np.random.default_rng(1)
    levels = np.array([0.0, 0.05, 0.2, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.7, 0.9, 1.0], dtype=np.float32)
    streams = 24
    options = [
        EndpointingOptions(
            vad=True,
            vad_threshold=float(rng.choice([0.4, 0.5, 0.55])),
            min_silence_ms=float(rng.choice([0, 32, 100, 200])),
            speech_pad_ms=float(rng.choice([0, 30, 45])),
            min_speech_ms=float(rng.choice([0, 64, 250])),
        )
        for _ in range(streams)
    ]
    windows = rng.integers(1, 320, streams)
    sequences = []
    for n in windows:  # runs of one level, so that silences and speech last
        runs = rng.integers(1, 12, n)
        sequences.append(np.repeat(rng.choice(levels, n), runs)[:n])
    width = int(windows.max())
    machine = SpeechStateMachine(streams, torch.device("cpu"))
    for slot, o in enumerate(options):
        machine.reset(
            slot, (o.vad_threshold, o.neg_threshold, RATE * o.min_silence_ms / 1000, RATE * o.min_speech_ms / 1000)
        )
    ended = [[] for _ in range(streams)]
    segments = compared = 0
    with torch.inference_mode():
        for j in range(width):
            rows = np.flatnonzero(windows > j)
            p = torch.tensor(np.array([sequences[r][j] for r in rows]))
            kept, start, end = machine.step(torch.from_numpy(rows), p, torch.full((rows.size,), j * WINDOW))
            for r, s, e in zip(rows[kept.numpy()].tolist(), start[kept].tolist(), end[kept].tolist(), strict=True):
                ended[r].append((s, e))
    for slot, o in enumerate(options):
        length = int((windows[slot] - 1) * WINDOW + rng.integers(1, WINDOW + 1))
        probs = [float(v) for v in sequences[slot]]
        in_speech = int(machine.start[slot]) if bool(machine.triggered[slot]) else None
        pad, min_speech = RATE * o.speech_pad_ms / 1000, RATE * o.min_speech_ms / 1000
        expected = silero_vad.get_speech_timestamps_from_probs(
            probs,
            threshold=o.vad_threshold,
            min_speech_duration_ms=o.min_speech_ms,
            min_silence_duration_ms=o.min_silence_ms,
            speech_pad_ms=o.speech_pad_ms,
            audio_length_samples=length,
        )
        assert speech_segments(ended[slot], in_speech, length, min_speech, pad) == expected, slot
        segments += len(expected)
        if o.min_speech_ms == 0:
            compared += 1
            model = Probabilities(probs)
            iterator = silero_vad.VADIterator(model, o.vad_threshold, RATE, o.min_silence_ms, o.speech_pad_ms)
            events = [e for e in (iterator(torch.zeros(WINDOW)) for _ in probs) if e]
            raw = speech_segments(ended[slot], in_speech, length, min_speech, None)
            assert events == iterator_view(raw, length, o), slot
    assert segments > 3 * streams and compared > 3


def test_the_front_end_refuses_a_read_of_overwritten_samples(preprocessor):
    front = AudioFrontEnd(preprocessor, num_slots=1, max_push_seconds=0.1)
    front.open(0)
    for _ in range(3):
        front.append({0: np.zeros(1600, dtype=np.int16).tobytes()})
        front.features()
    assert front.read_samples(np.array([0]), np.array([4700]), 100).shape == (1, 100)  # beyond the end: zeros
    with pytest.raises(ValueError, match=r"stream 0: sample 0 was overwritten in the front end's ring \(4800 samples"):
        front.read_samples(np.array([0]), np.array([0]), 512)


def test_missing_package_names_it_and_the_option(preprocessor, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "silero_vad" else find_spec(name))
    front = AudioFrontEnd(preprocessor, num_slots=1)
    with pytest.raises(ImportError, match=r"EndpointingOptions\(vad=True\)\) needs the silero-vad package; install"):
        BatchedVAD(front)


@pytest.mark.gpu
def test_batched_vad_equals_silero_on_the_gpu(silero, preprocessor, exact_fp32):
    """On CUDA: the front end's kernels fill the rings, silero's network runs batched on the GPU; against silero's own
    model on the CPU, each stream alone."""
    silero_vad, model = silero
    streams = vad_audio(seed=7)
    front = AudioFrontEnd(preprocessor.cuda(), num_slots=3, device="cuda", max_push_seconds=0.5)
    vad = BatchedVAD(front)
    probs, results = run_batched(front, vad, streams, np.random.default_rng(2), OPTIONS)
    for stream, pcm in enumerate(streams):
        np.testing.assert_allclose(probs[stream], silero_probabilities(model, pcm), rtol=0, atol=1e-4)
