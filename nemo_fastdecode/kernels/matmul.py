"""``x @ W^T + b`` on tensor cores in 3xTF32: the near-fp32 linear layer of the opt-in fast paths.

cuBLAS runs fp32 GEMMs on the CUDA cores (SIMT) unless TF32 is allowed, and TF32 alone rounds the inputs to 10
mantissa bits (relative error ~1e-3, too coarse for the streaming encoder's 1e-4 agreement with NeMo). 3xTF32
(:mod:`~nemo_fastdecode.kernels.tf32x3`, which holds the tile products and split-K) gives fp32-level accuracy
(~1e-6 relative here) at tensor-core speed. At the encoder's shapes (a few hundred rows of 512-2048 features)
cuBLAS's SIMT kernels stay well below fp32 peak (``benchmarks/profile_streaming.py`` shows it);
``benchmarks/bench_matmul.py`` times this kernel against them, tiled by :func:`matmul_tiling`.

The fast-math decoder's per-step GEMMs (the prediction network's projection and recurrent gates, the joint's output
layer) run the same kernel at a few dozen rows, tiled by :func:`decoder_tiling`, into buffers they keep (``out``),
optionally only the rows of a mask (``row_mask``).

:func:`linear_reference` (``torch.nn.functional.linear``) is the CPU path and the tests' reference; Triton's
interpreter runs the kernel on the CPU in tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from nemo_fastdecode.kernels.tf32x3 import (
    PRECISIONS,
    accumulate,
    accumulate_normalized,
    and_flag,
    check_fp32,
    check_row_mask,
    split_k_buffers,
    split_k_total,
    stream_split_k_counters,
)


@triton.jit
def _linear_kernel(
    x_ptr, x_stride, w_ptr, w_stride, b_ptr, out_ptr, out_stride, partial_ptr, counter_ptr, rows, n_out, depth,
    residual_ptr, residual_stride, residual_scale,
    stats_out_ptr, stats_in_ptr, stats_in_tiles, stats_in_width, norm_w_ptr, norm_b_ptr, norm_eps,
    scatter_ptr, scatter_offsets_ptr, scatter_start, row_mask_ptr,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, PRECISION: tl.constexpr, SPLIT_K: tl.constexpr, SWISH: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, STATS_OUT: tl.constexpr, NORM_IN: tl.constexpr, SCATTER: tl.constexpr,
    HAS_ROW_MASK: tl.constexpr,
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
    if NORM_IN:  # x's rows pass through a layer norm as they are loaded: statistics from the GEMM that wrote x
        mean, rstd = _merged_row_stats(stats_in_ptr, stats_in_tiles, stats_in_width, depth, offs_m, m_ok, norm_eps)
        acc = accumulate_normalized(acc, x_ptr, x_stride, w_ptr, w_stride, w_rows, offs_m, m_ok, depth, mean, rstd,
                                    norm_w_ptr, norm_b_ptr, BLOCK_K, PRECISION, SPLIT_K)  # fmt: skip
    else:
        acc = accumulate(acc, x_ptr, x_stride, w_ptr, w_stride, w_rows, offs_m, m_ok, depth, BLOCK_K, PRECISION,
                         SPLIT_K)  # fmt: skip
    if SPLIT_K > 1:  # the tile's last program adds the partial sums in split order (deterministic)
        acc, last = split_k_total(acc, partial_ptr, rows * n_out, offs_m[:, None] * n_out + offs_n[None, :], mask,
                                  counter_ptr, SPLIT_K)  # fmt: skip
        mask = and_flag(mask, last)
    if HAS_ROW_MASK:  # rows outside the mask keep what `out` held
        mask = mask & (tl.load(row_mask_ptr + offs_m, mask=m_ok, other=0) != 0)[:, None]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    # epilogue: the elementwise work around the GEMM in a Conformer layer, in torch's order of operations
    if SWISH:
        acc = acc * tl.sigmoid(acc)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + offs_m[:, None] * residual_stride + offs_n[None, :], mask=mask, other=0.0)
        acc = residual + residual_scale * acc
    if SCATTER:  # columns from scatter_start go to each row's own place in scatter_ptr (e.g. a k/v cache slot)
        kept = offs_n < scatter_start
        tl.store(out_ptr + offs_m[:, None] * out_stride + offs_n[None, :], acc, mask=mask & kept[None, :])
        row_offsets = tl.load(scatter_offsets_ptr + offs_m, mask=m_ok, other=0)
        moved = row_offsets[:, None] + (offs_n - scatter_start)[None, :]
        tl.store(scatter_ptr + moved, acc, mask=mask & (offs_n >= scatter_start)[None, :])
    else:
        tl.store(out_ptr + offs_m[:, None] * out_stride + offs_n[None, :], acc, mask=mask)
    if STATS_OUT:  # this tile's (mean, M2) of each row, two-pass over its columns, for a layer norm downstream
        width = tl.minimum(n_out - pid_n * BLOCK_N, BLOCK_N)
        tile_mean, centred = row_mean_centred(acc, n_ok[None, :], width)
        tile_m2 = tl.sum(centred * centred, axis=1)
        stats_ok = tl.max(mask.to(tl.int32), axis=1) > 0  # valid row (and, with split-K, the tile's last program)
        where = stats_out_ptr + (offs_m * tiles_n + pid_n) * 2
        tl.store(where, tile_mean, mask=stats_ok)
        tl.store(where + 1, tile_m2, mask=stats_ok)


@triton.jit
def row_mean_centred(values, valid, count):
    """``(mean [M], values - mean, zero where not valid)`` of each row of ``values [M, N]`` over its ``count`` valid
    entries: the first of the two passes behind a row's (mean, M2), exact where one pass over sums is not."""
    mean = tl.sum(tl.where(valid, values, 0.0), axis=1) / count
    return mean, tl.where(valid, values - mean[:, None], 0.0)


