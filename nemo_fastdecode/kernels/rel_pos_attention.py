"""Transformer-XL relative-position attention (NeMo's ``RelPositionMultiHeadAttention``) in one pass over the keys.

NeMo computes ``matrix_ac = (q + u) k^T`` and ``matrix_bd = (q + v_bias) p^T`` per head, shifts ``matrix_bd`` by
padding and re-viewing it (``rel_shift``: ``bd[i, j] = bd_raw[i, T - 1 - i + j]``), adds, scales, masks, takes the
softmax, masks again and multiplies by ``v``: about ten passes over ``[B, H, T, T]`` tensors. Here ``bd_raw`` (a GEMM,
as in NeMo) is read where the shift puts it, and the rest runs flash-attention style, one tile of queries at a time
with an online softmax, straight into ``[B, T, H * d]`` (the output projection's input, no transpose):

    s[i, j]   = ((q[i] + u) . k[j] + bd_raw[i, T - 1 - i + j]) * scale,   -inf where mask[i, j]
    out[i]    = softmax(s[i]) @ v,                                         0 where every key of row i is masked

(NeMo fills masked scores with -10000 and zeroes masked weights after the softmax: the same values, a fully masked
row included). Sums run in fp32; ``q + u`` and the softmax weights are rounded to the inputs' dtype before their
products, as NeMo's bf16 path rounds them, but the order of the sums differs from cuBLAS's, so results agree with
NeMo's to rounding. :func:`rel_pos_attention_reference` is NeMo's arithmetic in torch; Triton's interpreter runs the
kernel on the CPU in tests.
"""

from __future__ import annotations

import torch

from nemo_fastdecode.kernels import triton_runs_on

try:  # Triton is optional: without it only the torch reference runs.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

__all__ = ["rel_pos_attention", "rel_pos_attention_reference"]

