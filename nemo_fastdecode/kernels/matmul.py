"""``x @ W^T + b`` on tensor cores in 3xTF32: near-fp32 GEMMs for the cache-aware streaming encoder (opt-in).

cuBLAS runs fp32 GEMMs on the CUDA cores (SIMT) unless TF32 is allowed, and TF32 alone rounds the inputs to 10
mantissa bits (relative error ~1e-3, too coarse for the streaming encoder's 1e-4 agreement with NeMo). 3xTF32
splits each input into a TF32 high part and a TF32 remainder and adds three tensor-core products (hi*hi + hi*lo +
lo*hi): fp32-level accuracy (~1e-6 relative here) at tensor-core speed. At the encoder's shapes (a few hundred rows
of 512-2048 features) cuBLAS's SIMT kernels reached about a third of fp32 peak on an H200
(``scripts/profile_streaming.py``); ``scripts/bench_matmul.py`` times this kernel against them.

:func:`linear_reference` (``torch.nn.functional.linear``) is the CPU path and the tests' reference; Triton's
interpreter runs the kernel on the CPU in tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

PRECISIONS = ("tf32x3", "tf32", "ieee")


@triton.jit
def _linear_kernel(
    x_ptr, x_stride, w_ptr, w_stride, b_ptr, out_ptr, out_stride, rows, n_out, depth,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    # grouped program order: GROUP_M row tiles share each weight tile while it is in L2
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(rows, BLOCK_M), tl.cdiv(n_out, BLOCK_N)
    group = pid // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    group_size = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % group_size
    pid_n = (pid % (GROUP_M * tiles_n)) // group_size
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = offs_m < rows, offs_n < n_out
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, depth, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < depth
        a = tl.load(x_ptr + offs_m[:, None] * x_stride + ks[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        # W is row-major [N, K]: its tile read along K (coalesced), used transposed
        w = tl.load(w_ptr + offs_n[:, None] * w_stride + ks[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(a, tl.trans(w), acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    tl.store(out_ptr + offs_m[:, None] * out_stride + offs_n[None, :], acc, mask=m_ok[:, None] & n_ok[None, :])


def matmul_tiling(rows: int, n_out: int) -> dict:
    """Block sizes and warps for ``rows x n_out`` outputs, the best of a sweep on an H200 at the encoder's shapes
    (``scripts/bench_matmul.py --sweep``, ``benchmarks/results/matmul_sweep_NVIDIA-H200_2026-11-22-s7.md``):
    narrow 64 x 32 tiles keep programs in flight at a few hundred rows; 128-row tiles for wide or tall outputs."""
    if rows < 64:
        block_m, block_n, num_warps = max(16, triton.next_power_of_2(rows)), 32, 4
    elif rows >= 2048 or (rows >= 512 and n_out >= 2048):
        block_m, block_n, num_warps = 128, 64, (8 if n_out <= 512 or rows < 2048 else 4)
    elif rows >= 512 and n_out >= 1024:
        block_m, block_n, num_warps = 128, 32, 8
    else:
        block_m, block_n, num_warps = 64, 32, 4
    return {"block_m": block_m, "block_n": block_n, "block_k": 32, "num_warps": num_warps, "num_stages": 3}


def tensor_cores_win(rows: int, n_out: int, depth: int) -> bool:
    """Whether this kernel beats cuBLAS fp32 at ``rows x depth @ depth x n_out`` on the H200 sweep above: from 128
    rows at depths up to 1024 (e.g. 512 rows, 512 -> 2048: 32.1 -> 20.5 us), and from 2048 rows at any depth; not
    for a few dozen rows (32 x 512 x 512: 6.8 vs 11.1 us) nor deep products of few rows (512 x 2048 -> 512: 34 vs
    38 us), where few programs each walk a long depth."""
    return rows >= 128 and (depth <= 1024 or rows >= 2048)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    precision: str = "tf32x3",
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """``x @ weight^T + bias`` with the Triton kernel: x ``[..., K]``, weight ``[N, K]``, bias ``[N]`` or ``None``;
    returns ``[..., N]``; all float32 on one device. Keyword block sizes override :func:`matmul_tiling` (tuning)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    tensors = {"x": x, "weight": weight} | ({"bias": bias} if bias is not None else {})
    for name, t in tensors.items():
        if t.dtype != torch.float32:
            raise ValueError(f"{name} must be float32, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}: all on one device")
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1] or (bias is not None and bias.shape != weight.shape[:1]):
        raise ValueError(
            f"shapes disagree: x {tuple(x.shape)} [..., K], weight {tuple(weight.shape)} [N, K], "
            f"bias {None if bias is None else tuple(bias.shape)} [N]"
        )
    x2 = x.reshape(x.shape[:-1].numel(), x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    rows, depth = x2.shape
    n_out = weight.shape[0]
    out = torch.empty([rows, n_out], dtype=torch.float32, device=x.device)
    if rows == 0 or n_out == 0:
        return out.view(*x.shape[:-1], n_out)
    if depth == 0:
        return out.copy_(bias.expand(rows, n_out) if bias is not None else 0).view(*x.shape[:-1], n_out)
    tiling = matmul_tiling(rows, n_out)
    overrides = {"block_m": block_m, "block_n": block_n, "block_k": block_k, "num_warps": num_warps,
                 "num_stages": num_stages}  # fmt: skip
    tiling.update({k: v for k, v in overrides.items() if v is not None})
    grid = (triton.cdiv(rows, tiling["block_m"]) * triton.cdiv(n_out, tiling["block_n"]),)
    _linear_kernel[grid](
        x2, x2.stride(0), weight, weight.stride(0), bias if bias is not None else weight, out, out.stride(0),
        rows, n_out, depth,
        HAS_BIAS=bias is not None, BLOCK_M=tiling["block_m"], BLOCK_N=tiling["block_n"], BLOCK_K=tiling["block_k"],
        GROUP_M=8, PRECISION=precision, num_warps=tiling["num_warps"], num_stages=tiling["num_stages"],
    )  # fmt: skip
    return out.view(*x.shape[:-1], n_out)


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`linear` in torch (``F.linear``): the CPU path and the tests' reference."""
    return F.linear(x, weight, bias)
