"""One LSTM cell step and one linear layer on tensor cores at near-fp32 accuracy (3xTF32), in Triton.

Opt-in fast math for the prediction network (``fast_math=True``): cuDNN's fp32 LSTM step at batch 32 runs
two SIMT GEMMs of about 22 us each on an H100/H200, although the weights (13 MB) sit in L2. These kernels
split every fp32 operand into a TF32 high part and a TF32 remainder and multiply on tensor cores with three
MMAs (``input_precision="tf32x3"``): the products are near fp32 (relative error about 1e-6 against a float64
reference) but not bit-identical to cuBLAS, so decisions may differ on near-ties. That is why the path is
opt-in and its agreement with the exact path is reported by the benchmark.

- :func:`lstm_cell_step`: ``gates = row_bias[bias_index[b]] (+ x @ W_x^T) + h @ W_h^T``, then the LSTM cell
  (PyTorch gate order i, f, g, o), one program per (row block, hidden block of 4-8 units), the four gates of
  its units in one dot, so that the cell runs in the GEMM's epilogue.
- :func:`linear`: ``x @ W^T + b``, optionally split-K (the depth over several programs per output tile, their
  partial sums added in a fixed order): more programs in flight where a small batch leaves SMs idle.

Both have a torch reference (``*_reference``), used on the CPU and by the tests (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _tanh(x):
    # tanh without libdevice (runs in the interpreter too): sign(x) (1 - e^{-2|x|}) / (1 + e^{-2|x|})
    t = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x < 0, -y, y)


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _depth_share(depth, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """``[start, end)`` of the depth that this program multiplies (split-K: its share, by ``program_id(2)``)."""
    share = tl.cdiv(tl.cdiv(depth, BLOCK_K), SPLIT_K) * BLOCK_K
    start = tl.program_id(2) * share
    return start, tl.minimum(start + share, depth)


@triton.jit
def _accumulate(acc, a_ptr, a_stride, w_ptr, w_stride, w_rows, rows, row_ok, depth, BLOCK_K: tl.constexpr,
                PRECISION: tl.constexpr, SPLIT_K: tl.constexpr):  # fmt: skip
    """acc += a[rows, K_s] @ W[w_rows, K_s]^T over this program's share K_s of the depth (split-K: axis 2)."""
    start, end = _depth_share(depth, BLOCK_K, SPLIT_K)
    for k0 in range(start, end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < end
        a = tl.load(a_ptr + rows[:, None] * a_stride + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        # W is row-major [N, K]: load its tile along K (coalesced, vectorised), transpose in registers
        w = tl.load(w_ptr + w_rows[:, None] * w_stride + ks[None, :], mask=k_ok[None, :], other=0.0)
        acc += tl.dot(a, tl.trans(w), input_precision=PRECISION)
    return acc


@triton.jit
def _split_k_total(acc, partial_ptr, plane, offsets, mask, counter_ptr, SPLIT_K: tl.constexpr):
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
def _and_flag(mask, flag):
    """``mask & flag`` for a scalar ``flag``, broadcast first (the interpreter's ``&`` would not give a bool mask)."""
    return mask & ((tl.zeros(mask.shape, dtype=tl.int32) + flag.to(tl.int32)) != 0)


@triton.jit
def _lstm_cell_kernel(
    bias_ptr, bias_stride, bias_index_ptr,
    x_ptr, x_stride, wx_ptr, wx_stride, x_depth,
    h_ptr, h_stride, wh_ptr, wh_stride, recurrent_ptr, recurrent_stride,
    c_ptr, c_stride, h_out_ptr, c_out_ptr, out_stride, row_mask_ptr,
    batch, hidden,
    HAS_X: tl.constexpr, HAS_H: tl.constexpr, ROW_INDEXED: tl.constexpr, HAS_ROW_MASK: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    # One program: BLOCK_B rows x BLOCK_H hidden units, all four gates of those units as ONE dot of 4 * BLOCK_H
    # columns (column = gate * BLOCK_H + unit): small hidden blocks spread the weights over many SMs, and the
    # cell runs in the epilogue. Units past `hidden` read a clamped (valid) weight row and are never stored.
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < batch
    cols = tl.arange(0, 4 * BLOCK_H)
    gate_units = tl.program_id(1) * BLOCK_H + cols % BLOCK_H
    w_rows = (cols // BLOCK_H) * hidden + tl.minimum(gate_units, hidden - 1)
    gates = tl.zeros([BLOCK_B, 4 * BLOCK_H], dtype=tl.float32)
    if HAS_X:
        gates = _accumulate(gates, x_ptr, x_stride, wx_ptr, wx_stride, w_rows, rows, row_ok, x_depth, BLOCK_K,
                            PRECISION, 1)  # fmt: skip
    if HAS_H:
        gates = _accumulate(gates, h_ptr, h_stride, wh_ptr, wh_stride, w_rows, rows, row_ok, hidden, BLOCK_K,
                            PRECISION, 1)  # fmt: skip
    else:  # h @ W_h^T computed beforehand (:func:`linear`), e.g. on a parallel branch of the decoder's graph
        gates += tl.load(recurrent_ptr + rows[:, None] * recurrent_stride + w_rows[None, :], mask=row_ok[:, None],
                         other=0.0)  # fmt: skip
    units = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = row_ok[:, None] & (units < hidden)[None, :]
    if HAS_ROW_MASK:  # rows outside the mask keep what the outputs held (an in-place, masked update)
        mask = mask & (tl.load(row_mask_ptr + rows, mask=row_ok, other=0) != 0)[:, None]
    # the per-row bias: the table row of the row's label (layer 0), or the layer's bias shared by all rows
    if ROW_INDEXED:
        index = tl.load(bias_index_ptr + rows, mask=row_ok, other=0)
        gates += tl.load(bias_ptr + index[:, None] * bias_stride + w_rows[None, :], mask=row_ok[:, None], other=0.0)
    else:
        gates += tl.load(bias_ptr + w_rows)[None, :]
    # [B, gate * BLOCK_H + unit] -> four [B, BLOCK_H] gates: the gate index to the last axis, split it twice
    gates = tl.reshape(tl.permute(tl.reshape(gates, [BLOCK_B, 4, BLOCK_H]), (0, 2, 1)), [BLOCK_B, BLOCK_H, 2, 2])
    even, odd = tl.split(gates)  # gates 0, 2 / 1, 3 (last axis: gate // 2)
    gate_i, gate_g = tl.split(even)
    gate_f, gate_o = tl.split(odd)
    c_prev = tl.load(c_ptr + rows[:, None] * c_stride + units[None, :], mask=mask, other=0.0)
    c_new = _sigmoid(gate_f) * c_prev + _sigmoid(gate_i) * _tanh(gate_g)
    h_new = _sigmoid(gate_o) * _tanh(c_new)
    out = rows[:, None] * out_stride + units[None, :]
    tl.store(c_out_ptr + out, c_new, mask=mask)
    tl.store(h_out_ptr + out, h_new, mask=mask)


def batch_tiling(batch: int) -> tuple[int, int]:
    """``(rows per program, warps)``, tuned on an H200 (``scripts/bench_prediction.py --sweep``)."""
    return (32, 2) if batch <= 32 else (64, 4)


def linear_tiling(batch: int) -> dict:
    """:func:`linear` options for the prediction network's layers (H = 640) at ``batch`` rows, tuned on an H200
    (``scripts/bench_prediction.py --sweep``): split-K over 8 programs at batch <= 32 (8.1 -> 5.4 us for the
    projection); the defaults above."""
    return {"split_k": 8, "block_n": 32, "block_k": 32, "num_warps": 2} if batch <= 32 else {}


# split-K counters: one int32 per output tile of a launch, zero between launches (each launch resets its own)
MAX_SPLIT_K_TILES = 8192


def _check_row_mask(row_mask: torch.Tensor | None, batch: int) -> None:
    if row_mask is not None and (row_mask.shape != (batch,) or row_mask.dtype != torch.bool):
        raise ValueError(f"row_mask must be bool [B]=[{batch}], got {row_mask.dtype} {tuple(row_mask.shape)}")


def split_k_counters(device: torch.device) -> torch.Tensor:
    """Zeroed tile counters for ``split_k > 1`` launches on ``device`` (allocate outside graph capture, keep)."""
    return torch.zeros(MAX_SPLIT_K_TILES, dtype=torch.int32, device=device)


def _split_k_buffers(
    split_k: int, counters: torch.Tensor | None, tiles: int, partial_shape: list[int], like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(partials, counters)`` for a launch: the arguments of ``_split_k_total`` (dummies when ``split_k == 1``)."""
    if split_k < 1:
        raise ValueError(f"split_k must be a positive int, got {split_k}")
    if split_k == 1:
        return like, like
    if counters is None or counters.dtype != torch.int32 or counters.device != like.device:
        raise ValueError(f"split_k={split_k} needs int32 tile counters on {like.device} (split_k_counters())")
    if tiles > counters.numel():
        raise ValueError(f"split_k={split_k}: {tiles} tiles, more than the {counters.numel()} counters")
    return torch.empty([split_k, *partial_shape], dtype=torch.float32, device=like.device), counters


def _check_fp32(**tensors: torch.Tensor | None) -> None:
    for name, tensor in tensors.items():
        if tensor is not None and tensor.dtype != torch.float32:
            raise ValueError(f"the 3xTF32 kernels compute in float32; {name} is {tensor.dtype}")


def lstm_cell_step(
    row_bias: torch.Tensor,
    bias_index: torch.Tensor | None,
    x: torch.Tensor | None,
    weight_x: torch.Tensor | None,
    h: torch.Tensor | None,
    weight_h: torch.Tensor | None,
    c: torch.Tensor,
    h_out: torch.Tensor,
    c_out: torch.Tensor,
    precision: str = "tf32x3",
    *,
    recurrent_gates: torch.Tensor | None = None,
    row_mask: torch.Tensor | None = None,
    block_b: int | None = None,
    block_h: int | None = None,
    block_k: int = 64,
    num_warps: int | None = None,
    num_stages: int = 4,
) -> None:
    """One LSTM step, written to ``h_out`` / ``c_out``.

    ``c_out`` may be ``c`` (each element is read and written by the same program); ``h_out`` may be ``h`` only with
    ``recurrent_gates`` (then ``h`` is not read). ``row_mask [B]`` (bool): only its rows are written, the others
    keep their values (with ``h_out is h``, ``c_out is c``: a masked update of the state in place).

    Shapes: ``row_bias [R, 4H]`` with ``bias_index [B]`` (int64): row ``bias_index[b]`` is added to row b's
    gates (a table of precomputed input gates indexed by label); or ``row_bias [4H]`` with ``bias_index=None``
    (a layer's summed biases, added to every row); ``x [B, K]`` and ``weight_x [4H, K]`` (``None``: no input
    GEMM); ``h, c [B, H]``, ``weight_h [4H, H]``; ``h_out, c_out [B, H]``. ``recurrent_gates [B, 4H]``: ``h @
    weight_h^T`` computed beforehand (then ``h`` and ``weight_h`` are ``None``). Everything float32. The
    keyword-only block sizes are for tuning (``scripts/bench_prediction.py``); ``None`` picks by batch size.
    """
    _check_fp32(row_bias=row_bias, x=x, weight_x=weight_x, h=h, weight_h=weight_h, c=c, recurrent_gates=recurrent_gates)
    batch, hidden = c.shape
    row_indexed = row_bias.dim() == 2
    has_h = recurrent_gates is None
    if (
        (has_h and (h is None or h.shape != c.shape or weight_h is None or weight_h.shape != (4 * hidden, hidden)))
        or (not has_h and (h is not None or weight_h is not None or recurrent_gates.shape != (batch, 4 * hidden)))
        or row_bias.shape[-1] != 4 * hidden
        or row_indexed != (bias_index is not None)
    ):
        shapes = {"c": c, "h": h, "weight_h": weight_h, "recurrent_gates": recurrent_gates, "row_bias": row_bias}
        described = ", ".join(f"{k} {None if v is None else tuple(v.shape)}" for k, v in shapes.items())
        raise ValueError(f"LSTM shapes disagree (give h and weight_h, or recurrent_gates): {described}")
    if has_h and h_out.data_ptr() == h.data_ptr():
        raise ValueError("h_out may be h only with recurrent_gates (the kernel reads h while others write h_out)")
    _check_row_mask(row_mask, batch)
    has_x = x is not None
    x_args = (x, x.stride(0), weight_x, weight_x.stride(0), x.shape[1]) if has_x else (c, 0, c, 0, 0)
    h_args = (h, h.stride(0), weight_h, weight_h.stride(0), c, 0) if has_h else (c, 0, c, 0, recurrent_gates,
                                                                                recurrent_gates.stride(0))  # fmt: skip
    # tuned on an H200 at H = 640 (scripts/bench_prediction.py --sweep): many small programs beat few large ones
    default_rows, default_warps = batch_tiling(batch)
    block_b = block_b or default_rows
    block_h = block_h or (4 if batch <= 32 else 8)
    num_warps = num_warps or default_warps
    grid = (triton.cdiv(batch, block_b), triton.cdiv(hidden, block_h))
    _lstm_cell_kernel[grid](
        row_bias, row_bias.stride(0), bias_index if row_indexed else row_bias,
        *x_args,
        *h_args,
        c, c.stride(0), h_out, c_out, h_out.stride(0), c if row_mask is None else row_mask,
        batch, hidden,
        HAS_X=has_x, HAS_H=has_h, ROW_INDEXED=row_indexed, HAS_ROW_MASK=row_mask is not None, BLOCK_B=block_b,
        BLOCK_H=block_h, BLOCK_K=block_k, PRECISION=precision, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip


def lstm_cell_step_reference(
    row_bias: torch.Tensor,
    bias_index: torch.Tensor | None,
    x: torch.Tensor | None,
    weight_x: torch.Tensor | None,
    h: torch.Tensor | None,
    weight_h: torch.Tensor | None,
    c: torch.Tensor,
    h_out: torch.Tensor,
    c_out: torch.Tensor,
    *,
    recurrent_gates: torch.Tensor | None = None,
    row_mask: torch.Tensor | None = None,
) -> None:
    """:func:`lstm_cell_step` in torch ops (fp32 GEMMs): the CPU path and the tests' reference."""
    gates = (row_bias[bias_index] if bias_index is not None else row_bias) + (
        h @ weight_h.T if recurrent_gates is None else recurrent_gates
    )
    if x is not None:
        gates = gates + x @ weight_x.T
    gate_i, gate_f, gate_g, gate_o = gates.chunk(4, dim=-1)
    c_new = gate_f.sigmoid() * c + gate_i.sigmoid() * gate_g.tanh()
    h_new = gate_o.sigmoid() * c_new.tanh()
    if row_mask is not None:
        c_new, h_new = torch.where(row_mask[:, None], c_new, c_out), torch.where(row_mask[:, None], h_new, h_out)
    c_out.copy_(c_new)
    h_out.copy_(h_new)


@triton.jit
def _linear_kernel(
    x_ptr, x_stride, w_ptr, w_stride, b_ptr, out_ptr, out_stride, partial_ptr, counter_ptr, row_mask_ptr, batch,
    n_out, depth,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_ROW_MASK: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < batch, cols < n_out
    mask = row_ok[:, None] & col_ok[None, :]
    store_mask = mask
    if HAS_ROW_MASK:  # rows outside the mask keep what `out` held
        store_mask = mask & (tl.load(row_mask_ptr + rows, mask=row_ok, other=0) != 0)[:, None]
    acc = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    # columns past n_out read a clamped (valid) weight row and are never stored
    w_rows = tl.minimum(cols, n_out - 1)
    acc = _accumulate(acc, x_ptr, x_stride, w_ptr, w_stride, w_rows, rows, row_ok, depth, BLOCK_K, PRECISION, SPLIT_K)
    if SPLIT_K > 1:
        acc, last = _split_k_total(acc, partial_ptr, batch * n_out, rows[:, None] * n_out + cols[None, :], mask,
                                   counter_ptr, SPLIT_K)  # fmt: skip
        store_mask = _and_flag(store_mask, last)
    acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0)[None, :]
    tl.store(out_ptr + rows[:, None] * out_stride + cols[None, :], acc, mask=store_mask)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    out: torch.Tensor,
    precision: str = "tf32x3",
    *,
    split_k: int = 1,
    counters: torch.Tensor | None = None,
    row_mask: torch.Tensor | None = None,
    block_b: int | None = None,
    block_n: int = 16,
    block_k: int = 64,
    num_warps: int | None = None,
    num_stages: int = 4,
) -> torch.Tensor:
    """``out = x @ weight^T + bias``; x ``[B, K]``, weight ``[N, K]``, bias ``[N]``, out ``[B, N]``, float32.

    ``split_k > 1`` splits the depth over that many programs per output tile and needs ``counters``
    (:func:`split_k_counters`); ``row_mask [B]`` (bool): only its rows of ``out`` are written. The keyword-only
    block sizes are for tuning (``scripts/bench_prediction.py``).
    """
    _check_fp32(x=x, weight=weight, bias=bias)
    batch, depth = x.shape
    n_out = weight.shape[0]
    default_rows, default_warps = batch_tiling(batch)
    block_b = block_b or default_rows
    grid = (triton.cdiv(batch, block_b), triton.cdiv(n_out, block_n), split_k)
    partials, counters = _split_k_buffers(split_k, counters, grid[0] * grid[1], [batch, n_out], x)
    _check_row_mask(row_mask, batch)
    _linear_kernel[grid](
        x, x.stride(0), weight, weight.stride(0), bias, out, out.stride(0), partials, counters,
        x if row_mask is None else row_mask, batch, n_out, depth,
        BLOCK_B=block_b, BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=precision, SPLIT_K=split_k,
        HAS_ROW_MASK=row_mask is not None, num_warps=num_warps or default_warps, num_stages=num_stages,
    )  # fmt: skip
    return out


def linear_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, out: torch.Tensor, row_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`linear` in torch: the CPU path and the tests' reference."""
    if row_mask is None:
        return torch.addmm(bias, x, weight.T, out=out)
    return torch.where(row_mask[:, None], torch.addmm(bias, x, weight.T), out, out=out)
