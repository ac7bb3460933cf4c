"""The prediction network's state update of a masked step: where ``mask[b]``, row ``b`` of the new LSTM states
(``h``/``c``) and output replaces the kept one (NeMo's ``batch_replace_states_mask`` plus the output's ``where``), in
one kernel instead of one ``torch.where`` per tensor.

The kernel copies values (cast to the destination's dtype) exactly as the torch path (``fused=False``, the reference)
does: the two are bit-identical.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

__all__ = ["masked_state_update"]


@triton.jit
def _copy_row_if(keep, dst_ptr, src_ptr, length, BLOCK: tl.constexpr):
    if keep:
        for start in range(0, length, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            values = tl.load(src_ptr + cols, mask=cols < length)
            tl.store(dst_ptr + cols, values.to(dst_ptr.dtype.element_ty), mask=cols < length)


@triton.jit
def _masked_state_update_kernel(
    mask_ptr,
    h_dst,
    h_src,
    c_dst,
    c_src,
    out_dst,
    out_src,
    batch,
    state_hidden,
    out_hidden,
    LAYERS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)  # 0..LAYERS-1: h of that layer; LAYERS..2*LAYERS-1: c; 2*LAYERS: output
    keep = tl.load(mask_ptr + row).to(tl.int1)
    if part < LAYERS:
        offset = (part * batch + row) * state_hidden
        _copy_row_if(keep, h_dst + offset, h_src + offset, state_hidden, BLOCK)
    elif part < 2 * LAYERS:
        offset = ((part - LAYERS) * batch + row) * state_hidden
        _copy_row_if(keep, c_dst + offset, c_src + offset, state_hidden, BLOCK)
    else:
        _copy_row_if(keep, out_dst + row * out_hidden, out_src + row * out_hidden, out_hidden, BLOCK)


def _replace_lstm_states(src_states: list[torch.Tensor], dst_states: list[torch.Tensor], mask: torch.Tensor) -> None:
    """NeMo's ``RNNTDecoder.batch_replace_states_mask``: ``dst[:, mask] = src[:, mask]`` for ``[L, B, H]`` states."""
    for dst, src in zip(dst_states, src_states, strict=True):
        torch.where(mask[None, :, None], src.to(dst.dtype), dst, out=dst)


def masked_state_update(
    mask: torch.Tensor,
    dst_states: list[torch.Tensor],
    src_states: list[torch.Tensor],
    dst_output: torch.Tensor,
    src_output: torch.Tensor,
    fused: bool,
    replace_states: Callable[..., None] = _replace_lstm_states,
) -> None:
    """Where ``mask[b]``: row ``b`` of every ``dst_states`` tensor from ``src_states``, ``dst_output[b] = src_output[b]``.

    Shapes: mask ``[B]``; states in the decoder's layout; outputs ``[B, 1, Ho]``. ``replace_states``: the decoder's
    ``batch_replace_states_mask`` (keywords ``src_states``, ``dst_states``, ``mask``; default: LSTM states ``[L, B, H]``),
    the unfused path for any layout. ``fused``: the kernel, for LSTM states ``(h, c)`` each ``[L, B, Hs]`` only (the
    caller knows the layout). Values are cast to the destination's dtype (an fp16 LSTM under autocast writes fp32
    state), as NeMo's ``batch_replace_states_mask`` does.
    """
    lstm_state = len(dst_states) == 2 and all(s.dim() == 3 and s.is_contiguous() for s in (*dst_states, *src_states))
    if not fused or not lstm_state or not (src_output.is_contiguous() and dst_output.is_contiguous()):
        replace_states(src_states=src_states, dst_states=dst_states, mask=mask)
        torch.where(mask[:, None, None], src_output.to(dst_output.dtype), dst_output, out=dst_output)
        return
    layers, batch, state_hidden = dst_states[0].shape
    out_hidden = dst_output.shape[-1]
    block = min(triton.next_power_of_2(max(state_hidden, out_hidden)), 1024)
    _masked_state_update_kernel[(batch, 2 * layers + 1)](
        mask, dst_states[0], src_states[0], dst_states[1], src_states[1], dst_output, src_output,
        batch, state_hidden, out_hidden, LAYERS=layers, BLOCK=block,
    )  # fmt: skip