@triton.jit
def _merged_row_stats(stats_ptr, tiles, width, features, offs_m, m_ok, eps):
    """Mean and 1 / sqrt(var + eps) of each row from its column tiles' (mean, M2), merged pairwise (Chan et al.)."""
    mean = tl.zeros(offs_m.shape, dtype=tl.float32)
    m2 = tl.zeros(offs_m.shape, dtype=tl.float32)
    for t in range(0, tiles):
        count = (t * width) * 1.0  # columns merged so far: every tile before the last is full
        n_t = tl.minimum(features - t * width, width) * 1.0
        where = stats_ptr + (offs_m * tiles + t) * 2
        mean_t = tl.load(where, mask=m_ok, other=0.0)
        m2_t = tl.load(where + 1, mask=m_ok, other=0.0)
        total = count + n_t
        delta = mean_t - mean
        mean = mean + delta * (n_t / total)
        m2 = m2 + m2_t + delta * delta * (count * n_t / total)
    return mean, 1.0 / tl.sqrt(m2 / features + eps)


def matmul_tiling(rows: int, n_out: int, depth: int = 512) -> dict:
    """Block sizes, warps and split-K for ``rows x depth @ depth x n_out``, the best of sweeps at the encoder's
    shapes (``benchmarks/bench_matmul.py --sweep``; tables in ``benchmarks/results/``): narrow 64 x 32 tiles keep
    programs in flight at a few hundred rows; 128-row tiles for wide or tall outputs; deep products of fewer than 2048
    rows split the depth over 4-8 programs per tile, so that enough programs run at once."""
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


def batch_tiling(batch: int) -> tuple[int, int]:
    """``(rows per program, warps)`` of the decoder's per-step kernels at ``batch`` rows (this GEMM and the LSTM
    cell), tuned by ``benchmarks/bench_prediction.py --sweep``."""
    return (32, 2) if batch <= 32 else (64, 4)


