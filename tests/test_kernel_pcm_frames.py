"""PCM decoding into slot sample rings (kernels/pcm_frames.py) against its torch reference and NumPy's decoding, in
Triton's interpreter on the CPU (conftest) or on a GPU; the int16 scaling against NeMo's ``AudioSegment``; G.711
mu-law and A-law against ``audioop`` and ITU-T G.711's decoding written out in NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nemo_fastdecode.kernels.pcm_frames import SampleFormat, g711_linear, pcm_frames, pcm_frames_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BLOCK = 16  # small blocks: the lengths below sit on both sides of one and two block boundaries


def _payload(sample_format: SampleFormat, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` samples with the format's extremes among them."""
    if sample_format is SampleFormat.INT16:
        values = rng.integers(-32768, 32768, size=count).astype("<i2")
        special = np.array([-32768, 32767, -1, 0, 1], dtype="<i2")
    elif sample_format.itemsize == 1:  # G.711: every byte is a sample
        values = rng.integers(0, 256, size=count).astype(np.uint8)
        special = np.array([0, 255, 127, 128, 0x55, 0xD5, 0x7F, 0xFF], dtype=np.uint8)
    else:
        values = rng.standard_normal(count).astype("<f4")
        special = np.array([-0.0, 1e-45, -3.4e38, 1.0, np.inf], dtype="<f4")  # the kernel copies any bits
    values[: min(count, len(special))] = special[:count]
    return values


def _decoded(sample_format: SampleFormat, payload: np.ndarray) -> np.ndarray:
    """float32 samples of a payload, decoded in NumPy."""
    if sample_format is SampleFormat.FLOAT32:
        return payload
    if sample_format is SampleFormat.INT16:
        return payload.astype(np.float32) / 32768
    return g711_linear(sample_format)[payload].astype(np.float32) / 32768


def _pack(payloads: list[np.ndarray], slots: list[int], positions: list[int], misalign: int, targets=None):
    """One byte buffer holding every payload (each at an odd or even offset) and the ``[B, 5]`` rows."""
    data, rows = bytearray(b"\x7f" * misalign), []
    targets = [0] * len(payloads) if targets is None else targets
    for payload, slot, position, target in zip(payloads, slots, positions, targets, strict=True):
        rows.append((len(data), len(payload), slot, position, target))
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
        decoded = _decoded(sample_format, payload)
        assert np.array_equal(expected[slot, columns].numpy().view(np.uint32), decoded.view(np.uint32))


@pytest.mark.parametrize("sample_format", list(SampleFormat))
def test_rows_targeting_the_input_ring(sample_format):
    """Rows with target 1 go to the input ring (its own width), the others to the sample ring, in one launch."""
    rng = np.random.default_rng(7)
    lengths, slots, targets = [5, 17, 33, 1], [0, 1, 2, 1], [1, 0, 1, 0]
    positions = [11, 40, 3, 10]  # slot 1: columns 40-47 and 0-8 (wrapping), then 10
    payloads = [_payload(sample_format, n, rng) for n in lengths]
    data, rows = _pack(payloads, slots, positions, misalign=1, targets=targets)
    ring, input_ring = torch.randn(3, 48), torch.randn(3, 40)
    expected, expected_input = ring.clone(), input_ring.clone()
    pcm_frames_reference(data, rows, expected, sample_format, 33, input_ring=expected_input)
    ring, input_ring = ring.to(DEVICE), input_ring.to(DEVICE)
    pcm_frames(data.to(DEVICE), rows.to(DEVICE), ring, sample_format, 33, block=BLOCK, input_ring=input_ring)
    assert torch.equal(ring.cpu(), expected) and torch.equal(input_ring.cpu(), expected_input)
    for payload, slot, position, target in zip(payloads, slots, positions, targets, strict=True):
        out = expected_input if target else expected
        columns = (position + np.arange(len(payload))) % out.shape[1]
        assert np.array_equal(out[slot, columns].numpy(), _decoded(sample_format, payload))


