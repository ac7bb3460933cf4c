"""The joint's hidden layer ``relu(encoder_projected[b, t[b]] + predictor_output[b])`` in one kernel (gather + add +
relu), at one frame per row (greedy and beam steps) or at each row's next ``window`` frames (the greedy look-ahead).

The kernel does exactly the element-wise arithmetic of the torch path (``fused=False``, the reference): one IEEE add
in fp32, rounded once to the storage type, then relu; the two are bit-identical.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["joint_hidden", "joint_hidden_window"]


@triton.jit
def _joint_hidden_kernel(
    enc_ptr,
    enc_stride_b,
    enc_stride_t,
    time_ptr,
    time_stride,
    pred_ptr,
    pred_stride_b,
    out_ptr,
    out_stride_b,
    hidden,
    last_frame_ptr,
    ROWS_PER_FRAME_ROW: tl.constexpr,
    WINDOW: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    in_row = cols < hidden
    if WINDOW > 1:
        # row (b, w) of a look-ahead window: utterance b's frame time[b] + w (its last frame at most)
        source = row // WINDOW
        t = tl.load(time_ptr + source * time_stride) + row % WINDOW
        t = tl.maximum(tl.minimum(t, tl.load(last_frame_ptr + source)), 0)
        enc_row, pred_row = source, source
    else:
        t = tl.load(time_ptr + row * time_stride)
        enc_row, pred_row = row // ROWS_PER_FRAME_ROW, row
    enc = tl.load(enc_ptr + enc_row * enc_stride_b + t * enc_stride_t + cols, mask=in_row)
    pred = tl.load(pred_ptr + pred_row * pred_stride_b + cols, mask=in_row)
    # one add in fp32, rounded once to the storage type (what torch does for fp32, fp16 and bf16 alike);
    # rounding keeps the sign, so relu before the rounding equals torch's relu after it (NaN stays NaN)
    x = enc.to(tl.float32) + pred.to(tl.float32)
    x = tl.where(x < 0, 0.0, x)
    tl.store(out_ptr + row * out_stride_b + cols, x.to(out_ptr.dtype.element_ty), mask=in_row)


def joint_hidden(
    encoder_projected: torch.Tensor,
    time_indices: torch.Tensor,
    predictor_output: torch.Tensor,
    out: torch.Tensor,
    fused: bool,
    rows_per_frame_row: int = 1,
) -> torch.Tensor:
    """``out[r] = relu(encoder_projected[r // R, time_indices[r]] + predictor_output[r, 0])``, ``R = rows_per_frame_row``.

    Shapes: encoder_projected ``[B, T, H]``, time_indices ``[B*R]`` (may be an expanded 0-d tensor),
    predictor_output ``[B*R, 1, H]``, out ``[B*R, H]``. Indices must be in ``[0, T)``. ``R > 1``: the ``R`` beams
    of each utterance (beam search) share its encoder row.
    """
    if not fused:
        rows = torch.arange(out.shape[0], device=out.device) // rows_per_frame_row
        torch.add(encoder_projected[rows, time_indices], predictor_output[:, 0], out=out)
        return torch.relu_(out)
    batch, hidden = out.shape
    assert encoder_projected.stride(2) == 1 and predictor_output.stride(2) == 1 and out.stride(1) == 1
    block = min(triton.next_power_of_2(hidden), 1024)
    _joint_hidden_kernel[(batch, triton.cdiv(hidden, block))](
        encoder_projected, encoder_projected.stride(0), encoder_projected.stride(1),
        time_indices, time_indices.stride(0), predictor_output, predictor_output.stride(0), out, out.stride(0),
        hidden, time_indices, ROWS_PER_FRAME_ROW=rows_per_frame_row, WINDOW=1, BLOCK_H=block,
    )  # fmt: skip
    return out


def joint_hidden_window(
    encoder_projected: torch.Tensor,
    time_indices: torch.Tensor,
    last_frame: torch.Tensor,
    predictor_output: torch.Tensor,
    out: torch.Tensor,
    window: int,
    fused: bool,
) -> torch.Tensor:
    """The joint's hidden activations at each utterance's next ``window`` frames, for one prediction output.

    ``out[b * W + w] = relu(encoder_projected[b, f] + predictor_output[b, 0])`` with
    ``f = max(min(time_indices[b] + w, last_frame[b]), 0)``. Shapes: encoder_projected ``[B, T, H]``,
    time_indices / last_frame ``[B]``, predictor_output ``[B, 1, H]``, out ``[B * W, H]``.
    Row ``(b, w)`` is what :func:`joint_hidden` gives row ``b`` at frame ``f``, value for value.
    """
    batch = time_indices.shape[0]
    if out.shape[0] != batch * window:
        raise ValueError(f"out must have B * window = {batch * window} rows, got {out.shape[0]}")
    if not fused:
        offsets = torch.arange(window, device=out.device)
        frames = torch.minimum(time_indices[:, None] + offsets, last_frame[:, None]).clamp_(min=0)
        rows = torch.arange(batch, device=out.device).repeat_interleave(window)
        torch.add(encoder_projected[rows, frames.view(-1)], predictor_output[rows, 0], out=out)
        return torch.relu_(out)
    hidden = out.shape[1]
    assert encoder_projected.stride(2) == 1 and predictor_output.stride(2) == 1 and out.stride(1) == 1
    block = min(triton.next_power_of_2(hidden), 1024)
    _joint_hidden_kernel[(out.shape[0], triton.cdiv(hidden, block))](
        encoder_projected, encoder_projected.stride(0), encoder_projected.stride(1),
        time_indices, time_indices.stride(0), predictor_output, predictor_output.stride(0), out, out.stride(0),
        hidden, last_frame, ROWS_PER_FRAME_ROW=1, WINDOW=window, BLOCK_H=block,
    )  # fmt: skip
    return out
