"""Pre-allocated batched beam hypotheses (a prefix tree written in place) and their NeMo form.

Same semantics as NeMo's ``BatchedBeamHyps`` (RNN-T and TDT), whose ``to_hyps_list`` /
``to_nbest_hyps_list`` turn the result into ``Hypothesis`` / ``NBestHypotheses``: every step extends
every beam by one entry (a label, a blank, or ``-1`` for a finished hypothesis) that points to its
parent beam. Differences that make it capturable and cheaper: storage is sized once for the longest
possible search (no doubling, no host check per step), and because all beams grow together one 0-d
step counter replaces NeMo's per-beam ``current_lengths_wb`` (writes go through ``index_copy_``, never
through indexing with a 0-d tensor, which would synchronise).
"""

from __future__ import annotations

import torch
from nemo.collections.asr.parts.utils.batched_beam_decoding_utils import (
    INACTIVE_SCORE,
    NON_EXISTENT_LABEL_VALUE,
    BatchedBeamHyps,
    hash_text,
)
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis, NBestHypotheses

from nemo_fastdecode.kernels.beam_backtrack import backtrack

__all__ = ["INACTIVE_SCORE", "NON_EXISTENT_LABEL_VALUE", "PER_BEAM", "BeamHypsBuffer"]

#: The per-beam values ``[B, K]`` a search begins from and a chunk hands on to the next (with NeMo's names in
#: ``BatchedBeamState``: ``scores``, ``current_lengths_nb``, ``labels``, ``transcript_hash``,
#: ``last_timestamp_lasts``, TDT ``time_jumps``).
PER_BEAM = ("scores", "lengths", "last_label", "hashes", "labels_at_time", "next_time")


