"""The greedy loops' per-step bookkeeping around the joint and the prediction network, each as ONE kernel.

A greedy step is a handful of big kernels (joint GEMM, LSTM) and dozens of tiny ones (masked selects, comparisons,
the hypothesis append, the loop flags); inside a CUDA graph each tiny kernel still costs a launch slot of a few
microseconds, so they are fused here:

- :func:`label_select` / :func:`label_emit`: the label loop's bookkeeping after the joint and before the LSTM.
- :func:`window_select`: up to ``window`` looks of the label loop at once (the look-ahead); its body
  (:func:`window_select_rows`) also ends the one-kernel look of :mod:`~nemo_fastdecode.kernels.window_look`.
- :func:`frame_select` / :func:`frame_emit`: the same for the frame loop.

Each runs as one program over the whole batch (:func:`batch_block`): they are tiny, and the loop flag is a reduction
over the batch that then needs no second kernel. The launchers take the loop's tensors (:class:`LookTensors`,
:class:`HypsTensors`: the per-row state and the hypotheses' storage); the torch references are the unfused paths of
:mod:`nemo_fastdecode.greedy.steps`, which run on the greedy loop buffers themselves. Every kernel does exactly the
element-wise arithmetic of its reference (selects, integer ops, one IEEE add), so the two are bit-identical.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

__all__ = [
    "HypsTensors",
    "LookTensors",
    "batch_block",
    "frame_emit",
    "frame_select",
    "label_emit",
    "label_select",
    "window_select",
    "window_select_rows",
]


class LookTensors(NamedTuple):
    """The label loop's per-row state ``[B]`` that a look reads and writes (in the kernels' argument order), and the
    0-d ``inner_flag`` (any row still looking). ``time``: each row's frame; ``safe_time``: ``min(time, last_frame)``;
    ``label_time``: the frame of the current label; ``lengths``: encoder lengths; ``active_before``: active at the
    outer iteration's first look; ``advance``: active rows that hold a blank; ``durations``: TDT durations."""

    time: torch.Tensor
    safe_time: torch.Tensor
    label_time: torch.Tensor
    last_frame: torch.Tensor
    lengths: torch.Tensor
    active: torch.Tensor
    active_before: torch.Tensor
    advance: torch.Tensor
    blank: torch.Tensor
    labels: torch.Tensor
    scores: torch.Tensor
    durations: torch.Tensor
    inner_flag: torch.Tensor


class HypsTensors(NamedTuple):
    """The hypotheses' storage (in the kernels' argument order): ``labels / times / durations [B, capacity]`` (row
    stride ``stride``), ``lengths``, ``scores``, ``last_time`` (frame of the last label), ``count`` (labels emitted
    at it) and ``last_label``, each ``[B]``. Writes past the capacity land on the last slot, counted in ``lengths``.
    """

    labels: torch.Tensor
    times: torch.Tensor
    durations: torch.Tensor
    stride: int
    capacity: int
    lengths: torch.Tensor
    scores: torch.Tensor
    last_time: torch.Tensor
    count: torch.Tensor
    last_label: torch.Tensor


def batch_block(batch_size: int) -> tuple[int, int]:
    """``(rows, warps)`` of the one-program bookkeeping kernels: the whole batch in one block."""
    block = triton.next_power_of_2(max(batch_size, 16))
    return block, 4 if block <= 512 else 8


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
    """The fused form of :meth:`~nemo_fastdecode.greedy.hyps.BatchedHypsBuffer.add_`; returns the new lengths,
    per-frame counts, last times."""
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


