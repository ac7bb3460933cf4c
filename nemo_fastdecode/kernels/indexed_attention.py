"""Fused indexed attention over pre-allocated per-stream caches (cache-aware streaming FastConformer).

A streaming server keeps one key cache and one value cache per attention layer, allocated once for
``S`` slots: ``k_cache, v_cache [S, H, T, D]``. Each stream owns a slot; its keys and values are written
in place (``cache[slot, :, pos] = new``) and occupy positions ``[0, length)`` of the slot. In one step
only ``N <= S`` streams have audio, each with its own length: the batch is incomplete and
desynchronised. :func:`indexed_attention` attends the ``N`` query chunks to their streams' caches
directly: it reads the caches in place through ``slot_ids`` and strides (no gather copy), and a
program stops at its stream's length (no work, and no mask, over the empty part of the cache).

Semantics, for stream ``i`` (``s = slot_ids[i]``, ``L = lengths[i]``) and head ``h``::

    scores[t, j] = ((q[i, h, t] + u[h]) . k_cache[s, h, j]  +  (q[i, h, t] + v[h]) . pos_emb[h, c - (qpos_t - j)]) * scale
    out[i, h, t] = softmax_j(scores[t, :L]) @ v_cache[s, h, :L]

with ``u = pos_bias_u`` (zero if not given), the second term present only when ``pos_emb`` is given,
``c = (P - 1) // 2`` and ``qpos_t = L - Tq + t``. All ``Tq`` queries of a stream see the same keys
``[0, L)``: the caller writes this step's keys into the cache before the call, as cache-aware streaming
(chunked attention with left context) does, so query ``t`` of the chunk is the frame at cache position
``L - Tq + t``. With ``key_starts`` the slot is a ring buffer: key ``j`` lives at position
``(key_starts[i] + j) mod T``, so a streaming server drops its oldest frames by moving the start instead of
copying the window (positions and distances above are the logical ``j``).

Three implementations share these semantics: the Triton kernel ``_indexed_attention_fwd`` (one program
per (stream, head, query block), flash-attention style online softmax over key blocks; ``tl.dot`` for
chunks of more than ``SMALL_TQ`` queries, CUDA-core products below, where ``tl.dot``'s 16-row minimum would
waste most of the work), its checked
launcher :func:`indexed_attention`, and :func:`indexed_attention_reference` (gather + masked
``scaled_dot_product_attention``, or explicit math for the relative term), used by the tests and as the
CPU fallback.
"""

from __future__ import annotations

import contextlib
import math
import os

import torch
import torch.nn.functional as F

try:  # Triton is optional: without it only the torch reference runs.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

__all__ = ["indexed_attention", "indexed_attention_reference", "build_rel_pos_table", "pick_blocks"]

_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)


