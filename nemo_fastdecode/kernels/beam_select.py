"""Fused candidate selection of a batched beam-search step (modified ALSD, RNN-T and TDT).

After the beam-step kernel (:mod:`~nemo_fastdecode.kernels.beam_topk`) has found each beam's ``K`` best
non-blank tokens plus blank, a search step still has to rank each beam's extensions (RNN-T: blank joins the
tokens at its rank; TDT: every token is paired with every duration), build the ``K x K`` candidates of a row
(finished beams keep their score once, beams at ``max_symbols`` labels on their frame may only emit blank)
and keep the row's ``K`` best. In torch that is a sort or a top-k per beam, a top-k per row and a dozen
gathers and masks; here it is one Triton program per batch row, everything in registers
(:func:`select_extensions`). :func:`advance_beams` also writes the new beams into the hypotheses, merges equal
ones and moves the beams' time (``BeamHypsBuffer.add_``, ``recombine_`` and the loop's time update: another
twenty small torch operations).

Semantics (the kernel and :func:`select_extensions_reference` make the same choices, and give the same scores up
to the last-bit differences named below; the reference is the code that produces NeMo's bits on the CPU):

- Float operations are NeMo's, in NeMo's order: ``candidate = score + extension``, TDT pairs
  ``token + log_softmax(duration logits)``, forced blank ``score + blank (+ best duration)``.
- Orders: every ranking is descending, ties broken by the lower position (a beam's extensions: column, then
  for TDT the pair id ``token column * D + duration``; a row's candidates: ``beam * K + rank``). NaN ranks
  above everything (as ``torch.topk`` / ``torch.sort`` rank it), ``-inf`` below every finite value.
  ``torch.topk`` on CUDA leaves the order of exact ties unspecified, so a step whose candidates tie exactly can
  pick another of the tied candidates than NeMo's search; in float32 that needs equal sums of log-probabilities.
- The TDT duration log-softmax, and the log-sum-exp of merged hypotheses, are summed in another order than
  PyTorch's and may differ from it in the last bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nemo_fastdecode.kernels import triton_runs_on

__all__ = [
    "NON_EXISTENT_LABEL",
    "advance_beams",
    "kernel_by_default",
    "select_extensions",
    "select_extensions_reference",
]

NON_EXISTENT_LABEL = -1  # NeMo's NON_EXISTENT_LABEL_VALUE: the "label" of a finished beam's step
_NO_LABEL = tl.constexpr(NON_EXISTENT_LABEL)
_FAR = tl.constexpr(1 << 30)  # a position past every real one: what a min-reduction finds when nothing is left


@triton.jit
def _pick_best(scores, positions, alive):
    """The best alive entry: ``(its score, its position)``; ties (NaN with NaN) go to the lower position."""
    any_nan = tl.max(tl.where(alive & (scores != scores), 1, 0)) > 0
    best = tl.max(tl.where(alive, scores, float("-inf")))
    chosen = alive & tl.where(any_nan, scores != scores, scores == best)
    position = tl.min(tl.where(chosen, positions, _FAR))
    # a NaN never equals the max: read the chosen entry back by position
    return tl.sum(tl.where(alive & (positions == position), scores, 0.0)), position


@triton.jit
def _pick_best_per_beam(scores, positions, alive):
    """:func:`_pick_best` along axis 1, for every beam at once: ``([KB] scores, [KB] positions)``."""
    any_nan = tl.max(tl.where(alive & (scores != scores), 1, 0), axis=1) > 0
    best = tl.max(tl.where(alive, scores, float("-inf")), axis=1)
    chosen = alive & tl.where(any_nan[:, None], scores != scores, scores == best[:, None])
    position = tl.min(tl.where(chosen, positions, _FAR), axis=1)
    hit = alive & (positions == position[:, None])
    # a NaN never equals the max: read the chosen entry back by position
    return tl.sum(tl.where(hit, scores, 0.0), axis=1), position


@triton.jit
def _select_kernel(
    values_ptr, ids_ptr, values_stride, ids_stride,
    durations_ptr, durations_stride,
    hyp_scores_ptr, active_ptr, labels_at_time_ptr,
    out_scores_ptr, out_parents_ptr, out_labels_ptr, out_durations_ptr,
    blank_id, max_symbols,
    step_ptr, capacity, tree_labels_ptr, tree_parents_ptr, tree_times_ptr, tree_durations_ptr,
    lengths_ptr, last_label_ptr, hashes_ptr, next_time_ptr,
    time_ptr, last_frame_ptr, safe_time_ptr, step_labels_ptr, keep_ptr,
    K: tl.constexpr, KB: tl.constexpr, EB: tl.constexpr, D: tl.constexpr, DB: tl.constexpr,
    TDT: tl.constexpr, HAS_MAX_SYMBOLS: tl.constexpr, UPDATE_HYPS: tl.constexpr,
):  # fmt: skip
    """One batch row per program: its K beams' extensions ranked, its K x K candidates, their K best.

    values/ids ``[B*K, K+1]`` (K best non-blank, then blank); TDT durations ``[B*K, D]`` (duration logits);
    hyp scores, active, labels at time ``[B, K]``; outputs ``[B, K]``. ``UPDATE_HYPS``: also extend the
    hypotheses (trees ``[B, K, capacity]`` at slot ``min(step, capacity - 1)``, per-beam state ``[B, K]``)
    and merge equal ones, as ``BeamHypsBuffer.add_`` and ``recombine_`` do (``_finish_step_kernel`` then
    advances ``step``), and move every beam's time and activity to its parent's plus the new step's.
    """
    row = tl.program_id(0)
    beams = tl.arange(0, KB)
    beam_ok = beams < K
    beam_rows = row * K + beams
    hyp_score = tl.load(hyp_scores_ptr + row * K + beams, mask=beam_ok, other=0.0)
    active = tl.load(active_ptr + row * K + beams, mask=beam_ok, other=0) != 0
    blank_value = tl.load(values_ptr + beam_rows * values_stride + K, mask=beam_ok, other=0.0)

    # 1. each beam's extensions, EB wide: RNN-T the K + 1 columns; TDT the (K + 1) x D (column, duration) pairs
    ext = tl.arange(0, EB)
    if TDT:
        ext_ok = beam_ok[:, None] & (ext < (K + 1) * D)[None, :]
        columns = ext // D
        logits = tl.load(durations_ptr + beam_rows[:, None] * durations_stride + tl.arange(0, DB)[None, :],
                         mask=beam_ok[:, None] & (tl.arange(0, DB) < D)[None, :], other=float("-inf"))  # fmt: skip
        shifted = logits - tl.max(logits, axis=1)[:, None]
        duration_scores = shifted - tl.log(tl.sum(tl.exp(shifted), axis=1))[:, None]  # [KB, DB]
        token = tl.load(values_ptr + beam_rows[:, None] * values_stride + columns[None, :], mask=ext_ok, other=0.0)
        # the duration score of each pair, picked out of the [KB, DB] tile (D is tiny)
        pair_duration = ext % D
        duration = tl.zeros([KB, EB], dtype=tl.float32)
        for d in tl.static_range(D):
            score_d = tl.sum(tl.where(tl.arange(0, DB)[None, :] == d, duration_scores, 0.0), axis=1)
            duration = tl.where(pair_duration[None, :] == d, score_d[:, None], duration)
        extension = token + duration
        best_duration = tl.max(tl.where((tl.arange(0, DB) < D)[None, :], duration_scores, float("-inf")), axis=1)
        forced_blank = hyp_score + (blank_value + best_duration)
    else:
        ext_ok = beam_ok[:, None] & (ext < K + 1)[None, :]
        extension = tl.load(values_ptr + beam_rows[:, None] * values_stride + ext[None, :], mask=ext_ok, other=0.0)
        forced_blank = hyp_score + blank_value
    positions = tl.broadcast_to(ext[None, :], [KB, EB])

    # each beam's K best extensions in order (rank r), as candidates of the row at position beam * K + r
    ranks = tl.arange(0, KB)
    candidates = tl.full([KB, KB], float("-inf"), dtype=tl.float32)
    picked_ext = tl.zeros([KB, KB], dtype=tl.int32)
    alive = ext_ok
    for r in tl.static_range(K):
        best, position = _pick_best_per_beam(extension, positions, alive)
        alive = alive & (positions != position[:, None])
        candidates = tl.where(ranks[None, :] == r, (hyp_score + best)[:, None], candidates)
        picked_ext = tl.where(ranks[None, :] == r, position[:, None], picked_ext)

    # 2. finished beams stay once with their score; beams at max_symbols labels may only emit blank
    first = ranks[None, :] == 0
    candidates = tl.where(active[:, None], candidates, tl.where(first, hyp_score[:, None], float("-inf")))
    kind = tl.where(active, 0, 1)  # 0: an extension, 1: finished (no label), 2: forced blank
    if HAS_MAX_SYMBOLS:
        labels_at_time = tl.load(labels_at_time_ptr + row * K + beams, mask=beam_ok, other=0)
        force_blank = active & (labels_at_time >= max_symbols)
        candidates = tl.where(force_blank[:, None], tl.where(first, forced_blank[:, None], float("-inf")), candidates)
        kind = tl.where(force_blank, 2, kind)

    # 3. the row's K best candidates, as [KB] vectors over the new beams
    flat = beams[:, None] * K + ranks[None, :]
    alive = beam_ok[:, None] & (ranks < K)[None, :]
    new_scores = tl.full([KB], float("-inf"), dtype=tl.float32)
    parents = tl.zeros([KB], dtype=tl.int32)
    labels = tl.zeros([KB], dtype=tl.int64)
    durations = tl.zeros([KB], dtype=tl.int32)
    for slot in tl.static_range(K):
        score, position = _pick_best(candidates, flat, alive)
        alive = alive & (flat != position)
        parent = position // K
        rank = position % K
        parent_kind = tl.sum(tl.where(beams == parent, kind, 0))
        extension_id = tl.sum(tl.where((beams[:, None] == parent) & (ranks[None, :] == rank), picked_ext, 0))
        column = extension_id // D if TDT else extension_id
        label = tl.load(ids_ptr + (row * K + parent) * ids_stride + column)
        label = tl.where(parent_kind == 1, _NO_LABEL, tl.where(parent_kind == 2, blank_id, label))
        # TDT: a blank never stays on its frame (a forced blank's pair keeps its duration, 0 made 1)
        duration_index = extension_id % D
        duration_index = tl.where((label == blank_id) & (duration_index == 0), 1, duration_index)
        here = beams == slot
        new_scores = tl.where(here, score, new_scores)
        parents = tl.where(here, parent, parents)
        labels = tl.where(here, label, labels)
        durations = tl.where(here, duration_index, durations)
    out = row * K + beams
    tl.store(out_scores_ptr + out, new_scores, mask=beam_ok)
    tl.store(out_parents_ptr + out, parents.to(tl.int64), mask=beam_ok)
    tl.store(out_labels_ptr + out, labels, mask=beam_ok)
    if TDT:
        tl.store(out_durations_ptr + out, durations.to(tl.int64), mask=beam_ok)
    if UPDATE_HYPS:
        _extend_hypotheses(
            row, beams, beam_ok, parents, labels, durations, new_scores, blank_id, hyp_scores_ptr, labels_at_time_ptr,
            step_ptr, capacity, tree_labels_ptr, tree_parents_ptr, tree_times_ptr, tree_durations_ptr,
            lengths_ptr, last_label_ptr, hashes_ptr, next_time_ptr, K, KB, TDT,
        )  # fmt: skip
        # the prediction network advances the beams that emitted a label; the others keep their parent's state
        emitted = (labels >= 0) & (labels != blank_id)
        tl.store(step_labels_ptr + out, tl.where(emitted, labels, blank_id), mask=beam_ok)
        tl.store(keep_ptr + out, ~emitted, mask=beam_ok)
        # time: blank moves on one frame (RNN-T), TDT moves by the duration; finished beams stay
        parent_time = tl.load(time_ptr + row * K + parents, mask=beam_ok, other=0)
        if TDT:
            time = parent_time + tl.where(labels >= 0, durations, 0).to(tl.int64)
        else:
            time = parent_time + (labels == blank_id).to(tl.int64)
        last_frame = tl.load(last_frame_ptr + out, mask=beam_ok, other=0)
        tl.debug_barrier()  # every parent's time is read before any is overwritten
        tl.store(time_ptr + out, time, mask=beam_ok)
        # rows of length 0 (never active) read frame 0
        tl.store(safe_time_ptr + out, tl.maximum(tl.minimum(time, last_frame), 0), mask=beam_ok)
        tl.store(active_ptr + out, time <= last_frame, mask=beam_ok)


@triton.jit
def _finish_step_kernel(step_ptr, capacity, active_ptr, flag_ptr, n, BLOCK: tl.constexpr):
    """One program: ``step += 1``, then ``flag = any(active) and step < capacity`` (the loop's condition)."""
    step = tl.load(step_ptr) + 1
    tl.store(step_ptr, step)
    any_active = tl.full([], 0, tl.int32)
    for start in range(0, n, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        any_active = tl.maximum(
            any_active, tl.max(tl.load(active_ptr + offsets, mask=offsets < n, other=0).to(tl.int32))
        )
    tl.store(flag_ptr, (any_active > 0) & (step < capacity))


@triton.jit
def _of_parent(values, of_parent):
    """``values[parents[j]]`` for every new beam ``j`` (``of_parent[j, i]``: ``parents[j] == i``)."""
    return tl.sum(tl.where(of_parent, values[None, :], 0), axis=1)


@triton.jit
def _extend_hypotheses(
    row, beams, beam_ok, parents, labels, durations, new_scores, blank_id, scores_ptr, labels_at_time_ptr,
    step_ptr, capacity, tree_labels_ptr, tree_parents_ptr, tree_times_ptr, tree_durations_ptr,
    lengths_ptr, last_label_ptr, hashes_ptr, next_time_ptr, K: tl.constexpr, KB: tl.constexpr, TDT: tl.constexpr,
):  # fmt: skip
    """``BeamHypsBuffer.add_`` then ``recombine_`` for one row (same integer arithmetic; the merge's log-sum-exp
    may differ from PyTorch's in the last bit)."""
    beam_state = row * K + beams
    # the parents' state, read before this row's beams are overwritten (the row is this program's alone)
    of_parent = parents[:, None] == beams[None, :]
    parent_last_label = _of_parent(tl.load(last_label_ptr + beam_state, mask=beam_ok, other=0), of_parent)
    parent_time = _of_parent(tl.load(next_time_ptr + beam_state, mask=beam_ok, other=0), of_parent)
    parent_at_time = _of_parent(tl.load(labels_at_time_ptr + beam_state, mask=beam_ok, other=0), of_parent)
    parent_length = _of_parent(tl.load(lengths_ptr + beam_state, mask=beam_ok, other=0), of_parent)
    parent_hash = _of_parent(tl.load(hashes_ptr + beam_state, mask=beam_ok, other=0), of_parent)

    is_extended = labels >= 0
    with_blank = labels == blank_id
    with_label = is_extended & (labels != blank_id)
    at_time = parent_at_time + with_label.to(tl.int64)
    if TDT:
        durations = tl.where(is_extended, durations, 0).to(tl.int64)
        times = parent_time + durations
        # a label that moves on (duration > 0) starts a new frame; so does every blank
        at_time = tl.where(is_extended & (durations > 0), 0, at_time)
    else:
        times = parent_time + with_blank.to(tl.int64)
        at_time = tl.where(with_blank, 0, at_time)
    lengths = parent_length + with_label.to(tl.int64)
    # NeMo's hash_text: prev * 6364136223846793005 + 1 + label (int64, wrapping)
    hashes = tl.where(with_label, parent_hash * 6364136223846793005 + 1 + labels, parent_hash)
    last_label = tl.where(with_label, labels, parent_last_label)

    slot = tl.minimum(tl.load(step_ptr), capacity - 1)
    tree = beam_state * capacity + slot
    tl.debug_barrier()  # every parent's state is read before any is overwritten (threads share the row)
    tl.store(tree_labels_ptr + tree, labels, mask=beam_ok)
    tl.store(tree_parents_ptr + tree, parents.to(tl.int64), mask=beam_ok)
    tl.store(tree_times_ptr + tree, times, mask=beam_ok)
    if TDT:
        tl.store(tree_durations_ptr + tree, durations, mask=beam_ok)
    tl.store(labels_at_time_ptr + beam_state, at_time, mask=beam_ok)
    tl.store(next_time_ptr + beam_state, times, mask=beam_ok)
    tl.store(lengths_ptr + beam_state, lengths, mask=beam_ok)
    tl.store(hashes_ptr + beam_state, hashes, mask=beam_ok)
    tl.store(last_label_ptr + beam_state, last_label, mask=beam_ok)

    # recombine: equal hypotheses (same transcript; TDT: same next frame) merge into the best one (lowest
    # beam among equal scores), which keeps the log-sum-exp of their scores; the others become inactive
    if K > 1:
        equal = (
            (hashes[:, None] == hashes[None, :])
            & (last_label[:, None] == last_label[None, :])
            & (lengths[:, None] == lengths[None, :])
            & beam_ok[None, :]
        )
        if TDT:
            equal = equal & (times[:, None] == times[None, :])
        matrix = tl.where(equal, new_scores[None, :], float("-inf"))
        # torch.argmax: the first maximum (NaN counts as the maximum)
        columns = tl.broadcast_to(beams[None, :], [KB, KB])
        _, best = _pick_best_per_beam(matrix, columns, tl.broadcast_to(beam_ok[None, :], [KB, KB]))
        top = tl.max(matrix, axis=1)
        shift = tl.where(tl.abs(top) == float("inf"), 0.0, top)  # torch.logsumexp's guard
        merged = tl.log(tl.sum(tl.exp(matrix - shift[:, None]), axis=1)) + shift
        new_scores = tl.where(beams == best, merged, float("-inf"))
    tl.store(scores_ptr + beam_state, new_scores, mask=beam_ok)


def nemo_step_candidates(
    logits: torch.Tensor, k: int, blank_id: int, num_durations: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Each beam's ``K`` candidates as NeMo's ``malsd_batch`` step makes them, op for op: its log-softmax in ``dtype``,
    its ``torch.topk`` over every label (blank included; TDT: every label x duration pair), so that ties -- common in
    bf16 -- break as NeMo's break.

    Args:
        logits: ``[B*K, V + 1 (+ D)]`` the joint's output at every beam's frame.
        k: the beam size; ``blank_id``: blank (the last token); ``num_durations``: TDT durations (0: RNN-T).
        dtype: the search's float dtype (the projected encoder output's), in which NeMo normalises and adds.

    Returns:
        ``(scores [B*K, K], labels [B*K, K], durations [B*K, K] or None, forced-blank scores [B*K])``.
    """
    token_logits = logits[:, :-num_durations] if num_durations else logits
    log_probs = torch.log_softmax(token_logits, dim=-1, dtype=dtype)
    if not num_durations:
        scores, labels = torch.topk(log_probs, k, dim=-1, largest=True, sorted=True)
        return scores, labels, None, log_probs[:, blank_id]
    duration_log_probs = torch.log_softmax(logits[:, -num_durations:], dim=-1, dtype=dtype)
    pairs = log_probs[:, :, None] + duration_log_probs[:, None, :]
    scores, pair_ids = torch.topk(pairs.view(pairs.shape[0], -1), k, dim=-1, largest=True, sorted=True)
    labels, durations = pair_ids // num_durations, pair_ids % num_durations
    durations = torch.where((labels == blank_id) & (durations == 0), 1, durations)  # blank never stays on its frame
    return scores, labels, durations, log_probs[:, blank_id] + duration_log_probs.max(dim=-1).values


def select_extensions_reference(
    values: torch.Tensor | None,
    ids: torch.Tensor | None,
    hyp_scores: torch.Tensor,
    active: torch.Tensor,
    labels_at_time: torch.Tensor,
    blank_id: int,
    max_symbols: int | None,
    duration_logits: torch.Tensor | None = None,
    blank_scores: torch.Tensor | None = None,
    candidates: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`select_extensions` in torch: NeMo's own operations (bit-identical to its search on the CPU).

    ``blank_scores [B*K]``: what a forced blank scores, where it is not ``values[:, K]``; then ``values`` / ``ids``
    may hold just the ``K`` candidates of each beam (NeMo's early pruning of fused scores). ``candidates``: each
    beam's candidates already made (:func:`nemo_step_candidates`); ``values``, ``ids``, ``duration_logits`` and
    ``blank_scores`` are then not read.
    """
    batch, k = hyp_scores.shape
    dtype, shape = hyp_scores.dtype, (batch, k, k)
    if candidates is not None:
        top_scores, top_labels, top_durations, blank_scores = candidates
        top_durations = None if top_durations is None else top_durations.view(shape)
    elif duration_logits is None:
        values = values.to(dtype)
        blank_scores = values[:, k] if blank_scores is None else blank_scores.to(dtype)
        # blank joins the K best non-blank tokens at its rank (ties: after the tokens); keep K
        order = values.sort(dim=-1, descending=True, stable=True).indices[:, :k]
        top_scores, top_labels, top_durations = values.gather(1, order), ids.gather(1, order), None
    else:
        values = values.to(dtype)
        blank_scores = values[:, k] if blank_scores is None else blank_scores.to(dtype)
        num_durations = duration_logits.shape[-1]
        duration_scores = torch.log_softmax(duration_logits, dim=-1, dtype=dtype)  # [B*K, D]
        # (token, duration) pairs: NeMo's `log_probs[..., None] + duration_log_probs[..., None, :]`, K(+1) tokens
        pairs = values[:, :, None] + duration_scores[:, None, :]
        top_scores, pair_ids = pairs.view(values.shape[0], -1).topk(k, dim=-1, largest=True, sorted=True)
        top_labels = ids.gather(1, pair_ids // num_durations)
        durations = pair_ids % num_durations
        # a blank never stays on its frame
        top_durations = torch.where((top_labels == blank_id) & (durations == 0), 1, durations).view(shape)
        blank_scores = blank_scores + duration_scores.max(dim=-1).values
    top_scores, top_labels, blank_scores = top_scores.view(shape), top_labels.view(shape), blank_scores.view(batch, k)

    # candidates (NeMo's steps 2.1-2.3, same float ops): finished beams stay, once, with their score
    candidates = hyp_scores.unsqueeze(-1) + top_scores  # [B, K, K]
    forced_blank_scores = hyp_scores + blank_scores
    candidates = torch.where(active.unsqueeze(-1), candidates, float("-inf"))
    candidates[..., 0] = torch.where(active, candidates[..., 0], hyp_scores)
    top_labels = torch.where(active.unsqueeze(-1), top_labels, NON_EXISTENT_LABEL)
    if max_symbols is not None:
        # max_symbols labels at this frame already: the only extension is blank
        force_blank = (labels_at_time >= max_symbols) & active
        candidates = torch.where(force_blank.unsqueeze(-1), float("-inf"), candidates)
        candidates[..., 0] = torch.where(force_blank, forced_blank_scores, candidates[..., 0])
        top_labels = torch.where(force_blank.unsqueeze(-1), blank_id, top_labels)
        if top_durations is not None:
            top_durations = torch.where(force_blank.unsqueeze(-1) & (top_durations == 0), 1, top_durations)

    # the K best of K x K
    next_scores, picked = torch.topk(candidates.view(batch, -1), k=k, largest=True, sorted=True)
    parents = picked // k
    next_labels = top_labels.view(batch, -1).gather(1, picked)
    next_durations = top_durations.view(batch, -1).gather(1, picked) if top_durations is not None else None
    return next_scores, parents, next_labels, next_durations


def kernel_by_default(device: torch.device, scores_dtype: torch.dtype) -> bool:
    """Whether the selection kernels run when not forced: CUDA tensors with float32 scores (the CPU keeps NeMo's
    bits through the torch reference; other score dtypes are the reference's)."""
    return device.type == "cuda" and scores_dtype == torch.float32


def select_extensions(
    values: torch.Tensor,
    ids: torch.Tensor,
    hyp_scores: torch.Tensor,
    active: torch.Tensor,
    labels_at_time: torch.Tensor,
    blank_id: int,
    max_symbols: int | None,
    duration_logits: torch.Tensor | None = None,
    use_triton: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The ``K`` best candidates of each row for the next step of a modified-ALSD beam search.

    Args:
        values, ids: ``[B*K, K+1]`` the beam-step kernel's output for beam ``b * K + k``: the ``K`` best
            non-blank log-probabilities (descending) and their ids, then blank's.
        hyp_scores: ``[B, K]`` the beams' scores (``-inf``: inactive beam).
        active: ``[B, K]`` bool: the beam has frames left (a finished beam is kept once, with its score).
        labels_at_time: ``[B, K]`` int64: labels the beam emitted at its current frame.
        blank_id: id of blank.
        max_symbols: at most this many labels per frame (a beam at the limit may only emit blank); ``None``: no limit.
        duration_logits: TDT: ``[B*K, D]`` duration logits (may be a column slice of the joint's output); ``None``
            for RNN-T.
        use_triton: ``None``: the kernel for CUDA tensors with float32 scores, else the reference (so the CPU
            gives NeMo's bits); ``True``: the kernel (CUDA, or the CPU under ``TRITON_INTERPRET=1``).

    Returns:
        ``(scores, parents, labels, durations)``, each ``[B, K]``, best first: the new beams' total scores (dtype of
        ``hyp_scores``), parent beams, labels (blank, or ``-1`` for a finished beam) and, for TDT, duration
        indices (``None`` for RNN-T).
    """
    if use_triton is None:
        use_triton = kernel_by_default(values.device, hyp_scores.dtype)
    if not use_triton:
        return select_extensions_reference(
            values, ids, hyp_scores, active, labels_at_time, blank_id, max_symbols, duration_logits
        )
    return _launch(values, ids, hyp_scores, active, labels_at_time, blank_id, max_symbols, duration_logits, None, None)


def advance_beams(
    values: torch.Tensor,
    ids: torch.Tensor,
    buffers,
    blank_id: int,
    max_symbols: int | None,
    duration_logits: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A whole search step but the networks, on the selection kernel: select each row's ``K`` best candidates
    (:func:`select_extensions`), write them into the hypotheses and merge equal ones (``BeamHypsBuffer.add_``
    and ``recombine_``), move every beam's time and activity, and set the loop's flag.

    ``buffers``: the search's :class:`~nemo_fastdecode.beam.state.BeamLoopBuffers` (``hyps``, ``active``,
    ``time_indices``, ``last_frame``, ``safe_time_indices``, ``flag``), updated in place; one program per row,
    then one to count the step (the merge's log-sum-exp may differ from PyTorch's in the last bit).

    Returns:
        ``(parents [B, K], labels to predict [B*K], keep [B*K])``: the new beams' parents, the label each
        beam feeds the prediction network (blank where it emitted none) and whether it keeps its parent's
        prediction-network state instead (it emitted no label).
    """
    hyps = buffers.hyps
    state = ("labels", "parents", "timestamps", "scores", "lengths", "last_label", "hashes", "next_time")
    for name in state:
        if not getattr(hyps, name).is_contiguous():
            raise ValueError(f"hyps.{name} must be contiguous (the kernel writes it in place)")
    step_labels = torch.empty([buffers.active.numel()], dtype=torch.long, device=values.device)
    keep = torch.empty([buffers.active.numel()], dtype=torch.bool, device=values.device)
    loop = (buffers.time_indices, buffers.last_frame, buffers.safe_time_indices, step_labels, keep)
    _, parents, _, _ = _launch(
        values,
        ids,
        hyps.scores,
        buffers.active,
        hyps.labels_at_time,
        blank_id,
        max_symbols,
        duration_logits,
        hyps,
        loop,
    )
    _finish_step_kernel[(1,)](
        hyps.step, hyps.capacity, buffers.active, buffers.flag, buffers.active.numel(), BLOCK=1024
    )
    return parents, step_labels, keep


def _launch(values, ids, hyp_scores, active, labels_at_time, blank_id, max_symbols, duration_logits, hyps, loop):
    batch, k = hyp_scores.shape
    if not triton_runs_on(values.device):
        raise ValueError(f"use_triton=True needs CUDA tensors or TRITON_INTERPRET=1, got {values.device}")
    if hyp_scores.dtype != torch.float32 or values.dtype != torch.float32:
        raise ValueError(
            f"the selection kernel scores in float32, got hyp_scores {hyp_scores.dtype}, values {values.dtype}"
        )
    if values.shape != (batch * k, k + 1) or ids.shape != values.shape:
        raise ValueError(f"values and ids must be [B*K, K+1] = [{batch * k}, {k + 1}] for hyp_scores {list(hyp_scores.shape)}, "
                         f"got {list(values.shape)} and {list(ids.shape)}")  # fmt: skip
    tdt = duration_logits is not None
    device = values.device
    scores = torch.empty([batch, k], dtype=torch.float32, device=device)
    parents = torch.empty([batch, k], dtype=torch.long, device=device)
    labels = torch.empty([batch, k], dtype=torch.long, device=device)
    durations = torch.empty([batch, k], dtype=torch.long, device=device) if tdt else None
    num_durations = duration_logits.shape[-1] if tdt else 1
    extensions = (k + 1) * num_durations if tdt else k + 1
    if hyps is not None:
        tree = (hyps.step, hyps.capacity, hyps.labels, hyps.parents, hyps.timestamps, hyps.durations if tdt else labels,
                hyps.lengths, hyps.last_label, hyps.hashes, hyps.next_time)  # fmt: skip
        for tensor in (active, *loop):
            if not tensor.is_contiguous():
                raise ValueError("the loop's state must be contiguous (the kernel writes it in place)")
    else:
        tree = (labels, 1, labels, labels, labels, labels, labels, labels, labels, labels)  # never touched
        loop = (labels,) * 5
    _select_kernel[(batch,)](
        values, ids, values.stride(0), ids.stride(0),
        duration_logits if tdt else values, duration_logits.stride(0) if tdt else 0,
        hyp_scores.contiguous(), active.contiguous(), labels_at_time.contiguous(),
        scores, parents, labels, durations if tdt else labels,
        blank_id, max_symbols if max_symbols is not None else 0,
        *tree, *loop,
        K=k, KB=triton.next_power_of_2(k), EB=triton.next_power_of_2(extensions), D=num_durations,
        DB=triton.next_power_of_2(num_durations), TDT=tdt, HAS_MAX_SYMBOLS=max_symbols is not None,
        UPDATE_HYPS=hyps is not None, num_warps=1 if extensions * k <= 256 else 4,
    )  # fmt: skip
    return scores, parents, labels, durations
