"""The per-step state updates of the greedy loops: a torch reference and a fused Triton kernel for each.

A greedy step is a handful of big kernels (joint GEMM, LSTM) and dozens of tiny ones (masked
selects, comparisons, the hypothesis append, the loop flags). Inside a CUDA graph each tiny kernel
still costs a launch slot of a few microseconds, so the tiny ones are fused here, a few per step:

- :func:`joint_hidden`: ``relu(encoder_projected[b, t[b]] + predictor_output[b])`` (gather + add + relu).
- :func:`masked_state_update`: the prediction network's states (LSTM ``h``/``c``) and output, kept where the mask
  is false.
- :func:`label_select` / :func:`label_emit`: the label loop's bookkeeping around the joint and the LSTM.
- :func:`frame_select` / :func:`frame_emit`: the same for the frame loop.

Every fused kernel does exactly the element-wise arithmetic of its reference (selects, integer ops,
one IEEE add), so the two paths are bit-identical and the fusion never changes a decision. The
select/emit kernels run as one program over the whole batch: they are tiny, and the loop flag is a
reduction over the batch that then needs no second kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from nemo_fastdecode.greedy.hyps import BatchedHypsBuffer
from nemo_fastdecode.greedy.state import LoopBuffers


def batch_block(batch_size: int) -> tuple[int, int]:
    """``(rows, warps)`` of the one-program bookkeeping kernels: the whole batch in one block."""
    block = triton.next_power_of_2(max(batch_size, 16))
    return block, 4 if block <= 512 else 8


# ----- joint hidden layer ------------------------------------------------------------------------
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


# ----- prediction network state ------------------------------------------------------------------
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


# ----- hypothesis append, shared by both loops -----------------------------------------------------
@triton.jit
def _append_hyps(
    rows,
    in_batch,
    found,
    labels,
    times,
    scores,
    durations,
    h_labels,
    h_times,
    h_durations,
    h_stride,
    capacity,
    h_lengths,
    h_scores,
    h_last_time,
    h_count,
    h_last_label,
    WITH_DURATIONS: tl.constexpr,
):
    """The fused form of :meth:`BatchedHypsBuffer.add_`; returns the new lengths, per-frame counts, last times."""
    lengths = tl.load(h_lengths + rows, mask=in_batch, other=0)
    slot = tl.minimum(lengths, capacity - 1)
    write = in_batch & found
    tl.store(h_labels + rows * h_stride + slot, labels, mask=write)
    tl.store(h_times + rows * h_stride + slot, times, mask=write)
    if WITH_DURATIONS:
        tl.store(h_durations + rows * h_stride + slot, durations, mask=write)
    last_time = tl.load(h_last_time + rows, mask=in_batch, other=0)
    count = tl.load(h_count + rows, mask=in_batch, other=0)
    count = tl.where(found, tl.where(last_time == times, count + 1, 1), count)
    last_time = tl.where(found, times, last_time)
    last_label = tl.where(found, labels, tl.load(h_last_label + rows, mask=in_batch, other=0))
    total = tl.load(h_scores + rows, mask=in_batch, other=0.0)
    total = tl.where(found, total + scores.to(total.dtype), total)
    lengths = lengths + found.to(lengths.dtype)
    tl.store(h_count + rows, count, mask=in_batch)
    tl.store(h_last_time + rows, last_time, mask=in_batch)
    tl.store(h_last_label + rows, last_label, mask=in_batch)
    tl.store(h_scores + rows, total, mask=in_batch)
    tl.store(h_lengths + rows, lengths, mask=in_batch)
    return lengths, count, last_time


def _hyps_args(hyps: BatchedHypsBuffer) -> tuple:
    return (
        hyps.labels, hyps.timestamps, hyps.durations, hyps.labels.stride(0), hyps.capacity,
        hyps.lengths, hyps.scores, hyps.last_label_time, hyps.labels_at_last_time, hyps.last_label,
    )  # fmt: skip


@triton.jit
def _any(flags):
    return tl.max(flags.to(tl.int32), axis=0) > 0


# ----- best token of each row -------------------------------------------------------------------------
@triton.jit
def _row_argmax_kernel(logits, logits_stride, num_tokens, out_scores, out_labels, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_V)
    x = tl.load(logits + row * logits_stride + cols, mask=cols < num_tokens, other=float("-inf"))
    best = tl.argmax(x, axis=0, tie_break_left=True)
    tl.store(out_scores + row, tl.max(x, axis=0))
    tl.store(out_labels + row, best.to(tl.int64))


def best_token(
    logits: torch.Tensor, num_tokens: int, out_scores: torch.Tensor, out_labels: torch.Tensor, fused: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Best of the first ``num_tokens`` columns (tokens + blank) of ``logits [B, N]``: ``(scores [B], labels [B])``.

    Written into ``out_*`` (``[B]``) when fused. Ties go to the lower label, as ``torch.max`` does; rows holding
    NaN are undefined in both paths (a broken model).
    """
    if not fused or logits.stride(1) != 1 or num_tokens > 16384:
        return logits[:, :num_tokens].max(dim=-1)
    _row_argmax_kernel[(logits.shape[0],)](
        logits, logits.stride(0), num_tokens, out_scores, out_labels,
        BLOCK_V=triton.next_power_of_2(num_tokens), num_warps=4,
    )  # fmt: skip
    return out_scores, out_labels


