"""Shared machinery of the greedy computers: buffers, graph lifetime, prediction and joint steps.

Subclasses (frame loop, label loop) only define the four loop phases. Every phase is written with
in-place, non-synchronising tensor ops (``torch.where(..., out=)`` for masked updates), so the
same code runs eagerly, as phase graphs and inside WHILE nodes. That includes NeMo's alignments and
step confidence when asked for (:mod:`nemo_fastdecode.greedy.records`): each look at the joint is
appended to pre-allocated step records inside the loop, in every graph mode; without them the loops
run no recording op at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from nemo.collections.asr.parts.submodules.transducer_decoding.label_looping_base import LabelLoopingStateItem
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis

from nemo_fastdecode.config import require_label_loop
from nemo_fastdecode.graphs import GraphMode, LoopPhases, TwoLevelLoop, choose_graph_mode
from nemo_fastdecode.graphs.owner import CapturedLoopOwner
from nemo_fastdecode.greedy.hyps import EmittedTokens
from nemo_fastdecode.greedy.records import RecordOptions, StepConfidence, StepRecords
from nemo_fastdecode.greedy.state import BatchedGreedyState, LoopBuffers
from nemo_fastdecode.kernels import triton_runs_on
from nemo_fastdecode.kernels.best_token import best_token
from nemo_fastdecode.kernels.joint_hidden import joint_hidden
from nemo_fastdecode.kernels.masked_state import masked_state_update
from nemo_fastdecode.kernels.warm_up import finish_triton_warm_up
from nemo_fastdecode.logs import logger
from nemo_fastdecode.prediction import (
    ExactPredictor,
    FastMathPredictor,
    decode_precision,
    fast_math_unsupported_reason,
    is_default_joint,
    normalise_joint_logits,
)
from nemo_fastdecode.transducer.fusion import FusionModels
from nemo_fastdecode.transducer.modules import check_blank_is_last_token, module_dtype, predictor_state_batch_dim

# With max_symbols=None the number of labels per frame is unbounded: start with this many slots per
# frame and grow (re-running the batch) when a row overflows; past the limit the model is not emitting
# blank at all and we stop with an error instead of looping forever.
UNBOUNDED_SYMBOLS_START = 2
UNBOUNDED_SYMBOLS_LIMIT = 1024


class GreedyComputerBase(CapturedLoopOwner):
    """Batched exact greedy decoding of a transducer; ``__call__`` returns NeMo hypotheses.

    Args:
        decoder: NeMo prediction network with ``blank_as_pad=True``: ``RNNTDecoder`` (LSTM) or
            ``StatelessTransducerDecoder``; its state is updated through its own ``batch_replace_states_mask``.
        joint: NeMo ``RNNTJoint``.
        blank_index: id of blank (= vocabulary size).
        max_symbols: at most this many labels per encoder frame; ``None`` for no limit.
        durations: TDT durations (e.g. ``[0, 1, 2, 3, 4]``), ``None`` for RNN-T.
        use_cuda_graphs: allow CUDA graphs on CUDA devices.
        graph_mode: force a :class:`GraphMode` (tests); ``None`` chooses automatically.
        fused_kernels: use the fused Triton step kernels (:mod:`nemo_fastdecode.greedy.steps`); ``None``: on
            CUDA. They are bit-identical to the torch ops they replace; ``True`` on the CPU needs
            ``TRITON_INTERPRET=1`` (tests). The prediction-network state update is fused for LSTM states only;
            other states (stateless networks) take the decoder's own masked update.
        fast_math: run the prediction network and the joint's output layer on near-fp32 tensor-core kernels
            (:class:`~nemo_fastdecode.prediction.FastMathPredictor`): faster, not bit-identical to NeMo. LSTM
            prediction networks only (a ValueError names the option for others).
        exact_predictor: opt-in, label loop without ``fast_math``: run the prediction network's step as
            :class:`~nemo_fastdecode.prediction.ExactPredictor` (IEEE fp32, its recurrent GEMMs beside the joint's
            look) for float32 decodes with the fused kernels (CUDA, or the Triton interpreter in tests); its scores
            agree with NeMo's modules to float32 rounding, so a near-tie may break the other way. A ValueError names
            networks it does not cover. ``False`` (default): NeMo's modules (``decoder.predict``,
            ``joint.project_prednet``), NeMo's bits.
        records: NeMo's alignments and step confidence to keep (:class:`RecordOptions`; ``None``: none).
        fusion: n-gram LM / boosting-tree fusion (:class:`~nemo_fastdecode.transducer.fusion.FusionModels`; label loop
            only, without records). Graphs need every model's ``advance`` capturable (NeMo's Triton kernels);
            otherwise the loop runs eagerly.
    """

    #: the hypotheses' alignments and confidence in the layout of NeMo's frame loop (else its label loop)
    frame_looping = False

    def __init__(
        self,
        decoder: torch.nn.Module,
        joint: torch.nn.Module,
        blank_index: int,
        max_symbols: int | None,
        durations: Sequence[int] | None = None,
        use_cuda_graphs: bool = True,
        graph_mode: GraphMode | None = None,
        fused_kernels: bool | None = None,
        fast_math: bool = False,
        records: RecordOptions | None = None,
        fusion: FusionModels | None = None,
        exact_predictor: bool = False,
    ):
        if max_symbols is not None and max_symbols <= 0:
            raise ValueError(f"max_symbols must be a positive int or None, got {max_symbols}")
        if not getattr(decoder, "blank_as_pad", False):
            raise ValueError(
                f"fast_greedy needs a prediction network with blank_as_pad=True (NeMo's default); "
                f"{type(decoder).__name__} has blank_as_pad=False: use strategy greedy_batch"
            )
        self.decoder, self.joint = decoder, joint
        check_blank_is_last_token(joint, blank_index, len(durations or []))
        self.state_batch_dim = predictor_state_batch_dim(decoder)
        self.blank_index, self.max_symbols = blank_index, max_symbols
        self.durations_list = list(durations) if durations else None
        self.use_cuda_graphs = use_cuda_graphs
        self.forced_mode = graph_mode
        self.fused_kernels = fused_kernels
        self.fast_predictor = FastMathPredictor(decoder, joint) if fast_math else None
        self.exact_predictor = self._build_exact_predictor(exact_predictor)
        self._buffers: LoopBuffers | None = None
        self._loop: TwoLevelLoop | None = None
        self._durations: torch.Tensor | None = None
        self._symbols_per_frame = max_symbols or UNBOUNDED_SYMBOLS_START
        self.records = records or RecordOptions()
        self._step_confidence = (
            StepConfidence(self.records.confidence_method_cfg, blank_index, self.records.duration_confidence)
            if self.records.confidence
            else None
        )
        if self.records.duration_confidence and not self.is_tdt:
            raise ValueError("duration confidence (include_duration_confidence) needs a TDT model (durations)")
        self.fusion = fusion
        if fusion is not None:
            self._check_fusion(fusion)

    def _check_fusion(self, fusion: FusionModels) -> None:
        """Fusion runs in the label loop without records; graphs only where the models' calls can be captured."""
        require_label_loop(["fusion_models"], not self.frame_looping)
        if self.records.enabled:
            raise ValueError(
                "n-gram LM / boosting tree fusion or per-stream biasing with alignments or confidence "
                "(preserve_alignments / preserve_frame_confidence) is not supported by fast_greedy; use strategy "
                "greedy_batch"
            )
        fusion.check_vocabulary(self.blank_index)
        self.use_cuda_graphs = fusion.allow_graphs(self.forced_mode, self.use_cuda_graphs, "greedy decoding")

    # ----- configuration -------------------------------------------------------------------
    def _build_exact_predictor(self, option: bool) -> ExactPredictor | None:
        """The exact predictor this computer runs where it applies (``None``: NeMo's modules always)."""
        if not option:
            return None
        if self.frame_looping:
            raise ValueError("exact_predictor needs the label-looping algorithm (loop_labels=True)")
        if self.fast_predictor is not None:
            return None  # fast math has its own predictor
        reason = fast_math_unsupported_reason(self.decoder, self.joint)
        if reason is not None:
            raise ValueError(f"exact_predictor=True: {reason.replace('fast_math', 'the exact predictor')}")
        return ExactPredictor(self.decoder, self.joint)

    def _predictor_for(self, device: torch.device, dtype: torch.dtype) -> FastMathPredictor | None:
        """The predictor a decode on ``device`` in ``dtype`` runs: fast math's, the exact one, or ``None`` (NeMo's
        modules, in the caller's precision and mode, as NeMo's decoders run them)."""
        if self.fast_predictor is not None:  # fast math decodes in fp32 whatever the caller's autocast
            return self.fast_predictor
        predictor = self.exact_predictor
        if predictor is None:
            return None
        if not self._use_fused(device):
            raise ValueError(
                f"exact_predictor=True needs the fused Triton kernels (CUDA, or TRITON_INTERPRET=1 with "
                f"fused_kernels=True); got device {device}, fused_kernels={self.fused_kernels}"
            )
        if dtype != torch.float32 or torch.is_autocast_enabled(device.type):
            return None
        if self.decoder.training or self.joint.training:
            return None
        return predictor

    @property
    def is_tdt(self) -> bool:
        return self.durations_list is not None

    def score_dtype(self, float_dtype: torch.dtype) -> torch.dtype:
        """Scores accumulate as NeMo's loop of the same kind: its RNN-T frame loop adds Python floats, its label
        loops (RNN-T and TDT) add in the decode's float dtype (``float_dtype``: bf16 with bf16 weights)."""
        return torch.float64 if self.frame_looping and not self.is_tdt else float_dtype

    # ----- phases: defined by the algorithm ------------------------------------------------
    def _phases(self, buffers: LoopBuffers, mode: GraphMode) -> LoopPhases:
        """The loop's phases on these buffers, for a loop run in ``mode`` (which may shape the loop)."""
        raise NotImplementedError

    # ----- shared steps used by the phases -------------------------------------------------
    def _use_fused(self, device: torch.device) -> bool:
        if self.fused_kernels is False:
            return False
        available = triton_runs_on(device)
        if self.fused_kernels and not available:
            raise ValueError(f"fused_kernels=True needs a CUDA device or TRITON_INTERPRET=1, got {device}")
        return available and (self.fused_kernels or device.type == "cuda")

    def _joint_is_fusable(self) -> bool:
        """The fused joint covers NeMo's default joint: ReLU, (dropout), Linear, no adapters, eval mode."""
        return is_default_joint(self.joint) and not self.joint.training

    def _logits_at(self, b: LoopBuffers, time_indices: torch.Tensor, fused: bool) -> torch.Tensor:
        """Joint logits ``[B, V + 1 (+ durations)]`` of each row's frame ``time_indices[b]`` and predictor output."""
        if fused and b.encoder_projected.dtype == b.predictor_output.dtype and self._joint_is_fusable():
            hidden = joint_hidden(b.encoder_projected, time_indices, b.predictor_output, b.joint_hidden, True)
            return self._joint_output(hidden, predictor=b.predictor)
        frames = b.encoder_projected[b.batch_indices, time_indices].unsqueeze(1)
        return self.joint.joint_after_projection(frames, b.predictor_output)[:, 0, 0, :]

    def _joint_output(
        self, hidden: torch.Tensor, tile_rows: int | None = None, predictor: FastMathPredictor | None = None
    ) -> torch.Tensor:
        """The joint's last layer and output normalisation, as ``RNNTJoint.joint_after_projection`` applies them.

        ``predictor``: the decode's predictor (``LoopBuffers.predictor``), whose output layer runs (fast math's
        3xTF32 kernel, the exact predictor's IEEE-fp32 one); ``None``: NeMo's Linear. ``tile_rows``: fast math's
        kernel tiled as for that many rows (a look-ahead window's rows then come out bit for bit as in the
        single-frame look).
        """
        if predictor is not None:  # prepare() checked float32 before the decode
            logits = predictor.joint_output(hidden, tile_rows=tile_rows)
        else:
            logits = self.joint.joint_net[-1](hidden)
        return normalise_joint_logits(self.joint, logits)

    def _best_token_at(
        self, b: LoopBuffers, time_indices: torch.Tensor, fused: bool, recorded: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Best token's score and label ``[B]`` at each row's frame, and the TDT duration logits (``None``: RNN-T).

        ``recorded`` ``[B]``: rows whose look is appended to ``b.steps`` (``None``: nothing is recorded).
        """
        num_tokens = self.blank_index + 1
        logits = self._logits_at(b, time_indices, fused)
        if recorded is None:
            scores, labels = best_token(logits, num_tokens, b.token_scores, b.token_labels, fused)
        else:
            confidence = self._step_confidence(logits) if self._step_confidence is not None else None
            logits = self._recorded_logits(logits)
            scores, labels = best_token(logits, num_tokens, b.token_scores, b.token_labels, fused)
            b.steps.add_(recorded, labels, time_indices, logits, confidence)
        return scores, labels, logits[:, num_tokens:] if self.is_tdt else None

    def _recorded_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The joint's output as the NeMo decoder of this algorithm selects from and records it, when recording."""
        return logits

    def _predict_masked(
        self,
        buffers: LoopBuffers,
        labels: torch.Tensor,
        mask: torch.Tensor,
        fused: bool,
        recurrent_gates: torch.Tensor | None = None,
    ) -> None:
        """Advance the prediction network by ``labels`` for rows in ``mask``; others keep their state.

        ``recurrent_gates``: with a fast-math or exact predictor (``buffers.predictor``),
        :meth:`FastMathPredictor.recurrent_gates` of the current state (then the rows are updated in place by the
        kernels, with no separate masked copy).
        """
        if recurrent_gates is not None:
            buffers.predictor.advance_in_place(
                labels, mask, buffers.predictor_states, buffers.predictor_output, recurrent_gates, fused
            )
            return
        if buffers.predictor is not None:
            output, new_states = buffers.predictor.step(labels, buffers.predictor_states, fused, recurrent_gates)
        else:
            output, new_states, *_ = self.decoder.predict(
                labels.unsqueeze(1), buffers.predictor_states, add_sos=False, batch_size=buffers.batch_size
            )
            output = self.joint.project_prednet(output)
        # same as: states[mask] = new_states[mask] (in the decoder's layout); predictor_output[mask] = output[mask]
        masked_state_update(
            mask,
            buffers.predictor_states,
            list(new_states),
            buffers.predictor_output,
            output,
            fused and self.state_batch_dim == 1,  # the kernel covers LSTM states [L, B, H]
            replace_states=self.decoder.batch_replace_states_mask,
        )

    def _extra_buffers(self, buffers: LoopBuffers) -> None:
        """Buffers a loop needs beyond :class:`LoopBuffers` (allocated with them)."""

    def _reset_results(self, buffers: LoopBuffers) -> None:
        """Empty the hypotheses (and the step records) before a loop."""
        buffers.hyps.reset_()
        if buffers.steps is not None:
            buffers.steps.reset_()

    def _restart_predictor(self, buffers: LoopBuffers) -> None:
        for state, initial in zip(buffers.predictor_states, buffers.initial_predictor_states, strict=True):
            state.copy_(initial)
        buffers.predictor_output.copy_(buffers.initial_predictor_output)

    # ----- buffers and graph lifetime ------------------------------------------------------
    def _capacity(self, max_time: int) -> int:
        return max(max_time, 1) * self._symbols_per_frame + 1

    def _prepare(self, batch_size: int, max_time: int, hidden: int, device: torch.device, dtype: torch.dtype):
        finish_triton_warm_up()
        mode = choose_graph_mode(device, self.use_cuda_graphs, self.forced_mode)
        capacity = self._capacity(max_time)
        if mode is GraphMode.EAGER:
            # eager runs at the exact batch shape: nothing to keep between calls
            buffers = self._allocate(batch_size, max_time, hidden, capacity, device, dtype)
            return buffers, TwoLevelLoop(self._phases(buffers, mode), mode)
        if self._buffers is not None and self._buffers.predictor is not self._predictor_for(device, dtype):
            self.reset_graphs()  # the predictor shapes the loop's buffers and phases (e.g. autocast turned on)
        if self._buffers is None or not self._buffers.fits(batch_size, max_time, capacity, device, dtype):
            old = self._buffers if self._buffers is not None and self._buffers.device == device else None
            grown_batch, grown_time = self._next_shape(old, batch_size, max_time)
            self._buffers = self._allocate(grown_batch, grown_time, hidden, self._capacity(grown_time), device, dtype)
            self._loop = TwoLevelLoop(self._phases(self._buffers, mode), mode)
            logger.debug(
                "nemo_fastdecode: greedy %s graphs sized for %d x %d frames", mode.value, grown_batch, grown_time
            )
        return self._buffers, self._loop

    def _allocate(self, batch_size, max_time, hidden, capacity, device, dtype) -> LoopBuffers:
        buffers = LoopBuffers(batch_size, max_time, hidden, capacity, device, dtype, self.score_dtype(dtype))
        buffers.predictor = self._predictor_for(device, dtype)
        if self.records.enabled:
            buffers.steps = self._step_records(batch_size, max_time, capacity, device, dtype)
        if self.fusion is not None:
            buffers.fusion = self.fusion.allocate(batch_size, device, dtype)  # scores are added to the logits
        self._extra_buffers(buffers)
        if self.is_tdt:
            self._durations = torch.tensor(self.durations_list, dtype=torch.long, device=device)
        # the prediction network's output after <SOS> (blank) is every fresh row's starting point
        sos = self.initial_state(batch_size, device, dtype)
        buffers.initial_predictor_states = [s.clone() for s in sos.predictor_states]
        buffers.predictor_states = [s.clone() for s in sos.predictor_states]
        buffers.initial_predictor_output.copy_(sos.predictor_outputs)
        buffers.sos_predictor_states = sos.predictor_states
        buffers.sos_predictor_output.copy_(sos.predictor_outputs)
        return buffers

    def _step_records(
        self, batch_size: int, max_time: int, capacity: int, device: torch.device, dtype: torch.dtype
    ) -> StepRecords:
        # the labels (at most `capacity`, else the hypotheses overflow) and at most one blank look per frame
        capacity += max(max_time, 1)
        logits_dim = self.blank_index + 1 + len(self.durations_list or [])
        confidence_shape = ((2,) if self.records.duration_confidence else ()) if self.records.confidence else None
        return StepRecords(
            batch_size, capacity, device, dtype, logits_dim if self.records.alignments else None, confidence_shape
        )

    @torch.no_grad()
    def initial_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> BatchedGreedyState:
        """The state of ``batch_size`` fresh rows: the prediction network after ``<SOS>`` (blank), nothing decoded.

        Continuing from it (:meth:`decode_with_state`) is the same as decoding from scratch: rows with no
        decoded frames start from the ``<SOS>`` state computed with the batch they decode in.
        """
        like = torch.zeros([batch_size, 1, 1], dtype=dtype, device=device)
        sos = torch.full([batch_size, 1], self.blank_index, dtype=torch.long, device=device)
        output, sos_state, *_ = self.decoder.predict(
            sos, self.decoder.initialize_state(like), add_sos=False, batch_size=batch_size
        )
        zeros = torch.zeros([batch_size], dtype=torch.long, device=device)
        return BatchedGreedyState(
            predictor_states=list(sos_state),
            predictor_outputs=self.joint.project_prednet(output).to(dtype),
            labels=sos[:, 0],
            decoded_lengths=zeros,
            time_jumps=zeros.clone() if self.is_tdt else None,
            fusion_states_list=([] if self.fusion is None else self.fusion.initial_states(batch_size, device)),
            state_batch_dim=self.state_batch_dim,
        )

    def prepare_reserved(self, device: torch.device, dtype: torch.dtype) -> None:
        """Allocate the buffers and capture the graphs at the size :meth:`reserve` asked for now: a decode of one
        frame of zeros, its result dropped. Run it in the precision (autocast) of the decodes to come, whose
        buffers it then is: the offline path does it while the first batch's audio is read. A no-op while buffers
        are kept (:meth:`reserve` drops those smaller than it asks for)."""
        encoder_dim = getattr(self.joint, "encoder_hidden", None)
        if self._buffers is not None or encoder_dim is None:
            return  # already sized, or not NeMo's joint (the first decode sizes the buffers)
        frames = torch.zeros(1, 1, int(encoder_dim), device=device, dtype=dtype)
        self(frames, torch.ones(1, dtype=torch.long, device=device))

    # ----- public entry points -------------------------------------------------------------
    @torch.inference_mode()
    def __call__(
        self,
        encoder_output: torch.Tensor,
        encoder_lengths: torch.Tensor,
        previous_states: Sequence[LabelLoopingStateItem | None] | None = None,
        with_durations: bool = True,
        model_ids: torch.Tensor | None = None,
    ) -> list[Hypothesis]:
        """Decode a batch.

        Args:
            encoder_output: ``[B, T, D]`` encoder output (time-major per row).
            encoder_lengths: ``[B]`` valid frames per row (0 allowed).
            previous_states: per row, the state a previous chunk ended in (``None``: start fresh); NeMo's
                label-looping greedy decoding makes the same items, so a stream may switch between the two.
            with_durations: TDT: fill ``Hypothesis.token_duration`` (else it is empty, as for RNN-T).
            model_ids: ``[B]`` int64, with per-row boosting (``FusionModels.per_row``): each row's tree (``-1``:
                none); ``None``: no row has one.

        Returns:
            ``B`` hypotheses; each ``dec_state`` is NeMo's ``LabelLoopingStateItem`` to continue from.
        """
        batch_size = encoder_output.shape[0]
        rows = [row for row, item in enumerate(previous_states or []) if item is not None]
        items = [previous_states[row] for row in rows]
        previous = BatchedGreedyState.stack(items, self.state_batch_dim) if rows else None
        row_ids = torch.tensor(rows, dtype=torch.long, device=encoder_output.device) if rows else None
        buffers = self._decode(encoder_output, encoder_lengths, previous, row_ids, model_ids)
        state = self._final_state(buffers, batch_size, encoder_lengths, previous, row_ids)
        # the per-row states need no results on the host: built while the GPU still runs the loop
        items = state.final.split()
        offsets = state.offsets if previous is not None else None  # zeros otherwise: skip the addition
        emitted = buffers.hyps.emitted(batch_size, self.is_tdt and with_durations, offsets)
        hyps = emitted.to_hypotheses()  # the first host synchronisation of the decode
        if buffers.steps is not None:
            buffers.steps.fill_hypotheses(hyps, self.records, self.blank_index, self.frame_looping)
        for hyp, item in zip(hyps, items, strict=True):
            hyp.dec_state = item
        return hyps

    @torch.inference_mode()
    def decode_with_state(
        self,
        encoder_output: torch.Tensor,
        encoder_lengths: torch.Tensor,
        state: BatchedGreedyState,
        model_ids: torch.Tensor | None = None,
    ) -> tuple[BatchedGreedyState, EmittedTokens]:
        """Continue every row from a batched state: the streaming entry point (no per-row Python work).

        Args:
            encoder_output: ``[B, T, D]`` the chunk's encoder output (time-major per row).
            encoder_lengths: ``[B]`` valid frames per row (0 allowed: the row keeps its state).
            state: ``B`` rows to continue from (fresh rows: :meth:`initial_state`), on the output's device.
            model_ids: ``[B]`` int64, with per-row boosting (``FusionModels.per_row``): each row's tree (``-1``:
                none); ``None``: no row has one.

        Returns:
            ``(final state, emitted tokens)``, both of ``B`` rows: the state to continue the next chunk from,
            and this chunk's tokens with timestamps counted from each row's start (``state.decoded_lengths``).
            Both may be views of this computer's buffers: valid until its next call (copy or scatter them).
        """
        batch_size = encoder_output.shape[0]
        if state.batch_size != batch_size:
            raise ValueError(f"state has {state.batch_size} rows for a batch of {batch_size}")
        buffers = self._decode(encoder_output, encoder_lengths, state, None, model_ids)
        return self.state_after(buffers, batch_size, encoder_lengths, state)

    @property
    def loop_buffers(self) -> LoopBuffers | None:
        """The buffers the loop (and its graph) run on now; re-allocated when a larger batch or input comes."""
        return self._buffers

    @torch.inference_mode()
    def load_with_state(
        self,
        encoder_output: torch.Tensor,
        encoder_lengths: torch.Tensor,
        state: BatchedGreedyState,
        model_ids: torch.Tensor | None = None,
    ) -> tuple[LoopBuffers, TwoLevelLoop]:
        """:meth:`decode_with_state` in parts, for callers that capture the parts around the loop in CUDA graphs:
        ``buffers, loop = load_with_state(...)``, ``loop.run()``, ``state_after(buffers, ...)``.

        This part projects the encoder output and loads it and ``state`` into the loop's buffers; it only
        launches device work (no host synchronisation). Needs ``max_symbols`` (without it the loop may have to
        run again with more room, which :meth:`decode_with_state` decides on the host).
        """
        if self.max_symbols is None:
            raise ValueError("load_with_state needs max_symbols (None may re-run the loop); use decode_with_state")
        if state.batch_size != encoder_output.shape[0]:
            raise ValueError(f"state has {state.batch_size} rows for a batch of {encoder_output.shape[0]}")
        precision, encoder_output = self._decode_precision(encoder_output)
        with precision:
            return self._load(self._project(encoder_output), encoder_lengths, state, None, model_ids)

    @torch.inference_mode()
    def state_after(
        self, buffers: LoopBuffers, batch_size: int, encoder_lengths: torch.Tensor, state: BatchedGreedyState
    ) -> tuple[BatchedGreedyState, EmittedTokens]:
        """The end of :meth:`decode_with_state`: ``(final state, emitted tokens)`` after the loop ran."""
        result = self._final_state(buffers, batch_size, encoder_lengths, state, None)
        return result.final, buffers.hyps.emitted(batch_size, self.is_tdt, result.offsets)

    def _decode(
        self,
        encoder_output: torch.Tensor,
        encoder_lengths: torch.Tensor,
        previous: BatchedGreedyState | None,
        rows: torch.Tensor | None,
        model_ids: torch.Tensor | None = None,
    ) -> LoopBuffers:
        """Run the loop over ``[B, T, D]``, rows ``rows`` (all if ``None``) continuing from ``previous``;
        ``model_ids``: the rows' per-row boosting trees (:meth:`decode_with_state`)."""
        batch_size = encoder_output.shape[0]
        if self.fusion is not None:
            self.fusion.to(encoder_output.device)
        precision, encoder_output = self._decode_precision(encoder_output)
        with precision:
            return self._decode_loop(
                self._project(encoder_output), encoder_lengths, previous, rows, batch_size, model_ids
            )

    def keeps_caller_autocast(self, device: torch.device) -> bool:
        """Whether decodes on ``device`` run under the caller's autocast, as the NeMo decoder replaced does: its frame
        loop, and its label loop without CUDA graphs. NeMo's label loop with its graphs (the default on a GPU) turns
        autocast off and decodes in the joint's parameters' dtype; so do these decodes then (and fast math)."""
        if self.fast_predictor is not None:
            return False
        return self.frame_looping or not self.use_cuda_graphs or device.type != "cuda"

    def _decode_precision(self, encoder_output: torch.Tensor):
        """:func:`~nemo_fastdecode.prediction.decode_precision` of this computer for ``encoder_output``."""
        return decode_precision(
            encoder_output,
            fast_math=self.fast_predictor is not None,
            like_nemo_graphs=not self.keeps_caller_autocast(encoder_output.device),
            parameter_dtype=module_dtype(self.joint, encoder_output.dtype),
        )

    def _decode_loop(
        self,
        projected: torch.Tensor,
        encoder_lengths: torch.Tensor,
        previous: BatchedGreedyState | None,
        rows: torch.Tensor | None,
        batch_size: int,
        model_ids: torch.Tensor | None = None,
    ) -> LoopBuffers:
        """:meth:`_decode` after the projection: the loop, run again with more room if ``max_symbols=None`` ran out."""
        while True:
            buffers, loop = self._load(projected, encoder_lengths, previous, rows, model_ids)
            loop.run()
            if self.max_symbols is not None or not buffers.hyps.overflowed(batch_size):
                break
            # max_symbols=None and some row emitted more labels than we had room for: retry with more room
            self._symbols_per_frame *= 4
            if self._symbols_per_frame > UNBOUNDED_SYMBOLS_LIMIT:
                self._symbols_per_frame = UNBOUNDED_SYMBOLS_START
                raise RuntimeError(
                    f"greedy decoding emitted more than {UNBOUNDED_SYMBOLS_LIMIT} labels per frame without a blank "
                    "(max_symbols=None); set decoding.greedy.max_symbols (e.g. 10)"
                )
            self.reset_graphs()
        self._loop = loop
        return buffers

    def _project(self, encoder_output: torch.Tensor) -> torch.Tensor:
        """The joint's encoder projection ``[B, T, H]`` (and the predictor's weights ready for its dtype)."""
        projected = self.joint.project_encoder(encoder_output)
        predictor = self._predictor_for(projected.device, projected.dtype)
        if predictor is not None and predictor.prepare(projected.dtype):
            self.reset_graphs()  # its weight copies moved: graphs captured before would read stale memory
        return projected

    def _load(
        self,
        projected: torch.Tensor,
        encoder_lengths: torch.Tensor,
        previous: BatchedGreedyState | None,
        rows: torch.Tensor | None,
        model_ids: torch.Tensor | None = None,
    ) -> tuple[LoopBuffers, TwoLevelLoop]:
        """The loop (and its buffers) for ``projected`` ``[B, T, H]``, its inputs loaded."""
        batch_size, max_time, hidden = projected.shape
        buffers, loop = self._prepare(batch_size, max_time, hidden, projected.device, projected.dtype)
        self._load_inputs(buffers, projected, encoder_lengths, previous, rows)
        if buffers.fusion is not None:
            self.fusion.load_model_ids(buffers.fusion, model_ids)
        elif model_ids is not None:
            raise ValueError("per-row boosting tree ids were given to a decoder that fuses no models")
        return buffers, loop

    def _load_inputs(
        self,
        buffers: LoopBuffers,
        projected: torch.Tensor,
        encoder_lengths: torch.Tensor,
        previous: BatchedGreedyState | None,
        rows: torch.Tensor | None,
    ) -> None:
        """Copy the batch in; every row starts after ``<SOS>``, rows ``rows`` (all if ``None``) from ``previous``."""
        batch_size, max_time, _ = projected.shape
        buffers.encoder_projected[:batch_size, :max_time].copy_(projected)
        buffers.encoder_lengths.zero_()  # padding rows stay inactive
        buffers.encoder_lengths[:batch_size].copy_(encoder_lengths)
        buffers.initial_time.zero_()
        for initial, sos in zip(buffers.initial_predictor_states, buffers.sos_predictor_states, strict=True):
            initial.copy_(sos)
        buffers.initial_predictor_output.copy_(buffers.sos_predictor_output)
        if buffers.fusion is not None:
            self.fusion.reset_initial_states(buffers.fusion)
        if previous is None:
            return
        rows = buffers.batch_indices[:batch_size] if rows is None else rows
        # same as: initial[rows] = previous where a row has decoded frames; rows with none decoded yet keep the
        # <SOS> state computed with this batch, as fresh rows do (no per-row loop)
        fresh = previous.decoded_lengths == 0
        dim = self.state_batch_dim
        for initial, saved in zip(buffers.initial_predictor_states, previous.predictor_states, strict=True):
            fresh_rows = fresh.view([-1 if d == dim else 1 for d in range(initial.dim())])
            start = torch.where(fresh_rows, initial.index_select(dim, rows), saved.to(initial.dtype))
            initial.index_copy_(dim, rows, start)
        output = buffers.initial_predictor_output
        start = torch.where(
            fresh[:, None, None], output.index_select(0, rows), previous.predictor_outputs.to(output.dtype)
        )
        output.index_copy_(0, rows, start)
        if previous.time_jumps is not None:
            buffers.initial_time.index_copy_(0, rows, previous.time_jumps)
        if buffers.fusion is None and previous.fusion_states_list:
            raise ValueError(
                "the previous decoding state carries n-gram LM / boosting tree fusion states, and this decoder fuses "
                "no models (set greedy.ngram_lm_model / greedy.boosting_tree as for the previous chunks)"
            )
        if buffers.fusion is not None:
            if len(previous.fusion_states_list) != len(self.fusion):
                raise ValueError(
                    f"the previous decoding state carries {len(previous.fusion_states_list)} fusion model states; "
                    f"this decoder fuses {len(self.fusion)} models"
                )
            for initial, saved in zip(buffers.fusion.initial_states, previous.fusion_states_list, strict=True):
                initial.index_copy_(0, rows, saved.to(initial.device))

    def _final_state(
        self,
        buffers: LoopBuffers,
        batch_size: int,
        encoder_lengths: torch.Tensor,
        previous: BatchedGreedyState | None,
        rows: torch.Tensor | None,
    ) -> _FinalState:
        """The state after the chunk (views of the buffers where possible) and each row's timestamp offset."""
        device = buffers.device
        offsets = torch.zeros([batch_size], dtype=torch.long, device=device)
        previous_labels = torch.full([batch_size], self.blank_index, dtype=torch.long, device=device)
        if previous is not None:
            rows = buffers.batch_indices[:batch_size] if rows is None else rows
            offsets.index_copy_(0, rows, previous.decoded_lengths)
            previous_labels.index_copy_(0, rows, previous.labels)
        last_labels = buffers.hyps.last_label[:batch_size]
        final = BatchedGreedyState(
            predictor_states=[s.narrow(self.state_batch_dim, 0, batch_size) for s in buffers.predictor_states],
            predictor_outputs=buffers.predictor_output[:batch_size],
            labels=torch.where(last_labels >= 0, last_labels, previous_labels),
            decoded_lengths=offsets + encoder_lengths.to(device),
            time_jumps=(
                buffers.time_indices[:batch_size] - buffers.encoder_lengths[:batch_size] if self.is_tdt else None
            ),
            fusion_states_list=[] if buffers.fusion is None else [s[:batch_size] for s in buffers.fusion.states],
            state_batch_dim=self.state_batch_dim,
        )
        return _FinalState(final, offsets)


@dataclass
class _FinalState:
    final: BatchedGreedyState
    offsets: torch.Tensor  # [B] frames decoded before this chunk (timestamp offsets)
