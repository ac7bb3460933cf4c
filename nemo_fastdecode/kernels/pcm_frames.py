"""Decode every stream's new PCM bytes of a cycle and append them to its slot's sample ring, in one kernel.

A streaming server copies the new audio of all streams to the GPU as ONE flat byte buffer (one host-to-device
copy). Row ``b`` of ``rows [B, 5]`` says where stream ``b``'s bytes are and where its samples go::

    rows[b] = (byte offset in data, samples, slot, first ring position, target ring)

:func:`pcm_frames` decodes the samples of one :class:`SampleFormat` (16-bit signed little-endian PCM, 32-bit
little-endian floats, or G.711 mu-law / A-law bytes) and writes them, as float32, into ``ring [S, C]`` at
``ring[slot, (position + i) % C]`` (target 0), or into a second ring ``input_ring [S, C_in]`` (target 1: the input
ring of a stream the front end resamples, :mod:`~nemo_fastdecode.kernels.resample`). Each row's byte range must
hold whole samples (a sample split between two network pushes is kept back on the host until its other bytes
arrive: :class:`~nemo_fastdecode.streaming.frontend.AudioFrontEnd` does this). int16 samples are scaled as NeMo
reads 16-bit WAV files (``AudioSegment`` through soundfile: ``x / 32768``, exact in fp32); floats are copied bit
for bit; a G.711 byte becomes its 16-bit linear value in ITU-T G.711 (what ``audioop.ulaw2lin`` /
``audioop.alaw2lin`` give at width 2: mu-law within +-32124, A-law within +-32256) over 32768, exact in fp32.
Bytes are read one at a time and assembled here, so rows may start at any byte offset and the result does not
depend on the host's byte order. :func:`pcm_frames_reference` is the torch version.
"""

from __future__ import annotations

import contextlib
import enum

import numpy as np
import torch

try:  # Triton is optional: without it only the torch reference runs.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

__all__ = ["INT16_SCALE", "SampleFormat", "g711_linear", "pcm_frames", "pcm_frames_reference"]

INT16_SCALE = 1.0 / 32768  # NeMo's AudioSegment: int16 samples / 2**15 (a power of two: exact)
# compiled kernels read only constexpr globals
_INT16_SCALE_CONST = tl.constexpr(INT16_SCALE) if tl is not None else None
ROW_FIELDS = 5  # byte offset, samples, slot, first ring position, target ring (0: ring, 1: input ring)


class SampleFormat(enum.Enum):
    """Encoding of the samples in a stream's bytes (little-endian, mono)."""

    INT16 = "int16"
    FLOAT32 = "float32"
    MULAW = "mulaw"  #: G.711 mu-law, one byte a sample (OpenAI Realtime's ``audio/pcmu``, 8 kHz)
    ALAW = "alaw"  #: G.711 A-law, one byte a sample (OpenAI Realtime's ``audio/pcma``, 8 kHz)

    @property
    def itemsize(self) -> int:
        """Bytes per sample."""
        return _ITEMSIZE[self]

    @property
    def code(self) -> int:
        """The kernel's compile-time format number (the order of the members)."""
        return list(SampleFormat).index(self)

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype of an array of this format's samples (G.711: its bytes, uint8)."""
        return np.dtype({"int16": "<i2", "float32": "<f4"}.get(self.value, "u1"))

    @classmethod
    def parse(cls, value: str | SampleFormat | torch.dtype) -> SampleFormat:
        """A format from its name (``"int16"``, ``"float32"``, ``"mulaw"``, ``"alaw"``), a torch dtype, or a format;
        else a clear error."""
        if isinstance(value, SampleFormat):
            return value
        names = {f.value: f for f in cls} | {torch.int16: cls.INT16, torch.float32: cls.FLOAT32}
        if value not in names:
            valid = ", ".join(repr(f.value) for f in cls)
            raise ValueError(f"sample format {value!r} is not supported; valid: {valid}")
        return names[value]


_ITEMSIZE = {SampleFormat.INT16: 2, SampleFormat.FLOAT32: 4, SampleFormat.MULAW: 1, SampleFormat.ALAW: 1}


