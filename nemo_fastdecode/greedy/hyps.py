"""Pre-allocated batched hypotheses, written in place by the decoding loops, and their NeMo form."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis


class BatchedHypsBuffer:
    """Token ids, frame indices, TDT durations and scores for a batch, in fixed-size storage.

    Shapes: ``labels/timestamps/durations [B, capacity]``, ``lengths/scores [B]``. Writes past the
    capacity are clamped onto the last slot and counted in ``lengths``, so an overflow is visible
    afterwards (:meth:`overflowed`) and the caller retries with more room; nothing is dropped silently.
    """

    def __init__(self, batch_size: int, capacity: int, device: torch.device, score_dtype: torch.dtype):
        self.capacity = capacity
        self.batch_indices = torch.arange(batch_size, device=device)
        self.labels = torch.zeros([batch_size, capacity], dtype=torch.long, device=device)
        self.timestamps = torch.zeros_like(self.labels)
        self.durations = torch.zeros_like(self.labels)
        self.lengths = torch.zeros([batch_size], dtype=torch.long, device=device)
        self.scores = torch.zeros([batch_size], dtype=score_dtype, device=device)
        # frame of the last non-blank label and how many labels in a row were emitted at it (max_symbols)
        self.last_label_time = torch.full([batch_size], -1, dtype=torch.long, device=device)
        self.labels_at_last_time = torch.zeros([batch_size], dtype=torch.long, device=device)
        self.last_label = torch.full([batch_size], -1, dtype=torch.long, device=device)

    def reset_(self) -> None:
        self.lengths.zero_()
        self.scores.zero_()
        self.last_label_time.fill_(-1)
        self.labels_at_last_time.zero_()
        self.last_label.fill_(-1)

    def add_(
        self,
        mask: torch.Tensor,
        labels: torch.Tensor,
        time_indices: torch.Tensor,
        scores: torch.Tensor,
        durations: torch.Tensor | None = None,
    ) -> None:
        """Append ``labels[b]`` (non-blank) to every row ``b`` where ``mask[b]``; no host synchronisation."""
        slot = self.lengths.clamp(max=self.capacity - 1)
        # rows outside the mask write too, into a slot that only becomes valid once they emit
        self.labels.index_put_((self.batch_indices, slot), labels)
        self.timestamps.index_put_((self.batch_indices, slot), time_indices)
        if durations is not None:
            self.durations.index_put_((self.batch_indices, slot), durations)
        same_frame = self.last_label_time == time_indices
        # labels_at_last_time = mask ? (same_frame ? count + 1 : 1) : count
        torch.where(
            mask,
            torch.where(same_frame, self.labels_at_last_time + 1, 1),
            self.labels_at_last_time,
            out=self.labels_at_last_time,
        )
        torch.where(mask, time_indices, self.last_label_time, out=self.last_label_time)
        torch.where(mask, labels, self.last_label, out=self.last_label)
        # scores[mask] += step scores (accumulated in the buffer's dtype, as the baseline does)
        torch.where(mask, self.scores + scores.to(self.scores.dtype), self.scores, out=self.scores)
        self.lengths += mask

    def overflowed(self, batch_size: int) -> bool:
        """True if any of the first ``batch_size`` rows filled its storage (it may have had more to emit)."""
        return bool((self.lengths[:batch_size] >= self.capacity).any())

    def emitted(self, batch_size: int, with_durations: bool, time_offsets: torch.Tensor | None = None) -> EmittedTokens:
        """The first ``batch_size`` rows as tensors (views of this buffer, valid until it is written again)."""
        timestamps = self.timestamps[:batch_size]
        if time_offsets is not None:
            timestamps = timestamps + time_offsets[:batch_size, None]
        return EmittedTokens(
            labels=self.labels[:batch_size],
            timestamps=timestamps,
            durations=self.durations[:batch_size] if with_durations else None,
            lengths=self.lengths[:batch_size],
            scores=self.scores[:batch_size],
        )


@dataclass
class EmittedTokens:
    """Tokens of ``B`` rows, padded: row ``b`` holds ``lengths[b]`` labels (the rest is junk).

    Shapes: ``labels / timestamps / durations [B, K]`` (``durations`` only for TDT), ``lengths / scores [B]``.
    ``timestamps`` are encoder frame indices (from the stream's start where the producer added offsets).
    """

    labels: torch.Tensor
    timestamps: torch.Tensor
    durations: torch.Tensor | None
    lengths: torch.Tensor
    scores: torch.Tensor

    def to_hypotheses(self) -> list[Hypothesis]:
        """NeMo hypotheses (tensors on the CPU, like NeMo's label loop); two small host copies.

        The per-row tensors are views of one host copy of the padded block, cut by one ``split`` per field into
        alternating (row, padding) pieces: slicing each row separately had cost more host time than the copies.
        """
        # lengths and scores in one copy (scores as the bits of float64: exact for float32 too)
        summary = torch.stack([self.lengths, self.scores.to(torch.float64).view(torch.long)]).cpu()
        lengths, scores = summary[0].tolist(), summary[1].view(torch.float64).tolist()
        longest = max(lengths, default=0)
        fields = [self.labels, self.timestamps] + ([self.durations] if self.durations is not None else [])
        block = torch.stack([field[:, :longest] for field in fields]).cpu()  # [fields, B, longest]
        pieces = [size for length in lengths for size in (length, longest - length)]
        labels, timestamps, *durations = (field.reshape(-1).split(pieces)[::2] for field in block)
        durations = durations[0] if durations else [torch.empty(0)] * len(lengths)  # RNN-T: none (shared, empty)
        return [
            Hypothesis(
                score=score,
                y_sequence=y_sequence,
                timestamp=timestamp,
                token_duration=duration,
                alignments=None,
                dec_state=None,
            )
            for score, y_sequence, timestamp, duration in zip(scores, labels, timestamps, durations, strict=True)
        ]