@triton.jit
def _any(flags):
    return tl.max(flags.to(tl.int32), axis=0) > 0


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
    programs of the same launch wrote them, as in :mod:`~nemo_fastdecode.kernels.window_look`)."""
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


def _durations_args(
    duration_logits: torch.Tensor | None,
    duration_values: torch.Tensor | None,
    other: torch.Tensor,
    labels: torch.Tensor,
) -> tuple:
    """``(duration_logits, its row stride, duration_values)`` for a kernel; stand-ins (never read) for RNN-T."""
    if duration_logits is None or duration_logits.shape[1] == 0:
        return other, 0, labels
    return duration_logits, duration_logits.stride(0), duration_values


def label_select(
    look: LookTensors,
    best_scores: torch.Tensor,
    best_labels: torch.Tensor,
    duration_logits: torch.Tensor | None,
    duration_values: torch.Tensor | None,
    blank_id: int,
    start: bool,
) -> None:
    """The label loop's look: take the joint's best label (and TDT duration), move blank rows on in time.

    ``start``: the first look of an outer iteration (every active row takes the new label); otherwise only rows in
    ``look.advance`` (which held a blank) do. Shapes: best_scores / best_labels ``[B]``; duration_logits
    ``[B, num_durations]`` (TDT) or ``None``; duration_values ``[num_durations]``. Updates labels, scores,
    durations, label_time, blank, time, safe_time, active, active_before (start), advance and inner_flag.
    """
    batch = look.labels.shape[0]
    block, warps = batch_block(batch)
    num_durations = 0 if duration_logits is None else duration_logits.shape[1]
    _label_select_kernel[(1,)](
        best_scores, best_labels, *_durations_args(duration_logits, duration_values, best_scores, best_labels),
        *look, batch, blank_id,
        START=start, NUM_DURATIONS=num_durations, BLOCK_B=block,
        BLOCK_D=triton.next_power_of_2(max(num_durations, 2)), num_warps=warps,
    )  # fmt: skip


def window_select(
    look: LookTensors,
    best_scores: torch.Tensor,
    best_labels: torch.Tensor,
    duration_logits: torch.Tensor | None,
    duration_values: torch.Tensor | None,
    blank_id: int,
    window: int,
    start: bool,
) -> None:
    """Up to ``window`` looks of the label loop at once, from the joint's answers at each row's next ``window``
    frames: ``best_scores / best_labels [B * W]``, ``duration_logits [B * W, num_durations]`` (TDT) or ``None``.

    A row moves on as :func:`label_select` would, look after look, until it finds a label, runs out of frames or
    leaves the window (it then continues at the next look).
    """
    batch = look.labels.shape[0]
    block, warps = batch_block(batch)
    num_durations = 0 if duration_logits is None else duration_logits.shape[1]
    _window_select_kernel[(1,)](
        best_scores, best_labels, *_durations_args(duration_logits, duration_values, best_scores, best_labels),
        *look, batch, blank_id,
        START=start, WINDOW=window, NUM_DURATIONS=num_durations, BLOCK_B=block,
        BLOCK_D=triton.next_power_of_2(max(num_durations, 2)), num_warps=warps,
    )  # fmt: skip


def label_emit(
    look: LookTensors,
    found: torch.Tensor,
    outer_flag: torch.Tensor,
    hyps: HypsTensors,
    max_symbols: int | None,
    with_durations: bool,
) -> None:
    """Rows that were decoding and found a non-blank label emit it (``found [B]``); enforce ``max_symbols``.

    Updates found, the hypotheses, time / safe_time / active (forced blanks; ``max_symbols=None``: rows whose
    storage is full stop) and the 0-d ``outer_flag`` (any row active).
    """
    batch = look.labels.shape[0]
    block, warps = batch_block(batch)
    _label_emit_kernel[(1,)](
        look.active_before, look.blank, look.labels, look.label_time, look.scores, look.durations, found,
        look.time, look.safe_time, look.last_frame, look.lengths, look.active, outer_flag,
        batch, max_symbols or 0, *hyps,
        BOUNDED=max_symbols is not None, WITH_DURATIONS=with_durations, BLOCK_B=block, num_warps=warps,
    )  # fmt: skip


def frame_select(
    best_scores: torch.Tensor,
    best_labels: torch.Tensor,
    scores: torch.Tensor,
    labels: torch.Tensor,
    blank: torch.Tensor,
    hyps: HypsTensors,
    symbols_at_frame: torch.Tensor,
    inner_flag: torch.Tensor,
    blank_id: int,
    max_symbols: int | None,
) -> None:
    """The frame loop's look: take the joint's best label at the current frame (``[B]``); rows that saw blank are
    done with the frame (``blank``). Updates scores, labels, blank and the 0-d ``inner_flag`` (any row emitting,
    fewer than ``max_symbols`` at the frame; the 0-d ``symbols_at_frame`` counts them)."""
    batch = labels.shape[0]
    block, warps = batch_block(batch)
    _frame_select_kernel[(1,)](
        best_scores, best_labels, scores, labels, blank, hyps.lengths, hyps.capacity,
        symbols_at_frame, inner_flag, batch, blank_id, max_symbols or 0,
        BOUNDED=max_symbols is not None, BLOCK_B=block, num_warps=warps,
    )  # fmt: skip


def frame_emit(
    blank: torch.Tensor,
    labels: torch.Tensor,
    scores: torch.Tensor,
    frame: torch.Tensor,
    symbols_at_frame: torch.Tensor,
    found: torch.Tensor,
    hyps: HypsTensors,
) -> None:
    """Rows that have not seen blank at the frame (0-d ``frame``) emit their label (``found``); count the symbol."""
    batch = labels.shape[0]
    block, warps = batch_block(batch)
    _frame_emit_kernel[(1,)](
        blank, labels, scores, frame, symbols_at_frame, found, batch, *hyps, BLOCK_B=block, num_warps=warps,
    )  # fmt: skip
