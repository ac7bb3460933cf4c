"""Layer norm over the last dim that also keeps its output's row statistics, for a layer norm in the next GEMM.

A Conformer layer ends with ``norm_out`` and the next one starts with ``norm_feed_forward1`` of that output: two layer
norms in a row, the first materialised (it is the next residual), the second read only by the feed-forward's first
GEMM. :func:`layer_norm_with_stats` computes ``y = layer_norm(x)`` (two passes over each row, torch's order of
operations) and the ``(mean, M2)`` of each row of ``y`` as a one-tile :class:`~nemo_fastdecode.kernels.matmul.RowStats`,
so that the GEMM applies the second norm while loading ``y`` (``matmul.linear(layer_norm=...)``).

:func:`layer_norm_with_stats_reference` is the torch version (tests); Triton's interpreter runs the kernel on the CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from nemo_fastdecode.kernels.matmul import RowStats, row_mean_centred

__all__ = ["layer_norm_with_stats", "layer_norm_with_stats_reference"]


@triton.jit
def _layer_norm_with_stats_kernel(
    x_ptr, x_stride, w_ptr, b_ptr, y_ptr, stats_ptr, rows, features, eps,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok, d_ok = offs_m < rows, offs_d < features
    mask = m_ok[:, None] & d_ok[None, :]
    x = tl.load(x_ptr + offs_m[:, None] * x_stride + offs_d[None, :], mask=mask, other=0.0)
    _, centred = row_mean_centred(x, mask, features)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / features + eps)
    w = tl.load(w_ptr + offs_d, mask=d_ok, other=0.0)
    b = tl.load(b_ptr + offs_d, mask=d_ok, other=0.0)
    y = centred * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + offs_m[:, None] * features + offs_d[None, :], y, mask=mask)
    y_mean, y_centred = row_mean_centred(y, mask, features)
    tl.store(stats_ptr + offs_m * 2, y_mean, mask=m_ok)
    tl.store(stats_ptr + offs_m * 2 + 1, tl.sum(y_centred * y_centred, axis=1), mask=m_ok)


def layer_norm_with_stats(x: torch.Tensor, norm: torch.nn.LayerNorm) -> tuple[torch.Tensor, RowStats]:
    """``(norm(x), row statistics of norm(x))`` for float32 ``x [..., D]`` and an affine ``LayerNorm(D)``.

    Returns ``y`` contiguous ``[..., D]`` and :class:`RowStats` with one tile of width ``D`` per row.
    """
    features = x.shape[-1]
    if x.dtype != torch.float32 or tuple(norm.normalized_shape) != (features,):
        raise ValueError(
            f"need float32 x [..., D] and LayerNorm(D); got x {x.dtype} {tuple(x.shape)}, "
            f"normalized_shape {tuple(norm.normalized_shape)}"
        )
    if norm.weight is None or norm.bias is None:
        raise ValueError("need an affine LayerNorm with a bias (elementwise_affine=True, bias=True)")
    if norm.weight.device != x.device or norm.weight.dtype != torch.float32:
        raise ValueError(f"the LayerNorm's weights are {norm.weight.dtype} on {norm.weight.device}; need float32 on "
                         f"{x.device}, where x is")  # fmt: skip
    if features > 4096:
        raise ValueError(f"rows of {features} features: one program holds whole rows, valid up to 4096")
    x2 = x.reshape(-1, features)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    y = torch.empty([rows, features], dtype=torch.float32, device=x.device)
    stats = RowStats(torch.empty([rows, 1, 2], dtype=torch.float32, device=x.device), features)
    if rows:
        block_d = triton.next_power_of_2(features)
        block_m = max(1, min(16, 4096 // block_d))  # 4K elements per program: whole rows, a few per program
        _layer_norm_with_stats_kernel[(triton.cdiv(rows, block_m),)](
            x2, x2.stride(0), norm.weight, norm.bias, y, stats.partials, rows, features, float(norm.eps),
            BLOCK_M=block_m, BLOCK_D=block_d, num_warps=4,
        )  # fmt: skip
    return y.view(x.shape), stats


def layer_norm_with_stats_reference(x: torch.Tensor, norm: torch.nn.LayerNorm) -> tuple[torch.Tensor, RowStats]:
    """Torch version of :func:`layer_norm_with_stats`: ``F.layer_norm`` and ``torch.var_mean`` of its rows."""
    y = F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    var, mean = torch.var_mean(y.reshape(-1, x.shape[-1]), dim=1, correction=0)
    return y, RowStats(torch.stack([mean, var * x.shape[-1]], dim=1)[:, None, :], x.shape[-1])
