"""PCM decoding into slot sample rings (kernels/pcm_frames.py) against its torch reference and NumPy's decoding, in
Triton's interpreter on the CPU (conftest) or on a GPU; and the int16 scaling against NeMo's ``AudioSegment``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nemo_fastdecode.kernels.pcm_frames import SampleFormat, pcm_frames, pcm_frames_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BLOCK = 16  # small blocks: the lengths below sit on both sides of one and two block boundaries


def _payload(sample_format: SampleFormat, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` samples with the format's extremes among them."""
    if sample_format is SampleFormat.INT16:
        values = rng.integers(-32768, 32768, size=count).astype("<i2")
        special = np.array([-32768, 32767, -1, 0, 1], dtype="<i2")
    else:
        values = rng.standard_normal(count).astype("<f4")
        special = np.array([-0.0, 1e-45, -3.4e38, 1.0, np.inf], dtype="<f4")  # the kernel copies any bits
    values[: min(count, len(special))] = special[:count]
    return values


def _pack(payloads: list[np.ndarray], slots: list[int], positions: list[int], misalign: int):
    """One byte buffer holding every payload (each at an odd or even offset) and the ``[B, 4]`` rows."""
    data, rows = bytearray(b"\x7f" * misalign), []
    for payload, slot, position in zip(payloads, slots, positions, strict=True):
        rows.append((len(data), len(payload), slot, position))
        data += payload.tobytes() + b"\xff"  # a stray byte after each row: never read
    return torch.frombuffer(data, dtype=torch.uint8).clone(), torch.tensor(rows, dtype=torch.int32)


@pytest.mark.parametrize("sample_format", list(SampleFormat))
@pytest.mark.parametrize(
    ("lengths", "misalign"),
    [([1, 15, 16, 17], 0), ([31, 32, 33, 2], 1), ([40] * 37, 3)],  # block boundaries; odd offsets; many streams
)
def test_matches_reference_and_numpy(sample_format, lengths, misalign):
    rng = np.random.default_rng(len(lengths) + misalign)
    capacity = 48
    slots = list(rng.permutation(len(lengths) + 2)[: len(lengths)])  # not every slot pushes
    positions = [int(p) for p in rng.integers(0, capacity, size=len(lengths))]  # some rows wrap around the ring
    payloads = [_payload(sample_format, n, rng) for n in lengths]
    data, rows = _pack(payloads, slots, positions, misalign)
    ring = torch.randn(len(lengths) + 2, capacity)
    expected = ring.clone()
    pcm_frames_reference(data, rows, expected, sample_format, max(lengths))
    data, rows, ring = data.to(DEVICE), rows.to(DEVICE), ring.to(DEVICE)
    pcm_frames(data, rows, ring, sample_format, max(lengths), block=BLOCK)
    assert torch.equal(ring.cpu(), expected)
    for payload, slot, position in zip(payloads, slots, positions, strict=True):
        columns = (position + np.arange(len(payload))) % capacity
        decoded = payload.astype(np.float32) / 32768 if sample_format is SampleFormat.INT16 else payload
        assert np.array_equal(expected[slot, columns].numpy().view(np.uint32), decoded.view(np.uint32))


def test_int16_bytes_of_one_tensor_and_empty_rows():
    """An int16 buffer is read as its bytes; rows of zero samples write nothing."""
    values = torch.tensor([1, -2, 300, -32768, 32767], dtype=torch.int16)
    rows = torch.tensor([[2, 4, 0, 3], [0, 0, 1, 0]], dtype=torch.int32)  # byte offset 2: from the second sample
    ring = torch.zeros(2, 5, device=DEVICE)
    pcm_frames(values.to(DEVICE), rows.to(DEVICE), ring, SampleFormat.INT16, 4, block=BLOCK)
    expected = torch.tensor([[-32768, 32767, 0, -2, 300], [0, 0, 0, 0, 0]]) / 32768  # from column 3, wrapping
    assert torch.equal(ring.cpu(), expected)


def test_int16_scaling_is_nemo_audio_segment(tmp_path):
    """NeMo reads a 16-bit WAV as x / 32768 (AudioSegment through soundfile): the kernel's scaling."""
    import soundfile as sf
    from nemo.collections.asr.parts.preprocessing.segment import AudioSegment

    pcm = _payload(SampleFormat.INT16, 999, np.random.default_rng(0))
    sf.write(tmp_path / "a.wav", pcm, 16000, subtype="PCM_16")
    nemo_samples = AudioSegment.from_file(str(tmp_path / "a.wav"), target_sr=16000).samples
    ring = torch.zeros(1, 999)
    rows = torch.tensor([[0, 999, 0, 0]], dtype=torch.int32)
    pcm_frames_reference(torch.from_numpy(pcm.view(np.uint8).copy()), rows, ring, SampleFormat.INT16, 999)
    assert nemo_samples.dtype == np.float32
    assert np.array_equal(ring[0].numpy(), nemo_samples)


def test_bad_arguments():
    data = torch.zeros(8, dtype=torch.uint8, device=DEVICE)
    ring = torch.zeros(2, 4, device=DEVICE)
    rows = torch.zeros(1, 4, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"rows must be a contiguous int32 \[B, 4\]"):
        pcm_frames(data, rows.long(), ring, SampleFormat.INT16, 1)
    with pytest.raises(ValueError, match="ring must be float32"):
        pcm_frames(data, rows, ring.double(), SampleFormat.INT16, 1)
    with pytest.raises(ValueError, match="data must be a flat contiguous tensor"):
        pcm_frames(data.view(2, 4), rows, ring, SampleFormat.INT16, 1)
    with pytest.raises(ValueError, match=r"sample format 'int24' is not supported; valid: 'int16', 'float32'"):
        SampleFormat.parse("int24")
