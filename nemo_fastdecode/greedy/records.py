"""Per-step records of the greedy loops: NeMo's alignments and frame / step confidence.

NeMo's greedy decoders can keep, for every look at the joint (blank steps included), the joint's output and
the label it chose (``preserve_alignments``) and a confidence score of that step (``preserve_frame_confidence``).
The loops here append each look to a :class:`StepRecords` buffer, pre-allocated with the other loop buffers
and written in place (``index_put_`` at each row's length, no host synchronisation), so the same code runs
eagerly, as phase graphs and inside WHILE nodes. After the loop, :meth:`StepRecords.fill_hypotheses` gives each
``Hypothesis`` the fields NeMo's decoder of the same algorithm fills, in its layout and types:

- label loop (``GreedyBatchedRNNTLabelLoopingComputer`` / ``GreedyBatchedTDTLabelLoopingComputer`` and
  ``rnnt_utils.batched_hyps_to_hypotheses``): ``non_blank_step_confidence_precomputed`` (floats); with every step
  recorded (alignments, or confidence with blanks), ``alignments[t] = [(logits, label), ...]`` and
  ``frame_confidence[t] = [0-d tensor, ...]``, one list per visited frame;
- frame loop (``GreedyBatchedRNNTInfer._greedy_decode_blank_as_pad_loop_frames``): ``alignments`` as above (one
  list per frame), ``frame_confidence[t] = [float, ...]``, nothing precomputed.

Confidence is NeMo's own measure (``ConfidenceMethodMixin``) of the log-softmax of the joint's output. The
records reach the hypotheses of a computer's ``__call__`` (NeMo's decoding entry point); the batched streaming
entry points return tokens only.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from nemo.collections.asr.parts.utils.asr_confidence_utils import ConfidenceMethodMixin
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis


@dataclass(frozen=True)
class RecordOptions:
    """What a greedy computer records per step; NeMo's options of the same names.

    Attributes:
        alignments: ``preserve_alignments``: the joint's output and the chosen label of every step.
        confidence: ``preserve_frame_confidence``: a confidence score per step.
        exclude_blank: ``exclude_blank_from_confidence``: confidence of non-blank steps only (blank steps are
            then kept only for alignments).
        duration_confidence: TDT ``include_duration_confidence``: each step's confidence is a pair (token,
            duration).
        confidence_method_cfg: NeMo's ``ConfidenceMethodConfig`` (``None``: its defaults).
    """

    alignments: bool = False
    confidence: bool = False
    exclude_blank: bool = False
    duration_confidence: bool = False
    confidence_method_cfg: Mapping[str, Any] | None = None

    @property
    def enabled(self) -> bool:
        return self.alignments or self.confidence

    @property
    def all_steps(self) -> bool:
        """Whether the hypotheses get per-frame lists (NeMo's ``record_all_steps``)."""
        return self.alignments or (self.confidence and not self.exclude_blank)


class StepConfidence(ConfidenceMethodMixin):
    """NeMo's per-step confidence of joint outputs ``[B, N]``: ``[B]``, or ``[B, 2]`` with TDT duration confidence.

    As NeMo's label-looping computers compute it (``_get_step_confidence``): the measure of the log-softmax over
    the tokens and blank (TDT: and over the durations), cast back to the logits' dtype.
    """

    def __init__(self, method_cfg: Mapping[str, Any] | None, blank_index: int, duration_confidence: bool = False):
        self._blank_index = blank_index
        self.duration_confidence = duration_confidence
        self._init_confidence_method(method_cfg)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        num_tokens = self._blank_index + 1
        tokens = self._get_confidence_tensor(F.log_softmax(logits[:, :num_tokens], dim=-1)).to(logits.dtype)
        if not self.duration_confidence:
            return tokens
        durations = self._get_confidence_tensor(F.log_softmax(logits[:, num_tokens:], dim=-1)).to(logits.dtype)
        return torch.stack((tokens, durations), dim=-1)


class StepRecords:
    """Every recorded step of a batch's rows, in fixed-size storage.

    Shapes: ``labels / timestamps [B, capacity]``, ``lengths [B]``; ``confidence [B, capacity]`` (``[B, capacity, 2]``
    with duration confidence) or ``None``; ``logits [B, capacity, N]`` or ``None``. As in
    :class:`~nemo_fastdecode.greedy.hyps.BatchedHypsBuffer`, writes past the capacity land on the last slot; the
    hypotheses' own overflow check covers them (a row records at most one blank step per frame besides its labels).
    """

    def __init__(
        self,
        batch_size: int,
        capacity: int,
        device: torch.device,
        float_dtype: torch.dtype,
        logits_dim: int | None,
        confidence_shape: tuple[int, ...] | None,
    ):
        self.capacity = capacity
        self.batch_indices = torch.arange(batch_size, device=device)
        self.labels = torch.zeros([batch_size, capacity], dtype=torch.long, device=device)
        self.timestamps = torch.zeros_like(self.labels)
        self.lengths = torch.zeros([batch_size], dtype=torch.long, device=device)
        self.logits = None
        if logits_dim is not None:
            self.logits = torch.zeros([batch_size, capacity, logits_dim], dtype=float_dtype, device=device)
        self.confidence = None
        if confidence_shape is not None:
            self.confidence = torch.zeros([batch_size, capacity, *confidence_shape], dtype=float_dtype, device=device)

    def reset_(self) -> None:
        self.lengths.zero_()

    def add_(
        self,
        mask: torch.Tensor,
        labels: torch.Tensor,
        time_indices: torch.Tensor,
        logits: torch.Tensor | None,
        confidence: torch.Tensor | None,
    ) -> None:
        """Append a step to every row ``b`` where ``mask[b]``: ``labels [B]`` at frames ``time_indices [B]``, the
        joint's output ``logits [B, N]`` and ``confidence [B]`` (or ``[B, 2]``) where kept. No host synchronisation."""
        slot = self.lengths.clamp(max=self.capacity - 1)
        # rows outside the mask write too, into a slot that only becomes valid once they record
        index = (self.batch_indices, slot)
        self.labels.index_put_(index, labels)
        self.timestamps.index_put_(index, time_indices.expand_as(labels))
        if self.logits is not None:
            self.logits.index_put_(index, logits.to(self.logits.dtype))
        if self.confidence is not None:
            self.confidence.index_put_(index, confidence)
        self.lengths += mask

    def fill_hypotheses(
        self, hyps: list[Hypothesis], options: RecordOptions, blank_index: int, frame_loop: bool
    ) -> None:
        """Give each hypothesis (row ``b`` of the batch) the fields NeMo's decoder fills (see the module doc).

        ``frame_loop``: NeMo's frame-looping layout (confidence as floats, nothing precomputed); otherwise its
        label-looping layout.
        """
        lengths = self.lengths[: len(hyps)].cpu().tolist()
        longest = max(lengths, default=0)
        labels = self.labels[: len(hyps), :longest].cpu()
        timestamps = self.timestamps[: len(hyps), :longest].cpu()
        logits = self.logits[: len(hyps), :longest].cpu() if options.alignments else None
        confidence = self.confidence[: len(hyps), :longest].cpu() if options.confidence else None
        for row, (hyp, length) in enumerate(zip(hyps, lengths, strict=True)):
            if confidence is not None and not frame_loop:
                non_blank = (labels[row, :length] != blank_index).nonzero()[:, 0]
                hyp.non_blank_step_confidence_precomputed = confidence[row, non_blank].tolist()
            if not (options.all_steps or frame_loop):
                continue
            # one list per frame the row visited, in order (NeMo groups consecutive timestamps)
            counts = torch.unique_consecutive(timestamps[row, :length], return_counts=True)[1].tolist()
            ends = itertools.accumulate(counts)
            steps = [range(end - count, end) for end, count in zip(ends, counts, strict=True)]
            if options.alignments:
                hyp.alignments = [[(logits[row, k], labels[row, k]) for k in frame] for frame in steps]
            if confidence is not None:
                values = confidence[row].tolist() if frame_loop else confidence[row]
                hyp.frame_confidence = [[values[k] for k in frame] for frame in steps]