def decoder_tiling(batch: int, split_k: bool = False) -> dict:
    """:func:`linear` options for the decoder's per-step GEMMs at ``batch`` rows (H = 640), tuned by
    ``benchmarks/bench_prediction.py --sweep``: :func:`batch_tiling`'s rows and warps, 16 columns, 64-deep blocks.
    ``split_k``: the prediction network's layers split the depth over 8 programs at batch <= 32 (too few row blocks
    to fill the GPU otherwise)."""
    block_m, num_warps = batch_tiling(batch)
    tiling = {"block_m": block_m, "block_n": 16, "block_k": 64, "num_warps": num_warps, "num_stages": 4, "split_k": 1}
    if split_k and batch <= 32:
        tiling.update(split_k=8, block_n=32, block_k=32, num_warps=2)
    return tiling


def tensor_cores_win(rows: int, n_out: int, depth: int) -> bool:
    """Whether this kernel, tiled by :func:`matmul_tiling`, beat cuBLAS fp32 at ``rows x depth @ depth x n_out`` in
    the sweeps of ``benchmarks/bench_matmul.py``: from 128 rows, and at depth 1024 and more with split-K; not at a
    few dozen rows of a shallow product, where cuBLAS stays."""
    return rows >= 128 or depth >= 1024


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    precision: str = "tf32x3",
    *,
    out: torch.Tensor | None = None,
    row_mask: torch.Tensor | None = None,
    counters: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    split_k: int | None = None,
    swish: bool = False,
    residual: torch.Tensor | None = None,
    residual_scale: float = 1.0,
    layer_norm: LayerNormInput | None = None,
    row_stats: bool = False,
    scatter: ColumnScatter | None = None,
) -> torch.Tensor | tuple[torch.Tensor, RowStats]:
    """``x @ weight^T + bias`` with the Triton kernel: x ``[..., K]``, weight ``[N, K]``, bias ``[N]`` or ``None``;
    returns ``[..., N]``; all float32 on one device. Keyword block sizes override :func:`matmul_tiling` (tuning);
    ``split_k > 1`` splits the depth over that many programs per output tile, their partial sums added in split
    order (deterministic). Epilogue: ``swish`` applies ``y * sigmoid(y)``; ``residual [..., N]`` returns
    ``residual + residual_scale * y`` (a Conformer layer's half-step feed-forward: ``x + 0.5 * ff(x)``).

    ``out [..., N]`` (row stride free, columns contiguous): written and returned instead of a new tensor.
    ``row_mask [rows]`` (bool, rows = ``x.shape[:-1].numel()``): only its rows of ``out`` are written, the others
    keep what they held. ``counters``: split-K tile counters (:func:`~nemo_fastdecode.kernels.tf32x3.
    split_k_counters`) for kernels that may run concurrently on other streams of one graph; ``None``: those of the
    current stream.

    ``layer_norm``: multiply ``layer_norm(x)`` instead of ``x``, normalising rows as they are loaded, with the row
    statistics of ``x`` that the GEMM which wrote ``x`` kept (no layer-norm kernel, no normalised copy of ``x``).
    ``row_stats``: also return those statistics of this GEMM's output (after its epilogue), ``(y, RowStats)``.
    ``scatter``: columns ``[scatter.start, N)`` of each output row are written to that row's place in
    ``scatter.target`` instead (a q-k-v projection writing k and v into a cache), and only ``[..., :start]`` is
    returned (no residual or row statistics with it)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    check_fp32(x=x, weight=weight, bias=bias, out=out)
    for name, t in {"weight": weight, "bias": bias, "out": out}.items():
        if t is not None and t.device != x.device:
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
    check_row_mask(row_mask, rows)
    if row_mask is not None and (row_stats or scatter is not None):
        raise ValueError("row_mask cannot be combined with row_stats or scatter")
    if scatter is not None:
        if residual is not None or row_stats:
            raise ValueError("scatter cannot be combined with residual or row_stats")
        scatter.check(rows, n_out, x.device)
    if (row_stats or layer_norm is not None) and 0 in (rows, n_out, depth) and scatter is None:
        raise ValueError(f"row_stats / layer_norm need a non-empty product, got [{rows}, {depth}] @ [{depth}, {n_out}]")
    kept = n_out if scatter is None else scatter.start
    if out is None:
        out = torch.empty([*x.shape[:-1], kept], dtype=torch.float32, device=x.device)
    elif out.shape != (*x.shape[:-1], kept) or out.stride(-1) != 1:
        raise ValueError(f"out must be [..., N] = {(*x.shape[:-1], kept)} with contiguous rows, got "
                         f"{tuple(out.shape)} strides {out.stride()}")  # fmt: skip
    if 0 in (rows, n_out, depth):  # nothing for the kernel to multiply: torch covers the edge cases
        y = linear_reference(x, weight, bias, swish=swish, residual=residual, residual_scale=residual_scale)
        return _write_rows(out, scatter.apply(y) if scatter is not None else y, row_mask)
    if layer_norm is not None:
        layer_norm.check(x2)
    tiling = matmul_tiling(rows, n_out, depth)
    overrides = {"block_m": block_m, "block_n": block_n, "block_k": block_k, "num_warps": num_warps,
                 "num_stages": num_stages, "split_k": split_k}  # fmt: skip
    tiling.update({k: v for k, v in overrides.items() if v is not None})
    tiles = triton.cdiv(rows, tiling["block_m"]) * triton.cdiv(n_out, tiling["block_n"])
    if counters is None and tiling["split_k"] > 1:
        counters = stream_split_k_counters(x.device)
    out2 = out.view(rows, kept)
    partials, counters = split_k_buffers(tiling["split_k"], counters, tiles, [rows, n_out], out2)
    residual2 = out2 if residual is None else residual.reshape(rows, n_out)
    if residual2.stride(-1) != 1:
        residual2 = residual2.contiguous()
    stats = RowStats(
        torch.empty([rows, triton.cdiv(n_out, tiling["block_n"]), 2], dtype=torch.float32, device=x.device),
        tiling["block_n"],
    ) if row_stats else None  # fmt: skip
    norm = layer_norm if layer_norm is not None else LayerNormInput(RowStats(out2, 1), out2, out2, 0.0)  # dummies
    _linear_kernel[(tiles, 1, tiling["split_k"])](
        x2, x2.stride(0), weight, weight.stride(0), bias if bias is not None else weight, out2, out2.stride(0),
        partials, counters, rows, n_out, depth, residual2, residual2.stride(0), float(residual_scale),
        stats.partials if stats is not None else out2, norm.stats.partials, norm.stats.partials.shape[1],
        norm.stats.tile_width, norm.weight, norm.bias, float(norm.eps),
        scatter.target if scatter is not None else out2, scatter.row_offsets if scatter is not None else out2,
        scatter.start if scatter is not None else n_out, row_mask if row_mask is not None else out2,
        HAS_BIAS=bias is not None, BLOCK_M=tiling["block_m"], BLOCK_N=tiling["block_n"], BLOCK_K=tiling["block_k"],
        GROUP_M=8, PRECISION=precision, SPLIT_K=tiling["split_k"], SWISH=swish, HAS_RESIDUAL=residual is not None,
        STATS_OUT=row_stats, NORM_IN=layer_norm is not None, SCATTER=scatter is not None,
        HAS_ROW_MASK=row_mask is not None, num_warps=tiling["num_warps"], num_stages=tiling["num_stages"],
    )  # fmt: skip
    return (out, stats) if row_stats else out


@dataclass(frozen=True)
class ColumnScatter:
    """Where :func:`linear` writes the last columns of each output row: row ``r``'s columns ``[start, N)`` go to
    ``target.view(-1)[row_offsets[r] : row_offsets[r] + N - start]`` (same as ``index_put_`` into a cache of rows
    that hold ``N - start`` contiguous values). ``target`` float32 and contiguous, ``row_offsets [rows]`` int64
    element offsets into it, both on the GEMM's device. Rows that share a place are written in no set order."""

    start: int
    target: torch.Tensor
    row_offsets: torch.Tensor

    def check(self, rows: int, n_out: int, device: torch.device) -> None:
        if not 0 <= self.start <= n_out:
            raise ValueError(f"scatter.start must be in [0, {n_out}], got {self.start}")
        if self.target.dtype != torch.float32 or not self.target.is_contiguous() or self.target.device != device:
            raise ValueError(f"scatter.target must be a contiguous float32 tensor on {device}, got "
                             f"{self.target.dtype} on {self.target.device}")  # fmt: skip
        offsets = self.row_offsets
        if offsets.shape != (rows,) or offsets.dtype != torch.int64 or offsets.device != device:
            raise ValueError(f"scatter.row_offsets must be int64 [{rows}] on {device}, got {offsets.dtype} "
                             f"{tuple(offsets.shape)} on {offsets.device}")  # fmt: skip

    def apply(self, y: torch.Tensor) -> torch.Tensor:
        """The scatter in torch, for ``y [..., N]`` computed whole: writes the moved columns, returns the kept ones."""
        rows = y.reshape(-1, y.shape[-1])
        width = rows.shape[1] - self.start
        places = self.row_offsets[:, None] + torch.arange(width, device=y.device)[None, :]
        self.target.view(-1)[places.reshape(-1)] = rows[:, self.start :].reshape(-1)
        return y[..., : self.start]


