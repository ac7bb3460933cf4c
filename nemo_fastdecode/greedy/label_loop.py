"""Label-looping greedy decoding (RNN-T and TDT).

Outer loop: one label per row per iteration. Inner loop: rows whose best label is blank move on
in time (by 1 frame for RNN-T, by the predicted duration for TDT) until they find a non-blank
label or run out of frames. The prediction network then runs once for the whole batch.
The bookkeeping between the joint and the LSTM lives in :mod:`nemo_fastdecode.greedy.steps`.
"""

from __future__ import annotations

import contextlib

import torch

from nemo_fastdecode.graphs import GraphMode, LoopPhases
from nemo_fastdecode.greedy.base import GreedyComputerBase
from nemo_fastdecode.greedy.state import LoopBuffers
from nemo_fastdecode.greedy.steps import label_emit, label_select, update_time_flags, window_look, window_select
from nemo_fastdecode.kernels.best_token import best_token
from nemo_fastdecode.kernels.joint_hidden import joint_hidden_window
from nemo_fastdecode.kernels.window_look import WindowLookBuffers
from nemo_fastdecode.prediction import joint_normalises

# automatic look-ahead (see LabelLoopGreedy): about this many joint rows per look, at most MAX_AUTO_LOOKAHEAD_FRAMES
# frames. With fast math, RNN-T prefers wide windows (blank runs are long), TDT narrower ones (blanks jump by their
# durations, so most looks end within a few frames and wider windows only add joint rows). The exact paths (NeMo's
# Linear over the window, the exact predictor, the few-row kernel) have a flatter optimum at fewer rows, within the
# runs' noise over a range of widths. The sweeps behind these numbers: benchmarks/results/archive/
# (greedy_*_lookahead-sweep, greedy_*_exact-window, experiment_exact-predictor-variants, experiment_exact-loop-schedule).
AUTO_LOOKAHEAD_ROWS = {"rnnt": 512, "tdt": 128}
AUTO_EXACT_LOOKAHEAD_ROWS = {"rnnt": 128, "tdt": 64}
MAX_AUTO_LOOKAHEAD_FRAMES = 16


# automatic looks per iteration with CUDA graphs (0: the two-level loop); see LabelLoopGreedy. One look per
# iteration was the fastest for both RNN-T and TDT, with fast math and on the exact path, and the two-level loop the
# slowest on the exact path (benchmarks/results/archive/greedy_tdt-0.6b_H200_2026-11-23_looks-sweep.md). An
# iteration that only skips blanks runs the prediction network for nothing, but costs less than a WHILE node's
# condition evaluation (or, without WHILE nodes, a host read of the flag) and the launches around it.
AUTO_LOOKS_PER_ITERATION = {"rnnt": 1, "tdt": 1}


def auto_looks_per_iteration(mode: GraphMode, tdt: bool = False) -> int:
    """Looks per label iteration when chosen automatically (0: the two-level loop with its inner loop).

    Eager (the CPU, or graphs off) keeps the two-level loop: there the prediction network's step is real work per
    iteration, not a few launches inside a graph (on the CPU with long blank runs the two-level loop is the
    faster one)."""
    return 0 if mode is GraphMode.EAGER else AUTO_LOOKS_PER_ITERATION["tdt" if tdt else "rnnt"]


