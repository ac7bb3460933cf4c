"""The streaming audio front end (streaming/frontend.py) against NeMo's preprocessor on whole files: any chunking
and interleaving of pushes gives the whole-file features frame for frame, and exactly NeMo's ``seq_len`` frames."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from nemo_fastdecode.streaming.frontend import AudioFrontEnd, MelSettings, fft_rows

# A frame's mel energy is a sum of 257 non-negative terms; BLAS (cuBLAS) may order it differently for another number
# of frames, which moves it by at most ~257 fp32 roundings (relative 257 * 2**-24 = 1.5e-5), i.e. as much absolute
# after the log, plus one rounding of the log (|log| < 17). On a CPU whose BLAS rounds a column the same at any
# shape (see _bit_exact_cpu) the features come out bit for bit.
ATOL = 2e-5
# on a GPU, mel energies relative to the frame's strongest band: the FFT's rounding (a few fp32 ulps of the largest
# bins, summed over a band)
POWER_RTOL = 1e-5
RATE = 16000
# whole-file lengths around the frame boundaries (hop 160, look-ahead 199) and a stream that wraps the rings often
LENGTHS = [0, 1, 159, 160, 161, 199, 358, 359, 4001, RATE + 321]

pytestmark = pytest.mark.usefixtures("single_thread")


def _audio(length: int, rng: np.random.Generator) -> np.ndarray:
    """Speech-like int16 PCM: a few tones under noise, with silence and clipping."""
    t = np.arange(length) / RATE
    wave = sum(np.sin(2 * np.pi * f * t + p) for f, p in rng.uniform([80, 0], [3000, 6], size=(3, 2)))
    wave = 6000 * wave + 1500 * rng.standard_normal(length)
    wave[length // 3 : length // 2] = 0
    return np.clip(wave * (1 + 5 * (rng.random() < 0.3)), -32768, 32767).astype("<i2")


def _nemo_features(preprocessor, samples: np.ndarray) -> torch.Tensor:
    """``[F, seq_len]`` NeMo's features of one whole file (float samples as AudioSegment reads them), on the CPU."""
    if len(samples) == 0:
        return torch.zeros(preprocessor.featurizer.nfilt, 0)
    device = preprocessor.featurizer.fb.device
    signal = torch.from_numpy(samples.astype(np.float32) / (32768 if samples.dtype == np.int16 else 1))
    length = torch.tensor([len(samples)], device=device)
    features, length = preprocessor(input_signal=signal[None].to(device), length=length)
    return features[0, :, : int(length)].cpu()


@functools.cache
def _bit_exact_cpu() -> bool:
    """Whether this CPU's BLAS gives a column of ``fb @ power`` the same bits at any number of columns and any place
    among them (MKL on AVX2 does; on AVX-512 it does not). Only then can streamed features, cut into other GEMM
    shapes than NeMo's whole file, equal NeMo's bit for bit; elsewhere they agree to fp32 rounding (``ATOL``)."""
    generator = torch.Generator().manual_seed(0)
    fb = torch.rand(1, 80, 257, generator=generator)
    power = torch.rand(1, 257, 64, generator=generator)
    whole = torch.matmul(fb, power)
    return all(
        torch.equal(torch.matmul(fb, power[:, :, i : i + n].contiguous()), whole[:, :, i : i + n])
        for i, n in ((0, 2), (3, 5), (7, 17), (30, 33))
    )