if triton is not None:
    _MASKED = tl.constexpr(-1.0e30)  # finite: a fully masked row must not turn into NaNs before it is zeroed

    @triton.jit
    def _rel_pos_attention_kernel(
        q_ptr, k_ptr, v_ptr, u_ptr, bd_ptr, mask_ptr, out_ptr,
        time, heads, scale,
        q_sb, q_st, q_sh, k_sb, k_st, k_sh, v_sb, v_st, v_sh,
        bd_sb, bd_sh, bd_st, m_sb, m_st, o_sb, o_st,
        HEAD_DIM: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        # one tile of BLOCK_M queries of one (batch row, head) per program; q, k, v are [B, T, H, d] views
        bh = tl.program_id(1)
        b = (bh // heads).to(tl.int64)
        h = bh % heads
        i = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        d = tl.arange(0, HEAD_DIM)
        i_ok = i < time
        q = tl.load(q_ptr + b * q_sb + i[:, None] * q_st + h * q_sh + d[None, :], mask=i_ok[:, None], other=0.0)
        u = tl.load(u_ptr + h * HEAD_DIM + d)
        q = (q.to(tl.float32) + u.to(tl.float32)[None, :]).to(k_ptr.dtype.element_ty)  # NeMo's q + u, rounded
        m_i = tl.full([BLOCK_M], _MASKED, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        valid_keys = tl.zeros([BLOCK_M], dtype=tl.int32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        bd_rows = bd_ptr + b * bd_sb + h * bd_sh + i[:, None] * bd_st + (time - 1) - i[:, None]
        for start in range(0, time, BLOCK_N):
            j = start + tl.arange(0, BLOCK_N)
            j_ok = j < time
            k = tl.load(k_ptr + b * k_sb + j[:, None] * k_st + h * k_sh + d[None, :], mask=j_ok[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            tile = i_ok[:, None] & j_ok[None, :]
            bd = tl.load(bd_rows + j[None, :], mask=tile, other=0.0).to(tl.float32)
            s = (s + bd) * scale
            keep = tile
            if HAS_MASK:
                masked = tl.load(mask_ptr + b * m_sb + i[:, None] * m_st + j[None, :], mask=tile, other=1)
                keep = keep & (masked == 0)
            s = tl.where(keep, s, _MASKED)
            valid_keys += tl.sum(keep.to(tl.int32), axis=1)
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.where(keep, tl.exp(s - m_new[:, None]), 0.0)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_ptr + b * v_sb + j[:, None] * v_st + h * v_sh + d[None, :], mask=j_ok[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        out = tl.where((valid_keys > 0)[:, None], acc / tl.maximum(l_i, 1e-30)[:, None], 0.0)
        target = out_ptr + b * o_sb + i[:, None] * o_st + h * HEAD_DIM + d[None, :]
        tl.store(target, out.to(out_ptr.dtype.element_ty), mask=i_ok[:, None])


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias_u: torch.Tensor, bd: torch.Tensor, mask) -> None:
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must be [B, T, H, d] of one shape, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")  # fmt: skip
    batch, time, heads, dim = q.shape
    if tuple(bias_u.shape) != (heads, dim):
        raise ValueError(f"bias_u must be [H={heads}, d={dim}], got shape {tuple(bias_u.shape)}")
    if tuple(bd.shape) != (batch, heads, time, 2 * time - 1):
        raise ValueError(
            f"bd must be [B={batch}, H={heads}, T={time}, 2T-1={2 * time - 1}], got shape {tuple(bd.shape)}"
        )
    if mask is not None and tuple(mask.shape) != (batch, time, time):
        raise ValueError(f"mask must be [B={batch}, T={time}, T={time}], got shape {tuple(mask.shape)}")


def rel_pos_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias_u: torch.Tensor,
    bd: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """NeMo's arithmetic (``rel_shift``, ``-10000`` fill, softmax, zero fill) in torch: see :func:`rel_pos_attention`."""
    _check(q, k, v, bias_u, bd, mask)
    batch, time, heads, dim = q.shape
    q_u = (q + bias_u).transpose(1, 2)
    ac = torch.matmul(q_u.to(k.dtype), k.transpose(1, 2).transpose(-2, -1))
    shifted = torch.nn.functional.pad(bd, (1, 0)).view(batch, heads, -1, time)[:, :, 1:].view(bd.shape)[..., :time]
    scores = (ac + shifted) * scale
    if mask is not None:
        scores = scores.masked_fill(mask.unsqueeze(1), -10000.0)
    attn = torch.softmax(scores, dim=-1)
    if mask is not None:
        attn = attn.masked_fill(mask.unsqueeze(1), 0.0)
    out = torch.matmul(attn.to(v.dtype), v.transpose(1, 2))  # [B, H, T, d]
    return out.transpose(1, 2).reshape(batch, time, heads * dim)


def rel_pos_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias_u: torch.Tensor,
    bd: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Relative-position multi-head attention from its projections.

    Args:
        q, k, v: the query, key and value projections, ``[B, T, H, d]`` (views of ``[B, T, H * d]`` GEMM outputs;
            ``d`` a power of two).
        bias_u: NeMo's ``pos_bias_u``, ``[H, d]``.
        bd: ``(q + pos_bias_v) p^T`` per head before the shift, ``[B, H, T, 2T - 1]`` (last dimension contiguous).
        mask: ``[B, T, T]`` bool, ``True`` where a query may not see a key (NeMo's ``att_mask``); ``None``: none.
        scale: ``1 / sqrt(d)``.

    Returns:
        ``[B, T, H * d]`` in ``v``'s dtype. The torch reference runs where Triton or a CUDA device is missing.
    """
    _check(q, k, v, bias_u, bd, mask)
    batch, time, heads, dim = q.shape
    if triton is None or not triton_runs_on(q.device) or dim & (dim - 1) or dim < 16:
        return rel_pos_attention_reference(q, k, v, bias_u, bd, mask, scale)
    if bd.stride(3) != 1:
        bd = bd.contiguous()
    q, k, v = (x if x.stride(3) == 1 else x.contiguous() for x in (q, k, v))
    out = torch.empty(batch, time, heads * dim, device=q.device, dtype=v.dtype)
    if out.numel() == 0:
        return out
    mask_bytes = None if mask is None else mask.contiguous().view(torch.uint8)
    block = 64 if dim <= 128 else 32
    grid = (triton.cdiv(time, block), batch * heads)
    _rel_pos_attention_kernel[grid](
        q, k, v, bias_u.contiguous(), bd, out if mask_bytes is None else mask_bytes, out,
        time, heads, scale,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), bd.stride(0), bd.stride(1), bd.stride(2),
        0 if mask_bytes is None else mask_bytes.stride(0), 0 if mask_bytes is None else mask_bytes.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=dim, HAS_MASK=mask_bytes is not None, PRECISION="ieee" if v.dtype == torch.float32 else "tf32",
        BLOCK_M=block, BLOCK_N=block, num_warps=4, num_stages=2,
    )  # fmt: skip
    return out
