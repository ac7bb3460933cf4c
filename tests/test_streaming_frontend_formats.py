"""Input formats and rates of the streaming audio front end (streaming/frontend.py): G.711 mu-law / A-law bytes and
streams at other rates than the model's, resampled on the device. Pushed in random pieces, interleaved with other
streams, a resampled stream's samples are ``scipy.signal.resample_poly`` of the whole signal (to fp32 rounding), and
its features those of that resampled signal."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.signal import resample_poly

from nemo_fastdecode.kernels.pcm_frames import SampleFormat, g711_linear
from nemo_fastdecode.streaming.frontend import INPUT_RATES, AudioFrontEnd

RATE = 16000
ATOL = 2e-6  # fp32 products and sums of at most 61 filter taps (|x| <= 1)

pytestmark = pytest.mark.usefixtures("single_thread")


def _signal(length: int, rate: int, rng: np.random.Generator) -> np.ndarray:
    """float32 speech-like audio within [-1, 1]: tones under noise, a silent stretch."""
    t = np.arange(length) / rate
    wave = sum(np.sin(2 * np.pi * f * t + p) for f, p in rng.uniform([80, 0], [min(7000, rate / 2.2), 6], size=(3, 2)))
    wave = 0.2 * wave + 0.05 * rng.standard_normal(length)
    wave[length // 3 : length // 2] = 0
    return np.clip(wave, -1, 1).astype(np.float32)


def _encode(x: np.ndarray, sample_format: SampleFormat) -> tuple[bytes, np.ndarray]:
    """The bytes of ``x`` in ``sample_format`` and the float32 samples they decode to."""
    if sample_format is SampleFormat.FLOAT32:
        return x.tobytes(), x
    pcm = np.round(x * 32767).astype("<i2")
    if sample_format is SampleFormat.INT16:
        return pcm.tobytes(), pcm.astype(np.float32) / 32768
    # G.711: the byte nearest each sample (a stand-in for an encoder: any bytes are valid input)
    table = g711_linear(sample_format)
    order = np.argsort(table)
    index = np.clip(np.searchsorted(table[order], pcm), 0, 255)
    codes = order[index].astype(np.uint8)
    return codes.tobytes(), table[codes].astype(np.float32) / 32768


def _ratio(rate: int) -> tuple[int, int]:
    g = np.gcd(rate, RATE)
    return RATE // g, rate // g


STREAMS = [  # (rate, format, seconds)
    (24000, SampleFormat.INT16, 0.9),
    (8000, SampleFormat.MULAW, 1.1),
    (48000, SampleFormat.FLOAT32, 0.7),
    (44100, SampleFormat.INT16, 0.8),
    (8000, SampleFormat.ALAW, 0.6),
    (16000, SampleFormat.INT16, 0.5),  # the model's rate: not resampled, among the others
    (22050, SampleFormat.FLOAT32, 0.05),
    (11025, SampleFormat.INT16, 0.0),  # no audio at all
]


@pytest.mark.parametrize("seed", [0, 1])
def test_resampled_streams_in_random_pushes_are_resample_poly_of_the_whole_signal(preprocessor, seed):
    """Streams at several rates and formats, pushed in random byte counts (split samples included) and interleaved:
    each stream's samples at the model's rate, read back from the ring as they become final, are resample_poly of
    its whole decoded signal; outputs appear as soon as their last input arrived; ``ceil(n * up / down)`` in all."""
    rng = np.random.default_rng(seed)
    max_push = 0.1
    front = AudioFrontEnd(preprocessor, num_slots=len(STREAMS), max_push_seconds=max_push)
    blobs, decoded = [], []
    for slot, (rate, sample_format, seconds) in enumerate(STREAMS):
        data, samples = _encode(_signal(int(seconds * rate), rate, rng), sample_format)
        blobs.append(data)
        decoded.append(samples)
        front.open(slot, sample_rate=rate, sample_format=sample_format.value)
    sent, read = [0] * len(STREAMS), [0] * len(STREAMS)
    got: list[list[np.ndarray]] = [[] for _ in STREAMS]
    ended = set()
    while len(ended) < len(STREAMS):
        pushes = {}
        for slot, (rate, sample_format, _) in enumerate(STREAMS):
            if slot in ended or rng.random() < 0.3:
                continue
            most = int(max_push * rate) * sample_format.itemsize
            size = int(rng.choice([0, 1, 3, int(rng.integers(1, most + 1)), most]))
            pushes[slot] = blobs[slot][sent[slot] : sent[slot] + size]
            sent[slot] += len(pushes[slot])
        front.append(pushes)
        ending = [s for s in range(len(STREAMS)) if s not in ended and sent[s] == len(blobs[s]) and rng.random() < 0.5]
        front.features(flush=ending)
        ended.update(ending)
        for slot, (rate, _, _) in enumerate(STREAMS):
            have = front.samples_received(slot)
            if have > read[slot]:
                new = front.read_samples(np.array([slot]), np.array([read[slot]]), have - read[slot])[0]
                got[slot].append(new.numpy())
                read[slot] = have
            if slot not in ended and rate != RATE:  # final as soon as the newest input they read has arrived
                up, down = _ratio(rate)
                inputs = sent[slot] // STREAMS[slot][1].itemsize
                assert have == max(0, (inputs * up - 1 - 10 * max(up, down)) // down + 1)
    for slot, (rate, _, _) in enumerate(STREAMS):
        samples = np.concatenate(got[slot]) if got[slot] else np.zeros(0, np.float32)
        expected = decoded[slot] if rate == RATE else resample_poly(decoded[slot], *_ratio(rate))
        assert len(samples) == len(expected) == -(-len(decoded[slot]) * _ratio(rate)[0] // _ratio(rate)[1])
        if len(expected):
            assert np.abs(samples - expected).max() < ATOL, (rate, np.abs(samples - expected).max())


def _features(front: AudioFrontEnd, slot: int, pieces: list[bytes]) -> torch.Tensor:
    frames = []
    for piece in pieces:
        front.append({slot: piece})
        frames.append(front.features().for_slot(slot))
    frames.append(front.features(flush=[slot]).for_slot(slot))
    return torch.cat(frames, dim=1)


def test_features_of_a_24khz_stream_are_those_of_its_resample_poly_signal(preprocessor):
    """A 24 kHz int16 stream's features equal the features of the scipy-resampled float32 stream at 16 kHz (pushed
    whole) and NeMo's features of that signal, to the rounding the two resamplings differ by."""
    rng = np.random.default_rng(5)
    pcm = np.round(_signal(24000, 24000, rng) * 32767).astype("<i2")
    front = AudioFrontEnd(preprocessor, num_slots=2, max_push_seconds=0.25)
    front.open(0, sample_rate=24000)
    pieces, i = [], 0
    while i < len(pcm):
        n = int(rng.integers(1, 6000))
        pieces.append(pcm[i : i + n].tobytes())
        i += n
    ours = _features(front, 0, pieces)
    resampled = resample_poly(pcm.astype(np.float32) / 32768, 2, 3).astype(np.float32)
    front.open(1, sample_format="float32")
    theirs = _features(front, 1, [resampled[i : i + 4000].tobytes() for i in range(0, len(resampled), 4000)])
    signal = torch.from_numpy(resampled)[None]
    nemo, length = preprocessor(input_signal=signal, length=torch.tensor([len(resampled)]))
    nemo = nemo[0, :, : int(length)]
    assert ours.shape == theirs.shape == nemo.shape and ours.shape[1] == len(resampled) // 160
    # mel energies relative to each frame's strongest band: the inputs differ by fp32 roundings
    for other in (theirs, nemo):
        energy, expected = ours.double().exp(), other.double().exp()
        assert ((energy - expected).abs() / expected.amax(dim=0, keepdim=True)).max().item() < 1e-5


