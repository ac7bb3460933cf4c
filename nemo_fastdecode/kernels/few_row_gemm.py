"""``x @ W^T + b`` in IEEE fp32 for a few dozen rows: the exact decoders' per-step products, in CUDA C.

A decoder step multiplies a batch of 32 rows (or a look-ahead window of a few times that) by weights of a few
megabytes. At these shapes cuBLAS's fp32 kernels and Triton's ``tl.dot`` in IEEE precision spend most of their time
outside the products (split-K passes over global memory, operands staged through shared memory for every multiply),
and take about twice as long as the fast path's 3xTF32 tensor-core kernel
(``benchmarks/results/latest/kernel_few-row-gemm_H200_2026-11-28.md`` has the timings). This kernel reaches the
tensor-core kernel's time on the CUDA cores, in plain fp32:

- each thread holds a register tile of ``RPT`` rows x 4 columns, reading the weight from a transposed copy
  ``W^T [K, N_pad]`` (:func:`transposed_weight`: one float4 per depth index, columns padded to a multiple of 4) and
  ``x`` as float4 along the depth, so every load feeds 16 fused multiply-adds per row;
- the block's warps are its depth slices; they add their partial tiles in shared memory in a fixed order, so there
  is no second pass, no counters, and every run adds in the same order (each output is an fp32 sum of ``K``
  products, as cuBLAS's is, in another order).

It is compiled once per device with NVRTC (:mod:`~nemo_fastdecode.graphs.cuda_api`); :func:`prepare` does it before
a graph capture, where loading a module is not allowed. It runs on CUDA only: on the CPU (and in Triton's
interpreter) the exact decoders use :func:`~nemo_fastdecode.kernels.matmul.linear` in IEEE precision, and the tests
of this kernel run on a GPU against float64.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import torch

#: the most rows a call may have (beyond that the products are large enough for the general GEMMs)
MAX_ROWS = 256

# (column groups of 4 per warp, rows per thread, depth slices = warps per block): the fastest of a sweep at K = 640
# (benchmarks/results/latest/kernel_few-row-gemm_H200_2026-11-28.md)
_WIDE = (8, 4, 16)  # e.g. 32 x 2560, 128 x 1025
_WINDOW = (8, 4, 20)  # e.g. 64 x 1030
_NARROW = (8, 1, 20)  # e.g. 32 x 640
TILINGS = (_WIDE, _WINDOW, _NARROW)

_SOURCE = r"""
// Block tile: 4 * CG columns x (32 / CG) * RPT rows; SLICES warps, one slice of the depth each.
template <int CG, int RPT, int SLICES>
__device__ __forceinline__ void few_row_gemm(
    const float* __restrict__ x, const float* __restrict__ wt, const float* __restrict__ bias,
    const float* residual, const bool* __restrict__ row_mask, float* out, int M, int N, int K, int n_pad,
    int slice) {
    constexpr int RG = 32 / CG, BN = 4 * CG, BM = RG * RPT;
    __shared__ float partial[SLICES][BM][BN];
    const int lane = threadIdx.x & 31, s = threadIdx.x >> 5;
    const int cg = lane % CG, rg = lane / CG;
    const int col0 = blockIdx.x * BN + 4 * cg;
    const int row0 = blockIdx.y * BM + rg * RPT;
    float acc[RPT][4];
#pragma unroll
    for (int i = 0; i < RPT; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
    const float* xr[RPT];
#pragma unroll
    for (int i = 0; i < RPT; ++i) xr[i] = x + (size_t)min(row0 + i, M - 1) * K;  // rows past M: read, never stored
    const float* wc = wt + min(col0, n_pad - 4);  // columns past N_pad likewise
    const int k_end = min(K, (s + 1) * slice);
    for (int k = s * slice; k < k_end; k += 4) {
        const float4 w0 = __ldg((const float4*)(wc + (size_t)(k + 0) * n_pad));
        const float4 w1 = __ldg((const float4*)(wc + (size_t)(k + 1) * n_pad));
        const float4 w2 = __ldg((const float4*)(wc + (size_t)(k + 2) * n_pad));
        const float4 w3 = __ldg((const float4*)(wc + (size_t)(k + 3) * n_pad));
#pragma unroll
        for (int i = 0; i < RPT; ++i) {
            const float4 v = __ldg((const float4*)(xr[i] + k));
            acc[i][0] = fmaf(v.x, w0.x, acc[i][0]); acc[i][1] = fmaf(v.x, w0.y, acc[i][1]);
            acc[i][2] = fmaf(v.x, w0.z, acc[i][2]); acc[i][3] = fmaf(v.x, w0.w, acc[i][3]);
            acc[i][0] = fmaf(v.y, w1.x, acc[i][0]); acc[i][1] = fmaf(v.y, w1.y, acc[i][1]);
            acc[i][2] = fmaf(v.y, w1.z, acc[i][2]); acc[i][3] = fmaf(v.y, w1.w, acc[i][3]);
            acc[i][0] = fmaf(v.z, w2.x, acc[i][0]); acc[i][1] = fmaf(v.z, w2.y, acc[i][1]);
            acc[i][2] = fmaf(v.z, w2.z, acc[i][2]); acc[i][3] = fmaf(v.z, w2.w, acc[i][3]);
            acc[i][0] = fmaf(v.w, w3.x, acc[i][0]); acc[i][1] = fmaf(v.w, w3.y, acc[i][1]);
            acc[i][2] = fmaf(v.w, w3.z, acc[i][2]); acc[i][3] = fmaf(v.w, w3.w, acc[i][3]);
        }
    }
#pragma unroll
    for (int i = 0; i < RPT; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) partial[s][rg * RPT + i][4 * cg + j] = acc[i][j];
    __syncthreads();
    // the slices' partial sums, added in slice order
    for (int e = threadIdx.x; e < BM * BN; e += 32 * SLICES) {
        const int r = e / BN, c = e % BN;
        const int row = blockIdx.y * BM + r, col = blockIdx.x * BN + c;
        if (row >= M || col >= N || (row_mask && !row_mask[row])) continue;
        float total = partial[0][r][c];
#pragma unroll
        for (int t = 1; t < SLICES; ++t) total += partial[t][r][c];
        if (bias) total += bias[col];
        if (residual) total += residual[(size_t)row * N + col];
        out[(size_t)row * N + col] = total;
    }
}

#define INSTANTIATE(CG, RPT, SLICES)                                                                                \
    extern "C" __global__ void __launch_bounds__(32 * SLICES) few_row_gemm_##CG##_##RPT##_##SLICES(                \
        const float* x, const float* wt, const float* bias, const float* residual, const bool* row_mask,         \
        float* out, int M, int N, int K, int n_pad, int slice) {                                                   \
        few_row_gemm<CG, RPT, SLICES>(x, wt, bias, residual, row_mask, out, M, N, K, n_pad, slice);               \
    }
