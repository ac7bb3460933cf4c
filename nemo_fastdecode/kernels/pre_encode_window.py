"""The subsampling's input window of each stream, and its pre-encode cache update, in one kernel.

Cache-aware streaming feeds the subsampling ``[last P feature frames of the stream, this chunk]`` (NeMo's
pre-encode cache), or the chunk alone for a stream's first step. For ``B`` streams whose caches live in slots
(``cache [S, F, P]``), :func:`pre_encode_window` builds the ``[B, F, W]`` window (``W = P + chunk``) of each row,
zero past its valid frames, and replaces each row's slot cache by the last ``P`` frames of ``[cache, chunk]``, in
place. :func:`pre_encode_window_reference` is the torch version (about a dozen small kernels: gather of the caches,
concatenation, alignment, mask, cache gather and scatter); the streaming encoder's fp32 path runs it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # Triton is optional: without it only the torch reference runs.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

__all__ = ["pre_encode_window", "pre_encode_window_reference"]

if triton is not None:

    @triton.jit
    def _window_value(cache_row, feat_row, feat_stride_t, j, valid, CACHE: tl.constexpr, frames):
        """Frame ``j`` of ``[cache (CACHE frames), chunk (frames)]`` for a [BLOCK_F] channel block (0 past the end)."""
        from_cache = valid & (j < CACHE)
        from_chunk = valid & (j >= CACHE) & (j - CACHE < frames)
        cached = tl.load(cache_row + tl.where(from_cache, j, 0), mask=from_cache, other=0.0)
        new = tl.load(feat_row + tl.where(from_chunk, j - CACHE, 0) * feat_stride_t, mask=from_chunk, other=0.0)
        return tl.where(from_cache, cached, new)

    @triton.jit
    def _pre_encode_window_kernel(
        feat_ptr, feat_stride_b, feat_stride_f, feat_stride_t, frames, lengths_ptr, started_ptr, slots_ptr,
        cache_ptr, cache_stride_s, cache_stride_f, out_ptr, channels,
        CACHE: tl.constexpr, WIDTH: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_W: tl.constexpr,
        BLOCK_P: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0)
        offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
        f_ok = offs_f < channels
        length = tl.load(lengths_ptr + b)
        started = tl.load(started_ptr + b) != 0
        slot = tl.load(slots_ptr + b)
        feat_rows = feat_ptr + b * feat_stride_b + offs_f[:, None] * feat_stride_f  # [BLOCK_F, 1]
        cache_rows = cache_ptr + slot * cache_stride_s + offs_f[:, None] * cache_stride_f
        # the window: first chunks skip the (empty) cache, i.e. start at frame CACHE of [cache, chunk]
        t = tl.arange(0, BLOCK_W)[None, :]
        offset = tl.where(started, 0, CACHE)
        in_length = length + tl.where(started, CACHE, 0)
        j = tl.minimum(t + offset, WIDTH - 1)
        inside = f_ok[:, None] & (t < WIDTH) & (t < in_length)
        window = _window_value(cache_rows, feat_rows, feat_stride_t, j, inside, CACHE, frames)
        # the new cache: the last CACHE frames of [cache, the chunk's `length` valid frames]
        p = tl.arange(0, BLOCK_P)[None, :]
        p_ok = f_ok[:, None] & (p < CACHE)
        new_cache = _window_value(cache_rows, feat_rows, feat_stride_t, length + p, p_ok, CACHE, frames)
        tl.debug_barrier()  # every read of the old cache is done before any thread overwrites it
        tl.store(out_ptr + (b * channels + offs_f[:, None]) * WIDTH + t, window, mask=f_ok[:, None] & (t < WIDTH))
        tl.store(cache_rows + p, new_cache, mask=p_ok)


def pre_encode_window(
    features: torch.Tensor,
    lengths: torch.Tensor,
    started: torch.Tensor,
    cache: torch.Tensor,
    slot_ids: torch.Tensor,
    width: int,
) -> torch.Tensor:
    """Each row's subsampling input window; the rows' slot caches move on by their chunks, in place.

    Args:
        features: ``[B, F, G]`` float32 chunks, left-aligned; ``G <= width - P``.
        lengths: ``[B]`` int64 valid frames of each chunk (0 for padding rows).
        started: ``[B]`` bool, whether the row's stream has stepped before (else no cache is prefixed).
        cache: ``[S, F, P]`` float32 slot caches (last ``P`` feature frames of each stream), updated in place.
        slot_ids: ``[B]`` int64 slot of each row; distinct, except padding rows, which may share a dummy slot.
        width: ``W = P + chunk``, the window length.

    Returns:
        ``[B, F, W]``: ``[cache, chunk]`` (started rows) or ``[chunk, ...]`` (first steps), zero from the row's
        ``length (+ P when started)`` on.
    """
    b, channels, frames = features.shape
    cache_frames = cache.shape[2]
    if features.dtype != torch.float32 or cache.dtype != torch.float32:
        raise TypeError(f"features and cache must be float32, got {features.dtype} and {cache.dtype}")
    if cache.shape[1] != channels or frames > width - cache_frames or cache.stride(2) != 1:
        raise ValueError(
            f"features {tuple(features.shape)} [B, F, G <= W - P] and cache {tuple(cache.shape)} [S, F, P] "
            f"(frames contiguous) disagree for W = {width}"
        )
    out = torch.empty(b, channels, width, dtype=torch.float32, device=features.device)
    if b == 0:
        return out
    lengths, started, slot_ids = (t.contiguous() for t in (lengths, started, slot_ids))  # read at offset b
    block_f = min(32, triton.next_power_of_2(channels))
    _pre_encode_window_kernel[(b, triton.cdiv(channels, block_f))](
        features, *features.stride(), frames, lengths, started, slot_ids, cache, cache.stride(0),
        cache.stride(1), out, channels, CACHE=cache_frames, WIDTH=width, BLOCK_F=block_f,
        BLOCK_W=triton.next_power_of_2(width), BLOCK_P=triton.next_power_of_2(max(cache_frames, 1)),
    )  # fmt: skip
    return out


def pre_encode_window_reference(
    features: torch.Tensor,
    lengths: torch.Tensor,
    started: torch.Tensor,
    cache: torch.Tensor,
    slot_ids: torch.Tensor,
    width: int,
) -> torch.Tensor:
    """Torch version of :func:`pre_encode_window` (same arguments, same in-place cache update)."""
    cache_frames = cache.shape[2]
    features = features.float()
    if features.shape[2] < width - cache_frames:
        features = F.pad(features, (0, width - cache_frames - features.shape[2]))
    joined = torch.cat([cache.index_select(0, slot_ids), features[:, :, : width - cache_frames]], 2)
    positions = torch.arange(width, device=features.device)
    # first chunks have no pre-encode cache (NeMo): start them at the chunk, i.e. shift left by P
    offset = torch.where(started, 0, cache_frames)
    in_lengths = lengths + torch.where(started, cache_frames, 0)
    src = (positions[None, :] + offset[:, None]).clamp(max=width - 1)
    window = joined.gather(2, src[:, None, :].expand(-1, joined.shape[1], -1))
    window = window * (positions[None, :] < in_lengths[:, None])[:, None, :]  # zeros after each row's end
    # the new pre-encode cache: the last P frames of [old cache, chunk]
    cache_src = lengths[:, None] + positions[None, :cache_frames]
    cache.index_copy_(0, slot_ids, joined.gather(2, cache_src[:, None, :].expand(-1, joined.shape[1], -1)))
    return window