# --------------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def _indexed_attention_fwd(
        Q,
        K,
        V,
        Out,
        SlotIds,
        Lengths,
        Starts,
        BiasU,
        BiasV,
        Pos,
        qk_scale,  # scale * log2(e): the softmax runs in base 2
        stride_qn,
        stride_qh,
        stride_qm,
        stride_qd,
        stride_ks,
        stride_kh,
        stride_kt,
        stride_kd,
        stride_vs,
        stride_vh,
        stride_vt,
        stride_vd,
        stride_on,
        stride_oh,
        stride_om,
        stride_od,
        stride_uh,
        stride_ud,
        stride_bvh,
        stride_bvd,
        stride_ph,
        stride_pp,
        stride_pd,
        H,
        S,
        T,
        Tq,
        D,
        P,
        HAS_BIAS_U: tl.constexpr,
        HAS_REL_POS: tl.constexpr,
        HAS_BIAS_V: tl.constexpr,
        HAS_STARTS: tl.constexpr,
        UPCAST_DOT: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        USE_DOT: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_nh = tl.program_id(1)
        n = pid_nh // H
        h = pid_nh % H

        slot = tl.load(SlotIds + n).to(tl.int64)
        length = tl.load(Lengths + n).to(tl.int32)
        # The launcher validates slot ids and lengths; when that check is skipped (CUDA graph capture)
        # an invalid slot reads nothing (zeros out) and lengths are clamped to [0, T]: memory stays safe.
        length = tl.where((slot >= 0) & (slot < S), length, 0)
        length = tl.minimum(tl.maximum(length, 0), T)
        slot = tl.where((slot >= 0) & (slot < S), slot, 0)
        if HAS_STARTS:  # ring buffer: logical key j at (start + j) mod T; out-of-range starts wrap (memory-safe)
            ring_start = tl.load(Starts + n).to(tl.int32) % T
            ring_start = tl.where(ring_start < 0, ring_start + T, ring_start)
        else:
            ring_start = 0

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        mask_m = offs_m < Tq
        mask_d = offs_d < D

        q_base = Q + n.to(tl.int64) * stride_qn + h * stride_qh
        q = tl.load(
            q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
            mask=mask_m[:, None] & mask_d[None, :],
            other=0.0,
        )
        if HAS_BIAS_U:
            bias_u = tl.load(BiasU + h * stride_uh + offs_d * stride_ud, mask=mask_d, other=0.0)
            q = (q.to(tl.float32) + bias_u.to(tl.float32)[None, :]).to(Q.dtype.element_ty)
        if UPCAST_DOT:  # TRITON_INTERPRET only: the interpreter's tl.dot reads bfloat16 bits as integers
            q = q.to(tl.float32)

        k_base = K + slot * stride_ks + h * stride_kh
        v_base = V + slot * stride_vs + h * stride_vh
        # Relative position: query t sits at cache position L - Tq + t, key j at j; the row of the
        # positional table for their distance d = qpos - j is c - d with c = (P - 1) // 2.
        center = (P - 1) // 2
        qpos = length - Tq + offs_m
        if HAS_BIAS_V:
            bias_v = tl.load(BiasV + h * stride_bvh + offs_d * stride_bvd, mask=mask_d, other=0.0).to(tl.float32)
        if not USE_DOT:  # few queries (BLOCK_M = Tq rounded up): CUDA-core products, no padding rows
            q = q.to(tl.float32)
            if HAS_REL_POS:
                qv = tl.load(
                    q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                    mask=mask_m[:, None] & mask_d[None, :],
                    other=0.0,
                ).to(tl.float32)
                if HAS_BIAS_V:
                    qv = qv + bias_v[None, :]

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        # Loop bound from this stream's length: key blocks past it are never touched.
        for start_n in range(0, length, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            mask_n = offs_n < length
            if HAS_STARTS:  # noqa: SIM108 (a static branch of the Triton kernel, resolved at compile time)
                phys_n = (ring_start + offs_n) % T
            else:
                phys_n = offs_n
            mask_nd = mask_n[:, None] & mask_d[None, :]
            k = tl.load(k_base + phys_n[:, None] * stride_kt + offs_d[None, :] * stride_kd, mask=mask_nd, other=0.0)
            if USE_DOT:
                s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N] fp32
            else:
                s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)

            if HAS_REL_POS:
                if USE_DOT:
                    # Many queries: one query row at a time, whose table rows for keys start_n.. are consecutive
                    # (c - qpos_t + j): one contiguous [BLOCK_N, D] tile and a dot over D (fp32 FMAs).
                    # Rows past Tq (the block's padding) stay 0.
                    bd = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                    first_row = pid_m * BLOCK_M
                    for t in range(0, tl.minimum(Tq - first_row, BLOCK_M)):
                        qv_t = tl.load(
                            q_base + (first_row + t) * stride_qm + offs_d * stride_qd, mask=mask_d, other=0.0
                        )
                        qv_t = qv_t.to(tl.float32)
                        if HAS_BIAS_V:
                            qv_t = qv_t + bias_v
                        rows = center - (length - Tq + first_row + t) + offs_n  # [BLOCK_N]
                        mask_r = mask_n & (rows >= 0) & (rows < P)
                        pe = tl.load(
                            Pos + h * stride_ph + rows[:, None] * stride_pp + offs_d[None, :] * stride_pd,
                            mask=mask_r[:, None] & mask_d[None, :],
                            other=0.0,
                        ).to(tl.float32)  # [BLOCK_N, BLOCK_D]
                        row = tl.sum(pe * qv_t[None, :], axis=1)  # [BLOCK_N]
                        bd = tl.where(offs_m[:, None] == first_row + t, row[None, :], bd)
                else:
                    # Few queries: gather the table rows of every (query, key) pair at once.
                    rows = center - qpos[:, None] + offs_n[None, :]  # [BLOCK_M, BLOCK_N]
                    mask_r = mask_m[:, None] & mask_n[None, :] & (rows >= 0) & (rows < P)
                    pe = tl.load(
                        Pos + h * stride_ph + rows[:, :, None] * stride_pp + offs_d[None, None, :] * stride_pd,
                        mask=mask_r[:, :, None] & mask_d[None, None, :],
                        other=0.0,
                    ).to(tl.float32)  # [BLOCK_M, BLOCK_N, BLOCK_D]
                    bd = tl.sum(qv[:, None, :] * pe, axis=2)
                s = s + bd

            s = tl.where(mask_n[None, :], s * qk_scale, float("-inf"))
            # Every block starts below the length, so each row has a finite maximum: no NaN.
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_base + phys_n[:, None] * stride_vt + offs_d[None, :] * stride_vd, mask=mask_nd, other=0.0)
            p = p.to(V.dtype.element_ty)  # probabilities rounded to the input dtype, as on GPU
            if USE_DOT:
                pv = tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
            else:
                pv = tl.sum(p.to(tl.float32)[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
            acc = acc * alpha[:, None] + pv
            m_i = m_new

        # length == 0: no block ran, l_i == 0 and the output is defined as zeros.
        denom = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc / denom[:, None]
        o_base = Out + n.to(tl.int64) * stride_on + h * stride_oh
        tl.store(
            o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
            out.to(Out.dtype.element_ty),
            mask=mask_m[:, None] & mask_d[None, :],
        )


# Up to this many queries per stream (cache-aware streaming at small look-ahead: 1-2 frames per chunk) the
# kernel skips tl.dot, which pads the queries to 16 rows, and multiplies on CUDA cores instead.
SMALL_TQ = 4


def pick_blocks(tq: int, d: int) -> tuple[bool, int, int, int, int]:
    """USE_DOT, BLOCK_M, BLOCK_N, BLOCK_D, num_warps (``benchmarks/sweep_indexed_attention.py`` swaps it to sweep)."""
    block_d = max(16, triton.next_power_of_2(d))
    if tq <= SMALL_TQ:
        block_m = triton.next_power_of_2(tq)
        # [BLOCK_M, BLOCK_N, BLOCK_D] product tiles of 2K elements, 32 per thread over 2 warps: small programs,
        # many resident per SM (the sweep at 256 streams: faster than 4 warps, and than tl.dot by about 2x)
        block_n = max(16, min(64, 2048 // (block_m * block_d)))
        return False, block_m, block_n, block_d, 2
    block_m = min(64, max(16, triton.next_power_of_2(tq)))  # tl.dot needs >= 16 rows
    block_n = 64 if block_d <= 64 else 32
    num_warps = 4 if block_d <= 64 else 8
    return True, block_m, block_n, block_d, num_warps


# --------------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------------
def _check_inputs(
    q, k_cache, v_cache, slot_ids, lengths, pos_bias_u, pos_bias_v, pos_emb, check_values, key_starts=None
):
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "slot_ids": slot_ids, "lengths": lengths}
    if key_starts is not None:
        tensors["key_starts"] = key_starts
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if q.dim() != 4:
        raise ValueError(f"q must be [N, H, Tq, D], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4:
        raise ValueError(f"k_cache must be [S, H, T, D], got shape {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} must equal k_cache shape {tuple(k_cache.shape)}")
    n, h, _, d = q.shape
    s, hk, t, dk = k_cache.shape
    if hk != h or dk != d:
        raise ValueError(
            f"k_cache [S, H, T, D] = {tuple(k_cache.shape)} does not match q [N, H, Tq, D] = {tuple(q.shape)} in H or D"
        )
    if q.dtype not in _SUPPORTED_DTYPES:
        raise TypeError(f"q dtype {q.dtype} is not supported; valid: {', '.join(map(str, _SUPPORTED_DTYPES))}")
    for name, value in (("k_cache", k_cache), ("v_cache", v_cache)):
        if value.dtype != q.dtype:
            raise TypeError(f"{name} dtype {value.dtype} must equal q dtype {q.dtype}")
    indices = (("slot_ids", slot_ids), ("lengths", lengths)) + (
        (("key_starts", key_starts),) if key_starts is not None else ()
    )
    for name, value in indices:
        if value.dtype not in _INDEX_DTYPES:
            raise TypeError(f"{name} dtype {value.dtype} is not supported; valid: torch.int32, torch.int64")
        if value.shape != (n,):
            raise ValueError(f"{name} must have shape [N] = ({n},) (one entry per q row), got {tuple(value.shape)}")

    optional = {"pos_bias_u": pos_bias_u, "pos_bias_v": pos_bias_v, "pos_emb": pos_emb}
    for name, value in optional.items():
        if value is None:
            continue
        tensors[name] = value
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(value).__name__}")
        if value.dtype != q.dtype:
            raise TypeError(f"{name} dtype {value.dtype} must equal q dtype {q.dtype}")
    for name in ("pos_bias_u", "pos_bias_v"):
        value = optional[name]
        if value is not None and value.shape != (h, d):
            raise ValueError(f"{name} must be [H, D] = ({h}, {d}), got {tuple(value.shape)}")
    if pos_bias_v is not None and pos_emb is None:
        raise ValueError("pos_bias_v is only used with the relative term: pass pos_emb too, or drop pos_bias_v")
    if pos_emb is not None:
        if pos_emb.dim() != 3 or pos_emb.shape[0] != h or pos_emb.shape[2] != d:
            raise ValueError(f"pos_emb must be [H, P, D] = ({h}, P, {d}), got {tuple(pos_emb.shape)}")
        p = pos_emb.shape[1]
        if p % 2 != 1 or p < 2 * t - 1:
            raise ValueError(
                f"pos_emb has P = {p} rows; valid: an odd P >= 2 * T - 1 = {2 * t - 1} (distances T-1 .. -(T-1))"
            )
        if q.shape[2] > t:
            raise ValueError(f"with pos_emb, Tq = {q.shape[2]} must be <= T = {t}: the queries are cache frames")

    for name, value in tensors.items():
        if value.device != q.device:
            raise ValueError(f"{name} is on {value.device}, q is on {q.device}: all inputs must be on one device")

    if check_values and n > 0:
        # One device-to-host copy for all checks (skipped when check_values is False, e.g. under
        # CUDA graph capture; the kernel then zeroes streams with a bad slot, clamps lengths, wraps starts).
        rows = [slot_ids, lengths] + ([key_starts] if key_starts is not None else [])
        host = torch.stack([row.to(torch.int64) for row in rows]).cpu()
        bad = ((host[0] < 0) | (host[0] >= s)).nonzero()
        if bad.numel():
            i = int(bad[0, 0])
            raise ValueError(
                f"slot_ids[{i}] = {int(host[0, i])} is out of range; valid slot ids: [0, {s}) for a cache of S = {s} slots"
            )
        bad = ((host[1] < 0) | (host[1] > t)).nonzero()
        if bad.numel():
            i = int(bad[0, 0])
            raise ValueError(
                f"lengths[{i}] = {int(host[1, i])} is out of range; valid lengths: [0, {t}] (cache T = {t})"
            )
        if key_starts is not None:
            bad = ((host[2] < 0) | (host[2] >= t)).nonzero()
            if bad.numel():
                i = int(bad[0, 0])
                raise ValueError(
                    f"key_starts[{i}] = {int(host[2, i])} is out of range; valid: [0, {t}) (cache T = {t})"
                )


def _should_check_values(check_values: bool | None, q: torch.Tensor) -> bool:
    if check_values is not None:
        return check_values
    return not (q.is_cuda and torch.cuda.is_current_stream_capturing())


# --------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------
def indexed_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_ids: torch.Tensor,
    lengths: torch.Tensor,
    scale: float | None = None,
    *,
    pos_bias_u: torch.Tensor | None = None,
    pos_bias_v: torch.Tensor | None = None,
    pos_emb: torch.Tensor | None = None,
    use_triton: bool | None = None,
    check_values: bool | None = None,
    key_starts: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of ``N`` query chunks to their streams' slots of a pre-allocated cache, read in place.

    Args:
        q: ``[N, H, Tq, D]`` queries of the ``N`` streams stepping now (any strides), already projected
            (NeMo: ``linear_q`` output viewed ``[N, Tq, H, D]`` and transposed; pass it without biases).
        k_cache, v_cache: ``[S, H, T, D]`` caches for ``S`` slots (any strides), same dtype as ``q``.
            Stream ``i`` reads positions ``[0, lengths[i])`` of slot ``slot_ids[i]``.
        slot_ids: ``[N]`` int32/int64, each in ``[0, S)``. Repeated ids are allowed (the kernel only
            reads the caches; two streams on one slot may even use different lengths).
        lengths: ``[N]`` int32/int64, each in ``[0, T]``: number of valid cache frames of each stream,
            this step's frames included. ``lengths[i] == 0`` is defined: stream ``i`` gets zeros.
        scale: softmax scale, default ``1 / sqrt(D)``.
        pos_bias_u: optional ``[H, D]``, added to ``q`` for the content term (Transformer-XL ``u``).
        pos_bias_v: optional ``[H, D]``, added to ``q`` for the positional term (``v``); needs ``pos_emb``.
        pos_emb: optional ``[H, P, D]`` positional table, already projected by ``linear_pos``; ``P`` odd
            and ``>= 2T - 1``. Row ``r`` holds relative distance ``d = (P - 1) // 2 - r`` where
            ``d = query position - key position`` (NeMo's ``RelPositionalEncoding`` layout: distances
            descending from ``+(P-1)/2`` to ``-(P-1)/2``). Query ``t`` of stream ``i`` is at cache position
            ``lengths[i] - Tq + t`` and key ``j`` at ``j``. Build it once per layer and step (it does not
            depend on the streams), e.g. with :func:`build_rel_pos_table`::

                _, pe = pos_enc(x, cache_len=T - x.size(1))   # NeMo pos_emb for input length T: [1, 2T-1, d_model]
                # (or pe = pos_enc.pe, the whole centred buffer, also valid)
                p = mha.linear_pos(pe).view(-1, H, D).transpose(0, 1)   # [H, P, D]

            In NeMo's cache-aware streaming the keys are ``[cache (left context), chunk]``, query ``t`` at
            index ``cache_len + t``; with the stream's frames stored left-aligned in its slot, the distance
            ``lengths[i] - Tq + t - j`` is the same time difference, so scores match NeMo's
            ``rel_shift((q + v) @ p^T)`` entry for entry.
        use_triton: ``None`` runs the Triton kernel when ``q`` is on CUDA, else the torch reference;
            ``True`` forces the kernel (on CPU only under ``TRITON_INTERPRET=1``); ``False`` the reference.
        check_values: check slot ids and lengths on the host (one device-to-host copy). ``None`` checks
            unless a CUDA graph is being captured; the kernel is memory-safe either way (a bad slot gives
            zeros, lengths are clamped to ``[0, T]``).
        key_starts: optional ``[N]`` int32/int64 in ``[0, T)``: each slot is a ring buffer whose logical key
            ``j`` sits at position ``(key_starts[i] + j) mod T`` (``None``: 0, the plain layout). Positions in
            the relative term are logical.
        out: optional ``[N, H, Tq, D]`` tensor to write the result into (any strides: e.g. a ``[N, Tq, H, D]``
            buffer transposed, which the output projection then reads as ``[N, Tq, H * D]`` without a copy).

    Returns:
        ``out``, or a new contiguous ``[N, H, Tq, D]`` tensor, in ``q``'s dtype (accumulation in fp32).

    Raises:
        ValueError / TypeError naming the bad value and the valid choices (shapes, dtypes, devices,
        slot ids outside ``[0, S)``, lengths outside ``[0, T]``).
    """
    _check_inputs(
        q,
        k_cache,
        v_cache,
        slot_ids,
        lengths,
        pos_bias_u,
        pos_bias_v,
        pos_emb,
        _should_check_values(check_values, q),
        key_starts,
    )
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device):
        raise ValueError(
            f"out must be a {q.dtype} tensor of q's shape {tuple(q.shape)} on {q.device}, got {out.dtype} "
            f"{tuple(out.shape)} on {out.device}"
        )
    if use_triton is None:
        use_triton = q.is_cuda and triton is not None
    if not use_triton:
        result = indexed_attention_reference(
            q,
            k_cache,
            v_cache,
            slot_ids,
            lengths,
            scale,
            pos_bias_u=pos_bias_u,
            pos_bias_v=pos_bias_v,
            pos_emb=pos_emb,
            key_starts=key_starts,
        )
        return result if out is None else out.copy_(result)
    if triton is None:
        raise RuntimeError("use_triton=True but triton is not installed; valid: use_triton=None or False")
    if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            f"use_triton=True with q on {q.device} needs TRITON_INTERPRET=1; valid: a CUDA tensor, or use_triton=None"
        )

    n, h, tq, d = q.shape
    s, _, t, _ = k_cache.shape
    if out is None:
        out = torch.empty((n, h, tq, d), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    if scale is None:
        scale = 1.0 / math.sqrt(d)

    has_rel = pos_emb is not None
    use_dot, block_m, block_n, block_d, num_warps = pick_blocks(tq, d)
    # Absent optional tensors: pass q as a never-read placeholder; the constexpr flags remove the loads.
    bias_u = pos_bias_u if pos_bias_u is not None else q
    bias_v = pos_bias_v if pos_bias_v is not None else q
    pos = pos_emb if pos_emb is not None else q
    u_strides = (bias_u.stride(0), bias_u.stride(1)) if pos_bias_u is not None else (0, 0)
    v_strides = (bias_v.stride(0), bias_v.stride(1)) if pos_bias_v is not None else (0, 0)
    p_strides = pos.stride() if pos_emb is not None else (0, 0, 0)
    p_rows = pos_emb.shape[1] if pos_emb is not None else 1

    grid = (triton.cdiv(tq, block_m), n * h)
    device_ctx = torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext()
    with device_ctx:
        _indexed_attention_fwd[grid](
            q,
            k_cache,
            v_cache,
            out,
            slot_ids,
            lengths,
            key_starts if key_starts is not None else lengths,  # placeholder, never read without HAS_STARTS
            bias_u,
            bias_v,
            pos,
            float(scale) * math.log2(math.e),
            *q.stride(),
            *k_cache.stride(),
            *v_cache.stride(),
            *out.stride(),
            *u_strides,
            *v_strides,
            *p_strides,
            h,
            s,
            t,
            tq,
            d,
            p_rows,
            HAS_BIAS_U=pos_bias_u is not None,
            HAS_REL_POS=has_rel,
            HAS_BIAS_V=pos_bias_v is not None,
            HAS_STARTS=key_starts is not None,
            UPCAST_DOT=not q.is_cuda and q.dtype == torch.bfloat16,
            # fp32 inputs: exact products ("ieee"), not TF32; fp16/bf16: Triton's default (tensor cores).
            DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
            USE_DOT=use_dot,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_D=block_d,
            num_warps=num_warps,
        )
    return out


def indexed_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_ids: torch.Tensor,
    lengths: torch.Tensor,
    scale: float | None = None,
    *,
    pos_bias_u: torch.Tensor | None = None,
    pos_bias_v: torch.Tensor | None = None,
    pos_emb: torch.Tensor | None = None,
    key_starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Torch reference and CPU fallback, same semantics as :func:`indexed_attention` (inputs unchecked).

    Gathers ``k_cache[slot_ids]`` (a copy of ``N`` full slots), masks keys ``>= lengths``, and runs
    ``scaled_dot_product_attention`` in the input dtype; with ``pos_emb`` it computes NeMo's math
    explicitly in at least fp32: ``(q + v) @ p^T`` over all ``P`` rows, then a gather that plays the role
    of ``rel_shift``. Streams with ``lengths == 0`` get zeros. No host synchronisation.
    """
    n, h, tq, d = q.shape
    t = k_cache.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    slot_ids = slot_ids.to(torch.int64)
    lengths = lengths.to(torch.int64)
    k = k_cache.index_select(0, slot_ids)  # [N, H, T, D]
    v = v_cache.index_select(0, slot_ids)
    if key_starts is not None:  # ring buffer: put logical key j at index j
        ring = (key_starts.to(torch.int64)[:, None] + torch.arange(t, device=q.device)[None, :]) % t  # [N, T]
        ring = ring[:, None, :, None].expand(n, h, t, d)
        k, v = k.gather(2, ring), v.gather(2, ring)
    key_pos = torch.arange(t, device=q.device)
    valid = key_pos[None, :] < lengths[:, None]  # [N, T]
    empty = (lengths == 0).view(n, 1, 1, 1)

    if pos_emb is None:
        qu = q if pos_bias_u is None else q + pos_bias_u[None, :, None, :]
        # Give empty streams one visible key so that SDPA has no all-masked row; zeroed below.
        mask = (valid | (lengths == 0)[:, None]).view(n, 1, 1, t)
        out = F.scaled_dot_product_attention(qu, k, v, attn_mask=mask, scale=scale)
        return torch.where(empty, torch.zeros_like(out), out)

    compute = torch.promote_types(q.dtype, torch.float32)
    qc, k, v, p = q.to(compute), k.to(compute), v.to(compute), pos_emb.to(compute)
    qu = qc if pos_bias_u is None else qc + pos_bias_u.to(compute)[None, :, None, :]
    qv = qc if pos_bias_v is None else qc + pos_bias_v.to(compute)[None, :, None, :]
    ac = qu @ k.transpose(-2, -1)  # [N, H, Tq, T]
    bd_full = qv @ p.transpose(-2, -1)[None]  # [N, H, Tq, P]
    num_rows = p.shape[1]
    qpos = lengths[:, None] - tq + torch.arange(tq, device=q.device)[None, :]  # [N, Tq]
    rows = (num_rows - 1) // 2 - qpos[:, :, None] + key_pos[None, None, :]  # [N, Tq, T]
    rows_ok = (rows >= 0) & (rows < num_rows)
    bd = torch.gather(bd_full, 3, rows.clamp(0, num_rows - 1)[:, None].expand(n, h, tq, t))
    bd = bd.masked_fill(~rows_ok[:, None], 0.0)
    scores = (ac + bd) * scale
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    scores = torch.where(empty, torch.zeros_like(scores), scores)
    out = torch.softmax(scores, dim=-1) @ v
    out = torch.where(empty, torch.zeros_like(out), out)
    return out.to(q.dtype)


def build_rel_pos_table(pos_emb: torch.Tensor, linear_pos: torch.nn.Module, num_heads: int) -> torch.Tensor:
    """Project NeMo's relative positional embedding into the kernel's ``[H, P, D]`` table.

    Args:
        pos_emb: ``[1, P, d_model]`` (or ``[P, d_model]``) from ``RelPositionalEncoding``: the ``pos_emb``
            it returns for an input length ``>= T`` (``pos_enc(x, cache_len=T - x.size(1))``), or its whole
            ``pe`` buffer. Rows run from distance ``+(P-1)/2`` down to ``-(P-1)/2``.
        linear_pos: the attention layer's ``linear_pos`` (``RelPositionMultiHeadAttention.linear_pos``).
        num_heads: ``H``.
    """
    if pos_emb.dim() == 3:
        if pos_emb.shape[0] != 1:
            raise ValueError(f"pos_emb batch must be 1 (shared by all streams), got {tuple(pos_emb.shape)}")
        pos_emb = pos_emb[0]
    num_rows, d_model = pos_emb.shape
    if d_model % num_heads:
        raise ValueError(f"d_model = {d_model} is not divisible by num_heads = {num_heads}")
    return linear_pos(pos_emb).view(num_rows, num_heads, d_model // num_heads).transpose(0, 1)