def auto_lookahead_frames(batch_size: int, tdt: bool = False, exact: bool = False) -> int:
    """Frames per look for ``batch_size`` rows when chosen automatically (1: single-frame steps); ``exact``: the
    exact path's window (IEEE fp32), else fast math's."""
    rows = (AUTO_EXACT_LOOKAHEAD_ROWS if exact else AUTO_LOOKAHEAD_ROWS)["tdt" if tdt else "rnnt"]
    return max(1, min(MAX_AUTO_LOOKAHEAD_FRAMES, rows // max(batch_size, 1)))


class LabelLoopGreedy(GreedyComputerBase):
    """Label-looping greedy computer; TDT when ``durations`` are given.

    ``lookahead_frames`` (``None``: automatic): each look at the joint (the first of an outer iteration, and the
    inner loop's while rows skip blanks) covers each row's next ``W`` frames, one joint call of ``B * W`` rows
    instead of up to ``W`` calls of ``B`` rows (:func:`~nemo_fastdecode.greedy.steps.window_select`). With
    ``fast_math`` on Triton its joint kernel is tiled as for ``B`` rows, so each row's logits are the single-frame
    look's bit for bit and the loop ends in the same state; automatic there: :func:`auto_lookahead_frames` (16 frames
    at batch 32 for RNN-T, 4 for TDT).
    With the opt-in exact predictor one IEEE-fp32 few-row GEMM computes the ``B * W`` rows, whose logits equal the
    single-frame look's to float32 rounding; automatic there: 4 frames at batch 32 for RNN-T, 2 for TDT. By default
    (NeMo's modules) looks go frame by frame, each joint call the shape of NeMo's, so its sums round as NeMo's do;
    ``lookahead_frames > 1`` asks for NeMo's Linear over the window (a GEMM of another shape: logits to float32
    rounding). Windows need the Triton step kernels (CUDA, or the interpreter) and NeMo's default joint; without
    them (``fused_kernels=False``, the CPU) looks go frame by frame.

    ``looks_per_iteration`` (``None``: by graph mode, :func:`auto_looks_per_iteration`): ``0`` runs the two-level
    loop, ``while labels: look; while blanks: look again; emit``, whose inner WHILE condition is evaluated at
    least once per label (each evaluation of a graph's conditional node leaves the GPU idle for a moment, which
    adds up over many labels). ``K >= 1`` runs one loop instead: ``while rows are active: look K times; emit``. A
    row still on blanks after its K looks emits nothing that iteration (its prediction network is not advanced)
    and goes on looking in the next, where the iteration's first look at its current frame is the look the inner loop
    would have made: every row makes the same looks and emissions as in the two-level loop, so the hypotheses
    are the same; only the batch's number of iterations and condition evaluations changes.

    Alignments and confidence (``records``) are recorded look by look inside the loop in every graph mode and for
    any ``looks_per_iteration`` (each look records the rows that make it); the look-ahead is then off.
    """

    def __init__(self, *args, lookahead_frames: int | None = None, looks_per_iteration: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if looks_per_iteration is not None and (isinstance(looks_per_iteration, bool) or looks_per_iteration < 0):
            raise ValueError(
                f"looks_per_iteration must be 0 (the two-level loop), a positive int or None (automatic), "
                f"got {looks_per_iteration!r}"
            )
        self.looks_per_iteration = None if looks_per_iteration is None else int(looks_per_iteration)
        if lookahead_frames is not None and lookahead_frames < 1:
            raise ValueError(f"lookahead_frames must be a positive int or None (automatic), got {lookahead_frames}")
        if lookahead_frames is not None and lookahead_frames > 1 and self.records.enabled:
            raise ValueError(
                f"lookahead_frames={lookahead_frames} does not keep alignments or confidence (each look is recorded "
                "frame by frame); use 1 or None"
            )
        self.lookahead_frames = lookahead_frames

    def _lookahead(self, device: torch.device, batch_size: int) -> int:
        """Frames per look in the inner loop for a batch of ``batch_size`` rows (1: single-frame steps)."""
        if self.fusion is not None:  # each look adds the fusion scores: frame by frame
            if self.lookahead_frames is not None and self.lookahead_frames > 1:
                raise ValueError(
                    f"lookahead_frames={self.lookahead_frames} does not apply n-gram LM / boosting tree fusion; use 1 "
                    "or None"
                )
            return 1
        windowed = self._use_fused(device) and self._joint_is_fusable()
        if self.lookahead_frames is not None and self.lookahead_frames > 1 and not windowed:
            raise ValueError(
                f"lookahead_frames={self.lookahead_frames} needs the Triton kernels (CUDA, or TRITON_INTERPRET=1 "
                f"with fused_kernels=True) and NeMo's default joint; got device {device}"
            )
        if self.lookahead_frames is not None:
            return self.lookahead_frames
        # automatic windows only where an opt-in arithmetic already owns the joint's output layer: NeMo's Linear over
        # B * W rows is a GEMM of another shape than NeMo's B-row look, whose sums may round otherwise; recorded looks
        # go frame by frame
        opted_in = self.fast_predictor is not None or self.exact_predictor is not None
        automatic = windowed and opted_in and not self.records.enabled
        return auto_lookahead_frames(batch_size, self.is_tdt, exact=self.fast_predictor is None) if automatic else 1

    def _extra_buffers(self, b: LoopBuffers) -> None:
        if b.predictor is not None and self._use_fused(b.device):
            layers, hidden = b.predictor.lstm.num_layers, b.predictor.lstm.hidden_size
            b.recurrent_gates = torch.empty([layers, b.batch_size, 4 * hidden], dtype=b.float_dtype, device=b.device)
            b.side_stream = torch.cuda.Stream(b.device) if b.device.type == "cuda" else None
        window = self._lookahead(b.device, b.batch_size)
        if window > 1:
            rows = b.batch_size * window
            b.window_hidden = torch.empty([rows, b.predictor_output.shape[-1]], dtype=b.float_dtype, device=b.device)
            if self.fast_predictor is not None and not joint_normalises(self.joint, b.device):
                # fast math, the logits are the scores: one kernel per look
                n_out = self.fast_predictor.joint_output_weights[0].shape[0]
                b.window_look = WindowLookBuffers.allocate(b.batch_size, window, n_out, b.device)
            else:
                b.window_scores = torch.empty([rows], dtype=torch.float32, device=b.device)
                b.window_labels = torch.empty([rows], dtype=torch.long, device=b.device)

    def _look_ahead(self, b: LoopBuffers, window: int, start: bool) -> None:
        """Up to ``window`` looks from one joint call at each row's next ``window`` frames."""
        hidden = joint_hidden_window(
            b.encoder_projected, b.time_indices, b.last_frame, b.predictor_output, b.window_hidden, window, True
        )
        num_tokens = self.blank_index + 1
        if b.window_look is not None:
            weight, bias = self.fast_predictor.joint_output_weights
            window_look(b, b.window_look, hidden, weight, bias, num_tokens, self._durations, self.blank_index, window,
                        start)  # fmt: skip
            return
        # fast math: tiled as for B rows, each row's logits the single-frame look's bit for bit; the exact path: one
        # IEEE-fp32 GEMM on the B * W rows (the single-frame look's to fp32 rounding)
        logits = self._joint_output(hidden, tile_rows=b.batch_size, predictor=b.predictor)
        scores, labels = best_token(logits, num_tokens, b.window_scores, b.window_labels, True)
        duration_logits = logits[:, num_tokens:] if self.is_tdt else None
        window_select(b, scores, labels, duration_logits, self._durations, self.blank_index, window, start)

    def _fused_best_token_at(
        self, b: LoopBuffers, fused: bool, start: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """:meth:`_best_token_at` with the fusion models' scores (:meth:`FusionModels.best_token`)."""
        num_tokens = self.blank_index + 1
        logits = self._logits_at(b, b.safe_time_indices, fused)
        scores, labels = self.fusion.best_token(b.fusion, logits, num_tokens, self.blank_index, start)
        return scores, labels, logits[:, num_tokens:] if self.is_tdt else None

    def _looks(self, mode: GraphMode) -> int:
        """Looks per iteration in ``mode`` (0: the two-level loop)."""
        if self.looks_per_iteration is not None:
            return self.looks_per_iteration
        return auto_looks_per_iteration(mode, self.is_tdt)

    def _phases(self, b: LoopBuffers, mode: GraphMode) -> LoopPhases:
        fused = self._use_fused(b.device)
        window = self._lookahead(b.device, b.batch_size)

        def look_at_current_frames(start: bool) -> None:
            if window > 1:
                self._look_ahead(b, window, start)
                return
            if b.fusion is not None:
                scores, labels, duration_logits = self._fused_best_token_at(b, fused, start)
            else:
                # the rows that look now (every active row first, then those on blanks) are the rows NeMo records
                recorded = None if b.steps is None else (b.active if start else b.advance)
                scores, labels, duration_logits = self._best_token_at(b, b.safe_time_indices, fused, recorded)
            label_select(b, scores, labels, duration_logits, self._durations, self.blank_index, start, fused)

        def before_loop() -> None:
            b.time_indices.copy_(b.initial_time)
            torch.clamp(b.encoder_lengths - 1, min=0, out=b.last_frame)
            update_time_flags(b)
            self._restart_predictor(b)
            self._reset_results(b)
            if b.fusion is not None:
                for state, initial in zip(b.fusion.states, b.fusion.initial_states, strict=True):
                    state.copy_(initial)
                b.advance.zero_()  # no row continues a search over blanks at the first iteration
            torch.any(b.active, dim=0, out=b.outer_flag)

        def outer_start() -> None:
            if b.fusion is not None:
                # the fusion models' scores from the rows' states (they change only when a row emits)
                self.fusion.advance(b.fusion)
                b.fusion.continuing.copy_(b.advance)
            if b.recurrent_gates is None:
                look_at_current_frames(start=True)
                return
            # fast math and the exact predictor: the prediction network's recurrent GEMMs need only the current
            # state, not this iteration's labels; on CUDA they run on a parallel branch while the joint and the
            # selection run (forked and joined within this phase, so every graph mode captures it whole)
            main = torch.cuda.current_stream(b.device) if b.side_stream is not None else None
            if main is not None:
                b.side_stream.wait_stream(main)
            with torch.cuda.stream(b.side_stream) if main is not None else contextlib.nullcontext():
                b.predictor.recurrent_gates(b.predictor_states, b.recurrent_gates, fused)
            look_at_current_frames(start=True)
            if main is not None:
                main.wait_stream(b.side_stream)

        def inner_step() -> None:
            # rows in `advance` hold a blank: look again at their new frame
            look_at_current_frames(start=False)

        def outer_end() -> None:
            # rows that were decoding and found a non-blank label emit it (TDT: even if it jumped past the end)
            label_emit(b, self.max_symbols, self.is_tdt, fused)
            self._predict_masked(b, b.labels, b.found, fused, b.recurrent_gates)
            if b.fusion is not None:
                self.fusion.select(b.fusion, b.labels, b.found)

        looks = self._looks(mode)
        if looks == 0:
            return LoopPhases(before_loop, outer_start, inner_step, outer_end, b.outer_flag, b.inner_flag)

        def iteration() -> None:
            # no inner loop: rows still on blanks after these looks continue in the next iteration
            outer_start()
            for _ in range(looks - 1):
                inner_step()
            outer_end()

        return LoopPhases.one_level(before_loop, iteration, b.outer_flag)
