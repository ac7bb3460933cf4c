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

from nemo_fastdecode.kernels import lstm_step

PRECISIONS = ("tf32x3", "tf32", "ieee")


@triton.jit
def _linear_kernel(
    x_ptr, x_stride, w_ptr, w_stride, b_ptr, out_ptr, out_stride, partial_ptr, counter_ptr, rows, n_out, depth,
    residual_ptr, residual_stride, residual_scale,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, PRECISION: tl.constexpr, SPLIT_K: tl.constexpr, SWISH: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
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
    mask = m_ok[:, None] & n_ok[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # columns past n_out read a clamped (valid) weight row and are never stored; split-K: depth shares on axis 2
    w_rows = tl.minimum(offs_n, n_out - 1)
    acc = lstm_step._accumulate(acc, x_ptr, x_stride, w_ptr, w_stride, w_rows, offs_m, m_ok, depth, BLOCK_K,
                                PRECISION, SPLIT_K)  # fmt: skip
    if SPLIT_K > 1:  # the tile's last program adds the partial sums in split order (deterministic)
        acc, last = lstm_step._split_k_total(acc, partial_ptr, rows * n_out, offs_m[:, None] * n_out + offs_n[None, :],
                                             mask, counter_ptr, SPLIT_K)  # fmt: skip
        mask = lstm_step._and_flag(mask, last)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    # epilogue: the elementwise work around the GEMM in a Conformer layer, in torch's order of operations
    if SWISH:
        acc = acc * tl.sigmoid(acc)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + offs_m[:, None] * residual_stride + offs_n[None, :], mask=mask, other=0.0)
        acc = residual + residual_scale * acc
    tl.store(out_ptr + offs_m[:, None] * out_stride + offs_n[None, :], acc, mask=mask)


_COUNTERS: dict[tuple, torch.Tensor] = {}


def _split_k_counters(device: torch.device) -> torch.Tensor:
    """Split-K tile counters of ``device``'s current stream (launches on one stream never overlap)."""
    stream = torch.cuda.current_stream(device).stream_id if device.type == "cuda" else 0
    key = (str(device), stream)
    if key not in _COUNTERS:
        _COUNTERS[key] = lstm_step.split_k_counters(device)
    return _COUNTERS[key]


def matmul_tiling(rows: int, n_out: int, depth: int = 512) -> dict:
    """Block sizes, warps and split-K for ``rows x depth @ depth x n_out``, the best of sweeps on an H200 at the
    encoder's shapes (``scripts/bench_matmul.py --sweep``, ``benchmarks/results/matmul_*sweep*_2026-11-22-s7.md``):
    narrow 64 x 32 tiles keep programs in flight at a few hundred rows; 128-row tiles for wide or tall outputs;
    deep products of fewer than 2048 rows split the depth over 4-8 programs per tile (512 x 2048 -> 512: 39 ->
    23.6 us, 128 rows: 38.7 -> 11.1 us)."""
    if depth >= 1024 and rows < 2048:
        return {"block_m": 64, "block_n": 64 if rows >= 512 else 32, "block_k": 32, "num_warps": 4, "num_stages": 3,
                "split_k": 4 if rows >= 512 else 8}  # fmt: skip
    if rows < 64:
        block_m, block_n, num_warps = max(16, triton.next_power_of_2(rows)), 32, 4
    elif rows >= 2048 or (rows >= 512 and n_out >= 2048):
        block_m, block_n, num_warps = 128, 64, (8 if n_out <= 512 or rows < 2048 else 4)
    elif rows >= 512 and n_out >= 1024:
        block_m, block_n, num_warps = 128, 32, 8
    else:
        block_m, block_n, num_warps = 64, 32, 4
    return {"block_m": block_m, "block_n": block_n, "block_k": 32, "num_warps": num_warps, "num_stages": 3,
            "split_k": 1}  # fmt: skip


def tensor_cores_win(rows: int, n_out: int, depth: int) -> bool:
    """Whether this kernel, tiled by :func:`matmul_tiling`, beat cuBLAS fp32 at ``rows x depth @ depth x n_out`` in
    the H200 sweeps: from 128 rows (512 x 512 -> 2048: 32.1 -> 20.5 us), and at depth 1024 and more with split-K
    (32 x 2048 -> 512: 10.9 -> 8.8 us); not at a few dozen rows of a shallow product (32 x 512 -> 512: 6.8 vs
    11.1 us), where cuBLAS stays."""
    return rows >= 128 or depth >= 1024


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
    split_k: int | None = None,
    swish: bool = False,
    residual: torch.Tensor | None = None,
    residual_scale: float = 1.0,
) -> torch.Tensor:
    """``x @ weight^T + bias`` with the Triton kernel: x ``[..., K]``, weight ``[N, K]``, bias ``[N]`` or ``None``;
    returns ``[..., N]``; all float32 on one device. Keyword block sizes override :func:`matmul_tiling` (tuning);
    ``split_k > 1`` splits the depth over that many programs per output tile, their partial sums added in split
    order (deterministic). Epilogue: ``swish`` applies ``y * sigmoid(y)``; ``residual [..., N]`` returns
    ``residual + residual_scale * y`` (a Conformer layer's half-step feed-forward: ``x + 0.5 * ff(x)``)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    tensors = {"x": x, "weight": weight} | ({"bias": bias} if bias is not None else {})
    for name, t in tensors.items():
        if t.dtype != torch.float32:
            raise ValueError(f"{name} must be float32, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}: all on one device")
    if residual is not None and (residual.dtype != torch.float32 or residual.device != x.device):
        raise ValueError(f"residual must be float32 on {x.device}, got {residual.dtype} on {residual.device}")
    if residual is not None and residual.shape != (*x.shape[:-1], weight.shape[0]):
        raise ValueError(f"residual must be [..., N] = {(*x.shape[:-1], weight.shape[0])}, got {tuple(residual.shape)}")
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
    if depth == 0:  # no product: the epilogue on the bias alone, in torch
        out = out.copy_(bias.expand(rows, n_out) if bias is not None else 0).view(*x.shape[:-1], n_out)
        return _epilogue_reference(out, swish, residual, residual_scale)
    tiling = matmul_tiling(rows, n_out, depth)
    overrides = {"block_m": block_m, "block_n": block_n, "block_k": block_k, "num_warps": num_warps,
                 "num_stages": num_stages, "split_k": split_k}  # fmt: skip
    tiling.update({k: v for k, v in overrides.items() if v is not None})
    tiles = triton.cdiv(rows, tiling["block_m"]) * triton.cdiv(n_out, tiling["block_n"])
    partials, counters = lstm_step._split_k_buffers(
        tiling["split_k"], _split_k_counters(x.device), tiles, [rows, n_out], out
    )
    residual2 = out if residual is None else residual.reshape(rows, n_out)
    if residual2.stride(-1) != 1:
        residual2 = residual2.contiguous()
    _linear_kernel[(tiles, 1, tiling["split_k"])](
        x2, x2.stride(0), weight, weight.stride(0), bias if bias is not None else weight, out, out.stride(0),
        partials, counters, rows, n_out, depth, residual2, residual2.stride(0), float(residual_scale),
        HAS_BIAS=bias is not None, BLOCK_M=tiling["block_m"], BLOCK_N=tiling["block_n"], BLOCK_K=tiling["block_k"],
        GROUP_M=8, PRECISION=precision, SPLIT_K=tiling["split_k"], SWISH=swish, HAS_RESIDUAL=residual is not None,
        num_warps=tiling["num_warps"], num_stages=tiling["num_stages"],
    )  # fmt: skip
    return out.view(*x.shape[:-1], n_out)


def linear_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    swish: bool = False,
    residual: torch.Tensor | None = None,
    residual_scale: float = 1.0,
) -> torch.Tensor:
    """:func:`linear` in torch (``F.linear`` and the epilogue's ops): the CPU path and the tests' reference."""
    return _epilogue_reference(F.linear(x, weight, bias), swish, residual, residual_scale)


def _epilogue_reference(y: torch.Tensor, swish: bool, residual: torch.Tensor | None, scale: float) -> torch.Tensor:
    if swish:
        y = y * torch.sigmoid(y)
    return y if residual is None else residual + scale * y
