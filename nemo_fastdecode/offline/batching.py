"""Length-sorted batches under a padded-audio budget: how the offline path groups utterances.

Sorting by length puts utterances of similar length together, so little of each batch is padding; the budget
(batch size times the longest utterance in it) keeps the encoder's memory, which grows with the padded length,
bounded while short utterances still go in large batches.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["plan_batches"]


def plan_batches(lengths: Sequence[int], max_batch_size: int, max_batch_samples: int | None = None) -> list[list[int]]:
    """Group utterance indices into batches, longest utterances first.

    Args:
        lengths: samples per utterance (``[N]``).
        max_batch_size: at most this many utterances per batch (>= 1).
        max_batch_samples: at most this many padded samples per batch (utterances x the longest one in the batch);
            ``None``: no budget, batches of ``max_batch_size``. An utterance longer than the budget gets a batch
            of its own.

    Returns:
        Batches of indices into ``lengths``; every index appears exactly once; within a batch and from one batch to
        the next, lengths do not increase (ties keep the input order).
    """
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    if max_batch_samples is not None and max_batch_samples < 1:
        raise ValueError(f"max_batch_samples must be >= 1 or None, got {max_batch_samples}")
    if any(n < 0 for n in lengths):
        raise ValueError(f"lengths must be >= 0, got {min(lengths)}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep the input order
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]
        full = len(current) == max_batch_size or (
            max_batch_samples is not None and (len(current) + 1) * max(longest, 1) > max_batch_samples
        )
        if current and full:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches
