"""Decode every stream's new PCM bytes of a cycle and append them to its slot's sample ring, in one kernel.

A streaming server copies the new audio of all streams to the GPU as ONE flat byte buffer (one host-to-device
copy). Row ``b`` of ``rows [B, 4]`` says where stream ``b``'s bytes are and where its samples go::

    rows[b] = (byte offset in data, samples, slot, first ring position)

:func:`pcm_frames` decodes the samples (16-bit signed little-endian PCM, or 32-bit little-endian floats) and
writes them, as float32, into ``ring [S, C]`` at ``ring[slot, (position + i) % C]``. Each row's byte range must
hold whole samples (a sample split between two network pushes is kept back on the host until its other bytes
arrive: :class:`~nemo_fastdecode.streaming.frontend.AudioFrontEnd` does this). int16 samples are scaled as NeMo
reads 16-bit WAV files (``AudioSegment`` through soundfile: ``x / 32768``, exact in fp32); floats are copied bit
for bit. Bytes are read one at a time and assembled here, so rows may start at any byte offset and the result
does not depend on the host's byte order. :func:`pcm_frames_reference` is the torch version.
"""

from __future__ import annotations

import contextlib
import enum

import torch

try:  # Triton is optional: without it only the torch reference runs.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

__all__ = ["INT16_SCALE", "SampleFormat", "pcm_frames", "pcm_frames_reference"]

INT16_SCALE = 1.0 / 32768  # NeMo's AudioSegment: int16 samples / 2**15 (a power of two: exact)
# compiled kernels read only constexpr globals
_INT16_SCALE_CONST = tl.constexpr(INT16_SCALE) if tl is not None else None
ROW_FIELDS = 4  # byte offset, samples, slot, first ring position


class SampleFormat(enum.Enum):
    """Encoding of the samples in a stream's bytes (little-endian, mono)."""

    INT16 = "int16"
    FLOAT32 = "float32"

    @property
    def itemsize(self) -> int:
        """Bytes per sample."""
        return 2 if self is SampleFormat.INT16 else 4

    @classmethod
    def parse(cls, value: str | SampleFormat | torch.dtype) -> SampleFormat:
        """A format from its name (``"int16"``, ``"float32"``), a torch dtype, or a format; else a clear error."""
        if isinstance(value, SampleFormat):
            return value
        names = {"int16": cls.INT16, "float32": cls.FLOAT32, torch.int16: cls.INT16, torch.float32: cls.FLOAT32}
        if value not in names:
            raise ValueError(f"sample format {value!r} is not supported; valid: 'int16', 'float32'")
        return names[value]


if triton is not None:

    @triton.jit
    def _pcm_frames_kernel(
        data_ptr, rows_ptr, ring_ptr, ring_stride, capacity, FLOAT32: tl.constexpr, BLOCK: tl.constexpr
    ):
        b = tl.program_id(0)
        offset = tl.load(rows_ptr + b * 4).to(tl.int64)
        count = tl.load(rows_ptr + b * 4 + 1)
        slot = tl.load(rows_ptr + b * 4 + 2).to(tl.int64)
        position = tl.load(rows_ptr + b * 4 + 3)
        i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = i < count
        if FLOAT32:
            src = data_ptr + offset + i.to(tl.int64) * 4
            bits = tl.load(src, mask=ok, other=0).to(tl.uint32)
            bits |= tl.load(src + 1, mask=ok, other=0).to(tl.uint32) << 8
            bits |= tl.load(src + 2, mask=ok, other=0).to(tl.uint32) << 16
            bits |= tl.load(src + 3, mask=ok, other=0).to(tl.uint32) << 24
            value = bits.to(tl.float32, bitcast=True)
        else:
            src = data_ptr + offset + i.to(tl.int64) * 2
            word = tl.load(src, mask=ok, other=0).to(tl.int32) | (tl.load(src + 1, mask=ok, other=0).to(tl.int32) << 8)
            word = tl.where(word >= 32768, word - 65536, word)  # two's complement sign
            value = word.to(tl.float32) * _INT16_SCALE_CONST
        column = ((position + i) % capacity).to(tl.int64)
        tl.store(ring_ptr + slot * ring_stride + column, value, mask=ok)


