"""Read chosen hypotheses out of the beam search's prefix tree: one Triton program per batch row.

The search stores, for every step ``t``, each beam's entry (label, end frame, TDT duration) and the beam it
extended (``parents[b, k, t]``). A hypothesis is read by walking the parents back from the last step, as
NeMo's ``BatchedBeamHyps.flatten_sort_`` does with one gather per step and tensor (hundreds of kernel
launches per batch). Here the whole walk is one kernel: each program follows its row's chosen beams through
all steps. :func:`backtrack_reference` is the same walk in torch (the CPU path and the tests' reference).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _backtrack_kernel(
    labels_ptr, parents_ptr, times_ptr, durations_ptr, start_ptr,
    out_labels_ptr, out_times_ptr, out_durations_ptr,
    beams, capacity, steps, chosen,
    WITH_DURATIONS: tl.constexpr, BLOCK_J: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    j = tl.arange(0, BLOCK_J)
    j_ok = j < chosen
    beam = tl.load(start_ptr + row * chosen + j, mask=j_ok, other=0)
    out = (row * chosen + j) * steps
    for i in range(steps):
        t = steps - 1 - i
        entry = (row * beams + beam) * capacity + t
        tl.store(out_labels_ptr + out + t, tl.load(labels_ptr + entry, mask=j_ok, other=0), mask=j_ok)
        tl.store(out_times_ptr + out + t, tl.load(times_ptr + entry, mask=j_ok, other=0), mask=j_ok)
        if WITH_DURATIONS:
            tl.store(out_durations_ptr + out + t, tl.load(durations_ptr + entry, mask=j_ok, other=0), mask=j_ok)
        beam = tl.load(parents_ptr + entry, mask=j_ok, other=0)


def _check(labels: torch.Tensor, parents: torch.Tensor, times: torch.Tensor, durations, start, steps) -> None:
    if labels.dim() != 3 or parents.shape != labels.shape or times.shape != labels.shape:
        raise ValueError(
            f"labels, parents and times must be [B, K, C] alike, got {tuple(labels.shape)}, {tuple(parents.shape)}, "
            f"{tuple(times.shape)}"
        )
    if durations is not None and durations.shape != labels.shape:
        raise ValueError(f"durations must be {tuple(labels.shape)} like labels, got {tuple(durations.shape)}")
    if start.dim() != 2 or start.shape[0] != labels.shape[0]:
        raise ValueError(f"start must be [B={labels.shape[0]}, J], got {tuple(start.shape)}")
    if not 0 <= steps <= labels.shape[2]:
        raise ValueError(f"steps must be in [0, {labels.shape[2]}] (the tree's capacity), got {steps}")


def _empty_paths(labels: torch.Tensor, durations: torch.Tensor | None, start: torch.Tensor, steps: int):
    """Uninitialised ``(labels, times, durations)`` paths, each ``[B, J, steps]`` like ``labels`` (int64)."""
    shape = [start.shape[0], start.shape[1], steps]
    out_labels = labels.new_empty(shape)
    return out_labels, torch.empty_like(out_labels), torch.empty_like(out_labels) if durations is not None else None


def backtrack(
    labels: torch.Tensor,
    parents: torch.Tensor,
    times: torch.Tensor,
    durations: torch.Tensor | None,
    start: torch.Tensor,
    steps: int,
    use_triton: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The entries along the paths that end in beams ``start`` at step ``steps - 1``.

    Args:
        labels, parents, times: ``[B, K, C]`` int64, the tree (``parents[b, k, t]``: the beam at step ``t - 1``
            that beam ``k`` extended at step ``t``).
        durations: ``[B, K, C]`` int64 (TDT) or ``None``.
        start: ``[B, J]`` int64, the beams whose paths to read (e.g. the best, or all sorted by score).
        steps: how many steps the tree holds (``0 <= steps <= C``).
        use_triton: ``None``: the kernel on CUDA, the torch walk elsewhere.

    Returns:
        ``(labels, times, durations)`` along the paths, each ``[B, J, steps]`` (``durations`` ``None`` for RNN-T).
    """
    if use_triton is None:
        use_triton = labels.device.type == "cuda"
    if not use_triton:
        return backtrack_reference(labels, parents, times, durations, start, steps)
    _check(labels, parents, times, durations, start, steps)
    batch, beams, capacity = labels.shape
    chosen = start.shape[1]
    out_labels, out_times, out_durations = _empty_paths(labels, durations, start, steps)
    if batch and chosen and steps:
        _backtrack_kernel[(batch,)](
            labels.contiguous(), parents.contiguous(), times.contiguous(),
            durations.contiguous() if durations is not None else labels, start.contiguous(),
            out_labels, out_times, out_durations if out_durations is not None else out_labels,
            beams, capacity, steps, chosen,
            WITH_DURATIONS=durations is not None, BLOCK_J=triton.next_power_of_2(chosen), num_warps=1,
        )  # fmt: skip
    return out_labels, out_times, out_durations


def backtrack_reference(
    labels: torch.Tensor,
    parents: torch.Tensor,
    times: torch.Tensor,
    durations: torch.Tensor | None,
    start: torch.Tensor,
    steps: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`backtrack` as a torch loop over the steps (NeMo's ``_flatten_with_permutation_`` walk)."""
    _check(labels, parents, times, durations, start, steps)
    out_labels, out_times, out_durations = _empty_paths(labels, durations, start, steps)
    rows = torch.arange(start.shape[0], device=start.device)[:, None]
    beam = start
    for t in range(steps - 1, -1, -1):
        out_labels[..., t] = labels[rows, beam, t]
        out_times[..., t] = times[rows, beam, t]
        if durations is not None:
            out_durations[..., t] = durations[rows, beam, t]
        beam = parents[rows, beam, t]
    return out_labels, out_times, out_durations
