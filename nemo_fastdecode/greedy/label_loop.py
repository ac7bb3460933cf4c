"""Label-looping greedy decoding (RNN-T and TDT).

Outer loop: one label per row per iteration. Inner loop: rows whose best label is blank move on
in time (by 1 frame for RNN-T, by the predicted duration for TDT) until they find a non-blank
label or run out of frames. The prediction network then runs once for the whole batch.
"""

from __future__ import annotations

import torch

from nemo_fastdecode.graphs import LoopPhases
from nemo_fastdecode.greedy.base import GreedyComputerBase
from nemo_fastdecode.greedy.state import LoopBuffers


class LabelLoopGreedy(GreedyComputerBase):
    """Label-looping greedy computer; TDT when ``durations`` are given."""

    def _phases(self, b: LoopBuffers) -> LoopPhases:
        def update_time_flags() -> None:
            torch.minimum(b.time_indices, b.last_frame, out=b.safe_time_indices)
            torch.less(b.time_indices, b.encoder_lengths, out=b.active)

        def step_time(mask: torch.Tensor, durations: torch.Tensor | None) -> None:
            """Rows in ``mask`` move on: 1 frame after blank (RNN-T); the predicted duration (TDT)."""
            if durations is None:
                b.time_indices.add_(torch.logical_and(mask, b.blank))
            else:
                # a blank never stays on its frame: duration 0 after blank counts as 1
                durations.masked_fill_(torch.logical_and(durations == 0, b.blank), 1)
                b.time_indices.add_(durations * mask)
            update_time_flags()
            torch.logical_and(b.active, b.blank, out=b.advance)
            torch.any(b.advance, dim=0, out=b.inner_flag)

        def joint_at_current_frames() -> torch.Tensor:
            frames = b.encoder_projected[b.batch_indices, b.safe_time_indices].unsqueeze(1)
            return self._joint(frames, b.predictor_output)

        def before_loop() -> None:
            b.time_indices.copy_(b.initial_time)
            torch.clamp(b.encoder_lengths - 1, min=0, out=b.last_frame)
            update_time_flags()
            self._restart_predictor(b)
            b.hyps.reset_()
            torch.any(b.active, dim=0, out=b.outer_flag)

        def outer_start() -> None:
            b.active_before.copy_(b.active)
            scores, labels, durations = self._best_labels(joint_at_current_frames())
            b.scores.copy_(scores)
            b.labels.copy_(labels)
            torch.eq(b.labels, self.blank_index, out=b.blank)
            b.label_time.copy_(b.time_indices)
            if durations is not None:
                b.durations.copy_(durations)
            step_time(b.active, None if durations is None else b.durations)

        def inner_step() -> None:
            # rows in `advance` hold a blank: look again at their new frame
            torch.where(b.advance, b.time_indices, b.label_time, out=b.label_time)
            scores, labels, durations = self._best_labels(joint_at_current_frames())
            torch.where(b.advance, labels, b.labels, out=b.labels)
            torch.where(b.advance, scores, b.scores, out=b.scores)
            if durations is not None:
                torch.where(b.advance, durations, b.durations, out=b.durations)
            torch.eq(b.labels, self.blank_index, out=b.blank)
            step_time(b.advance, None if durations is None else b.durations)

        def outer_end() -> None:
            # rows that were decoding and found a non-blank label emit it (TDT: even if it jumped past the end)
            torch.logical_and(b.active_before, torch.logical_not(b.blank), out=b.found)
            b.hyps.add_(b.found, b.labels, b.label_time, b.scores, b.durations if self.is_tdt else None)
            self._predict_masked(b, b.labels, b.found)
            if self.max_symbols is not None:
                # max_symbols labels at this frame already: emit a blank instead, i.e. move on one frame
                force_blank = b.found & (b.hyps.labels_at_last_time >= self.max_symbols)
                force_blank &= b.hyps.last_label_time == b.time_indices
                force_blank &= b.active
                b.time_indices.add_(force_blank)
                update_time_flags()
            else:
                # unbounded labels per frame: a row whose storage is full stops (the caller retries larger)
                torch.logical_and(b.active, b.hyps.lengths < b.hyps.capacity, out=b.active)
            torch.any(b.active, dim=0, out=b.outer_flag)

        return LoopPhases(before_loop, outer_start, inner_step, outer_end, b.outer_flag, b.inner_flag)
