"""Frame-looping greedy decoding for RNN-T (Galvez et al., Interspeech 2024, Algorithm 1).

Outer loop: one encoder frame for the whole batch. Inner loop: every row that has not yet emitted
blank at this frame emits its best label and advances its prediction network, up to max_symbols.
This is the algorithm of NeMo's ``greedy_batch`` with ``loop_labels=False``.
"""

from __future__ import annotations

import torch

from nemo_fastdecode.graphs import LoopPhases
from nemo_fastdecode.greedy.base import GreedyComputerBase
from nemo_fastdecode.greedy.state import LoopBuffers


class FrameLoopGreedy(GreedyComputerBase):
    """Frame-looping greedy computer (RNN-T only: TDT durations desynchronise frames, see label loop)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.is_tdt:
            raise ValueError("frame looping (loop_labels=False) is RNN-T only; TDT decodes with loop_labels=True")

    def _phases(self, b: LoopBuffers) -> LoopPhases:
        max_symbols = self.max_symbols

        def best_label_at_frame() -> None:
            scores, labels, _ = self._best_labels(self._joint(b.frame_encoder, b.predictor_output))
            b.scores.copy_(scores)
            b.labels.copy_(labels)
            # once a row has seen blank (or its end) at this frame it is done with the frame
            b.blank.logical_or_(labels == self.blank_index)
            if max_symbols is None:  # a row with full storage stops; the caller retries with more room
                b.blank.logical_or_(b.hyps.lengths >= b.hyps.capacity)
            emitting = torch.logical_not(torch.all(b.blank))
            if max_symbols is not None:
                emitting &= b.symbols_at_frame < max_symbols
            b.inner_flag.copy_(emitting)

        def before_loop() -> None:
            b.frame.zero_()
            torch.amax(b.encoder_lengths, dim=0, out=b.max_length)
            self._restart_predictor(b)
            b.hyps.reset_()
            torch.less(b.frame, b.max_length, out=b.outer_flag)

        def outer_start() -> None:
            b.symbols_at_frame.zero_()
            # index_select keeps the frame index on the GPU (indexing with a 0-d tensor would synchronise)
            torch.index_select(b.encoder_projected, 1, b.frame.view(1), out=b.frame_encoder)
            torch.greater_equal(b.frame, b.encoder_lengths, out=b.blank)
            best_label_at_frame()

        def inner_step() -> None:
            torch.logical_not(b.blank, out=b.found)
            b.hyps.add_(b.found, b.labels, b.frame.expand_as(b.labels), b.scores)
            b.symbols_at_frame.add_(1)
            self._predict_masked(b, b.labels, b.found)
            best_label_at_frame()

        def outer_end() -> None:
            b.frame.add_(1)
            torch.less(b.frame, b.max_length, out=b.outer_flag)

        return LoopPhases(before_loop, outer_start, inner_step, outer_end, b.outer_flag, b.inner_flag)
