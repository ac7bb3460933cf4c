"""One LSTM cell step on tensor cores at near-fp32 accuracy (3xTF32), in Triton.

Opt-in fast math for the prediction network (``fast_math=True``): cuDNN's fp32 LSTM step at batch 32 runs
two SIMT GEMMs on the CUDA cores, slow for their size although the weights (13 MB) sit in L2. This kernel
multiplies in 3xTF32 (:mod:`~nemo_fastdecode.kernels.tf32x3`): near fp32 but not bit-identical to cuBLAS, so
decisions may differ on near-ties. That is why the path is opt-in and its agreement with the exact path is
reported by the benchmark.

:func:`lstm_cell_step`: ``gates = row_bias[bias_index[b]] (+ x @ W_x^T) + h @ W_h^T``, then the LSTM cell (PyTorch
gate order i, f, g, o), one program per (row block, hidden block of 4-8 units), the four gates of its units in one
dot, so that the cell runs in the GEMM's epilogue. The layer's other GEMMs (projection, precomputed recurrent
gates) are :func:`~nemo_fastdecode.kernels.matmul.linear`. :func:`lstm_cell_step_reference` is the torch
reference, used on the CPU and by the tests (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nemo_fastdecode.kernels.matmul import batch_tiling
from nemo_fastdecode.kernels.tf32x3 import accumulate, check_fp32, check_row_mask, sigmoid, tanh


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
        gates = accumulate(gates, x_ptr, x_stride, wx_ptr, wx_stride, w_rows, rows, row_ok, x_depth, BLOCK_K,
                           PRECISION, 1)  # fmt: skip
    if HAS_H:
        gates = accumulate(gates, h_ptr, h_stride, wh_ptr, wh_stride, w_rows, rows, row_ok, hidden, BLOCK_K,
                           PRECISION, 1)  # fmt: skip
    else:  # h @ W_h^T computed beforehand (matmul.linear), e.g. on a parallel branch of the decoder's graph
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
    c_new = sigmoid(gate_f) * c_prev + sigmoid(gate_i) * tanh(gate_g)
    h_new = sigmoid(gate_o) * tanh(c_new)
    out = rows[:, None] * out_stride + units[None, :]
    tl.store(c_out_ptr + out, c_new, mask=mask)
    tl.store(h_out_ptr + out, h_new, mask=mask)


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
    keyword-only block sizes are for tuning (``benchmarks/bench_prediction.py``); ``None`` picks by batch size.
    """
    check_fp32(row_bias=row_bias, x=x, weight_x=weight_x, h=h, weight_h=weight_h, c=c, recurrent_gates=recurrent_gates)
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
    check_row_mask(row_mask, batch)
    has_x = x is not None
    x_args = (x, x.stride(0), weight_x, weight_x.stride(0), x.shape[1]) if has_x else (c, 0, c, 0, 0)
    h_args = (h, h.stride(0), weight_h, weight_h.stride(0), c, 0) if has_h else (c, 0, c, 0, recurrent_gates,
                                                                                recurrent_gates.stride(0))  # fmt: skip
    # tuned at H = 640 (benchmarks/bench_prediction.py --sweep): many small programs beat few large ones
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
