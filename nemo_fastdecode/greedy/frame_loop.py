"""Frame-looping greedy decoding for RNN-T (Galvez et al., Interspeech 2024, Algorithm 1).

Outer loop: one encoder frame for the whole batch. Inner loop: every row that has not yet emitted
blank at this frame emits its best label and advances its prediction network, up to max_symbols.
This is the algorithm of NeMo's ``greedy_batch`` with ``loop_labels=False``.
The bookkeeping between the joint and the LSTM lives in :mod:`nemo_fastdecode.greedy.steps`.
"""

from __future__ import annotations

import torch

from nemo_fastdecode.graphs import GraphMode, LoopPhases
from nemo_fastdecode.greedy import steps
from nemo_fastdecode.greedy.base import GreedyComputerBase
from nemo_fastdecode.greedy.state import LoopBuffers


class FrameLoopGreedy(GreedyComputerBase):
    """Frame-looping greedy computer (RNN-T only: TDT durations desynchronise frames, see label loop).

    With alignments or confidence kept, each look selects from (and records) the joint's output as NeMo's frame
    loop does: log-softmaxed once more on the CPU and whenever confidence is kept (its ``_joint_step``).
    """

    frame_looping = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.is_tdt:
            raise ValueError("frame looping (loop_labels=False) is RNN-T only; TDT decodes with loop_labels=True")

    def _phases(self, b: LoopBuffers, mode: GraphMode) -> LoopPhases:
        fused = self._use_fused(b.device)

        def best_label_at_frame() -> None:
            recorded = None
            if b.steps is not None:
                # rows still on this frame, in a look NeMo makes (it stops looking after max_symbols labels)
                recorded = torch.logical_not(b.blank)
                if self.max_symbols is not None:
                    recorded &= b.symbols_at_frame < self.max_symbols
            scores, labels, _ = self._best_token_at(b, b.frame_indices, fused, recorded)
            steps.frame_select(b, scores, labels, self.blank_index, self.max_symbols, fused)

        def before_loop() -> None:
            b.frame.zero_()
            torch.amax(b.encoder_lengths, dim=0, out=b.max_length)
            self._restart_predictor(b)
            self._reset_results(b)
            torch.less(b.frame, b.max_length, out=b.outer_flag)

        def outer_start() -> None:
            b.symbols_at_frame.zero_()
            # rows past their end have "seen blank" at this frame already
            torch.greater_equal(b.frame, b.encoder_lengths, out=b.blank)
            best_label_at_frame()

        def inner_step() -> None:
            steps.frame_emit(b, fused)
            self._predict_masked(b, b.labels, b.found, fused)
            best_label_at_frame()

        def outer_end() -> None:
            b.frame.add_(1)
            torch.less(b.frame, b.max_length, out=b.outer_flag)

        return LoopPhases(before_loop, outer_start, inner_step, outer_end, b.outer_flag, b.inner_flag)

    def _recorded_logits(self, logits: torch.Tensor) -> torch.Tensor:
        if self.records.confidence or logits.device.type != "cuda":
            return logits.log_softmax(dim=-1)
        return logits
