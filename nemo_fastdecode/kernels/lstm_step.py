"""One LSTM cell step and one linear layer on tensor cores at near-fp32 accuracy (3xTF32), in Triton.

Opt-in fast math for the prediction network (``fast_math=True``): cuDNN's fp32 LSTM step at batch 32 runs
two SIMT GEMMs of about 22 us each on an H100/H200, although the weights (13 MB) sit in L2. These kernels
split every fp32 operand into a TF32 high part and a TF32 remainder and multiply on tensor cores with three
MMAs (``input_precision="tf32x3"``): the products are near fp32 (relative error about 1e-6 against a float64
reference) but not bit-identical to cuBLAS, so decisions may differ on near-ties. That is why the path is
opt-in and its agreement with the exact path is reported by the benchmark.

- :func:`lstm_cell_step`: ``gates = row_bias[bias_index[b]] (+ x @ W_x^T) + h @ W_h^T``, then the LSTM cell
  (PyTorch gate order i, f, g, o), one program per (row block, hidden block), all four gates of a hidden block
  in the same program so that the cell runs in the GEMM's epilogue.
- :func:`linear`: ``x @ W^T + b``.

Both have a torch reference (``*_reference``), used on the CPU and by the tests (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# tl.dot needs at least 16 rows, columns and depth; rows are masked up to the block
MIN_BLOCK = 16


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
def _accumulate_gates(
    acc_i,
    acc_f,
    acc_g,
    acc_o,
    a_ptr,
    a_stride,
    w_ptr,
    w_stride,
    rows,
    row_ok,
    units,
    unit_ok,
    hidden,
    depth,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """acc_gate += a[rows, :] @ W[gate * hidden + units, :]^T for the four gates."""
    for k0 in range(0, depth, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < depth
        a = tl.load(a_ptr + rows[:, None] * a_stride + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = k_ok[:, None] & unit_ok[None, :]
        w = w_ptr + units[None, :] * w_stride + ks[:, None]  # [BLOCK_K, BLOCK_H] view of W^T
        acc_i += tl.dot(a, tl.load(w, mask=w_mask, other=0.0), input_precision=PRECISION)
        acc_f += tl.dot(a, tl.load(w + hidden * w_stride, mask=w_mask, other=0.0), input_precision=PRECISION)
        acc_g += tl.dot(a, tl.load(w + 2 * hidden * w_stride, mask=w_mask, other=0.0), input_precision=PRECISION)
        acc_o += tl.dot(a, tl.load(w + 3 * hidden * w_stride, mask=w_mask, other=0.0), input_precision=PRECISION)
    return acc_i, acc_f, acc_g, acc_o


@triton.jit
def _lstm_cell_kernel(
    bias_ptr, bias_stride, bias_index_ptr,
    x_ptr, x_stride, wx_ptr, wx_stride, x_depth,
    h_ptr, h_stride, wh_ptr, wh_stride,
    c_ptr, c_stride, h_out_ptr, c_out_ptr, out_stride,
    batch, hidden,
    HAS_X: tl.constexpr, ROW_INDEXED: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    units = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok, unit_ok = rows < batch, units < hidden
    acc_i = tl.zeros([BLOCK_B, BLOCK_H], dtype=tl.float32)
    acc_f = tl.zeros([BLOCK_B, BLOCK_H], dtype=tl.float32)
    acc_g = tl.zeros([BLOCK_B, BLOCK_H], dtype=tl.float32)
    acc_o = tl.zeros([BLOCK_B, BLOCK_H], dtype=tl.float32)
    if HAS_X:
        acc_i, acc_f, acc_g, acc_o = _accumulate_gates(
            acc_i, acc_f, acc_g, acc_o, x_ptr, x_stride, wx_ptr, wx_stride, rows, row_ok, units, unit_ok,
            hidden, x_depth, BLOCK_K, PRECISION,
        )  # fmt: skip
    acc_i, acc_f, acc_g, acc_o = _accumulate_gates(
        acc_i, acc_f, acc_g, acc_o, h_ptr, h_stride, wh_ptr, wh_stride, rows, row_ok, units, unit_ok,
        hidden, hidden, BLOCK_K, PRECISION,
    )  # fmt: skip
    # the per-row bias: the table row of the row's label (layer 0), or the layer's bias shared by all rows
    if ROW_INDEXED:
        index = tl.load(bias_index_ptr + rows, mask=row_ok, other=0)
        bias = bias_ptr + index[:, None] * bias_stride + units[None, :]
    else:
        bias = bias_ptr + rows[:, None] * 0 + units[None, :]
    mask = row_ok[:, None] & unit_ok[None, :]
    gate_i = _sigmoid(acc_i + tl.load(bias, mask=mask, other=0.0))
    gate_f = _sigmoid(acc_f + tl.load(bias + hidden, mask=mask, other=0.0))
    gate_g = _tanh(acc_g + tl.load(bias + 2 * hidden, mask=mask, other=0.0))
    gate_o = _sigmoid(acc_o + tl.load(bias + 3 * hidden, mask=mask, other=0.0))
    c_prev = tl.load(c_ptr + rows[:, None] * c_stride + units[None, :], mask=mask, other=0.0)
    c_new = gate_f * c_prev + gate_i * gate_g
    h_new = gate_o * _tanh(c_new)
    out = rows[:, None] * out_stride + units[None, :]
    tl.store(c_out_ptr + out, c_new, mask=mask)
    tl.store(h_out_ptr + out, h_new, mask=mask)


def _check_fp32(**tensors: torch.Tensor | None) -> None:
    for name, tensor in tensors.items():
        if tensor is not None and tensor.dtype != torch.float32:
            raise ValueError(f"the 3xTF32 kernels compute in float32; {name} is {tensor.dtype}")


def _row_major(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def lstm_cell_step(
    row_bias: torch.Tensor,
    bias_index: torch.Tensor | None,
    x: torch.Tensor | None,
    weight_x: torch.Tensor | None,
    h: torch.Tensor,
    weight_h: torch.Tensor,
    c: torch.Tensor,
    h_out: torch.Tensor,
    c_out: torch.Tensor,
    precision: str = "tf32x3",
    *,
    block_h: int | None = None,
    block_k: int = 64,
    num_warps: int = 4,
) -> None:
    """One LSTM step, written to ``h_out`` / ``c_out`` (which must not alias ``h`` / ``c``).

    Shapes: ``row_bias [R, 4H]`` with ``bias_index [B]`` (int64): row ``bias_index[b]`` is added to row b's
    gates (a table of precomputed input gates indexed by label); or ``row_bias [4H]`` with ``bias_index=None``
    (a layer's summed biases, added to every row); ``x [B, K]`` and ``weight_x [4H, K]`` (``None``: no input GEMM); ``h, c [B, H]``,
    ``weight_h [4H, H]``; ``h_out, c_out [B, H]``. Everything float32. The keyword-only block sizes are for
    tuning (``scripts/bench_prediction.py``); ``block_h=None`` picks by batch size.
    """
    _check_fp32(row_bias=row_bias, x=x, weight_x=weight_x, h=h, weight_h=weight_h, c=c)
    batch, hidden = h.shape
    row_indexed = row_bias.dim() == 2
    if (
        weight_h.shape != (4 * hidden, hidden)
        or row_bias.shape[-1] != 4 * hidden
        or row_indexed != (bias_index is not None)
    ):
        raise ValueError(f"LSTM shapes disagree: h {tuple(h.shape)}, weight_h {tuple(weight_h.shape)}, "
                         f"row_bias {tuple(row_bias.shape)}")  # fmt: skip
    has_x = x is not None
    x_args = (x, x.stride(0), weight_x, weight_x.stride(0), x.shape[1]) if has_x else (h, 0, weight_h, 0, 0)
    block_b = min(max(triton.next_power_of_2(batch), MIN_BLOCK), 32)
    block_h = block_h or (MIN_BLOCK if batch <= 32 else 32)
    grid = (triton.cdiv(batch, block_b), triton.cdiv(hidden, block_h))
    _lstm_cell_kernel[grid](
        row_bias, row_bias.stride(0), bias_index if row_indexed else row_bias,
        *x_args,
        h, h.stride(0), weight_h, weight_h.stride(0),
        c, c.stride(0), h_out, c_out, h_out.stride(0),
        batch, hidden,
        HAS_X=has_x, ROW_INDEXED=row_indexed, BLOCK_B=block_b, BLOCK_H=block_h, BLOCK_K=block_k, PRECISION=precision,
        num_warps=num_warps,
    )  # fmt: skip


def lstm_cell_step_reference(
    row_bias: torch.Tensor,
    bias_index: torch.Tensor | None,
    x: torch.Tensor | None,
    weight_x: torch.Tensor | None,
    h: torch.Tensor,
    weight_h: torch.Tensor,
    c: torch.Tensor,
    h_out: torch.Tensor,
    c_out: torch.Tensor,
) -> None:
    """:func:`lstm_cell_step` in torch ops (fp32 GEMMs): the CPU path and the tests' reference."""
    gates = (row_bias[bias_index] if bias_index is not None else row_bias) + h @ weight_h.T
    if x is not None:
        gates = gates + x @ weight_x.T
    gate_i, gate_f, gate_g, gate_o = gates.chunk(4, dim=-1)
    c_new = gate_f.sigmoid() * c + gate_i.sigmoid() * gate_g.tanh()
    c_out.copy_(c_new)
    h_out.copy_(gate_o.sigmoid() * c_new.tanh())


@triton.jit
def _linear_kernel(
    x_ptr, x_stride, w_ptr, w_stride, b_ptr, out_ptr, out_stride, batch, n_out, depth,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < batch, cols < n_out
    acc = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, depth, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < depth
        a = tl.load(x_ptr + rows[:, None] * x_stride + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + cols[None, :] * w_stride + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc += tl.dot(a, w, input_precision=PRECISION)
    acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0)[None, :]
    tl.store(out_ptr + rows[:, None] * out_stride + cols[None, :], acc, mask=row_ok[:, None] & col_ok[None, :])


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    out: torch.Tensor,
    precision: str = "tf32x3",
    *,
    block_n: int = 32,
    block_k: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    """``out = x @ weight^T + bias``; x ``[B, K]``, weight ``[N, K]``, bias ``[N]``, out ``[B, N]``, float32.

    The keyword-only block sizes are for tuning (``scripts/bench_prediction.py``).
    """
    _check_fp32(x=x, weight=weight, bias=bias)
    batch, depth = x.shape
    n_out = weight.shape[0]
    block_b = min(max(triton.next_power_of_2(batch), MIN_BLOCK), 32)
    grid = (triton.cdiv(batch, block_b), triton.cdiv(n_out, block_n))
    _linear_kernel[grid](
        x, x.stride(0), weight, weight.stride(0), bias, out, out.stride(0), batch, n_out, depth,
        BLOCK_B=block_b, BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=precision, num_warps=num_warps,
    )  # fmt: skip
    return out


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """:func:`linear` in torch: the CPU path and the tests' reference."""
    return torch.addmm(bias, x, weight.T, out=out)
