"""The per-step state updates of the greedy loops on their :class:`~nemo_fastdecode.greedy.state.LoopBuffers`: a
torch reference and a fused Triton kernel for each.

A greedy step is a handful of big kernels (joint GEMM, LSTM) and dozens of tiny ones (masked selects, comparisons,
the hypothesis append, the loop flags); the tiny ones are fused, a few per step, by the kernels of
:mod:`nemo_fastdecode.kernels.greedy_select` (and :mod:`~nemo_fastdecode.kernels.window_look`), which take the
buffers' tensors; the functions here unpack the buffers for them, and hold the torch path (``fused=False``):

- :func:`label_select` / :func:`label_emit`: the label loop's bookkeeping around the joint and the LSTM;
  :func:`window_select` / :func:`window_look`: its look-ahead (several frames per look).
- :func:`frame_select` / :func:`frame_emit`: the same for the frame loop.

The joint's hidden layer (:mod:`~nemo_fastdecode.kernels.joint_hidden`), each row's best token
(:mod:`~nemo_fastdecode.kernels.best_token`) and the prediction network's masked state update
(:mod:`~nemo_fastdecode.kernels.masked_state`) are kernels of their own, on plain tensors.

Every fused kernel does exactly the element-wise arithmetic of its reference (selects, integer ops, one IEEE add), so
the two paths are bit-identical and the fusion never changes a decision.
"""

from __future__ import annotations

import torch

from nemo_fastdecode.greedy.hyps import BatchedHypsBuffer
from nemo_fastdecode.greedy.state import LoopBuffers
from nemo_fastdecode.kernels import greedy_select
from nemo_fastdecode.kernels import window_look as window_look_kernel
from nemo_fastdecode.kernels.greedy_select import HypsTensors, LookTensors
from nemo_fastdecode.kernels.window_look import WindowLookBuffers


def look_tensors(b: LoopBuffers) -> LookTensors:
    """The label loop's per-row state in ``b``, as the select kernels take it."""
    return LookTensors(
        b.time_indices, b.safe_time_indices, b.label_time, b.last_frame, b.encoder_lengths, b.active,
        b.active_before, b.advance, b.blank, b.labels, b.scores, b.durations, b.inner_flag,
    )  # fmt: skip


def hyps_tensors(hyps: BatchedHypsBuffer) -> HypsTensors:
    """The hypotheses' storage, as the emit kernels take it."""
    return HypsTensors(
        hyps.labels, hyps.timestamps, hyps.durations, hyps.labels.stride(0), hyps.capacity,
        hyps.lengths, hyps.scores, hyps.last_label_time, hyps.labels_at_last_time, hyps.last_label,
    )  # fmt: skip


# ----- label loop ----------------------------------------------------------------------------------
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
    ``[B]`` (see :func:`~nemo_fastdecode.kernels.best_token.best_token`); duration_logits ``[B, num_durations]``
    (TDT) or ``None``; duration_values ``[num_durations]``.
    Updates labels, scores, durations, label_time, blank, time_indices, active, advance, inner_flag.
    """
    if fused:
        greedy_select.label_select(
            look_tensors(b), best_scores, best_labels, duration_logits, duration_values, blank_id, start
        )
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

    The best tokens come from the joint at each row's next ``window`` frames
    (:func:`~nemo_fastdecode.kernels.joint_hidden.joint_hidden_window`): ``best_scores / best_labels [B * W]``,
    ``duration_logits [B * W, num_durations]`` (TDT) or ``None``. A row
    moves on as :func:`label_select` would, look after look (``start``: the first look of an outer iteration,
    for every active row; then only rows that hold a blank), until it finds a label, runs out of frames or
    leaves the window (it then continues at the next look). Every row's evolution depends only on its own
    frames, so the loop ends in the state the single-frame looks reach (rows that are not decoding may keep
    other junk labels; nothing reads them).
    """
    greedy_select.window_select(
        look_tensors(b), best_scores, best_labels, duration_logits, duration_values, blank_id, window, start
    )


def window_look(
    b: LoopBuffers,
    scratch: WindowLookBuffers,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    num_tokens: int,
    duration_values: torch.Tensor | None,
    blank_id: int,
    window: int,
    start: bool,
) -> None:
    """Up to ``window`` looks of the label loop from the joint's hidden rows ``[B * W, H]``, in one kernel: the
    joint's output layer, each row's best token and :func:`window_select`
    (:func:`~nemo_fastdecode.kernels.window_look.window_look`; ``precision``: its default, ``tf32x3``).
    """
    window_look_kernel.window_look(
        look_tensors(b), scratch, hidden, weight, bias, num_tokens, duration_values, blank_id, window, start
    )


def label_emit(b: LoopBuffers, max_symbols: int | None, with_durations: bool, fused: bool) -> None:
    """Rows that were decoding and found a non-blank label emit it (``b.found``); enforce max_symbols.

    Updates found, the hypotheses, time_indices/active (forced blanks) and outer_flag.
    """
    if fused:
        greedy_select.label_emit(
            look_tensors(b), b.found, b.outer_flag, hyps_tensors(b.hyps), max_symbols, with_durations
        )
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
        greedy_select.frame_select(
            best_scores, best_labels, b.scores, b.labels, b.blank, hyps_tensors(b.hyps), b.symbols_at_frame,
            b.inner_flag, blank_id, max_symbols,
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
        greedy_select.frame_emit(
            b.blank, b.labels, b.scores, b.frame, b.symbols_at_frame, b.found, hyps_tensors(b.hyps)
        )
        return
    torch.logical_not(b.blank, out=b.found)
    b.hyps.add_(b.found, b.labels, b.frame.expand_as(b.labels), b.scores)
    b.symbols_at_frame.add_(1)