def test_g711_streams_decode_as_audioop(preprocessor):
    """8 kHz mu-law and A-law bytes (audioop's encoding of a signal) come out as audioop's decoding, resampled."""
    audioop = pytest.importorskip("audioop")
    rng = np.random.default_rng(2)
    pcm = np.round(_signal(4000, 8000, rng) * 32767).astype("<i2").tobytes()
    front = AudioFrontEnd(preprocessor, num_slots=2, max_push_seconds=0.5)
    for slot, (name, encode, decode) in enumerate(
        [("mulaw", audioop.lin2ulaw, audioop.ulaw2lin), ("alaw", audioop.lin2alaw, audioop.alaw2lin)]
    ):
        codes = encode(pcm, 2)
        front.open(slot, sample_rate=8000, sample_format=name)
        front.append({slot: np.frombuffer(codes, dtype=np.uint8)})  # a uint8 array of the bytes
        front.features(flush=[slot])
        expected = resample_poly(np.frombuffer(decode(codes, 2), dtype="<i2").astype(np.float32) / 32768, 2, 1)
        got = front.read_samples(np.array([slot]), np.array([0]), front.samples_received(slot))[0].numpy()
        assert len(got) == len(expected) == 8000
        assert np.abs(got - expected).max() < ATOL


def test_refused_rates_and_pushes_of_resampled_streams(preprocessor):
    front = AudioFrontEnd(preprocessor, num_slots=2, max_push_seconds=0.01)
    assert set(INPUT_RATES) >= {8000, 16000, 22050, 24000, 32000, 44100, 48000}
    with pytest.raises(ValueError, match=r"stream 1: sample rate 96000 Hz is not supported; valid: 8000, .*, 48000 Hz"):
        front.open(1, sample_rate=96000)
    front.open(0, sample_rate=48000, sample_format="float32")
    with pytest.raises(ValueError, match=r"stream 0: 2000 new samples exceed .* \(max_push_seconds=0.01\)"):
        front.append({0: np.zeros(2000, dtype="<f4")})  # 2000 at 48 kHz: 667 at 16 kHz, over 160 + the margin
    with pytest.raises(ValueError, match="stream 0: an array of dtype int16 was pushed to a float32 stream"):
        front.append({0: np.zeros(4, dtype="<i2")})
    assert front.samples_received(0) == 0 and front.input_rate(0) == 48000
    front.append({0: np.zeros(480, dtype="<f4")})  # 10 ms: taken
    front.features(flush=[0])
    assert front.samples_received(0) == 160