def _check(data: torch.Tensor, rows: torch.Tensor, ring: torch.Tensor) -> torch.Tensor:
    """The bytes of ``data`` as a flat uint8 tensor, after checking the arguments' shapes and dtypes."""
    if data.dim() != 1 or not data.is_contiguous():
        raise ValueError(f"data must be a flat contiguous tensor, got shape {tuple(data.shape)}")
    if rows.dim() != 2 or rows.shape[1] != ROW_FIELDS or rows.dtype != torch.int32 or not rows.is_contiguous():
        raise ValueError(
            f"rows must be a contiguous int32 [B, {ROW_FIELDS}] tensor (byte offset, samples, slot, ring position), "
            f"got {rows.dtype} {tuple(rows.shape)}"
        )
    if ring.dim() != 2 or ring.dtype != torch.float32 or ring.stride(1) != 1:
        raise ValueError(f"ring must be float32 [S, C] with unit column stride, got {ring.dtype} {tuple(ring.shape)}")
    if not (data.device == rows.device == ring.device):
        raise ValueError(f"data, rows and ring must share a device, got {data.device}, {rows.device}, {ring.device}")
    return data.view(torch.uint8)


def pcm_frames(
    data: torch.Tensor,
    rows: torch.Tensor,
    ring: torch.Tensor,
    sample_format: SampleFormat,
    max_samples: int,
    block: int = 1024,
) -> None:
    """Decode the samples of every row of ``data`` and write them into ``ring``, in place.

    Args:
        data: ``[N]`` the packed bytes of all rows (any dtype: it is read as bytes; e.g. uint8 or int16).
        rows: ``[B, 4]`` int32: byte offset into ``data``, samples, slot, first ring position (``< C``). Rows of
            one slot must write distinct positions (together at most ``C`` samples; the kernel does not check: the
            front end does).
        ring: ``[S, C]`` float32 per-slot sample rings, written at ``[slot, (position + i) % C]``.
        sample_format: how every row's bytes encode samples (one launch per format).
        max_samples: the largest sample count among the rows (host-known: sizes the grid without a sync).
        block: samples per program.
    """
    data = _check(data, rows, ring)
    if rows.shape[0] == 0 or max_samples == 0:
        return
    grid = (rows.shape[0], triton.cdiv(max_samples, block))
    with torch.cuda.device(ring.device) if ring.is_cuda else contextlib.nullcontext():
        _pcm_frames_kernel[grid](
            data, rows, ring, ring.stride(0), ring.shape[1], FLOAT32=sample_format is SampleFormat.FLOAT32, BLOCK=block
        )


def pcm_frames_reference(
    data: torch.Tensor, rows: torch.Tensor, ring: torch.Tensor, sample_format: SampleFormat, max_samples: int
) -> None:
    """Torch version of :func:`pcm_frames` (same arguments, same in-place writes), one row at a time."""
    data = _check(data, rows, ring).long()
    capacity = ring.shape[1]
    for offset, count, slot, position in rows.tolist():
        size = sample_format.itemsize
        parts = data[offset : offset + count * size].view(count, size)  # [n, bytes] little-endian
        word = sum(parts[:, k] << (8 * k) for k in range(size))
        if sample_format is SampleFormat.INT16:
            values = torch.where(word >= 32768, word - 65536, word).float() * INT16_SCALE
        else:
            values = torch.where(word >= 2**31, word - 2**32, word).int().view(torch.float32)
        columns = (position + torch.arange(count, device=ring.device)) % capacity
        ring[slot].index_copy_(0, columns, values)