class BeamHypsBuffer:
    """Beam hypotheses of a batch in fixed-size storage, updated without host synchronisation.

    Shapes (``B`` rows, ``K`` beams, ``C`` steps of capacity): ``labels/parents/timestamps/durations
    [B, K, C]``; ``scores/lengths/last_label/hashes/next_time/labels_at_time [B, K]``; ``step`` 0-d.
    Timestamps are a label's frame (RNN-T) or its end frame (TDT, start = end - duration on export),
    as in NeMo. A step past the capacity overwrites the last slot; :meth:`full` tells the caller.

    A search begins (:meth:`begin_`) from the per-beam values in ``start`` (:data:`PER_BEAM` ``[B, K]`` each):
    the empty hypotheses (:meth:`start_empty_`), or the beams of a previous chunk (:meth:`start_from_`), whose
    scores, transcripts' hashes and lengths, last labels and labels at the current frame carry on, as in
    NeMo's ``seed_batched_hyps_from_state``. The prefix tree always begins empty: it holds this chunk's steps.
    """

    def __init__(
        self,
        batch_size: int,
        beam_size: int,
        capacity: int,
        blank_index: int,
        device: torch.device,
        float_dtype: torch.dtype,
        tdt: bool,
    ):
        self.batch_size, self.beam_size, self.capacity = batch_size, beam_size, capacity
        self.blank_index, self.tdt, self.device, self.float_dtype = blank_index, tdt, device, float_dtype
        tree_shape, beam_shape = [batch_size, beam_size, capacity], [batch_size, beam_size]
        self.labels = torch.full(tree_shape, NON_EXISTENT_LABEL_VALUE, dtype=torch.long, device=device)
        self.parents = torch.zeros(tree_shape, dtype=torch.long, device=device)
        self.timestamps = torch.zeros(tree_shape, dtype=torch.long, device=device)
        self.durations = torch.zeros(tree_shape if tdt else [0], dtype=torch.long, device=device)
        self.step = torch.zeros([], dtype=torch.long, device=device)
        self.scores = torch.zeros(beam_shape, dtype=float_dtype, device=device)
        self.lengths = torch.zeros(beam_shape, dtype=torch.long, device=device)  # non-blank labels
        self.last_label = torch.zeros(beam_shape, dtype=torch.long, device=device)
        self.hashes = torch.zeros(beam_shape, dtype=torch.long, device=device)
        self.next_time = torch.zeros(beam_shape, dtype=torch.long, device=device)
        # labels emitted at the current frame in a row (NeMo's last_timestamp_lasts; max_symbols)
        self.labels_at_time = torch.zeros(beam_shape, dtype=torch.long, device=device)
        self._beam_range = torch.arange(beam_size, device=device)
        self._last_slot = torch.tensor(capacity - 1, dtype=torch.long, device=device)
        self._inactive = torch.tensor(INACTIVE_SCORE, dtype=float_dtype, device=device)  # out= needs tensors
        self.start = {name: torch.empty_like(getattr(self, name)) for name in PER_BEAM}
        self.start_empty_()

    def start_empty_(self) -> None:
        """The next search begins with empty hypotheses: beam 0 with score 0, the other beams inactive (-inf)."""
        self.start["scores"].fill_(INACTIVE_SCORE)
        self.start["scores"][:, 0] = 0.0
        self.start["last_label"].fill_(NON_EXISTENT_LABEL_VALUE)
        for name in ("lengths", "hashes", "labels_at_time", "next_time"):
            self.start[name].zero_()

    def start_from_(self, rows: int, **values: torch.Tensor) -> None:
        """The next search continues beams: rows ``0..rows-1`` begin from ``values`` (every name of :data:`PER_BEAM`,
        ``[rows, K]`` each); the other rows keep their start values."""
        if set(values) != set(PER_BEAM):
            raise ValueError(f"start_from_ needs exactly {sorted(PER_BEAM)}, got {sorted(values)}")
        for name, value in values.items():
            self.start[name][:rows].copy_(value)

    def begin_(self) -> None:
        """Every beam at its start values (:attr:`start`), the prefix tree empty."""
        self.step.zero_()
        for name in PER_BEAM:
            getattr(self, name).copy_(self.start[name])

    def add_(
        self,
        parents: torch.Tensor,
        labels: torch.Tensor,
        scores: torch.Tensor,
        durations: torch.Tensor | None = None,
    ) -> None:
        """Extend beam ``parents[b, k]`` by ``labels[b, k]`` (``-1``: none, finished) with total ``scores``.

        All arguments ``[B, K]``; ``durations`` (TDT) are duration indices, as NeMo uses them.
        """
        slot = torch.minimum(self.step, self._last_slot).view(1)
        last_labels = torch.gather(self.last_label, -1, parents)
        self.labels.index_copy_(2, slot, labels.unsqueeze(-1))
        self.parents.index_copy_(2, slot, parents.unsqueeze(-1))
        is_extended = labels >= 0
        with_blank = labels == self.blank_index
        with_label = is_extended & ~with_blank
        times = torch.gather(self.next_time, -1, parents)
        labels_at_time = torch.gather(self.labels_at_time, -1, parents) + with_label
        if self.tdt:
            durations = torch.where(is_extended, durations, 0)
            times = times + durations
            # a label that moves on (duration > 0) starts a new frame; so does every blank
            self.labels_at_time.copy_(labels_at_time.masked_fill_(is_extended & (durations > 0), 0))
            self.durations.index_copy_(2, slot, durations.unsqueeze(-1))
        else:
            times = times + with_blank
            self.labels_at_time.copy_(labels_at_time.masked_fill_(with_blank, 0))
        self.timestamps.index_copy_(2, slot, times.unsqueeze(-1))
        self.next_time.copy_(times)
        self.lengths.copy_(torch.gather(self.lengths, -1, parents) + with_label)
        self.scores.copy_(scores)
        previous_hashes = torch.gather(self.hashes, -1, parents)
        torch.where(with_label, hash_text(previous_hashes, labels), previous_hashes, out=self.hashes)
        torch.where(with_label, labels, last_labels, out=self.last_label)
        self.step.add_(1)

    def recombine_(self) -> None:
        """Merge equal hypotheses (same transcript; TDT: same next frame): the best keeps the log-sum-exp score.

        The float operations are NeMo's (``BatchedBeamHyps.recombine_hyps_``), so scores stay bit-identical.
        """
        if self.beam_size <= 1:
            return
        equal = (
            (self.hashes[:, :, None] == self.hashes[:, None, :])
            & (self.last_label[:, :, None] == self.last_label[:, None, :])
            & (self.lengths[:, :, None] == self.lengths[:, None, :])
        )
        if self.tdt:
            equal &= self.next_time[:, :, None] == self.next_time[:, None, :]
        scores_matrix = torch.where(equal, self.scores[:, None, :].expand_as(equal), self._inactive)
        keep = self._beam_range[None, :] == scores_matrix.argmax(-1)
        merged = torch.logsumexp(scores_matrix, dim=-1)
        torch.where(keep, merged.to(self.scores.dtype), self._inactive, out=self.scores)

    def full(self) -> bool:
        """True once every slot is written (the search may have had more steps to make; host sync)."""
        return int(self.step) >= self.capacity

    def to_hypotheses(
        self, batch_size: int, score_norm: bool = True, nbest: bool = False, use_triton: bool | None = None
    ) -> list[Hypothesis] | list[NBestHypotheses]:
        """The first ``batch_size`` rows as NeMo hypotheses: what ``to_nemo(batch_size).to_hyps_list(score_norm)``
        (or ``to_nbest_hyps_list`` with ``nbest``) returns, field for field, at a fraction of its cost.

        NeMo's export walks the tree with a few gathers per step and copies every hypothesis to the host on its
        own; here the walk is one kernel (:func:`backtrack`; on CUDA) and the host receives everything in one copy.
        Beams are ranked as NeMo ranks them (the same ``torch.sort`` of the same normalised scores, so ties go
        the same way); ``nbest`` leaves out inactive beams, as NeMo does.
        """
        steps = min(int(self.step), self.capacity)
        rows = slice(0, batch_size)
        scores = self.scores[rows]
        normalised = scores / (self.lengths[rows].to(scores.dtype) + 1) if score_norm else scores
        order = torch.sort(normalised, dim=-1, descending=True)[1]
        if not nbest:
            order = order[:, :1]
        durations = self.durations[rows] if self.tdt else None
        paths = backtrack(self.labels[rows], self.parents[rows], self.timestamps[rows], durations, order, steps,
                          use_triton)  # fmt: skip
        # one device-to-host copy of every path (labels, end frames, TDT durations)
        host = torch.stack([p for p in paths if p is not None]).cpu().numpy()
        labels, end_times, durations = host[0], host[1], host[2] if self.tdt else None
        ranked_scores = torch.gather(scores, -1, order).tolist()

        def hypothesis(b: int, j: int) -> Hypothesis:
            emitted = (labels[b, j] >= 0) & (labels[b, j] != self.blank_index)
            ends = end_times[b, j][emitted]
            token_durations = durations[b, j][emitted] if durations is not None else None
            return Hypothesis(
                score=ranked_scores[b][j],
                y_sequence=labels[b, j][emitted],
                timestamp=ends - token_durations if token_durations is not None else ends,  # TDT: start frames
                token_duration=token_durations,
                alignments=None,
                dec_state=None,
            )

        if not nbest:
            return [hypothesis(b, 0) for b in range(batch_size)]
        return [
            NBestHypotheses([hypothesis(b, j) for j in range(order.shape[1]) if ranked_scores[b][j] > INACTIVE_SCORE])
            for b in range(batch_size)
        ]

    def to_nemo(self, batch_size: int) -> BatchedBeamHyps:
        """The first ``batch_size`` rows as NeMo's ``BatchedBeamHyps`` (the reference for :meth:`to_hypotheses`)."""
        steps = min(int(self.step), self.capacity)
        nemo = BatchedBeamHyps(
            batch_size=batch_size,
            beam_size=self.beam_size,
            init_length=max(steps, 1),
            blank_index=self.blank_index,
            device=self.device,
            float_dtype=self.float_dtype,
            model_type="tdt" if self.tdt else "rnnt",
        )
        rows = slice(0, batch_size)
        nemo.transcript_wb[..., :steps].copy_(self.labels[rows, :, :steps])
        nemo.transcript_wb_prev_ptr[..., :steps].copy_(self.parents[rows, :, :steps])
        nemo.timestamps[..., :steps].copy_(self.timestamps[rows, :, :steps])
        if self.tdt:
            nemo.token_durations[..., :steps].copy_(self.durations[rows, :, :steps])
        nemo.current_lengths_wb.fill_(steps)
        nemo.current_lengths_nb.copy_(self.lengths[rows])
        nemo.scores.copy_(self.scores[rows])
        nemo.last_label.copy_(self.last_label[rows])
        nemo.transcript_hash.copy_(self.hashes[rows])
        nemo.last_timestamp_lasts.copy_(self.labels_at_time[rows])
        return nemo
