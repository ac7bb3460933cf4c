"""Label-looping greedy decoding (RNN-T and TDT).

Outer loop: one label per row per iteration. Inner loop: rows whose best label is blank move on
in time (by 1 frame for RNN-T, by the predicted duration for TDT) until they find a non-blank
label or run out of frames. The prediction network then runs once for the whole batch.
The bookkeeping between the joint and the LSTM lives in :mod:`nemo_fastdecode.greedy.steps`.
"""

from __future__ import annotations

import torch

from nemo_fastdecode.graphs import LoopPhases
from nemo_fastdecode.greedy import steps
from nemo_fastdecode.greedy.base import GreedyComputerBase
from nemo_fastdecode.greedy.state import LoopBuffers


class LabelLoopGreedy(GreedyComputerBase):
    """Label-looping greedy computer; TDT when ``durations`` are given."""

    def _phases(self, b: LoopBuffers) -> LoopPhases:
        fused = self._use_fused(b.device)

        def look_at_current_frames(start: bool) -> None:
            scores, labels, duration_logits = self._best_token_at(b, b.safe_time_indices, fused)
            steps.label_select(b, scores, labels, duration_logits, self._durations, self.blank_index, start, fused)

        def before_loop() -> None:
            b.time_indices.copy_(b.initial_time)
            torch.clamp(b.encoder_lengths - 1, min=0, out=b.last_frame)
            steps.update_time_flags(b)
            self._restart_predictor(b)
            b.hyps.reset_()
            torch.any(b.active, dim=0, out=b.outer_flag)

        def outer_start() -> None:
            look_at_current_frames(start=True)

        def inner_step() -> None:
            # rows in `advance` hold a blank: look again at their new frame
            look_at_current_frames(start=False)

        def outer_end() -> None:
            # rows that were decoding and found a non-blank label emit it (TDT: even if it jumped past the end)
            steps.label_emit(b, self.max_symbols, self.is_tdt, fused)
            self._predict_masked(b, b.labels, b.found, fused)

        return LoopPhases(before_loop, outer_start, inner_step, outer_end, b.outer_flag, b.inner_flag)
