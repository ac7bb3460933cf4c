"""Frame-looping greedy decoding for RNN-T (Galvez et al., Interspeech 2024, Algorithm 1).

Outer loop: one encoder frame for the whole batch. Inner loop: every row that has not yet emitted
blank at this frame emits its best label and advances its prediction network, up to max_symbols.
This is the algorithm of NeMo's ``greedy_batch`` with ``loop_labels=False``.
The bookkeeping between the joint and the LSTM lives in :mod:`nemo_fastdecode.greedy.steps`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nemo_fastdecode.decode_call import eval_mode
from nemo_fastdecode.graphs import GraphMode, LoopPhases
from nemo_fastdecode.greedy.base import GreedyComputerBase
from nemo_fastdecode.greedy.state import LoopBuffers
from nemo_fastdecode.greedy.steps import frame_emit, frame_select
from nemo_fastdecode.transducer.modules import module_device, module_dtype

PredictorStep = tuple[torch.Tensor, Sequence[torch.Tensor] | None]


class FrameLoopGreedy(GreedyComputerBase):
    """Frame-looping greedy computer (RNN-T only: TDT durations desynchronise frames, see label loop).

    Each look selects from (and records, with alignments or confidence kept) the joint's output as NeMo's frame loop
    does: log-softmaxed once more on the CPU and, with confidence kept, on CUDA too (its ``_joint_step``).

    Every row starts from the prediction network after ``<SOS>`` (blank), computed once for the batch. NeMo's frame
    loop starts rows in other ways too, which one depending on the other rows of the batch; for NeMo's prediction
    networks they are all the same start, and a prediction network for which they are not is refused
    (:func:`start_mismatch`).
    """

    frame_looping = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.is_tdt:
            raise ValueError("frame looping (loop_labels=False) is RNN-T only; TDT decodes with loop_labels=True")
        mismatch = start_mismatch(self.decoder, self.blank_index)
        if mismatch is not None:
            raise ValueError(
                f"fast_greedy's frame loop (loop_labels=False) starts every utterance from "
                f"decoder.predict(blank, decoder.initialize_state(...)); NeMo's frame loop also starts utterances "
                f"from {mismatch}, which predicts otherwise for {type(self.decoder).__name__}: NeMo's hypotheses "
                "cannot be reproduced. Use loop_labels=True (the label loop starts as NeMo's does), or strategy "
                "greedy_batch"
            )

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
            frame_select(b, scores, labels, self.blank_index, self.max_symbols, fused)

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
            frame_emit(b, fused)
            self._predict_masked(b, b.labels, b.found, fused)
            best_label_at_frame()

        def outer_end() -> None:
            b.frame.add_(1)
            torch.less(b.frame, b.max_length, out=b.outer_flag)

        return LoopPhases(before_loop, outer_start, inner_step, outer_end, b.outer_flag, b.inner_flag)

    def _logits_at(self, b: LoopBuffers, time_indices: torch.Tensor, fused: bool) -> torch.Tensor:
        """The joint's output as NeMo's frame loop selects from it (its ``_joint_step``): log-softmaxed once more on
        the CPU, whether or not the joint normalises (NeMo's ``RNNTJoint`` does on the CPU, a hand-written joint may
        not: the scores are NeMo's log-probabilities, not the raw logits). Recorded looks take it in
        :meth:`_recorded_logits`, after their confidence is measured."""
        logits = super()._logits_at(b, time_indices, fused)
        if b.steps is not None or logits.device.type == "cuda":
            return logits
        return logits.log_softmax(dim=-1)

    def _recorded_logits(self, logits: torch.Tensor) -> torch.Tensor:
        if self.records.confidence or logits.device.type != "cuda":
            return logits.log_softmax(dim=-1)
        return logits


@torch.inference_mode()
def start_mismatch(decoder: torch.nn.Module, blank_index: int) -> str | None:
    """How NeMo's frame loop may start a row differently from ours, for this prediction network (``None``: it
    cannot).

    Ours: ``decoder.predict(blank, decoder.initialize_state(...))`` for every row. NeMo's
    (``GreedyBatchedRNNTInfer._greedy_decode_blank_as_pad_loop_frames``), while no row of the batch has emitted a
    label: ``predict(None, None)`` at the first look (its ``<SOS>``), ``predict(blank, None)`` at the next frames;
    and rows that see blank when another row emits restart from ``predict(blank, state)`` with ``state`` reset by
    ``batch_copy_states(..., value=0.0)``. NeMo's ``RNNTDecoder`` (blank as padding: a zero embedding, a zero
    initial state) and ``StatelessTransducerDecoder`` give one start for all. Compared on one row in eval mode: the
    start's output and the outputs of two labels fed after it (a state that differs shows in them).
    """
    device = module_device(decoder)
    blank = torch.full([1, 1], blank_index, dtype=torch.long, device=device)

    def predict(labels: torch.Tensor | None, state: Sequence[torch.Tensor] | None) -> PredictorStep:
        output, new_state, *_ = decoder.predict(labels, state, add_sos=False, batch_size=1)
        return output, new_state

    def reset(state: Sequence[torch.Tensor] | None) -> Sequence[torch.Tensor] | None:
        if state is None:
            return None
        rows = torch.zeros([1, 1], dtype=torch.long, device=device)  # NeMo passes blank rows as nonzero() indices
        return decoder.batch_copy_states([s.clone() for s in state], None, rows, value=0.0)

    def outputs_after(start: PredictorStep) -> list[torch.Tensor]:
        """The start's output, then the outputs of (up to) two non-blank labels fed one after the other."""
        output, state = start
        seen = [output]
        for label in (label for label in (0, 1) if label != blank_index):
            output, state = predict(torch.full_like(blank, label), state)
            seen.append(output)
        return seen

    with eval_mode(decoder):
        like = torch.zeros([1, 1, 1], dtype=module_dtype(decoder), device=device)
        ours = outputs_after(predict(blank, decoder.initialize_state(like)))
        sos, blank_first = predict(None, None), predict(blank, None)
        reset_start = "predict(blank, the state of {} reset by batch_copy_states(value=0.0)) (rows that see blank)"
        nemo_starts = {
            "predict(None, None) (its <SOS>)": sos,
            "predict(blank, None) (the frames before the batch's first label)": blank_first,
            reset_start.format("<SOS>"): predict(blank, reset(sos[1])),
            reset_start.format("predict(blank, None)"): predict(blank, reset(blank_first[1])),
        }
        for name, start in nemo_starts.items():
            theirs = outputs_after(start)
            if not all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(ours, theirs, strict=True)):
                return name
    return None