# ----- label loop ----------------------------------------------------------------------------------
@triton.jit
def _best_durations(duration_logits, duration_logits_stride, duration_values, logit_rows, mask,
                    NUM_DURATIONS: tl.constexpr, BLOCK_D: tl.constexpr, CACHE: tl.constexpr):  # fmt: skip
    """The TDT duration (value) with the highest logit in each of ``logit_rows`` (ties: the lower index)."""
    cols = tl.arange(0, BLOCK_D)
    d_logits = tl.load(
        duration_logits + logit_rows[:, None] * duration_logits_stride + cols[None, :],
        mask=mask[:, None] & (cols[None, :] < NUM_DURATIONS),
        other=float("-inf"),
        cache_modifier=CACHE,
    )
    best_duration = tl.argmax(d_logits, axis=1, tie_break_left=True)
    return tl.load(duration_values + best_duration, mask=mask, other=0)


@triton.jit
def _store_look(rows, in_batch, cur_time, cur_labels, cur_scores, is_blank, t, now_active, now_advance,
                label_time, labels, scores, blank, time, safe_time, last_frame, active, advance, inner_flag):  # fmt: skip
    """A look's result into the loop buffers (the state both label-loop select kernels leave)."""
    tl.store(label_time + rows, cur_time, mask=in_batch)
    tl.store(labels + rows, cur_labels, mask=in_batch)
    tl.store(scores + rows, cur_scores, mask=in_batch)
    tl.store(blank + rows, is_blank, mask=in_batch)
    tl.store(time + rows, t, mask=in_batch)
    tl.store(safe_time + rows, tl.minimum(t, tl.load(last_frame + rows, mask=in_batch, other=0)), mask=in_batch)
    tl.store(active + rows, now_active, mask=in_batch)
    tl.store(advance + rows, now_advance, mask=in_batch)
    tl.store(inner_flag, _any(now_advance & in_batch))