def _assert_same_features(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """CPU features equal: bit for bit where :func:`_bit_exact_cpu`, else to fp32 rounding."""
    assert actual.shape == expected.shape and actual.numel() > 0
    if _bit_exact_cpu():
        assert torch.equal(actual, expected)
    else:
        torch.testing.assert_close(actual, expected, rtol=0, atol=ATOL)


def _expected_frames(samples: int) -> int:
    """Frames out after ``samples`` samples, from NeMo's window alone: frame t reads samples up to t*160 + 198."""
    return min(samples // 160, max(0, (samples - 199) // 160 + 1))


def _stream_everything(front: AudioFrontEnd, streams: list[tuple[np.ndarray, str]], rng: np.random.Generator):
    """Push all ``streams`` through ``front`` in random interleaved pieces, at most ``num_slots`` open at once, and
    collect each stream's emitted frames. Checks on the way that frames come out as soon as their samples exist."""
    waiting = list(range(len(streams)))
    open_slots: dict[int, int] = {}  # slot -> stream
    sent = [0] * len(streams)
    blobs = [pcm.tobytes() for pcm, _ in streams]
    frames: list[list[torch.Tensor]] = [[] for _ in streams]
    while waiting or open_slots:
        for slot in range(front.num_slots):  # streams open as slots free up
            if slot not in open_slots and waiting:
                stream = waiting.pop(0)
                front.open(slot, sample_format=streams[stream][1], sample_rate=RATE)
                open_slots[slot] = stream
        pushes = {}
        for slot, stream in open_slots.items():
            if rng.random() < 0.3:
                continue  # this stream sends nothing this cycle
            size = int(rng.choice([0, 1, 2, 3, 5, int(rng.integers(1, 900))]))  # bytes: split samples included
            pushes[slot] = blobs[stream][sent[stream] : sent[stream] + size]
            sent[stream] += len(pushes[slot])
        front.append(pushes)
        ending = {slot for slot, stream in open_slots.items() if sent[stream] == len(blobs[stream])}
        ending = {slot for slot in ending if rng.random() < 0.5}  # some finished streams linger a few cycles
        out = front.features(flush=ending)
        assert out.ended.tolist() == sorted(ending)
        for slot, stream in open_slots.items():
            new = out.for_slot(slot)
            if new.shape[1]:
                assert out.starts[out.slots.tolist().index(slot)] == sum(f.shape[1] for f in frames[stream])
            frames[stream].append(new.cpu())
            if slot not in ending:  # a frame is out as soon as its samples are
                assert front.frames_emitted(slot) == _expected_frames(front.samples_received(slot))
        for slot in ending:
            front.close(slot)
            del open_slots[slot]
    return [torch.cat(f, 1) for f in frames]


def _check_against_nemo(
    preprocessor, device: torch.device, seed: int, warm_up: bool = False, cuda_graphs: bool = False
) -> float:
    """Our front end on ``device`` against NeMo's whole-file features (``preprocessor`` on the CPU); ``warm_up``:
    after :meth:`AudioFrontEnd.warm_up`; ``cuda_graphs``: the feature pass as graph replays."""
    rng = np.random.default_rng(seed)
    streams = []
    for i, length in enumerate(LENGTHS):
        pcm = _audio(length, rng)
        streams.append((pcm, "int16") if i % 3 else (pcm.astype(np.float32) / 32768, "float32"))
    front = AudioFrontEnd(preprocessor, num_slots=4, device=device, max_push_seconds=0.1, cuda_graphs=cuda_graphs)
    if warm_up:
        assert front.warm_up() == 2
        assert not any(front._open)  # its slots are free again
    got = _stream_everything(front, streams, rng)
    if cuda_graphs and device.type == "cuda":  # every pass ran as a replay: the graphs of the row counts met are there
        assert front._graphs is not None and front._graphs.captured
    worst, compared = 0.0, 0
    for (pcm, _), frames in zip(streams, got, strict=True):
        expected = _nemo_features(preprocessor, pcm)
        assert frames.shape == expected.shape  # NeMo's seq_len frames
        if frames.numel():
            worst = max(worst, _difference(frames, expected, device))
            compared += frames.shape[1]
    assert compared > 0
    assert worst <= (ATOL if device.type == "cpu" else POWER_RTOL)
    return worst


def _difference(frames: torch.Tensor, expected: torch.Tensor, device: torch.device) -> float:
    """On the CPU: the largest difference of the log-mel features. On a GPU: of the mel energies (``exp`` of the
    features), relative to each frame's strongest band. cuFFT rounds differently from NeMo's CPU FFT, by a share of
    a frame's largest terms, so the log of a band far weaker than them moves more than fp32 rounding of its own."""
    if device.type == "cpu":
        return (frames - expected).abs().max().item()
    energy, expected_energy = frames.double().exp(), expected.double().exp()
    return ((energy - expected_energy).abs() / expected_energy.amax(dim=0, keepdim=True)).max().item()


@pytest.mark.parametrize("seed", [0, 1])
def test_interleaved_pushes_give_the_whole_file_features(preprocessor, seed):
    worst = _check_against_nemo(preprocessor, torch.device("cpu"), seed)
    if _bit_exact_cpu():  # NeMo's FFT and GEMM see the same operands and round each column alike: bit for bit
        assert worst == 0.0


@pytest.mark.gpu
def test_interleaved_pushes_on_cuda(preprocessor, exact_fp32):
    """Our front end on a GPU against NeMo's features on the CPU, to fp32 rounding of the FFT (POWER_RTOL)."""
    _check_against_nemo(preprocessor, torch.device("cuda"), seed=2)


@pytest.mark.gpu
@pytest.mark.parametrize("warm_up", [False, True])
def test_interleaved_pushes_on_cuda_with_graphs(preprocessor, exact_fp32, warm_up):
    """The feature pass as CUDA graph replays (captured on first use, or all by the warm-up): NeMo's features to the
    same precision as the eager pass, for every mix of streams and frame counts."""
    _check_against_nemo(preprocessor, torch.device("cuda"), seed=5, warm_up=warm_up, cuda_graphs=True)


def test_graphs_are_a_gpu_option(preprocessor):
    """On the CPU the option changes nothing: the eager pass, NeMo's features."""
    assert AudioFrontEnd(preprocessor, num_slots=2, max_push_seconds=0.1, cuda_graphs=True)._graphs is None
    _check_against_nemo(preprocessor, torch.device("cpu"), seed=6, cuda_graphs=True)


def test_warm_up_leaves_streams_exact_and_slots_free(preprocessor):
    _check_against_nemo(preprocessor, torch.device("cpu"), seed=3, warm_up=True)


def test_warm_up_waits_for_no_open_stream(preprocessor):
    """With a stream open the warm-up launches nothing: the stream keeps its audio and emits the same frames."""
    pcm = (np.sin(np.arange(900) / 7.0) * 9000).astype(np.int16).tobytes()
    outputs = []
    for warm_up in (False, True):
        front = AudioFrontEnd(preprocessor, num_slots=2, max_push_seconds=0.1)
        front.open(0)
        front.append({0: pcm})
        if warm_up:
            assert front.warm_up() == 0
        assert front.samples_received(0) == 900 and front.frames_emitted(0) == 0
        outputs.append(front.features().for_slot(0))
    assert outputs[0].shape[1] == _expected_frames(900) > 0
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0)


@pytest.mark.gpu
def test_warm_up_launches_every_kernel_variant_a_stream_needs(preprocessor, exact_fp32):
    """After the warm-up, interleaved streams of both formats and any push sizes compile (or load) no Triton kernel:
    a server that compiled one under load would stall every stream."""
    triton = pytest.importorskip("triton")
    front = AudioFrontEnd(preprocessor, num_slots=4, device=torch.device("cuda"), max_push_seconds=0.1)
    front.warm_up()
    compiled = []
    previous = triton.knobs.runtime.jit_post_compile_hook
    triton.knobs.runtime.jit_post_compile_hook = lambda *args, **kwargs: compiled.append(kwargs.get("fn"))
    try:
        rng = np.random.default_rng(4)
        streams = [(_audio(n, rng), "int16") for n in LENGTHS] + [
            (_audio(4001, rng).astype(np.float32) / 32768, "float32")
        ]
        got = _stream_everything(front, streams, rng)
    finally:
        triton.knobs.runtime.jit_post_compile_hook = previous
    assert sum(f.shape[1] for f in got) > 0
    assert compiled == []


def test_lookahead_is_nemo_dependence(preprocessor):
    """NeMo's frame t reads samples t*hop - 200 (through pre-emphasis) to t*hop + 198: the front end's look-ahead."""
    settings = MelSettings.from_preprocessor(preprocessor)
    assert (settings.lookahead, settings.first_tap, settings.last_tap) == (199, 57, 454)
    pcm = _audio(3000, np.random.default_rng(3))
    t = 7
    changed = pcm.copy()
    changed[t * 160 + 199 :] = 12345
    changed[: t * 160 - 200] = -999
    before, after = _nemo_features(preprocessor, pcm), _nemo_features(preprocessor, changed)
    assert torch.equal(before[:, t], after[:, t])
    for edge in (t * 160 - 200, t * 160 + 198):
        changed = pcm.copy()
        changed[edge] = -32768 if pcm[edge] > 0 else 32767  # the taps next to the window's zeros are small
        assert not torch.equal(before[:, t], _nemo_features(preprocessor, changed)[:, t])


def test_one_stream_endless_in_160ms_pushes_is_bounded(preprocessor):
    """A long stream in network-sized pushes: fixed ring memory, the same frames as NeMo on the whole file."""
    front = AudioFrontEnd(preprocessor, num_slots=1, max_push_seconds=0.16)
    ring = front.ring.data_ptr(), front.ring.shape
    pcm = _audio(RATE * 5 + 77, np.random.default_rng(4))
    front.open(0)
    got = []
    for start in range(0, len(pcm), 2560):
        front.append({0: pcm[start : start + 2560]})
        got.append(front.features().for_slot(0))
    got.append(front.features(flush=[0]).for_slot(0))
    _assert_same_features(torch.cat(got, 1), _nemo_features(preprocessor, pcm))
    assert (front.ring.data_ptr(), front.ring.shape) == ring


def test_split_samples_and_empty_pushes(preprocessor):
    front = AudioFrontEnd(preprocessor, num_slots=2, max_push_seconds=0.1)
    front.open(0)
    front.open(1, sample_format="float32")
    pcm = _audio(500, np.random.default_rng(5))
    floats = (pcm / 32768).astype("<f4")
    data, fdata = pcm.tobytes(), floats.tobytes()
    front.append({0: data[:3], 1: fdata[:7]})  # 1.5 and 1.75 samples
    assert (front.samples_received(0), front.samples_received(1)) == (1, 1)
    front.append({0: b"", 1: bytearray()})
    front.append({0: memoryview(data)[3:], 1: np.frombuffer(fdata[7:], dtype=np.uint8)})
    out = front.features(flush=[0, 1])
    _assert_same_features(out.for_slot(0), out.for_slot(1))  # x / 32768 as floats: the same features
    _assert_same_features(out.for_slot(0), _nemo_features(preprocessor, pcm))
    front.reset(0)
    front.append({0: data[:5]})
    with pytest.warns(UserWarning, match=r"stream 0 ends with 1 byte\(s\) of an incomplete int16 sample; dropped"):
        assert front.features(flush=[0]).counts.size == 0  # 2 samples: no frame


def test_output_arrays_index_the_packed_frames(preprocessor):
    front = AudioFrontEnd(preprocessor, num_slots=4, max_push_seconds=0.1)
    pcm = _audio(1000, np.random.default_rng(3))
    for slot in (0, 2, 3):
        front.open(slot)
    front.append({3: pcm[:700].tobytes(), 0: pcm[:400].tobytes(), 2: pcm[:100].tobytes()})
    out = front.features(flush=np.array([2]))
    assert out.features.shape[1] > 0  # frames to compare
    for name in ("slots", "starts", "counts", "offsets", "ended"):
        assert getattr(out, name).dtype == np.int64
    assert out.slots.tolist() == [0, 3] and out.ended.tolist() == [2]  # 100 samples: no frame even at the end
    assert out.counts.tolist() == [_expected_frames(400), _expected_frames(700)]
    assert out.offsets.tolist() == [0, _expected_frames(400)] and out.starts.tolist() == [0, 0]
    assert [slot for slot, _ in out] == [0, 3] and out.for_slot(2).shape[1] == out.for_slot(1).shape[1] == 0
    for slot, frames in out:
        assert torch.equal(frames, out.for_slot(slot))
    _assert_same_features(out.for_slot(3), _nemo_features(preprocessor, pcm)[:, : _expected_frames(700)])


def test_refused_input_names_the_stream(preprocessor):
    front = AudioFrontEnd(preprocessor, num_slots=3, max_push_seconds=0.01)  # 160 samples
    valid = "valid: 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000 Hz"
    for rate in (8001, 96000, 24000.0, True):
        with pytest.raises(ValueError, match=f"stream 0: sample rate {rate} Hz is not supported; {valid} .* 16000 Hz"):
            front.open(0, sample_rate=rate)
    with pytest.raises(ValueError, match="stream 0: 2 channels are not supported; valid: 1"):
        front.open(0, channels=2)
    with pytest.raises(ValueError, match="sample format 'int8' is not supported"):
        front.open(0, sample_format="int8")
    with pytest.raises(ValueError, match="slot 3 is out of range; valid: 0 to 2"):
        front.open(3)
    front.open(0)
    front.open(1, sample_format="float32")
    bad = np.zeros(40, dtype="<f4")
    bad[17] = np.nan
    with pytest.raises(ValueError, match="stream 1: non-finite sample nan at sample 17"):
        front.append({0: b"\x01\x00", 1: bad})
    assert front.samples_received(0) == 0  # nothing of a refused append is kept
    with pytest.raises(ValueError, match="stream 1: non-finite sample inf"):
        front.append({1: np.array([np.inf], dtype="<f4")})
    with pytest.raises(ValueError, match=r"stream 0: audio must be mono \(1-D\), got an array of shape \(4, 2\)"):
        front.append({0: np.zeros((4, 2), dtype="<i2")})
    with pytest.raises(ValueError, match="stream 0: an array of dtype float32 was pushed to a int16 stream"):
        front.append({0: np.zeros(4, dtype="<f4")})
    with pytest.raises(ValueError, match="slot 2 is not open"):
        front.append({2: b"\x00\x00"})
    with pytest.raises(ValueError, match=r"stream 0: 1000 new samples exceed .* \(max_push_seconds=0.01\)"):
        front.append({0: np.zeros(1000, dtype="<i2")})
    front.features(flush=[0])
    with pytest.raises(ValueError, match="stream 0 was flushed; reset or close it"):
        front.append({0: b"\x00\x00"})


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("normalize", "per_feature", "normalize='per_feature' is not supported .* normalize='NA'"),
        ("frame_splicing", 3, "frame_splicing=3 is not supported"),
        ("exact_pad", True, "exact_pad=True is not supported"),
    ],
)
def test_refused_preprocessor_settings(setting, value, message):
    from nemo.collections.asr.modules import AudioToMelSpectrogramPreprocessor

    settings = {"normalize": "NA", "n_fft": 512, "features": 80, setting: value}
    preprocessor = AudioToMelSpectrogramPreprocessor(**settings)
    with pytest.raises(ValueError, match=message):
        AudioFrontEnd(preprocessor, num_slots=1)


