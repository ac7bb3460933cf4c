"""The 3xTF32 GEMM core that the tensor-core kernels share: tile products, split-K, activations, checks.

3xTF32 splits every fp32 operand into a TF32 high part and a TF32 remainder and adds three tensor-core products
(hi*hi + hi*lo + lo*hi; ``tl.dot(..., input_precision="tf32x3")``): near-fp32 products (relative error about 1e-6
against a float64 reference) at tensor-core speed, but not bit-identical to cuBLAS's fp32 GEMMs.

- :func:`accumulate` / :func:`accumulate_normalized`: ``acc += a @ W^T`` over this program's share of the depth.
- Split-K (the depth of an output tile over several programs, axis 2 of the grid): :func:`depth_share`,
  :func:`split_k_total` (the partial sums added in split order: deterministic) and the launcher side,
  :func:`split_k_buffers` with tile counters from :func:`split_k_counters` / :func:`stream_split_k_counters`.
- :func:`sigmoid`, :func:`tanh`: activations without libdevice (they run in the interpreter too).

Used by :mod:`~nemo_fastdecode.kernels.matmul` (the linear layer), :mod:`~nemo_fastdecode.kernels.lstm_step` (the
LSTM cell) and :mod:`~nemo_fastdecode.kernels.window_look` (the joint's output layer fused with the greedy look).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

PRECISIONS = ("tf32x3", "tf32", "ieee")

# split-K counters: one int32 per output tile of a launch, zero between launches (each launch resets its own)
MAX_SPLIT_K_TILES = 8192


@triton.jit
def tanh(x):
    # |x| >= 1/4: sign(x) (1 - e^{-2|x|}) / (1 + e^{-2|x|}), no overflow for large |x| and 1 - e^{-2|x|} >= 0.39, so
    # little cancellation; below, where 1 - e^{-2|x|} would cancel (relative error eps / |x|), the odd Taylor series
    # to x^9 (next term under 1e-8 relative): float32 rounding everywhere, as torch.tanh
    a = tl.abs(x)
    t = tl.exp(-2.0 * a)
    large = (1.0 - t) / (1.0 + t)
    a2 = a * a
    small = a * (1.0 + a2 * (-1.0 / 3.0 + a2 * (2.0 / 15.0 + a2 * (-17.0 / 315.0 + a2 * (62.0 / 2835.0)))))
    y = tl.where(a < 0.25, small, large)
    return tl.where(x < 0, -y, y)


@triton.jit
def sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def depth_share(depth, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """``[start, end)`` of the depth that this program multiplies (split-K: its share, by ``program_id(2)``)."""
    share = tl.cdiv(tl.cdiv(depth, BLOCK_K), SPLIT_K) * BLOCK_K
    start = tl.program_id(2) * share
    return start, tl.minimum(start + share, depth)


@triton.jit
def _accumulate_tiles(acc, a_ptr, a_stride, w_ptr, w_stride, w_rows, rows, row_ok, depth, mean, rstd, gamma_ptr,
                      beta_ptr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, SPLIT_K: tl.constexpr,
                      NORM_IN: tl.constexpr):  # fmt: skip
    start, end = depth_share(depth, BLOCK_K, SPLIT_K)
    for k0 in range(start, end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < end
        a = tl.load(a_ptr + rows[:, None] * a_stride + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if NORM_IN:
            gamma = tl.load(gamma_ptr + ks, mask=k_ok, other=0.0)
            beta = tl.load(beta_ptr + ks, mask=k_ok, other=0.0)
            a = (a - mean[:, None]) * rstd[:, None] * gamma[None, :] + beta[None, :]
        # W is row-major [N, K]: load its tile along K (coalesced, vectorised), transpose in registers
        w = tl.load(w_ptr + w_rows[:, None] * w_stride + ks[None, :], mask=k_ok[None, :], other=0.0)
        acc += tl.dot(a, tl.trans(w), input_precision=PRECISION)
    return acc


@triton.jit
def accumulate(acc, a_ptr, a_stride, w_ptr, w_stride, w_rows, rows, row_ok, depth, BLOCK_K: tl.constexpr,
               PRECISION: tl.constexpr, SPLIT_K: tl.constexpr):  # fmt: skip
    """acc += a[rows, K_s] @ W[w_rows, K_s]^T over this program's share K_s of the depth (split-K: axis 2)."""
    return _accumulate_tiles(acc, a_ptr, a_stride, w_ptr, w_stride, w_rows, rows, row_ok, depth, 0.0, 0.0, a_ptr,
                             a_ptr, BLOCK_K, PRECISION, SPLIT_K, False)  # fmt: skip