@dataclass(frozen=True)
class RowStats:
    """Per-row statistics of a GEMM output ``y [rows, N]`` in column tiles: ``partials[r, t] = (mean, M2)`` of
    ``y[r, t * tile_width : (t + 1) * tile_width]`` (M2: sum of squared deviations from that mean)."""

    partials: torch.Tensor  # [rows, tiles, 2] float32
    tile_width: int

    def mean_var(self, features: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean [rows], biased variance [rows])`` of the whole rows of ``features`` columns (torch, for tests)."""
        rows, tiles, _ = self.partials.shape
        counts = torch.tensor(
            [min(self.tile_width, features - t * self.tile_width) for t in range(tiles)],
            dtype=torch.float64, device=self.partials.device,
        )  # fmt: skip
        means, m2s = self.partials[..., 0].double(), self.partials[..., 1].double()
        mean = (means * counts).sum(1) / features
        m2 = m2s.sum(1) + (counts * (means - mean[:, None]) ** 2).sum(1)
        return mean, m2 / features


@dataclass(frozen=True)
class LayerNormInput:
    """``torch.nn.LayerNorm`` over the last dim of a GEMM's input, with that input's :class:`RowStats`."""

    stats: RowStats
    weight: torch.Tensor  # [K]
    bias: torch.Tensor  # [K]
    eps: float

    def check(self, x: torch.Tensor) -> None:
        rows, depth = x.shape
        tiles = -(-depth // self.stats.tile_width)
        if self.stats.partials.shape != (rows, tiles, 2):
            raise ValueError(
                f"layer_norm stats are {tuple(self.stats.partials.shape)}, x is [{rows}, {depth}]: need the "
                f"[{rows}, {tiles}, 2] statistics of x kept by the GEMM that wrote it"
            )
        for name, t in (("weight", self.weight), ("bias", self.bias)):
            if t.shape != (depth,) or t.dtype != torch.float32 or t.device != x.device:
                raise ValueError(f"layer_norm {name} must be float32 [{depth}] on {x.device}, got {t.dtype} "
                                 f"{tuple(t.shape)} on {t.device}")  # fmt: skip


def linear_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    row_mask: torch.Tensor | None = None,
    swish: bool = False,
    residual: torch.Tensor | None = None,
    residual_scale: float = 1.0,
    layer_norm: torch.nn.LayerNorm | None = None,
) -> torch.Tensor:
    """:func:`linear` in torch (``F.linear`` and the epilogue's ops; ``layer_norm`` a module applied to ``x`` first;
    ``out`` / ``row_mask`` as there): the CPU path and the tests' reference."""
    x = layer_norm(x) if layer_norm is not None else x
    y = F.linear(x, weight, bias)
    if swish:
        y = y * torch.sigmoid(y)
    if residual is not None:
        y = residual + residual_scale * y
    return y if out is None else _write_rows(out, y, row_mask)


def _write_rows(out: torch.Tensor, y: torch.Tensor, row_mask: torch.Tensor | None) -> torch.Tensor:
    """``out`` with ``y`` in the rows of ``row_mask`` (all rows without one)."""
    if row_mask is None:
        return out.copy_(y)
    return torch.where(row_mask.view(*y.shape[:-1], 1), y, out, out=out)
