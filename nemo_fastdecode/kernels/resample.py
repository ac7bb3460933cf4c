"""Resample many streams at once, each at its own rate, as ``scipy.signal.resample_poly`` does, in streaming form.

``resample_poly(x, up, down)`` with its defaults (``window=('kaiser', 5.0)``, zero padding) filters ``x`` upsampled by
``up`` with ``h = firwin(2 * half_len + 1, 1 / max(up, down), window=('kaiser', 5.0)) * up`` (``half_len = 10 *
max(up, down)``) and keeps every ``down``-th sample, centred::

    y[n] = sum_k x[k] * h[n * down + half_len - k * up]      (x = 0 outside the stream; 0 <= n < ceil(L * up / down))

so output ``n`` needs inputs up to ``floor((n * down + half_len) / up)``: :func:`ready_outputs` of a stream with
``L`` inputs so far are final, and at its end the rest follow with zeros past the last input (:func:`total_outputs`).
Each output reads at most ``ceil((2 * half_len + 1) / up)`` inputs (one polyphase branch of ``h``).

Here the inputs live in per-slot rings (``input_ring [S, C_in]``, input ``k`` at column ``k % C_in``) and the outputs
go to the per-slot sample rings the front end frames (``ring [S, C]``). Row ``b`` of ``rows [B, 9]`` (int64) is one
stream's run of consecutive outputs::

    rows[b] = (slot, first output n0, outputs, up, down, half_len, filter offset in bank, inputs, first ring column)

Output ``n0 + j`` is written at ``ring[slot, (column + j) % C]``; inputs at or past ``inputs`` (and before 0) read as
zeros; ``bank`` packs every rate's filter (:class:`FilterBank`), so one launch serves streams of any rates.
:func:`resample` is the Triton kernel (fp32 products and sums), :func:`resample_reference` the torch version.
:func:`design_filter` designs a rate pair's filter with ``scipy.signal.firwin`` exactly as ``resample_poly`` does
for float32 input (``firwin``'s taps rounded to float32, then times ``up`` in float32).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch

try:  # Triton is optional: without it only the torch reference runs.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

__all__ = [
    "RESAMPLE_FIELDS",
    "FilterBank",
    "Ratio",
    "design_filter",
    "ready_outputs",
    "resample",
    "resample_reference",
    "total_outputs",
]

RESAMPLE_FIELDS = 9  # slot, first output, outputs, up, down, half_len, filter offset, inputs, first ring column


@dataclass(frozen=True)
class Ratio:
    """A rate pair in lowest terms: ``up / down = out_rate / in_rate`` (``resample_poly``'s arguments)."""

    up: int
    down: int

    @classmethod
    def of(cls, in_rate: int, out_rate: int) -> Ratio:
        g = math.gcd(in_rate, out_rate)
        return cls(out_rate // g, in_rate // g)

    @property
    def half_len(self) -> int:
        """``resample_poly``'s filter half-length, ``10 * max(up, down)``."""
        return 10 * max(self.up, self.down)

    @property
    def taps(self) -> int:
        """The most inputs one output reads (the longest polyphase branch of the ``2 * half_len + 1`` taps)."""
        return -(-(2 * self.half_len + 1) // self.up)

    @property
    def lag(self) -> int:
        """An upper bound on the outputs a stream's end adds to its :func:`ready_outputs` (``total - ready``)."""
        return -(-self.half_len // self.down) + 2

    @property
    def history(self) -> int:
        """An upper bound on the inputs before its last one that a stream's first not-yet-ready output still reads."""
        return -(-(2 * self.half_len + self.down + 1) // self.up) + 1


def design_filter(ratio: Ratio) -> np.ndarray:
    """``[2 * half_len + 1]`` float32: ``resample_poly``'s default filter for ``ratio``, as it computes it for float32
    input (``firwin(2 * half_len + 1, 1 / max(up, down), window=('kaiser', 5.0))`` cast to float32, times ``up``)."""
    from scipy.signal import firwin

    h = np.asarray(firwin(2 * ratio.half_len + 1, 1.0 / max(ratio.up, ratio.down), window=("kaiser", 5.0)))
    h = h.astype(np.float32)
    h *= np.float32(ratio.up)
    return h


def ready_outputs(inputs: np.ndarray, up: np.ndarray, down: np.ndarray, half_len: np.ndarray) -> np.ndarray:
    """Outputs final once ``inputs`` inputs arrived: ``n`` with ``n * down + half_len < inputs * up`` (element-wise),
    at most :func:`total_outputs`."""
    reach = inputs * up - 1 - half_len
    return np.minimum(np.where(reach >= 0, reach // down + 1, 0), total_outputs(inputs, up, down))


def total_outputs(inputs: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
    """``resample_poly``'s output length for ``inputs`` inputs, ``ceil(inputs * up / down)`` (element-wise)."""
    return -(-inputs * up // down)


class FilterBank:
    """Every rate pair's filter, packed into one float32 vector: ``offset(ratio)`` is where its taps start.

    Filters are designed (:func:`design_filter`) when a ratio is first added; the device copy is rebuilt then.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._offsets: dict[Ratio, int] = {}
        self._taps: list[np.ndarray] = []
        self.bank = torch.zeros(1, dtype=torch.float32, device=device)

    def add(self, ratio: Ratio) -> int:
        """The offset of ``ratio``'s filter in :attr:`bank` (designed and packed on first use)."""
        if ratio not in self._offsets:
            self._offsets[ratio] = sum(len(t) for t in self._taps)
            self._taps.append(design_filter(ratio))
            self.bank = torch.from_numpy(np.concatenate(self._taps)).to(self.device)
        return self._offsets[ratio]

    def offset(self, ratio: Ratio) -> int:
        return self._offsets[ratio]


if triton is not None:

    @triton.jit
    def _resample_kernel(
        input_ptr,
        input_stride,
        input_capacity,
        bank_ptr,
        rows_ptr,
        ring_ptr,
        ring_stride,
        capacity,
        TAPS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        b = tl.program_id(0)
        row = rows_ptr + b * 9
        slot = tl.load(row)
        first = tl.load(row + 1)
        count = tl.load(row + 2)
        up = tl.load(row + 3)
        down = tl.load(row + 4)
        half_len = tl.load(row + 5)
        filter_offset = tl.load(row + 6)
        inputs = tl.load(row + 7)
        column = tl.load(row + 8)
        j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
        ok = j < count
        t = (first + j) * down + half_len  # [BLOCK]: h index of input 0 for each output
        newest = t // up  # the newest input each output reads
        phase = t - newest * up
        tap = tl.arange(0, TAPS).to(tl.int64)
        k = newest[:, None] - tap[None, :]  # [BLOCK, TAPS] input indices
        h_index = phase[:, None] + tap[None, :] * up
        valid = ok[:, None] & (h_index < 2 * half_len + 1) & (k >= 0) & (k < inputs)
        x = tl.load(input_ptr + slot * input_stride + tl.where(valid, k, 0) % input_capacity, mask=valid, other=0.0)
        h = tl.load(bank_ptr + filter_offset + tl.where(valid, h_index, 0), mask=valid, other=0.0)
        y = tl.sum(x * h, axis=1)
        tl.store(ring_ptr + slot * ring_stride + (column + j) % capacity, y, mask=ok)


def _check(input_ring: torch.Tensor, bank: torch.Tensor, rows: torch.Tensor, ring: torch.Tensor) -> None:
    for name, r in (("input_ring", input_ring), ("ring", ring)):
        if r.dim() != 2 or r.dtype != torch.float32 or r.stride(1) != 1:
            raise ValueError(f"{name} must be float32 [S, C] with unit column stride, got {r.dtype} {tuple(r.shape)}")
    if bank.dim() != 1 or bank.dtype != torch.float32 or not bank.is_contiguous():
        raise ValueError(f"bank must be a contiguous float32 vector, got {bank.dtype} {tuple(bank.shape)}")
    if rows.dim() != 2 or rows.shape[1] != RESAMPLE_FIELDS or rows.dtype != torch.int64 or not rows.is_contiguous():
        raise ValueError(
            f"rows must be a contiguous int64 [B, {RESAMPLE_FIELDS}] tensor (slot, first output, outputs, up, down, "
            f"half_len, filter offset, inputs, first ring column), got {rows.dtype} {tuple(rows.shape)}"
        )
    devices = {input_ring.device, bank.device, rows.device, ring.device}
    if len(devices) != 1:
        raise ValueError(f"input_ring, bank, rows and ring must share a device, got {sorted(map(str, devices))}")


def resample(
    input_ring: torch.Tensor,
    bank: torch.Tensor,
    rows: torch.Tensor,
    ring: torch.Tensor,
    max_outputs: int,
    taps: int,
    block: int = 64,
) -> None:
    """Compute every row's outputs (module docstring) and write them into ``ring``, in place: one launch for all rows.

    Args:
        input_ring: ``[S, C_in]`` float32 per-slot input rings (input ``k`` at column ``k % C_in``).
        bank: the packed filters (:attr:`FilterBank.bank`).
        rows: ``[B, 9]`` int64, one run of outputs per row (module docstring).
        ring: ``[S, C]`` float32 per-slot output rings.
        max_outputs: the largest output count among the rows (host-known: sizes the grid without a sync).
        taps: at least the most inputs one output of any row reads (:attr:`Ratio.taps`); rounded up to a power of two
            (a compile-time size: give one value for all launches, e.g. the most over the supported rates).
        block: outputs per program.
    """
    _check(input_ring, bank, rows, ring)
    if rows.shape[0] == 0 or max_outputs == 0:
        return
    grid = (rows.shape[0], triton.cdiv(max_outputs, block))
    with torch.cuda.device(ring.device) if ring.is_cuda else contextlib.nullcontext():
        _resample_kernel[grid](
            input_ring,
            input_ring.stride(0),
            input_ring.shape[1],
            bank,
            rows,
            ring,
            ring.stride(0),
            ring.shape[1],
            TAPS=triton.next_power_of_2(taps),
            BLOCK=block,
        )


def resample_reference(
    input_ring: torch.Tensor,
    bank: torch.Tensor,
    rows: torch.Tensor,
    ring: torch.Tensor,
    max_outputs: int,
    taps: int,
) -> None:
    """Torch version of :func:`resample` (same arguments, same in-place writes), one row at a time."""
    _check(input_ring, bank, rows, ring)
    device = ring.device
    for slot, first, count, up, down, half_len, offset, inputs, column in rows.tolist():
        if count == 0:
            continue
        n = first + torch.arange(count, device=device)
        t = n * down + half_len
        newest, phase = t // up, t % up
        tap = torch.arange(taps, device=device)
        k = newest[:, None] - tap[None, :]
        h_index = phase[:, None] + tap[None, :] * up
        valid = (h_index < 2 * half_len + 1) & (k >= 0) & (k < inputs)
        x = input_ring[slot, torch.where(valid, k, 0) % input_ring.shape[1]]
        h = bank[offset + torch.where(valid, h_index, 0)]
        y = torch.where(valid, x * h, 0.0).sum(dim=1)
        ring[slot].index_copy_(0, (column + torch.arange(count, device=device)) % ring.shape[1], y)