@triton.jit
def accumulate_normalized(acc, a_ptr, a_stride, w_ptr, w_stride, w_rows, rows, row_ok, depth, mean, rstd, gamma_ptr,
                          beta_ptr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, SPLIT_K: tl.constexpr):  # fmt: skip
    """:func:`accumulate` of ``layer_norm(a)``: each loaded tile becomes ``(a - mean) * rstd * gamma + beta``
    (torch's order of operations) before the product; ``mean`` / ``rstd`` ``[rows]``, gamma / beta ``[K]``."""
    return _accumulate_tiles(acc, a_ptr, a_stride, w_ptr, w_stride, w_rows, rows, row_ok, depth, mean, rstd,
                             gamma_ptr, beta_ptr, BLOCK_K, PRECISION, SPLIT_K, True)  # fmt: skip


@triton.jit
def split_k_total(acc, partial_ptr, plane, offsets, mask, counter_ptr, SPLIT_K: tl.constexpr):
    """Split-K: ``(sum of the tile's SPLIT_K partial sums, whether this program is the tile's last to arrive)``.

    Every program of a tile (axes 0 and 1; splits on axis 2) stores its partial sum ``acc`` at
    ``partial_ptr + split * plane + offsets`` and counts itself in the tile's counter; the last to arrive adds the
    partials in split order (deterministic, whatever the arrival order), resets the counter for the next launch
    and gets the sum; the others get zeros and must store nothing.
    """
    tl.store(partial_ptr + tl.program_id(2) * plane + offsets, acc, mask=mask)
    tl.debug_barrier()  # every thread's partial is written before the counter moves (released by the atomic)
    tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel")
    total = tl.zeros_like(acc)
    if arrived == SPLIT_K - 1:
        for split in tl.static_range(SPLIT_K):  # from L2 (.cg): other SMs wrote them
            total += tl.load(partial_ptr + split * plane + offsets, mask=mask, other=0.0, cache_modifier=".cg")
        tl.atomic_xchg(counter_ptr + tile, 0)
    return total, arrived == SPLIT_K - 1


@triton.jit
def and_flag(mask, flag):
    """``mask & flag`` for a scalar ``flag``, broadcast first (the interpreter's ``&`` would not give a bool mask)."""
    return mask & ((tl.zeros(mask.shape, dtype=tl.int32) + flag.to(tl.int32)) != 0)


def check_fp32(**tensors: torch.Tensor | None) -> None:
    """A clear error for any given tensor that is not float32 (``None``: not given, not checked)."""
    for name, tensor in tensors.items():
        if tensor is not None and tensor.dtype != torch.float32:
            raise ValueError(f"{name} must be float32, got {tensor.dtype} (the 3xTF32 kernels compute in float32)")


def check_row_mask(row_mask: torch.Tensor | None, batch: int) -> None:
    if row_mask is not None and (row_mask.shape != (batch,) or row_mask.dtype != torch.bool):
        raise ValueError(f"row_mask must be bool [B]=[{batch}], got {row_mask.dtype} {tuple(row_mask.shape)}")


def split_k_counters(device: torch.device) -> torch.Tensor:
    """Zeroed tile counters for ``split_k > 1`` launches on ``device`` (allocate outside graph capture, keep)."""
    return torch.zeros(MAX_SPLIT_K_TILES, dtype=torch.int32, device=device)


_STREAM_COUNTERS: dict[tuple[str, int], torch.Tensor] = {}


def stream_split_k_counters(device: torch.device) -> torch.Tensor:
    """The split-K tile counters of ``device``'s current stream, allocated on first use (launches on one stream
    never overlap; kernels that may run concurrently on other streams of one graph pass counters of their own)."""
    stream = torch.cuda.current_stream(device).stream_id if device.type == "cuda" else 0
    key = (str(device), stream)
    if key not in _STREAM_COUNTERS:
        _STREAM_COUNTERS[key] = split_k_counters(device)
    return _STREAM_COUNTERS[key]


def split_k_buffers(
    split_k: int, counters: torch.Tensor, tiles: int, partial_shape: list[int], like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(partials, counters)`` for a launch: the arguments of :func:`split_k_total` (dummies when
    ``split_k == 1``)."""
    if split_k < 1:
        raise ValueError(f"split_k must be a positive int, got {split_k}")
    if split_k == 1:
        return like, like
    if counters.dtype != torch.int32 or counters.device != like.device:
        raise ValueError(f"split_k={split_k} needs int32 tile counters on {like.device} (split_k_counters())")
    if tiles > counters.numel():
        raise ValueError(f"split_k={split_k}: {tiles} tiles, more than the {counters.numel()} counters")
    return torch.empty([split_k, *partial_shape], dtype=torch.float32, device=like.device), counters