@triton.jit
def _label_select_kernel(
    best_scores,
    best_labels,
    duration_logits,
    duration_logits_stride,
    duration_values,
    time,
    safe_time,
    label_time,
    last_frame,
    lengths,
    active,
    active_before,
    advance,
    blank,
    labels,
    scores,
    durations,
    inner_flag,
    batch,
    blank_id,
    START: tl.constexpr,
    NUM_DURATIONS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    rows = tl.arange(0, BLOCK_B)
    in_batch = rows < batch
    t = tl.load(time + rows, mask=in_batch, other=0)
    new_scores = tl.load(best_scores + rows, mask=in_batch, other=0.0)
    new_labels = tl.load(best_labels + rows, mask=in_batch, other=0)
    if NUM_DURATIONS > 0:
        new_durations = _best_durations(
            duration_logits, duration_logits_stride, duration_values, rows, in_batch, NUM_DURATIONS, BLOCK_D, ""
        )
    else:
        new_durations = tl.zeros([BLOCK_B], dtype=tl.int64)
    if START:
        # every active row takes the joint's answer at its current frame
        mask = tl.load(active + rows, mask=in_batch, other=0).to(tl.int1)
        tl.store(active_before + rows, mask, mask=in_batch)
        cur_labels, cur_scores, cur_time, cur_durations = new_labels, new_scores, t, new_durations
    else:
        # rows that held a blank look again at their new frame
        mask = tl.load(advance + rows, mask=in_batch, other=0).to(tl.int1)
        cur_time = tl.where(mask, t, tl.load(label_time + rows, mask=in_batch, other=0))
        cur_labels = tl.where(mask, new_labels, tl.load(labels + rows, mask=in_batch, other=0))
        cur_scores = tl.where(mask, new_scores, tl.load(scores + rows, mask=in_batch, other=0.0))
        cur_durations = tl.where(mask, new_durations, tl.load(durations + rows, mask=in_batch, other=0))
    is_blank = cur_labels == blank_id
    if NUM_DURATIONS > 0:
        cur_durations = tl.where((cur_durations == 0) & is_blank, 1, cur_durations)
        t = t + tl.where(mask, cur_durations, 0)
        tl.store(durations + rows, cur_durations, mask=in_batch)
    else:
        t = t + (mask & is_blank).to(t.dtype)
    now_active = t < tl.load(lengths + rows, mask=in_batch, other=0)
    now_advance = now_active & is_blank
    _store_look(rows, in_batch, cur_time, cur_labels, cur_scores, is_blank, t, now_active, now_advance,
                label_time, labels, scores, blank, time, safe_time, last_frame, active, advance, inner_flag)  # fmt: skip


@triton.jit
def _label_emit_kernel(
    active_before,
    blank,
    labels,
    label_time,
    scores,
    durations,
    found,
    time,
    safe_time,
    last_frame,
    lengths,
    active,
    outer_flag,
    batch,
    max_symbols,
    h_labels,
    h_times,
    h_durations,
    h_stride,
    capacity,
    h_lengths,
    h_scores,
    h_last_time,
    h_count,
    h_last_label,
    BOUNDED: tl.constexpr,
    WITH_DURATIONS: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    rows = tl.arange(0, BLOCK_B)
    in_batch = rows < batch
    emit = tl.load(active_before + rows, mask=in_batch, other=0).to(tl.int1)
    emit = emit & (tl.load(blank + rows, mask=in_batch, other=1).to(tl.int1) == 0)
    tl.store(found + rows, emit, mask=in_batch)
    new_labels = tl.load(labels + rows, mask=in_batch, other=0)
    times = tl.load(label_time + rows, mask=in_batch, other=0)
    new_scores = tl.load(scores + rows, mask=in_batch, other=0.0)
    new_durations = tl.load(durations + rows, mask=in_batch, other=0)
    hyp_lengths, count, last_time = _append_hyps(
        rows, in_batch, emit, new_labels, times, new_scores, new_durations,
        h_labels, h_times, h_durations, h_stride, capacity, h_lengths, h_scores, h_last_time, h_count, h_last_label,
        WITH_DURATIONS,
    )  # fmt: skip
    now_active = tl.load(active + rows, mask=in_batch, other=0).to(tl.int1)
    if BOUNDED:
        # max_symbols labels at this frame already: emit a blank instead, i.e. move on one frame
        t = tl.load(time + rows, mask=in_batch, other=0)
        force_blank = emit & (count >= max_symbols) & (last_time == t) & now_active
        t = t + force_blank.to(t.dtype)
        now_active = t < tl.load(lengths + rows, mask=in_batch, other=0)
        tl.store(time + rows, t, mask=in_batch)
        tl.store(safe_time + rows, tl.minimum(t, tl.load(last_frame + rows, mask=in_batch, other=0)), mask=in_batch)
    else:
        # unbounded labels per frame: a row whose storage is full stops (the caller retries larger)
        now_active = now_active & (hyp_lengths < capacity)
    tl.store(active + rows, now_active, mask=in_batch)
    tl.store(outer_flag, _any(now_active & in_batch))


def label_select(
    b: LoopBuffers,
    best_scores: torch.Tensor,
    best_labels: torch.Tensor,
    duration_logits: torch.Tensor | None,
    duration_values: torch.Tensor | None,
    blank_id: int,
    start: bool,
    fused: bool,
) -> None:
    """Take the joint's best label (and TDT duration) and move blank rows on in time.

    ``start``: the first look of an outer iteration (every active row takes the new label); otherwise
    an inner step (only rows in ``b.advance``, which held a blank, do). Shapes: best_scores/best_labels
    ``[B]`` (see :func:`best_token`); duration_logits ``[B, num_durations]`` (TDT) or ``None``; duration_values ``[num_durations]``.
    Updates labels, scores, durations, label_time, blank, time_indices, active, advance, inner_flag.
    """
    if fused:
        block, warps = batch_block(b.batch_size)
        num_durations = 0 if duration_logits is None else duration_logits.shape[1]
        _label_select_kernel[(1,)](
            best_scores, best_labels,
            duration_logits if num_durations else best_scores, duration_logits.stride(0) if num_durations else 0,
            duration_values if num_durations else best_labels,
            b.time_indices, b.safe_time_indices, b.label_time, b.last_frame, b.encoder_lengths, b.active,
            b.active_before, b.advance, b.blank, b.labels, b.scores, b.durations, b.inner_flag, b.batch_size, blank_id,
            START=start, NUM_DURATIONS=num_durations, BLOCK_B=block,
            BLOCK_D=triton.next_power_of_2(max(num_durations, 2)), num_warps=warps,
        )  # fmt: skip
        return
    durations = None if duration_logits is None else duration_values[duration_logits.argmax(dim=-1)]
    if start:
        mask = b.active
        b.active_before.copy_(b.active)
        b.scores.copy_(best_scores)
        b.labels.copy_(best_labels)
        b.label_time.copy_(b.time_indices)
        if durations is not None:
            b.durations.copy_(durations)
    else:
        mask = b.advance
        torch.where(mask, b.time_indices, b.label_time, out=b.label_time)
        torch.where(mask, best_labels, b.labels, out=b.labels)
        torch.where(mask, best_scores, b.scores, out=b.scores)
        if durations is not None:
            torch.where(mask, durations, b.durations, out=b.durations)
    torch.eq(b.labels, blank_id, out=b.blank)
    if durations is None:  # RNN-T: 1 frame after blank
        b.time_indices.add_(torch.logical_and(mask, b.blank))
    else:  # TDT: the predicted duration; a blank never stays on its frame (duration 0 counts as 1)
        b.durations.masked_fill_(torch.logical_and(b.durations == 0, b.blank), 1)
        b.time_indices.add_(b.durations * mask)
    update_time_flags(b)
    torch.logical_and(b.active, b.blank, out=b.advance)
    torch.any(b.advance, dim=0, out=b.inner_flag)


@triton.jit
def window_select_rows(
    best_scores,
    best_labels,
    duration_logits,
    duration_logits_stride,
    duration_values,
    time,
    safe_time,
    label_time,
    last_frame,
    lengths,
    active,
    active_before,
    advance,
    blank,
    labels,
    scores,
    durations,
    inner_flag,
    batch,
    blank_id,
    START: tl.constexpr,
    WINDOW: tl.constexpr,
    NUM_DURATIONS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CACHE: tl.constexpr,
):
    """The look's rows (one program). CACHE: the loads' cache modifier for the joint's answers (".cg" when other
    programs of the same launch wrote them, as in :mod:`~nemo_fastdecode.greedy.window_look`)."""
    # Up to WINDOW steps of the label loop's look (label_select) in registers: a row that holds a blank takes the
    # joint's answer at its new frame, read from the window (row b, offset new - first frame). START: the first
    # look of an outer iteration, where every active row takes the answer at its current frame (offset 0).
    rows = tl.arange(0, BLOCK_B)
    in_batch = rows < batch
    first = tl.load(time + rows, mask=in_batch, other=0)
    t = first
    seq_len = tl.load(lengths + rows, mask=in_batch, other=0)
    if START:
        moving = tl.load(active + rows, mask=in_batch, other=0).to(tl.int1)
        tl.store(active_before + rows, moving, mask=in_batch)
    else:
        moving = tl.load(advance + rows, mask=in_batch, other=0).to(tl.int1)
    cur_time = tl.load(label_time + rows, mask=in_batch, other=0)
    cur_labels = tl.load(labels + rows, mask=in_batch, other=0)
    cur_scores = tl.load(scores + rows, mask=in_batch, other=0.0)
    cur_durations = tl.load(durations + rows, mask=in_batch, other=0)
    is_blank = tl.load(blank + rows, mask=in_batch, other=0).to(tl.int1)
    now_active = tl.load(active + rows, mask=in_batch, other=0).to(tl.int1)
    for _ in tl.static_range(WINDOW):
        offset = t - first
        look = moving & (offset < WINDOW) & in_batch  # rows past the window wait for the next look
        slot = rows * WINDOW + tl.minimum(offset, WINDOW - 1)
        new_labels = tl.load(best_labels + slot, mask=look, other=0, cache_modifier=CACHE)
        new_scores = tl.load(best_scores + slot, mask=look, other=0.0, cache_modifier=CACHE)
        cur_time = tl.where(look, t, cur_time)
        cur_labels = tl.where(look, new_labels, cur_labels)
        cur_scores = tl.where(look, new_scores, cur_scores)
        is_blank = cur_labels == blank_id
        if NUM_DURATIONS > 0:
            new_durations = _best_durations(
                duration_logits, duration_logits_stride, duration_values, slot, look, NUM_DURATIONS, BLOCK_D, CACHE
            )
            cur_durations = tl.where(look, new_durations, cur_durations)
            cur_durations = tl.where((cur_durations == 0) & is_blank, 1, cur_durations)
            t = t + tl.where(look, cur_durations, 0)
        else:
            t = t + (look & is_blank).to(t.dtype)
        now_active = t < seq_len
        moving = now_active & is_blank
    if NUM_DURATIONS > 0:
        tl.store(durations + rows, cur_durations, mask=in_batch)
    _store_look(rows, in_batch, cur_time, cur_labels, cur_scores, is_blank, t, now_active, moving,
                label_time, labels, scores, blank, time, safe_time, last_frame, active, advance, inner_flag)  # fmt: skip


@triton.jit
def _window_select_kernel(
    best_scores, best_labels, duration_logits, duration_logits_stride, duration_values, time, safe_time, label_time,
    last_frame, lengths, active, active_before, advance, blank, labels, scores, durations, inner_flag, batch, blank_id,
    START: tl.constexpr, WINDOW: tl.constexpr, NUM_DURATIONS: tl.constexpr, BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    window_select_rows(best_scores, best_labels, duration_logits, duration_logits_stride, duration_values, time,
                       safe_time, label_time, last_frame, lengths, active, active_before, advance, blank, labels,
                       scores, durations, inner_flag, batch, blank_id, START, WINDOW, NUM_DURATIONS, BLOCK_B, BLOCK_D,
                       "")  # fmt: skip


def window_select(
    b: LoopBuffers,
    best_scores: torch.Tensor,
    best_labels: torch.Tensor,
    duration_logits: torch.Tensor | None,
    duration_values: torch.Tensor | None,
    blank_id: int,
    window: int,
    start: bool,
) -> None:
    """Up to ``window`` looks of the label loop at once (Triton; CUDA or the interpreter).

    The best tokens come from the joint at each row's next ``window`` frames (:func:`joint_hidden_window`):
    ``best_scores / best_labels [B * W]``, ``duration_logits [B * W, num_durations]`` (TDT) or ``None``. A row
    moves on as :func:`label_select` would, look after look (``start``: the first look of an outer iteration,
    for every active row; then only rows that hold a blank), until it finds a label, runs out of frames or
    leaves the window (it then continues at the next look). Every row's evolution depends only on its own
    frames, so the loop ends in the state the single-frame looks reach (rows that are not decoding may keep
    other junk labels; nothing reads them).
    """
    block, warps = batch_block(b.batch_size)
    num_durations = 0 if duration_logits is None else duration_logits.shape[1]
    _window_select_kernel[(1,)](
        best_scores, best_labels,
        duration_logits if num_durations else best_scores, duration_logits.stride(0) if num_durations else 0,
        duration_values if num_durations else best_labels,
        b.time_indices, b.safe_time_indices, b.label_time, b.last_frame, b.encoder_lengths, b.active,
        b.active_before, b.advance, b.blank, b.labels, b.scores, b.durations, b.inner_flag, b.batch_size, blank_id,
        START=start, WINDOW=window, NUM_DURATIONS=num_durations, BLOCK_B=block,
        BLOCK_D=triton.next_power_of_2(max(num_durations, 2)), num_warps=warps,
    )  # fmt: skip


def label_emit(b: LoopBuffers, max_symbols: int | None, with_durations: bool, fused: bool) -> None:
    """Rows that were decoding and found a non-blank label emit it (``b.found``); enforce max_symbols.

    Updates found, the hypotheses, time_indices/active (forced blanks) and outer_flag.
    """
    if fused:
        block, warps = batch_block(b.batch_size)
        _label_emit_kernel[(1,)](
            b.active_before, b.blank, b.labels, b.label_time, b.scores, b.durations, b.found,
            b.time_indices, b.safe_time_indices, b.last_frame, b.encoder_lengths, b.active, b.outer_flag,
            b.batch_size, max_symbols or 0, *_hyps_args(b.hyps),
            BOUNDED=max_symbols is not None, WITH_DURATIONS=with_durations, BLOCK_B=block, num_warps=warps,
        )  # fmt: skip
        return
    torch.logical_and(b.active_before, torch.logical_not(b.blank), out=b.found)
    b.hyps.add_(b.found, b.labels, b.label_time, b.scores, b.durations if with_durations else None)
    if max_symbols is not None:
        force_blank = b.found & (b.hyps.labels_at_last_time >= max_symbols)
        force_blank &= b.hyps.last_label_time == b.time_indices
        force_blank &= b.active
        b.time_indices.add_(force_blank)
        update_time_flags(b)
    else:
        torch.logical_and(b.active, b.hyps.lengths < b.hyps.capacity, out=b.active)
    torch.any(b.active, dim=0, out=b.outer_flag)


def update_time_flags(b: LoopBuffers) -> None:
    """safe_time_indices (a valid frame to read) and active (frames left) from time_indices."""
    torch.minimum(b.time_indices, b.last_frame, out=b.safe_time_indices)
    torch.less(b.time_indices, b.encoder_lengths, out=b.active)


# ----- frame loop ----------------------------------------------------------------------------------
@triton.jit
def _frame_select_kernel(
    best_scores,
    best_labels,
    scores,
    labels,
    blank,
    h_lengths,
    capacity,
    symbols_at_frame,
    inner_flag,
    batch,
    blank_id,
    max_symbols,
    BOUNDED: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    rows = tl.arange(0, BLOCK_B)
    in_batch = rows < batch
    new_labels = tl.load(best_labels + rows, mask=in_batch, other=0)
    tl.store(scores + rows, tl.load(best_scores + rows, mask=in_batch, other=0.0), mask=in_batch)
    tl.store(labels + rows, new_labels, mask=in_batch)
    # once a row has seen blank (or its end) at this frame it is done with the frame
    done = tl.load(blank + rows, mask=in_batch, other=1).to(tl.int1) | (new_labels == blank_id)
    if not BOUNDED:  # a row with full storage stops; the caller retries with more room
        done = done | (tl.load(h_lengths + rows, mask=in_batch, other=0) >= capacity)
    tl.store(blank + rows, done, mask=in_batch)
    emitting = _any((done == 0) & in_batch)
    if BOUNDED:
        emitting = emitting & (tl.load(symbols_at_frame) < max_symbols)
    tl.store(inner_flag, emitting)


@triton.jit
def _frame_emit_kernel(
    blank,
    labels,
    scores,
    frame,
    symbols_at_frame,
    found,
    batch,
    h_labels,
    h_times,
    h_durations,
    h_stride,
    capacity,
    h_lengths,
    h_scores,
    h_last_time,
    h_count,
    h_last_label,
    BLOCK_B: tl.constexpr,
):
    rows = tl.arange(0, BLOCK_B)
    in_batch = rows < batch
    emit = tl.load(blank + rows, mask=in_batch, other=1).to(tl.int1) == 0
    tl.store(found + rows, emit, mask=in_batch)
    times = tl.zeros([BLOCK_B], dtype=tl.int64) + tl.load(frame)
    new_labels = tl.load(labels + rows, mask=in_batch, other=0)
    new_scores = tl.load(scores + rows, mask=in_batch, other=0.0)
    _append_hyps(
        rows, in_batch, emit, new_labels, times, new_scores, new_labels,
        h_labels, h_times, h_durations, h_stride, capacity, h_lengths, h_scores, h_last_time, h_count, h_last_label,
        False,
    )  # fmt: skip
    tl.store(symbols_at_frame, tl.load(symbols_at_frame) + 1)


def frame_select(
    b: LoopBuffers,
    best_scores: torch.Tensor,
    best_labels: torch.Tensor,
    blank_id: int,
    max_symbols: int | None,
    fused: bool,
) -> None:
    """Take the joint's best label at the current frame; rows that saw blank are done with the frame.

    Shapes: best_scores/best_labels ``[B]``. Updates scores, labels, blank and inner_flag.
    """
    if fused:
        block, warps = batch_block(b.batch_size)
        _frame_select_kernel[(1,)](
            best_scores, best_labels, b.scores, b.labels, b.blank, b.hyps.lengths, b.hyps.capacity,
            b.symbols_at_frame, b.inner_flag, b.batch_size, blank_id, max_symbols or 0,
            BOUNDED=max_symbols is not None, BLOCK_B=block, num_warps=warps,
        )  # fmt: skip
        return
    b.scores.copy_(best_scores)
    b.labels.copy_(best_labels)
    b.blank.logical_or_(best_labels == blank_id)
    if max_symbols is None:
        b.blank.logical_or_(b.hyps.lengths >= b.hyps.capacity)
    emitting = torch.logical_not(torch.all(b.blank))
    if max_symbols is not None:
        emitting &= b.symbols_at_frame < max_symbols
    b.inner_flag.copy_(emitting)


def frame_emit(b: LoopBuffers, fused: bool) -> None:
    """Rows that have not seen blank at this frame emit their label (``b.found``); count the symbol."""
    if fused:
        block, warps = batch_block(b.batch_size)
        _frame_emit_kernel[(1,)](
            b.blank, b.labels, b.scores, b.frame, b.symbols_at_frame, b.found, b.batch_size, *_hyps_args(b.hyps),
            BLOCK_B=block, num_warps=warps,
        )  # fmt: skip
        return
    torch.logical_not(b.blank, out=b.found)
    b.hyps.add_(b.found, b.labels, b.frame.expand_as(b.labels), b.scores)
    b.symbols_at_frame.add_(1)