def _g711_standard(sample_format: SampleFormat) -> np.ndarray:
    """ITU-T G.711's decoding of every byte, written out from the standard's tables (sign, 3-bit segment, 4-bit
    step): mu-law ``((2 * step + 33) << segment) - 33`` in 14-bit units, A-law ``2 * step + 1`` (segment 0) or
    ``(2 * step + 33) << (segment - 1)`` in 13-bit units; scaled to 16 bits (x4 and x8)."""
    out = np.empty(256, dtype=np.int64)
    for byte in range(256):
        if sample_format is SampleFormat.MULAW:
            code = ~byte & 0xFF  # transmitted inverted
            segment, step = (code >> 4) & 7, code & 15
            magnitude = (((2 * step + 33) << segment) - 33) * 4
            out[byte] = -magnitude if code & 0x80 else magnitude
        else:
            code = byte ^ 0x55  # even bits inverted
            segment, step = (code >> 4) & 7, code & 15
            magnitude = (2 * step + 1 if segment == 0 else (2 * step + 33) << (segment - 1)) * 8
            out[byte] = magnitude if code & 0x80 else -magnitude
    return out


@pytest.mark.parametrize("sample_format", [SampleFormat.MULAW, SampleFormat.ALAW])
def test_g711_decoding_is_audioop_and_the_standard(sample_format):
    """Every byte decodes to audioop's 16-bit value (where audioop exists) and to G.711's formula, over 32768."""
    every = np.arange(256, dtype=np.uint8)
    standard = _g711_standard(sample_format)
    assert np.array_equal(g711_linear(sample_format), standard)
    data, rows = _pack([every], [0], [0], misalign=0)
    ring, expected = torch.zeros(1, 256, device=DEVICE), torch.zeros(1, 256)
    pcm_frames(data.to(DEVICE), rows.to(DEVICE), ring, sample_format, 256, block=BLOCK)
    pcm_frames_reference(data, rows, expected, sample_format, 256)
    assert torch.equal(ring.cpu(), expected)
    assert np.array_equal(expected[0].numpy(), standard.astype(np.float32) / 32768)
    audioop = pytest.importorskip("audioop")
    decode = audioop.ulaw2lin if sample_format is SampleFormat.MULAW else audioop.alaw2lin
    reference = np.frombuffer(decode(every.tobytes(), 2), dtype="<i2")
    assert np.array_equal(expected[0].numpy(), reference.astype(np.float32) / 32768)
    assert sample_format.itemsize == 1 and SampleFormat.parse(sample_format.value) is sample_format


def test_int16_bytes_of_one_tensor_and_empty_rows():
    """An int16 buffer is read as its bytes; rows of zero samples write nothing."""
    values = torch.tensor([1, -2, 300, -32768, 32767], dtype=torch.int16)
    rows = torch.tensor([[2, 4, 0, 3, 0], [0, 0, 1, 0, 0]], dtype=torch.int32)  # byte offset 2: the second sample
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
    rows = torch.tensor([[0, 999, 0, 0, 0]], dtype=torch.int32)
    pcm_frames_reference(torch.from_numpy(pcm.view(np.uint8).copy()), rows, ring, SampleFormat.INT16, 999)
    assert nemo_samples.dtype == np.float32
    assert np.array_equal(ring[0].numpy(), nemo_samples)


def test_bad_arguments():
    data = torch.zeros(8, dtype=torch.uint8, device=DEVICE)
    ring = torch.zeros(2, 4, device=DEVICE)
    rows = torch.zeros(1, 5, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"rows must be a contiguous int32 \[B, 5\]"):
        pcm_frames(data, rows.long(), ring, SampleFormat.INT16, 1)
    with pytest.raises(ValueError, match="ring must be float32"):
        pcm_frames(data, rows, ring.double(), SampleFormat.INT16, 1)
    with pytest.raises(ValueError, match="data must be a flat contiguous tensor"):
        pcm_frames(data.view(2, 4), rows, ring, SampleFormat.INT16, 1)
    with pytest.raises(ValueError, match=r"sample format 'int24' is not supported; valid: 'int16', 'float32', 'mulaw'"):
        SampleFormat.parse("int24")