def g711_linear(sample_format: SampleFormat) -> np.ndarray:
    """``[256]`` int32: the 16-bit linear value of each G.711 byte (ITU-T G.711's decoding, as ``audioop`` has it).

    mu-law: the byte inverted, ``t = ((mantissa << 3) + 0x84) << exponent``, ``t - 0x84`` (``0x84 - t`` if the sign
    bit is set). A-law: the byte XOR ``0x55``, ``t = mantissa << 4`` plus ``8`` (segment 0), ``0x108`` (segment 1) or
    ``0x108`` shifted by ``segment - 1``; negative unless the sign bit is set.
    """
    byte = np.arange(256, dtype=np.int32)
    if sample_format is SampleFormat.MULAW:
        u = ~byte & 0xFF
        t = (((u & 0x0F) << 3) + 0x84) << ((u >> 4) & 7)
        return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int32)
    if sample_format is SampleFormat.ALAW:
        a = byte ^ 0x55
        t, segment = (a & 0x0F) << 4, (a >> 4) & 7
        t = np.where(segment == 0, t + 8, np.where(segment == 1, t + 0x108, (t + 0x108) << np.maximum(segment - 1, 0)))
        return np.where(a & 0x80, t, -t).astype(np.int32)
    raise ValueError(f"{sample_format} is not a G.711 format")


