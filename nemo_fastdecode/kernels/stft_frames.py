"""The windowed STFT frames of many streams, cut from their slot sample rings, with NeMo's pre-emphasis and padding.

NeMo's ``FilterbankFeatures`` pre-emphasises a whole file (``y[0] = x[0]``, ``y[i] = x[i] - a * x[i - 1]``), pads
it with ``pad = n_fft // 2`` zeros on both sides (``torch.stft(center=True, pad_mode="constant")``) and multiplies
frame ``t``, ``p[t * hop : t * hop + n_fft]``, by the window centred in ``n_fft``. Here the samples live in per-slot
rings (``ring [S, C]``: padded position ``q`` of a stream at column ``q % C``, as
:mod:`~nemo_fastdecode.kernels.pcm_frames` writes them), and frame ``r`` of the output is frame
``start[b] + r - offset[b]`` of stream ``b = stream_of[r]`` (slot ``slot[b]``; its samples end at padded position
``end[b]``). Positions outside ``[pad, end)`` read as zeros: NeMo's padding, never a stale ring column.

:func:`stft_frames` does it in one pass (one program per frame); :func:`stft_frames_reference` with torch gathers.
Both compute the pre-emphasis as a product, then a difference, each rounded (the kernel is compiled without fused
multiply-adds), and then the window product: the same roundings as NeMo's torch operations, so the frames are equal
bit for bit to the ones ``torch.stft`` transforms.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

try:  # Triton is optional: without it only the torch reference runs.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

__all__ = ["FrameIndex", "stft_frames", "stft_frames_reference"]


@dataclass(frozen=True)
class FrameIndex:
    """Which frames to cut: output row ``r`` is frame ``start[b] + r - offset[b]`` of stream ``b = stream_of[r]``.

    Attributes:
        stream_of: ``[R]`` int64, the stream of each output frame (non-decreasing).
        slot, start, offset, end: ``[B]`` int64 per stream: its slot, its first frame's index in the stream, its first
            output row, and one past its last sample's padded position.
    """

    stream_of: torch.Tensor
    slot: torch.Tensor
    start: torch.Tensor
    offset: torch.Tensor
    end: torch.Tensor

    def check(self) -> None:
        """Contiguous int64 vectors, one entry per stream in each per-stream vector."""
        tensors = (self.stream_of, self.slot, self.start, self.offset, self.end)
        if any(t.dim() != 1 or t.dtype != torch.int64 or not t.is_contiguous() for t in tensors):
            raise ValueError(
                "stream_of [R] and slot, start, offset, end [B] must be contiguous int64 vectors, got "
                + ", ".join(f"{t.dtype} {tuple(t.shape)}" for t in tensors)
            )
        if len({t.shape for t in tensors[1:]}) != 1:
            raise ValueError(
                f"slot, start, offset, end must have one entry per stream, got {[len(t) for t in tensors[1:]]}"
            )


if triton is not None:

    @triton.jit
    def _stft_frames_kernel(
        ring_ptr, ring_stride, capacity, window_ptr, stream_of_ptr, slot_ptr, start_ptr, offset_ptr, end_ptr,
        out_ptr, frames, count_ptr, preemph, PAD: tl.constexpr, HOP: tl.constexpr, N_FFT: tl.constexpr,
        PREEMPH: tl.constexpr, COUNT_IN_MEMORY: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        if COUNT_IN_MEMORY:  # a CUDA graph's replays: the frame count changes, the launch does not
            frames = tl.load(count_ptr)
        r = tl.program_id(0)  # rows from ``frames`` on are the FFT's zero padding: they read the last frame, store 0
        b = tl.load(stream_of_ptr + tl.minimum(r, frames - 1))
        slot = tl.load(slot_ptr + b)
        frame = tl.load(start_ptr + b) + r - tl.load(offset_ptr + b)
        end = tl.load(end_ptr + b)
        k = tl.arange(0, BLOCK)
        in_frame = k < N_FFT
        q = frame * HOP + k  # padded sample positions of the frame (int64)
        valid = in_frame & (q >= PAD) & (q < end)
        row = ring_ptr + slot * ring_stride
        x = tl.load(row + q % capacity, mask=valid, other=0.0)
        if PREEMPH:  # y = x - a * x[-1], with x[-1] a zero where it is padding (so y[0] = x[0] - 0 = x[0])
            prev_valid = in_frame & (q - 1 >= PAD) & (q - 1 < end)
            prev = tl.load(row + (q - 1 + capacity) % capacity, mask=prev_valid, other=0.0)
            x = tl.where(valid, x - preemph * prev, 0.0)
        window = tl.load(window_ptr + k, mask=in_frame, other=0.0)
        tl.store(out_ptr + r * N_FFT + k, tl.where(r < frames, x * window, 0.0), mask=in_frame)


def _check(ring: torch.Tensor, window: torch.Tensor, index: FrameIndex) -> None:
    if ring.dim() != 2 or ring.dtype != torch.float32 or ring.stride(1) != 1:
        raise ValueError(f"ring must be float32 [S, C] with unit column stride, got {ring.dtype} {tuple(ring.shape)}")
    if window.dim() != 1 or window.dtype != torch.float32 or not window.is_contiguous():
        raise ValueError(f"window must be a contiguous float32 [n_fft], got {window.dtype} {tuple(window.shape)}")
    index.check()


def stft_frames(
    ring: torch.Tensor,
    window: torch.Tensor,
    index: FrameIndex,
    *,
    hop: int,
    pad: int,
    preemph: float | None,
    rows: int = 0,
    frame_count: torch.Tensor | None = None,
) -> torch.Tensor:
    """Windowed, pre-emphasised frames of many streams.

    Args:
        ring: ``[S, C]`` float32 sample rings (padded position ``q`` of a slot's stream at column ``q % C``).
        window: ``[n_fft]`` float32 window, already centred in ``n_fft`` (zeros around a shorter window).
        index: which frame of which stream each output row is.
        hop, pad: frame hop and left zero padding (``n_fft // 2``) in samples.
        preemph: pre-emphasis coefficient (``None``: none).
        rows: at least this many output rows; those past the ``R`` frames are zeros (a batch size for the FFT).
        frame_count: ``[1]`` int64 on the device: ``R``, read by the kernel, where ``stream_of`` holds more entries
            (those from ``R`` on are not read). Lets a CUDA graph cut a different number of frames at each replay.

    Returns:
        ``[max(R, rows), n_fft]`` float32: row ``r < R`` is ``window * y[t * hop - pad : t * hop - pad + n_fft]``
        (zeros outside the stream) for frame ``t = start[b] + r - offset[b]`` of stream ``b = stream_of[r]``.
    """
    _check(ring, window, index)
    n_fft, frames = window.shape[0], index.stream_of.shape[0]
    out = torch.empty(max(frames, rows), n_fft, dtype=torch.float32, device=ring.device)
    if frames == 0:
        return out.zero_()
    with torch.cuda.device(ring.device) if ring.is_cuda else contextlib.nullcontext():
        _stft_frames_kernel[(out.shape[0],)](
            ring, ring.stride(0), ring.shape[1], window, index.stream_of, index.slot, index.start, index.offset,
            index.end, out, frames, index.stream_of if frame_count is None else frame_count,
            0.0 if preemph is None else preemph, PAD=pad, HOP=hop, N_FFT=n_fft, PREEMPH=preemph is not None,
            COUNT_IN_MEMORY=frame_count is not None, BLOCK=triton.next_power_of_2(n_fft),
            enable_fp_fusion=False,  # x - a * prev as two roundings, as torch computes it (no FMA)
        )  # fmt: skip
    return out


def stft_frames_reference(
    ring: torch.Tensor,
    window: torch.Tensor,
    index: FrameIndex,
    *,
    hop: int,
    pad: int,
    preemph: float | None,
    rows: int = 0,
    frame_count: torch.Tensor | None = None,
) -> torch.Tensor:
    """Torch version of :func:`stft_frames` (same arguments and result): gathers, masks, NeMo's operations."""
    _check(ring, window, index)
    stream_of, slot, start, offset, end = index.stream_of, index.slot, index.start, index.offset, index.end
    if frame_count is not None:
        rows = max(rows, stream_of.shape[0])
        stream_of = stream_of[: int(frame_count)]
    capacity = ring.shape[1]
    frame = start[stream_of] + torch.arange(stream_of.shape[0], device=ring.device) - offset[stream_of]
    # positions a frame reads, from the one before its first on (pre-emphasis): [R, n_fft + 1]
    position = frame[:, None] * hop + torch.arange(-1, window.shape[0], device=ring.device)
    samples = ring.take(slot[stream_of, None] * capacity + position % capacity)
    valid = (position >= pad) & (position < end[stream_of, None])
    samples = torch.where(valid, samples, 0.0)
    if preemph is None:
        emphasised = samples[:, 1:]
    else:  # NeMo: cat(x[0], x[1:] - preemph * x[:-1]); x[-1] is a masked zero, so x[0] - 0 keeps x[0]
        emphasised = torch.where(valid[:, 1:], samples[:, 1:] - preemph * samples[:, :-1], 0.0)
    frames = emphasised * window  # torch.stft: input.mul(window) before the FFT
    return torch.nn.functional.pad(frames, (0, 0, 0, max(rows - frames.shape[0], 0)))