@pytest.mark.gpu
def test_warm_up_launches_the_format_and_resampler_variants(preprocessor, exact_fp32):
    """After the warm-up, G.711 streams and resampled streams of several rates, interleaved with int16 and float32
    ones, compile (or load) no Triton kernel; their samples are still resample_poly's."""
    triton = pytest.importorskip("triton")
    front = AudioFrontEnd(preprocessor, num_slots=4, device=torch.device("cuda"), max_push_seconds=0.1)
    front.warm_up()
    compiled = []
    previous = triton.knobs.runtime.jit_post_compile_hook
    triton.knobs.runtime.jit_post_compile_hook = lambda *args, **kwargs: compiled.append(kwargs.get("fn"))
    rng = np.random.default_rng(9)
    streams = [(24000, SampleFormat.INT16), (8000, SampleFormat.MULAW), (44100, SampleFormat.FLOAT32)]
    streams += [(16000, SampleFormat.ALAW)]
    try:
        decoded = []
        for slot, (rate, sample_format) in enumerate(streams):
            data, samples = _encode(_signal(rate // 2, rate, rng), sample_format)
            decoded.append(samples)
            front.open(slot, sample_rate=rate, sample_format=sample_format.value)
            step = int(0.05 * rate) * sample_format.itemsize
            for i in range(0, len(data), step):
                front.append({slot: data[i : i + step]})
                front.features()
            front.features(flush=[slot])
            n = front.samples_received(slot)
            samples = front.read_samples(np.array([slot]), np.array([max(0, n - 1000)]), min(n, 1000))[0].cpu()
            expected = decoded[slot] if rate == RATE else resample_poly(decoded[slot], *_ratio(rate))
            assert np.abs(samples.numpy() - expected[-len(samples) :]).max() < ATOL
    finally:
        triton.knobs.runtime.jit_post_compile_hook = previous
    assert compiled == []