def test_refused_featurizer():
    with pytest.raises(ValueError, match="computes NeMo's FilterbankFeatures .* got featurizer NoneType"):
        AudioFrontEnd(torch.nn.Identity(), num_slots=1)


def test_benchmark_script_smoke_run(tmp_path):
    """benchmarks/bench_frontend.py on the CPU: every row filled, and the front end's frames equal NeMo's."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_frontend.py"
    spec = importlib.util.spec_from_file_location("bench_frontend", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = ["--device", "cpu", "--streams", "4", "--cycles", "2", "--warmup", "1", "--per-stream-max", "2"]
    bench.main([*args, "--json", str(tmp_path / "f.json"), "--md", str(tmp_path / "f.md")])
    (row,) = json.loads((tmp_path / "f.json").read_text())["results"]
    assert row["streams"] == 4 and row["push_samples"] == 2560 and row["frames_per_stream_per_cycle"] == 16
    assert row["max_abs_diff_vs_nemo"] == 0.0
    assert row["ours_gpu_span_ms"] is None and row["nemo_per_stream_timed_streams"] == 2
    assert all(row[k] > 0 for k in ("ours_cycle_ms", "ours_host_ms", "nemo_batched_ms", "nemo_per_stream_ms"))
    assert "| 4 | 0.02 |" in (tmp_path / "f.md").read_text()


def test_fft_batch_sizes_are_few_and_close_to_the_frames():
    """The FFT's batch sizes: at least the frames, at most 1/8 more, and 8 per octave (few cuFFT plans)."""
    sizes = [fft_rows(n) for n in range(1, 70000)]
    assert all(n <= size <= max(16, n + n / 8) for n, size in zip(range(1, 70000), sizes, strict=True))
    assert len(set(sizes)) <= 8 * 13