if triton is not None:

    @triton.jit
    def _g711_word(byte, FORMAT: tl.constexpr):
        """The 16-bit linear value of G.711 bytes (int32): :func:`g711_linear`'s formula."""
        if FORMAT == 2:  # mu-law
            u = 255 - byte
            t = (((u & 15) << 3) + 132) << ((u >> 4) & 7)
            word = tl.where((u & 128) != 0, 132 - t, t - 132)
        else:  # A-law
            a = byte ^ 85
            t = (a & 15) << 4
            segment = (a >> 4) & 7
            t = tl.where(segment == 0, t + 8, tl.where(segment == 1, t + 264, (t + 264) << tl.maximum(segment - 1, 0)))
            word = tl.where((a & 128) != 0, t, -t)
        return word

    @triton.jit
    def _pcm_frames_kernel(
        data_ptr,
        rows_ptr,
        ring_ptr,
        ring_stride,
        capacity,
        input_ptr,
        input_stride,
        input_capacity,
        FORMAT: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        b = tl.program_id(0)
        offset = tl.load(rows_ptr + b * 5).to(tl.int64)
        count = tl.load(rows_ptr + b * 5 + 1)
        slot = tl.load(rows_ptr + b * 5 + 2).to(tl.int64)
        position = tl.load(rows_ptr + b * 5 + 3)
        target = tl.load(rows_ptr + b * 5 + 4)
        i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = i < count
        if FORMAT == 1:  # float32
            src = data_ptr + offset + i.to(tl.int64) * 4
            bits = tl.load(src, mask=ok, other=0).to(tl.uint32)
            bits |= tl.load(src + 1, mask=ok, other=0).to(tl.uint32) << 8
            bits |= tl.load(src + 2, mask=ok, other=0).to(tl.uint32) << 16
            bits |= tl.load(src + 3, mask=ok, other=0).to(tl.uint32) << 24
            value = bits.to(tl.float32, bitcast=True)
        elif FORMAT == 0:  # int16
            src = data_ptr + offset + i.to(tl.int64) * 2
            word = tl.load(src, mask=ok, other=0).to(tl.int32) | (tl.load(src + 1, mask=ok, other=0).to(tl.int32) << 8)
            word = tl.where(word >= 32768, word - 65536, word)  # two's complement sign
            value = word.to(tl.float32) * _INT16_SCALE_CONST
        else:  # G.711: one byte a sample
            byte = tl.load(data_ptr + offset + i.to(tl.int64), mask=ok, other=0).to(tl.int32)
            value = _g711_word(byte, FORMAT).to(tl.float32) * _INT16_SCALE_CONST
        if target == 0:
            column = ((position + i) % capacity).to(tl.int64)
            tl.store(ring_ptr + slot * ring_stride + column, value, mask=ok)
        else:
            column = ((position + i) % input_capacity).to(tl.int64)
            tl.store(input_ptr + slot * input_stride + column, value, mask=ok)


def _check(
    data: torch.Tensor, rows: torch.Tensor, ring: torch.Tensor, input_ring: torch.Tensor | None = None
) -> torch.Tensor:
    """The bytes of ``data`` as a flat uint8 tensor, after checking the arguments' shapes and dtypes."""
    if data.dim() != 1 or not data.is_contiguous():
        raise ValueError(f"data must be a flat contiguous tensor, got shape {tuple(data.shape)}")
    if rows.dim() != 2 or rows.shape[1] != ROW_FIELDS or rows.dtype != torch.int32 or not rows.is_contiguous():
        raise ValueError(
            f"rows must be a contiguous int32 [B, {ROW_FIELDS}] tensor (byte offset, samples, slot, ring position, "
            "target ring), "
            f"got {rows.dtype} {tuple(rows.shape)}"
        )
    if ring.dim() != 2 or ring.dtype != torch.float32 or ring.stride(1) != 1:
        raise ValueError(f"ring must be float32 [S, C] with unit column stride, got {ring.dtype} {tuple(ring.shape)}")
    if input_ring is not None and (
        input_ring.dim() != 2 or input_ring.dtype != torch.float32 or input_ring.stride(1) != 1
    ):
        raise ValueError(
            f"input_ring must be float32 [S, C_in] with unit column stride, got {input_ring.dtype} "
            f"{tuple(input_ring.shape)}"
        )
    devices = {data.device, rows.device, ring.device} | ({input_ring.device} if input_ring is not None else set())
    if len(devices) != 1:
        raise ValueError(f"data, rows, ring and input_ring must share a device, got {sorted(map(str, devices))}")
    return data.view(torch.uint8)


def pcm_frames(
    data: torch.Tensor,
    rows: torch.Tensor,
    ring: torch.Tensor,
    sample_format: SampleFormat,
    max_samples: int,
    block: int = 1024,
    input_ring: torch.Tensor | None = None,
) -> None:
    """Decode the samples of every row of ``data`` and write them into ``ring`` (or ``input_ring``), in place.

    Args:
        data: ``[N]`` the packed bytes of all rows (any dtype: it is read as bytes; e.g. uint8 or int16).
        rows: ``[B, 5]`` int32: byte offset into ``data``, samples, slot, first ring position (``< C``, or
            ``< C_in``), target ring (0: ``ring``, 1: ``input_ring``). Rows of one slot and ring must write distinct
            positions (together at most the ring's columns; the kernel does not check: the front end does).
        ring: ``[S, C]`` float32 per-slot sample rings, written at ``[slot, (position + i) % C]``.
        sample_format: how every row's bytes encode samples (one launch per format).
        max_samples: the largest sample count among the rows (host-known: sizes the grid without a sync).
        block: samples per program.
        input_ring: ``[S, C_in]`` float32 per-slot rings of the rows with target 1 (``None``: no such rows).
    """
    data = _check(data, rows, ring, input_ring)
    if rows.shape[0] == 0 or max_samples == 0:
        return
    second = ring if input_ring is None else input_ring
    grid = (rows.shape[0], triton.cdiv(max_samples, block))
    with torch.cuda.device(ring.device) if ring.is_cuda else contextlib.nullcontext():
        _pcm_frames_kernel[grid](
            data,
            rows,
            ring,
            ring.stride(0),
            ring.shape[1],
            second,
            second.stride(0),
            second.shape[1],
            FORMAT=sample_format.code,
            BLOCK=block,
        )


def pcm_frames_reference(
    data: torch.Tensor,
    rows: torch.Tensor,
    ring: torch.Tensor,
    sample_format: SampleFormat,
    max_samples: int,
    input_ring: torch.Tensor | None = None,
) -> None:
    """Torch version of :func:`pcm_frames` (same arguments, same in-place writes), one row at a time; G.711 bytes
    through the 256-entry table of :func:`g711_linear`."""
    data = _check(data, rows, ring, input_ring).long()
    table = None
    if sample_format in (SampleFormat.MULAW, SampleFormat.ALAW):
        table = torch.from_numpy(g711_linear(sample_format)).to(ring.device)
    for offset, count, slot, position, target in rows.tolist():
        size = sample_format.itemsize
        parts = data[offset : offset + count * size].view(count, size)  # [n, bytes] little-endian
        word = sum(parts[:, k] << (8 * k) for k in range(size))
        if sample_format is SampleFormat.INT16:
            values = torch.where(word >= 32768, word - 65536, word).float() * INT16_SCALE
        elif sample_format is SampleFormat.FLOAT32:
            values = torch.where(word >= 2**31, word - 2**32, word).int().view(torch.float32)
        else:
            values = table[word].float() * INT16_SCALE
        out = ring if target == 0 else input_ring
        columns = (position + torch.arange(count, device=ring.device)) % out.shape[1]
        out[slot].index_copy_(0, columns, values)
