"""Batched modified-ALSD beam search (RNN-T and TDT) that returns exactly what NeMo's ``malsd_batch`` returns.

The algorithm is NeMo's (``ModifiedALSDBatchedRNNTComputer`` / ``ModifiedALSDBatchedTDTComputer``, 3.0):
every step, each of the ``K`` beams of a row proposes its ``K`` best extensions (label or blank; TDT:
label x duration), the row keeps the ``K`` best of the ``K x K`` candidates, equal hypotheses are merged
(log-sum-exp), and the prediction network advances the beams that emitted a label. It runs as one
loop, ``before_loop(); while flag: step()``, whose phases use in-place, non-synchronising ops only,
so the same code runs eagerly, as phase graphs and inside a WHILE node (:mod:`nemo_fastdecode.graphs`).

What is ours: the per-step top-k is the fused beam-step kernel (:func:`log_softmax_topk`: log-softmax
and the top-k non-blank tokens plus blank in one pass), the candidates of a row are ranked and selected
by one more kernel that also writes them into the hypotheses and moves the beams' time (:func:`advance_beams`;
both kernels' torch references run on the CPU), state and
hypotheses live in pre-allocated buffers re-captured only when a batch is larger or longer than any
before, and a hypothesis never depends on the rest of its batch.

Exactness (fp32): the floating-point operations that produce scores are NeMo's, in NeMo's order; on
the CPU (torch reference) the log-probabilities are bit-identical to NeMo's ``log_softmax`` and so are
tokens, timestamps and scores. On CUDA the Triton kernel's log-probabilities agree with PyTorch's to
float32 rounding (its normaliser is summed in another order), so a choice between two candidates whose
scores tie to within rounding can differ; ``fused_topk=False`` uses the torch path there too.
Deliberate difference: NeMo 3.0's RNN-T search re-activates rows of length 0 after its first step (its
active mask becomes ``time <= max(length - 1, 0)``) and decodes their padding frame when other rows
are longer; here such a row stays empty (score 0), as NeMo returns it when decoded alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from nemo.collections.asr.parts.submodules.transducer_decoding.label_looping_base import BatchedBeamState
from nemo.collections.asr.parts.utils.batched_beam_decoding_utils import BatchedBeamHyps

from nemo_fastdecode.beam.fusion import BeamFusion, parse_fusion_modes
from nemo_fastdecode.beam.hyps import BeamHypsBuffer
from nemo_fastdecode.beam.state import BeamLoopBuffers
from nemo_fastdecode.graphs import GraphMode, LoopPhases, TwoLevelLoop, choose_graph_mode
from nemo_fastdecode.graphs.owner import CapturedLoopOwner
from nemo_fastdecode.kernels import triton_runs_on
from nemo_fastdecode.kernels.beam_select import (
    advance_beams,
    kernel_by_default,
    nemo_step_candidates,
    select_extensions_reference,
)
from nemo_fastdecode.kernels.beam_topk import MAX_K, log_softmax_topk
from nemo_fastdecode.kernels.joint_hidden import joint_hidden
from nemo_fastdecode.kernels.warm_up import finish_triton_warm_up
from nemo_fastdecode.logs import logger
from nemo_fastdecode.prediction import FastMathPredictor, decode_precision
from nemo_fastdecode.transducer.fusion import FusionModels
from nemo_fastdecode.transducer.modules import check_blank_is_last_token, module_dtype, predictor_state_batch_dim

# With max_symbols=None a hypothesis may emit any number of labels per frame: start with room for this
# many steps per frame and grow (re-running the batch) when the storage fills; past the limit the model
# keeps emitting labels and we stop with an error instead of looping forever.
UNBOUNDED_STEPS_START = 4
UNBOUNDED_STEPS_LIMIT = 1024


class MALSDBeamComputer(CapturedLoopOwner):
    """Batched exact modified-ALSD beam search: ``__call__`` searches whole utterances, :meth:`search_chunk`
    continues streams chunk by chunk.

    Args:
        decoder: NeMo ``RNNTDecoder`` (LSTM prediction network, ``blank_as_pad=True``).
        joint: NeMo ``RNNTJoint``.
        blank_index: id of blank (= number of non-blank tokens ``V``).
        beam_size: beams per utterance, ``1..min(16, V)``.
        max_symbols: at most this many labels per encoder frame and hypothesis; ``None`` for no limit.
        durations: TDT durations (e.g. ``[0, 1, 2, 3, 4]``), ``None`` for RNN-T. Like NeMo, the search
            uses duration *indices* as durations (equal for the usual ``[0, 1, ..., n]``).
        use_cuda_graphs: allow CUDA graphs on CUDA devices.
        graph_mode: force a :class:`GraphMode` (tests); ``None`` chooses automatically.
        fused_topk: ``None``: the Triton beam-step kernels (top-k, candidate selection) on CUDA, their torch
            references elsewhere; ``True``/``False`` force one of them.
        fast_math: run the prediction network and the joint's output layer on near-fp32 tensor-core kernels
            (:class:`~nemo_fastdecode.prediction.FastMathPredictor`): faster, not bit-identical to NeMo.
        compiled_step: experimental, CUDA only: the candidate selection and hypothesis update of each step
            compiled by ``torch.compile`` (fewer, fused kernels; compiles on first use).
        fusion: n-gram LM / boosting-tree fusion (NeMo's models with their weights; also a per-row multi-model whose
            rows' trees :meth:`search_chunk` takes), as NeMo's ``malsd_batch`` applies it
            (:mod:`nemo_fastdecode.beam.fusion`). Where the beam-step kernels run, late pruning with one weight sum for
            all rows runs on the fused top-k kernel; the selection kernel runs whenever a forced blank scores as its
            candidate does (late pruning). Everything else runs on the torch top-k and selection.
        pruning_mode / blank_lm_score_mode: NeMo's fusion options (``late`` or ``early``; ``lm_weighted_full`` or
            ``no_score``); ``None``: the defaults of NeMo's ``malsd_batch`` set-up (``late``, ``lm_weighted_full``).
    """

    def __init__(
        self,
        decoder: torch.nn.Module,
        joint: torch.nn.Module,
        blank_index: int,
        beam_size: int,
        max_symbols: int | None = 10,
        durations: Sequence[int] | None = None,
        use_cuda_graphs: bool = True,
        graph_mode: GraphMode | None = None,
        fused_topk: bool | None = None,
        fast_math: bool = False,
        compiled_step: bool = False,
        fusion: FusionModels | None = None,
        pruning_mode: str | None = None,
        blank_lm_score_mode: str | None = None,
    ):
        largest_beam = min(MAX_K, blank_index)
        if isinstance(beam_size, bool) or not isinstance(beam_size, int) or not 1 <= beam_size <= largest_beam:
            raise ValueError(
                f"beam_size must be an int in 1..{largest_beam} (at most {MAX_K}, the beam-step kernel's limit, "
                f"and at most the {blank_index} non-blank tokens), got {beam_size!r}; use strategy 'malsd_batch' "
                "for larger beams"
            )
        if max_symbols is not None and max_symbols <= 0:
            raise ValueError(f"max_symbols must be a positive int or None, got {max_symbols}")
        if not getattr(decoder, "blank_as_pad", False):
            raise ValueError("nemo_fastdecode needs a prediction network with blank_as_pad=True (NeMo's default)")
        self.decoder, self.joint = decoder, joint
        self.blank_index, self.beam_size, self.max_symbols = blank_index, beam_size, max_symbols
        self.durations_list = list(durations) if durations else None
        self.use_cuda_graphs = use_cuda_graphs
        self.forced_mode = graph_mode
        self.fused_topk = fused_topk
        self.fast_predictor = FastMathPredictor(decoder, joint) if fast_math else None
        # experimental: the step's remaining torch ops (parent gathers and selects; the candidate selection where it
        # is not the Triton kernel) fused by torch.compile on CUDA
        self._compiled = (
            tuple(torch.compile(f, dynamic=False) for f in (self._extend, self._select_parents, self._keep_parents))
            if compiled_step
            else None
        )
        if self.durations_list is not None:  # RNN-T searches any blank_index as malsd_batch does; TDT does not
            check_blank_is_last_token(joint, blank_index, len(self.durations_list), "fast_beam (TDT)", "malsd_batch")
        self.state_batch_dim = predictor_state_batch_dim(decoder)
        self._buffers: BeamLoopBuffers | None = None
        self._loop: TwoLevelLoop | None = None
        self._steps_per_frame = max_symbols + 1 if max_symbols is not None else UNBOUNDED_STEPS_START
        self.fusion = None
        if fusion is not None:
            self.fusion = BeamFusion(fusion, beam_size, *parse_fusion_modes(pruning_mode, blank_lm_score_mode))
            self._check_fusion(fusion)

    def _check_fusion(self, fusion: FusionModels) -> None:
        """Graphs only where the models' calls can be captured."""
        fusion.check_vocabulary(self.blank_index)
        self.use_cuda_graphs = fusion.allow_graphs(self.forced_mode, self.use_cuda_graphs, "beam search")

    # ----- configuration -------------------------------------------------------------------
    @property
    def is_tdt(self) -> bool:
        return self.durations_list is not None

    # ----- one search step -----------------------------------------------------------------
    def _top_k(self, b: BeamLoopBuffers, logits: torch.Tensor):
        """The beam-step kernel on the token logits: ``(values, ids) [B*K, K+1]``, the ``K`` best non-blank then blank,
        and ``None``; with fusion its scores are in the values (:meth:`BeamFusion.top_k`, also the forced blank's
        scores ``[B*K]`` where they are not the last column)."""
        num_durations = len(self.durations_list) if self.is_tdt else 0
        token_logits = logits[:, :-num_durations] if num_durations else logits
        if b.fusion is not None:
            use_kernel = self._extend_uses_kernel(b) and self.fusion.kernel_applies(token_logits, b.float_dtype)
            return self.fusion.top_k(b.fusion, token_logits, self.blank_index, b.float_dtype, use_kernel)
        values, ids = log_softmax_topk(token_logits, self.beam_size, self.blank_index, use_triton=self.fused_topk)
        return values, ids, None

    def _extend(self, b: BeamLoopBuffers, logits, values, ids, blank_scores=None):
        """Steps 1b-3 and 5: each row's ``K`` best candidates into the hypotheses (equal ones merged), then every
        beam's time and the loop flags. Returns ``(parents [B, K], labels to predict [B*K, 1], keep [B*K])``;
        ``keep``: the beam emitted no label and keeps its parent's prediction-network output and state.

        From the joint's logits (TDT: their duration part) and the beam-step kernel's output (:meth:`_top_k`):
        on CUDA one kernel does it all (:func:`advance_beams`); elsewhere NeMo's torch operations
        (:func:`select_extensions_reference`, ``BeamHypsBuffer.add_`` and ``recombine_``).
        """
        duration_logits = logits[:, -len(self.durations_list) :] if self.is_tdt else None
        common = (self.blank_index, self.max_symbols, duration_logits)
        # a forced blank scored apart from the candidates (early pruning with fusion) is the torch selection's
        if blank_scores is None and self._extend_uses_kernel(b):
            parents, step_labels, keep = advance_beams(values, ids, b, *common)
            return parents, step_labels.view(-1, 1), keep
        hyps: BeamHypsBuffer = b.hyps
        scores, parents, labels, durations = select_extensions_reference(
            values, ids, hyps.scores, b.active, hyps.labels_at_time, *common, blank_scores
        )
        return self._apply_selection(b, scores, parents, labels, durations)

    def _extend_as_nemo(self, b: BeamLoopBuffers, logits: torch.Tensor):
        """:meth:`_extend` for searches in bf16 / fp16 (bf16 weights): each beam's candidates by NeMo's own ops
        (:func:`nemo_step_candidates`: log-softmax and ``torch.topk`` in the search's dtype, where ties are common and
        must break as NeMo's do), then NeMo's selection."""
        hyps: BeamHypsBuffer = b.hyps
        num_durations = len(self.durations_list) if self.is_tdt else 0
        candidates = nemo_step_candidates(logits, self.beam_size, self.blank_index, num_durations, b.float_dtype)
        scores, parents, labels, durations = select_extensions_reference(
            None, None, hyps.scores, b.active, hyps.labels_at_time, self.blank_index, self.max_symbols,
            candidates=candidates,
        )  # fmt: skip
        return self._apply_selection(b, scores, parents, labels, durations)

    def _apply_selection(self, b: BeamLoopBuffers, scores, parents, labels, durations):
        """The selected extensions into the hypotheses (equal ones merged), then every beam's time and the flags."""
        hyps: BeamHypsBuffer = b.hyps
        hyps.add_(parents, labels, scores, durations)
        hyps.recombine_()
        # 5. time: blank moves on one frame (RNN-T); TDT moves by the duration (finished beams stay)
        parent_time = torch.gather(b.time_indices, -1, parents)
        if self.is_tdt:
            b.time_indices.copy_(parent_time + torch.where(labels >= 0, durations, 0))
        else:
            b.time_indices.copy_(parent_time + (labels == self.blank_index))
        self._update_time_flags(b)
        emitted = (labels >= 0) & (labels != self.blank_index)
        return parents, torch.where(emitted, labels, self.blank_index).view(-1, 1), ~emitted.view(-1)

    def _extend_uses_kernel(self, b: BeamLoopBuffers) -> bool:
        if self.fused_topk is not None:
            return self.fused_topk
        return kernel_by_default(b.device, b.float_dtype)

    def _select_parents(self, b: BeamLoopBuffers, parents) -> None:
        """Step 4a: each new beam's parent prediction-network output and state, into ``parent_decoder_*``."""
        batch, k = b.batch_size, self.beam_size
        torch.gather(
            b.decoder_output.view(batch, k, 1, -1),
            dim=1,
            index=parents[:, :, None, None].expand(batch, k, 1, b.decoder_output.shape[-1]),
            out=b.parent_decoder_output.view(batch, k, 1, -1),
        )
        self.decoder.batch_aggregate_states_beam(b.decoder_state, batch, k, parents, b.parent_decoder_state)

    def _joint_hidden(self, b: BeamLoopBuffers) -> torch.Tensor:
        """The fast-math joint's hidden activations at every beam's frame: ``relu(frame + prediction)`` ``[B*K, H]``
        (one kernel where Triton runs: the greedy search's, with the ``K`` beams of a row sharing its frames)."""
        out = torch.empty_like(b.decoder_output[:, 0])
        fused = triton_runs_on(out.device)
        frames = b.safe_time_indices.view(-1)
        return joint_hidden(
            b.encoder_projected, frames, b.decoder_output, out, fused, rows_per_frame_row=self.beam_size
        )

    def _keep_parents(self, b: BeamLoopBuffers, output, new_state, keep) -> None:
        """Step 4b: the new prediction-network outputs and states; beams that emitted no label keep their parent's."""
        # same as: output[keep] = parent_output[keep]; state[keep] = parent_state[keep]; else the new ones
        torch.where(keep[:, None, None], b.parent_decoder_output, output, out=b.decoder_output)
        self.decoder.batch_replace_states_mask(
            src_states=b.parent_decoder_state, dst_states=b.decoder_state, mask=keep, other_src_states=new_state
        )

    @staticmethod
    def _update_time_flags(b: BeamLoopBuffers) -> None:
        torch.minimum(b.time_indices, b.last_frame, out=b.safe_time_indices)
        b.safe_time_indices.clamp_(min=0)  # rows of length 0 (never active) read frame 0
        torch.less_equal(b.time_indices, b.last_frame, out=b.active)
        torch.logical_and(b.active.any(), b.hyps.step < b.hyps.capacity, out=b.flag)

    def _step_parts(self, b: BeamLoopBuffers):
        """The step's torch parts ``(extend, select parents, keep parents)``: with ``compiled_step`` on CUDA
        compiled (``extend`` only where it is not the Triton kernel), else as written."""
        if self._compiled is None or b.device.type != "cuda":
            return self._extend, self._select_parents, self._keep_parents
        extend, select_parents, keep_parents = self._compiled
        return self._extend if self._extend_uses_kernel(b) else extend, select_parents, keep_parents

    def _phases(self, b: BeamLoopBuffers) -> LoopPhases:
        batch, k = b.batch_size, self.beam_size
        hyps: BeamHypsBuffer = b.hyps
        extend, select_parents, keep_parents = self._step_parts(b)

        def before_loop() -> None:
            # every beam at its start: afresh after <SOS>, or where a previous chunk left it (BeamLoopBuffers.start_*)
            hyps.begin_()
            for state, start in zip(b.decoder_state, b.start_decoder_state, strict=True):
                state.copy_(start)
            b.decoder_output.copy_(b.start_decoder_output)
            b.time_indices.copy_(hyps.next_time)  # TDT: frames jumped past the previous chunk's end; else 0
            if b.fusion is not None:
                for state, initial in zip(b.fusion.states, b.fusion.initial_states, strict=True):
                    state.copy_(initial)
            torch.sub(b.encoder_lengths[:, None].expand(batch, k), 1, out=b.last_frame)
            self._update_time_flags(b)

        def step() -> None:
            # 1. joint at every beam's frame, its K best extensions
            if self.fast_predictor is not None:
                logits = self.fast_predictor.joint_logits_from_hidden(self.joint, self._joint_hidden(b))
            else:
                frames = b.encoder_projected[b.beam_rows, b.safe_time_indices.view(-1)].unsqueeze(1)
                logits = self.joint.joint_after_projection(frames, b.decoder_output)[:, 0, 0, :]
            # 2.-3., 5. candidates, the K best of K x K into the hypotheses (equal ones merged), time and flags
            if b.float_dtype != torch.float32 and b.fusion is None:
                parents, step_labels, keep = self._extend_as_nemo(b, logits)
            else:
                values, ids, blank_scores = self._top_k(b, logits)
                parents, step_labels, keep = extend(b, logits, values, ids, blank_scores)
            if b.fusion is not None:  # every kept beam's fusion states: its parent's, moved by its label
                self.fusion.select(b.fusion, parents, step_labels.view(-1), keep)
            # 4. prediction network: beams that emitted a label advance from their parent's state
            select_parents(b, parents)
            if self.fast_predictor is not None:
                fused = triton_runs_on(step_labels.device)
                output, new_state = self.fast_predictor.step(step_labels.view(-1), b.parent_decoder_state, fused)
            else:
                output, new_state, *_ = self.decoder.predict(
                    step_labels, b.parent_decoder_state, add_sos=False, batch_size=batch * k
                )
                output = self.joint.project_prednet(output)
            keep_parents(b, output, new_state, keep)

        return LoopPhases.one_level(before_loop, step, b.flag)

    # ----- buffers and graph lifetime ------------------------------------------------------
    def _capacity(self, max_time: int) -> int:
        # a hypothesis makes at most max_symbols + 1 steps per frame (labels, then a forced blank)
        return max(max_time, 1) * self._steps_per_frame

    def _prepare(self, batch_size: int, max_time: int, hidden: int, device: torch.device, dtype: torch.dtype):
        finish_triton_warm_up()
        mode = choose_graph_mode(device, self.use_cuda_graphs, self.forced_mode)
        if mode is GraphMode.EAGER:
            # eager runs at the exact batch shape (the networks see exactly NeMo's shapes)
            buffers = self._allocate(batch_size, max_time, hidden, device, dtype)
            return buffers, TwoLevelLoop(self._phases(buffers), mode)
        if self._buffers is None or not self._buffers.fits(
            batch_size, max_time, self._capacity(max_time), device, dtype
        ):
            old = self._buffers if self._buffers is not None and self._buffers.device == device else None
            grown_batch, grown_time = self._next_shape(old, batch_size, max_time)
            self._buffers = self._allocate(grown_batch, grown_time, hidden, device, dtype)
            self._loop = TwoLevelLoop(self._phases(self._buffers), mode)
            logger.debug(
                "nemo_fastdecode: beam %s graphs sized for %d x %d frames", mode.value, grown_batch, grown_time
            )
        return self._buffers, self._loop

    def _allocate(self, batch_size: int, max_time: int, hidden: int, device, dtype) -> BeamLoopBuffers:
        b = BeamLoopBuffers(
            batch_size,
            self.beam_size,
            max_time,
            hidden,
            self._capacity(max_time),
            self.blank_index,
            device,
            dtype,
            self.is_tdt,
        )
        beams = batch_size * self.beam_size
        # every hypothesis starts from the prediction network's output after <SOS> (blank)
        sos = torch.full([beams, 1], self.blank_index, dtype=torch.long, device=device)
        output, sos_state, *_ = self.decoder.predict(sos, None, add_sos=False, batch_size=beams)
        b.sos_decoder_state = [s.clone() for s in sos_state]
        b.start_decoder_state = [s.clone() for s in sos_state]
        b.decoder_state = [s.clone() for s in sos_state]
        b.parent_decoder_state = [s.clone() for s in sos_state]
        b.sos_decoder_output.copy_(self.joint.project_prednet(output))
        b.start_decoder_output.copy_(b.sos_decoder_output)
        if self.fusion is not None:
            b.fusion = self.fusion.allocate(batch_size, device, dtype)
        return b

    # ----- public entry point --------------------------------------------------------------
    @torch.inference_mode()
    def __call__(self, encoder_output: torch.Tensor, encoder_lengths: torch.Tensor) -> BeamHypsBuffer:
        """Search a batch.

        Args:
            encoder_output: ``[B, T, D]`` encoder output (time-major per row), ``B >= 1``.
            encoder_lengths: ``[B]`` valid frames per row (0 allowed).

        Returns:
            The hypotheses buffer (rows ``0..B-1`` are the batch; :meth:`BeamHypsBuffer.to_hypotheses` exports them).
        """
        precision, encoder_output = self._decode_precision(encoder_output)
        with precision:
            return self._search(encoder_output, encoder_lengths, None).hyps

    def search_chunk(
        self,
        encoder_output: torch.Tensor,
        encoder_lengths: torch.Tensor,
        previous: BatchedBeamState | None = None,
        model_ids: torch.Tensor | None = None,
        model_weights: torch.Tensor | None = None,
    ) -> tuple[BatchedBeamHyps, BatchedBeamState]:
        """Search one chunk of a stream, continuing the beams of the previous chunk: what NeMo's modified-ALSD
        computers do when called with ``prev_batched_state``.

        Args:
            encoder_output: ``[B, T, D]`` the chunk's encoder output (time-major per row), ``B >= 1``.
            encoder_lengths: ``[B]`` valid frames per row (0 allowed: the row's beams stay as they are; so does a
                chunk of ``T = 0`` frames, which NeMo's computer refuses).
            previous: the state this method (or NeMo's computer of the same beam size) returned for the previous
                chunk (its first ``B`` rows continue); ``None`` for a stream's first chunk.
            model_ids: ``[B]`` int64, with a per-row fusion model (NeMo's ``GPUBiasingMultiModel``): each row's tree in
                it, fused by all its beams (``-1``: none); ``None``: no row has one.
            model_weights: ``[B]`` float64: each row's tree's weight (0 without one), with ``model_ids``; it joins the
                sum of the fusion weights that scales blank, as in NeMo's search fusing that tree.

        Returns:
            ``(hypotheses, state)``: NeMo's ``BatchedBeamHyps`` of ``B`` rows holding this chunk's prefix tree,
            timestamps counted from each stream's start and the beams' cumulative scores, as NeMo's computer
            returns them (NeMo's ``flatten_`` / ``merge_(..., is_chunk_continuation=True)`` join the chunks); and
            the ``BatchedBeamState`` to continue from (its tensors are copies).
        """
        batch_size, max_time, dim = encoder_output.shape
        if max_time == 0:  # a chunk without frames: one padding frame that no row reads (the beams stay as they are)
            encoder_output = encoder_output.new_zeros([batch_size, 1, dim])
        with torch.inference_mode():
            precision, encoder_output = self._decode_precision(encoder_output)
            with precision:
                b = self._search(encoder_output, encoder_lengths, previous, model_ids, model_weights)
        # NeMo's objects are made outside inference mode: callers update them in place (flatten_, merge_)
        hyps = b.hyps.to_nemo(batch_size)
        if previous is not None:
            hyps.timestamps += previous.decoded_lengths[:batch_size, None, None].to(hyps.timestamps.device)
        return hyps, b.state_after(batch_size, encoder_lengths, previous, self.state_batch_dim, self.blank_index)

    def _decode_precision(self, encoder_output: torch.Tensor):
        """:func:`~nemo_fastdecode.prediction.decode_precision` of this search: as ``malsd_batch``, whose CUDA graphs
        (its default on a GPU) turn autocast off and search in the joint's parameters' dtype; without them, under the
        caller's autocast."""
        return decode_precision(
            encoder_output,
            fast_math=self.fast_predictor is not None,
            like_nemo_graphs=self.use_cuda_graphs and encoder_output.device.type == "cuda",
            parameter_dtype=module_dtype(self.joint, encoder_output.dtype),  # a joint may have no parameters
        )

    def _search(
        self,
        encoder_output: torch.Tensor,
        encoder_lengths: torch.Tensor,
        previous: BatchedBeamState | None,
        model_ids: torch.Tensor | None = None,
        model_weights: torch.Tensor | None = None,
    ) -> BeamLoopBuffers:
        batch_size, max_time, _ = encoder_output.shape
        projected = self.joint.project_encoder(encoder_output)
        if self.fusion is not None:
            self.fusion.models.to(projected.device)
        if self.fast_predictor is not None and self.fast_predictor.prepare(projected.dtype):
            self.reset_graphs()  # its weight copies moved: graphs captured before would read stale memory
        while True:
            b, loop = self._prepare(batch_size, max_time, projected.shape[-1], projected.device, projected.dtype)
            b.encoder_projected[:batch_size, :max_time].copy_(projected)
            b.encoder_lengths.zero_()  # padding rows stay inactive
            b.encoder_lengths[:batch_size].copy_(encoder_lengths)
            if previous is None:
                b.start_empty()
            else:
                b.start_from(previous, batch_size, self.state_batch_dim, self.is_tdt, fuses=self.fusion is not None)
            if self.fusion is not None:
                b.start_fusion_from(self.fusion.models, previous, batch_size)
                self.fusion.load_rows(b.fusion, model_ids, model_weights)
            elif model_ids is not None:
                raise ValueError("per-row model ids were given to a beam search without a per-row (multi-)model")
            loop.run()
            if not (b.hyps.full() and bool(b.active.any())):
                break
            # only reachable with max_symbols=None: some hypothesis needs more steps than we had room for
            self._steps_per_frame *= 4
            if self._steps_per_frame > UNBOUNDED_STEPS_LIMIT:
                self._steps_per_frame = UNBOUNDED_STEPS_START
                raise RuntimeError(
                    f"beam search made more than {UNBOUNDED_STEPS_LIMIT} steps per frame without finishing "
                    "(max_symbols=None); set decoding.beam.max_symbols (e.g. 10)"
                )
            self.reset_graphs()
        self._loop = loop
        return b