"""


def _kernel_name(tiling: tuple[int, int, int]) -> str:
    return "few_row_gemm_{}_{}_{}".format(*tiling)


def available(device: torch.device) -> bool:
    """The kernel runs on ``device``: CUDA with cuda-python's driver and NVRTC bindings."""
    if device.type != "cuda":
        return False
    from nemo_fastdecode.graphs.cuda_api import cuda_driver, nvrtc

    return cuda_driver is not None and nvrtc is not None


@cache
def _kernels(device_index: int, tilings: tuple[tuple[int, int, int], ...] = TILINGS) -> dict[tuple, Any]:
    """Each tiling's ``CUfunction``, compiled in one NVRTC program for the device's architecture."""
    from nemo_fastdecode.graphs.cuda_api import compile_kernels

    source = _SOURCE + "".join("INSTANTIATE({}, {}, {})\n".format(*t) for t in tilings)
    with torch.cuda.device(device_index):
        major, minor = torch.cuda.get_device_capability(device_index)
        options = [f"--gpu-architecture=compute_{major}{minor}".encode()]
        names = [_kernel_name(t).encode() for t in tilings]
        functions = compile_kernels(source.encode(), names, b"few_row_gemm.cu", options)
    return dict(zip(tilings, functions, strict=True))


def check_tiling(tiling: tuple[int, int, int]) -> None:
    """A clear error for a tiling the kernel cannot run: ``(column groups, rows per thread, depth slices)``."""
    column_groups, rows_per_thread, slices = tiling
    shared = slices * (32 // max(column_groups, 1)) * rows_per_thread * 4 * column_groups * 4
    if column_groups not in (1, 2, 4, 8, 16, 32) or rows_per_thread < 1 or not 1 <= slices <= 32 or shared > 48 * 1024:
        raise ValueError(
            f"tiling {tiling}: column groups must divide 32, rows per thread >= 1, 1-32 depth slices, and the "
            f"partial tiles fit 48 KB of shared memory (this one needs {shared} bytes)"
        )


def prepare(device: torch.device) -> None:
    """Compile the kernels for ``device`` now (outside any graph capture); later calls return at once."""
    _kernels(device.index if device.index is not None else torch.cuda.current_device())


def choose_tiling(rows: int, n_out: int) -> tuple[int, int, int]:
    """``(column groups, rows per thread, depth slices)`` for a product of ``rows`` x ``n_out``."""
    if n_out >= 2048 or rows > 64:
        return _WIDE
    return _WINDOW if rows > 32 else _NARROW


def transposed_weight(weight: torch.Tensor) -> torch.Tensor:
    """``W [N, K]`` as the kernel reads it: ``W^T [K, N_pad]`` float32, ``N_pad`` the next multiple of 4 (zeros)."""
    n, k = weight.shape
    out = torch.zeros([k, _ceil_div(n, 4) * 4], dtype=torch.float32, device=weight.device)
    out[:, :n] = weight.detach().T
    return out


def unsupported_reason(x: torch.Tensor, weight_t: torch.Tensor, out: torch.Tensor) -> str | None:
    """Why :func:`linear` cannot take these operands (``None``: it can)."""
    rows, depth = x.shape
    if not available(x.device):
        return f"device {x.device} is not CUDA with cuda-python"
    if rows > MAX_ROWS:
        return f"{rows} rows, more than MAX_ROWS = {MAX_ROWS}"
    if depth % 4 or x.stride() != (depth, 1) or x.data_ptr() % 16:
        return f"x must be contiguous float4 rows (K = {depth} a multiple of 4, 16-byte aligned)"
    if x.dtype != torch.float32 or out.dtype != torch.float32 or weight_t.dtype != torch.float32:
        return f"float32 operands only, got x {x.dtype}, weight {weight_t.dtype}, out {out.dtype}"
    if weight_t.shape[0] != depth or weight_t.shape[1] % 4 or not weight_t.is_contiguous():
        return f"weight_t must be transposed_weight()'s [K = {depth}, N_pad], got {tuple(weight_t.shape)}"
    return None


def linear(
    x: torch.Tensor,
    weight_t: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    residual: torch.Tensor | None = None,
    row_mask: torch.Tensor | None = None,
    tiling: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """``out = x @ W^T + bias (+ residual)``, only on the rows of ``row_mask`` (the others keep ``out``'s values).

    Shapes: x ``[M, K]`` (M <= :data:`MAX_ROWS`, K a multiple of 4, contiguous); weight_t ``[K, N_pad]``
    (:func:`transposed_weight` of ``W [N, K]``); bias ``[N]`` or ``None``; out and residual ``[M, N]`` with rows of
    stride N (residual may be ``out`` itself); row_mask ``[M]`` bool. ``tiling``: ``(column groups, rows per thread,
    depth slices)``, by default :func:`choose_tiling`'s (others compile on first use: never inside a graph capture).
    Launched on the current stream (capturable).
    """
    reason = unsupported_reason(x, weight_t, out)
    if reason is not None:
        raise ValueError(f"few_row_gemm.linear: {reason}")
    rows, depth = x.shape
    n_out = out.shape[-1]
    for name, tensor in (("out", out), ("residual", residual)):
        if tensor is not None and (tuple(tensor.shape) != (rows, n_out) or tensor.stride() != (n_out, 1)):
            raise ValueError(f"{name} must be [{rows}, {n_out}] with rows of stride {n_out}, got "
                             f"{tuple(tensor.shape)} strides {tensor.stride()}")  # fmt: skip
    if n_out > weight_t.shape[1] or (bias is not None and bias.shape != (n_out,)):
        raise ValueError(f"out has {n_out} columns: weight_t {tuple(weight_t.shape)}, bias "
                         f"{None if bias is None else tuple(bias.shape)}")  # fmt: skip
    if row_mask is not None and (row_mask.shape != (rows,) or row_mask.dtype != torch.bool):
        raise ValueError(f"row_mask must be [{rows}] bool, got {tuple(row_mask.shape)} {row_mask.dtype}")
    if tiling is None:
        tiling = choose_tiling(rows, n_out)
    else:
        check_tiling(tiling)
    column_groups, rows_per_thread, slices = tiling
    # the default tilings share one cached program with prepare()'s
    kernel = (_kernels(x.device.index) if tiling in TILINGS else _kernels(x.device.index, (tiling,)))[tiling]
    slice_depth = _ceil_div(_ceil_div(depth, slices), 4) * 4  # float4 steps
    grid = (_ceil_div(n_out, 4 * column_groups), _ceil_div(rows, (32 // column_groups) * rows_per_thread), 1)
    _launch(kernel, grid, 32 * slices, [x, weight_t, bias, residual, row_mask, out],
            [rows, n_out, depth, weight_t.shape[1], slice_depth])  # fmt: skip
    return out


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _launch(
    kernel: Any, grid: tuple[int, int, int], threads: int, tensors: list[torch.Tensor | None], ints: list[int]
) -> None:
    """Launch ``kernel`` on the current stream with the tensors' addresses (``None``: a null pointer), then the ints."""
    from nemo_fastdecode.graphs.cuda_api import check, cuda_driver

    # cuLaunchKernel reads each argument through its address; the arrays live until it returns
    values = [np.array([0 if t is None else t.data_ptr()], dtype=np.uint64) for t in tensors]
    values += [np.array([v], dtype=np.int32) for v in ints]
    params = np.array([v.ctypes.data for v in values], dtype=np.uint64)
    stream = torch.cuda.current_stream(tensors[0].device).cuda_stream
    check(cuda_driver.cuLaunchKernel(kernel, *grid, threads, 1, 1, 0, stream, params.ctypes.data, 0))


def linear_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    residual: torch.Tensor | None = None,
    row_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`linear` in torch (``weight`` untransposed ``[N, K]``): the tests' reference."""
    result = torch.nn.functional.linear(x, weight, bias)
    if residual is not None:
        result = result + residual
    if row_mask is None:
        out.copy_(result)
    else:
        out[row_mask] = result[row_mask]
    return out
