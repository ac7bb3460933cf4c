"""NeMo-facing greedy decoder: what ``decoding.strategy: fast_greedy`` puts in ``model.decoding.decoding``.

It has the interface of NeMo's ``GreedyBatchedRNNTInfer`` / ``GreedyBatchedTDTInfer`` (their constructor
arguments, called with ``[B, D, T]`` encoder output, returns a 1-tuple of hypotheses, honours
``partial_hypotheses``, exposes a ``decoding_computer``) and runs our own frame- or label-looping computers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from nemo.collections.asr.parts.context_biasing.biasing_multi_model import GPUBiasingMultiModel
from nemo.collections.asr.parts.submodules.rnnt_greedy_decoding import _GreedyRNNTInfer
from nemo.collections.asr.parts.submodules.transducer_decoding.label_looping_base import LabelLoopingStateItem
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis
from nemo.collections.common.parts.optional_cuda_graphs import WithOptionalCudaGraphs
from nemo.core.classes import typecheck

from nemo_fastdecode.config import FastGreedyConfig, nemo_max_symbols, require_label_loop
from nemo_fastdecode.decode_call import check_decoder_inputs, eval_mode, mark_nonfinite
from nemo_fastdecode.graphs import GraphMode
from nemo_fastdecode.greedy.base import GreedyComputerBase
from nemo_fastdecode.greedy.frame_loop import FrameLoopGreedy
from nemo_fastdecode.greedy.label_loop import LabelLoopGreedy
from nemo_fastdecode.greedy.nemo_computer import NemoDecodingComputer
from nemo_fastdecode.greedy.records import RecordOptions
from nemo_fastdecode.logs import logger
from nemo_fastdecode.transducer.fusion import FusionModels


class FastGreedyBatchedInfer(_GreedyRNNTInfer, WithOptionalCudaGraphs):
    """Exact batched greedy decoding for RNN-T and TDT, as CUDA graphs with WHILE nodes where possible.

    Takes every argument of NeMo's ``GreedyBatchedRNNTInfer`` and ``GreedyBatchedTDTInfer``, so that code building
    NeMo's class can build this one. After ``max_symbols_per_step`` the arguments are keyword-only: NeMo's two
    classes order them differently (the TDT class takes ``durations`` fourth).

    Args:
        decoder_model / joint_model / blank_index / max_symbols_per_step: as in NeMo's greedy decoders. The
            prediction network may be NeMo's LSTM ``RNNTDecoder`` or ``StatelessTransducerDecoder``.
        durations: TDT durations (``None`` for RNN-T).
        preserve_alignments / preserve_frame_confidence / exclude_blank_from_confidence / confidence_method_cfg /
            include_duration_confidence: as in NeMo's ``GreedyBatchedRNNTInfer`` / ``GreedyBatchedTDTInfer``: the
            hypotheses get NeMo's ``alignments``, ``frame_confidence`` and ``non_blank_step_confidence_precomputed``
            (:mod:`nemo_fastdecode.greedy.records`), recorded inside the loops in every graph mode.
        include_duration: fill ``Hypothesis.token_duration`` (TDT).
        loop_labels: label looping (default) or frame looping (RNN-T only).
        use_cuda_graph_decoder: allow CUDA graphs (ignored on the CPU).
        fusion_models / fusion_models_alpha: as in NeMo: n-gram LM (``NGramGPULanguageModel``) and boosting-tree
            (``GPUBoostingTreeModel``) fusion with one weight per model, label looping only, applied as NeMo's
            label-looping computers apply them (:mod:`nemo_fastdecode.transducer.fusion`).
        enable_per_stream_biasing: NeMo's per-stream biasing, label looping only: a ``GPUBiasingMultiModel``
            (``decoding_computer.biasing_multi_model``, where NeMo's streaming pipelines add and remove the streams'
            boosting trees) fused after ``fusion_models``, each row boosted by its own tree (its hypothesis'
            ``biasing_cfg.multi_model_id``, or the ``multi_biasing_ids`` given to ``decoding_computer``).
        graph_mode: "auto" (default), "full_graph", "no_while_graph" or "eager".
        fused_kernels: fused Triton step kernels (``None``: on CUDA); bit-identical to the torch path.
        fast_math: opt-in near-fp32 tensor-core prediction network and joint output layer
            (:mod:`nemo_fastdecode.prediction`); faster, not bit-identical to NeMo's baseline. LSTM prediction
            networks only.
        exact_predictor: opt-in, label loop without ``fast_math``: the prediction network's step as
            :class:`~nemo_fastdecode.prediction.ExactPredictor` (IEEE fp32 on CUDA, its recurrent GEMMs beside the
            joint's look; scores to float32 rounding as NeMo's, so a near-tie may break the other way). ``False``
            (default): NeMo's modules, NeMo's bits.
        lookahead_frames: label loop: frames per joint call while rows skip blanks (``None``: automatic with the
            Triton step kernels, at batch 32 16 (RNN-T) or 4 (TDT) with ``fast_math``, 4 or 2 with the exact
            predictor; else 1, NeMo's joint calls); see :class:`LabelLoopGreedy`.
        looks_per_iteration: label loop: ``0`` the two-level loop (an inner loop skips blanks), ``K >= 1`` one
            loop of ``K`` looks per iteration (fewer loop-condition evaluations); ``None``: automatic. The same
            hypotheses either way, see :class:`LabelLoopGreedy`.

    :meth:`from_options` builds one from our options dataclass (``decoding.greedy`` of ``strategy: fast_greedy``
    parsed: :class:`~nemo_fastdecode.config.FastGreedyConfig`), as the registry does.

    Attributes:
        options: the :class:`~nemo_fastdecode.config.FastGreedyConfig` it was built from (``None``: built from
            keyword arguments).
        offline_batching, fast_encoder: the model's ``transcribe`` takes the offline path, with the fused encoder
            (``options.offline_batching``, ``options.fast_encoder``).
        computer: our greedy computer (:class:`LabelLoopGreedy` or :class:`FrameLoopGreedy`).
        decoding_computer: the same computer behind NeMo's label-looping computer interface
            (:class:`~nemo_fastdecode.greedy.nemo_computer.NemoDecodingComputer`), read by NeMo's streaming pipelines.
    """

    def __init__(
        self,
        decoder_model: torch.nn.Module,
        joint_model: torch.nn.Module,
        blank_index: int,
        max_symbols_per_step: int | None = None,
        *,
        durations: Sequence[int] | None = None,
        preserve_alignments: bool = False,
        preserve_frame_confidence: bool = False,
        exclude_blank_from_confidence: bool = False,
        confidence_method_cfg: Any = None,
        include_duration: bool = False,
        include_duration_confidence: bool = False,
        loop_labels: bool = True,
        use_cuda_graph_decoder: bool = True,
        fusion_models: Sequence[Any] | None = None,
        fusion_models_alpha: Sequence[float] | None = None,
        enable_per_stream_biasing: bool = False,
        graph_mode: str | GraphMode | None = "auto",
        fused_kernels: bool | None = None,
        fast_math: bool = False,
        exact_predictor: bool = False,
        lookahead_frames: int | None = None,
        looks_per_iteration: int | None = None,
    ):
        super().__init__(
            decoder_model=decoder_model,
            joint_model=joint_model,
            blank_index=blank_index,
            max_symbols_per_step=max_symbols_per_step,
            preserve_alignments=preserve_alignments,
            preserve_frame_confidence=preserve_frame_confidence,
            confidence_method_cfg=confidence_method_cfg,
        )
        records = RecordOptions(
            alignments=bool(preserve_alignments),
            confidence=bool(preserve_frame_confidence),
            exclude_blank=bool(exclude_blank_from_confidence),
            duration_confidence=bool(include_duration_confidence) and durations is not None,
            confidence_method_cfg=confidence_method_cfg,
        )
        require_label_loop(["fusion_models"] if fusion_models else [], loop_labels)
        require_label_loop(["enable_per_stream_biasing=True"] if enable_per_stream_biasing else [], loop_labels)
        biasing_multi_model = None
        if enable_per_stream_biasing:
            # its storage grows as trees are added: graphs captured on the old storage must go
            biasing_multi_model = GPUBiasingMultiModel(
                vocab_size=blank_index, reallocation_callback_fn=self._drop_captured_graphs
            )
        fusion = None
        if fusion_models or biasing_multi_model is not None:
            fusion = FusionModels(fusion_models or [], fusion_models_alpha or [], per_row=biasing_multi_model)
        label_loop_options = {"lookahead_frames": lookahead_frames, "looks_per_iteration": looks_per_iteration}
        if not loop_labels:
            for name, value, default in (
                ("lookahead_frames", lookahead_frames, 1),
                ("looks_per_iteration", looks_per_iteration, 0),
            ):
                if value not in (None, default):
                    raise ValueError(f"{name}={value} applies to the label loop only (loop_labels=True)")
            label_loop_options = {}
        computer_class = LabelLoopGreedy if loop_labels else FrameLoopGreedy
        self.durations = list(durations) if durations else None
        self.loop_labels = loop_labels
        self.use_cuda_graph_decoder = use_cuda_graph_decoder
        self.include_duration = include_duration
        self.include_duration_confidence = include_duration_confidence
        self.exclude_blank_from_confidence = exclude_blank_from_confidence
        self.fusion_models_alpha = list(fusion_models_alpha or [])
        self.computer: GreedyComputerBase = computer_class(
            decoder=decoder_model,
            joint=joint_model,
            blank_index=blank_index,
            max_symbols=nemo_max_symbols(
                max_symbols_per_step, graphs_allowed=use_cuda_graph_decoder, frame_loop=not loop_labels
            ),
            durations=durations,
            use_cuda_graphs=use_cuda_graph_decoder,
            graph_mode=GraphMode.parse(graph_mode),
            fused_kernels=fused_kernels,
            fast_math=fast_math,
            exact_predictor=exact_predictor,
            records=records,
            fusion=fusion,
            **label_loop_options,
        )
        self.decoding_computer = NemoDecodingComputer(self.computer, allow_cuda_graphs=use_cuda_graph_decoder)
        self.options: FastGreedyConfig | None = None
        self.offline_batching = False
        self.fast_encoder = False
        self.warm_up_seconds = self._warm_up_on_gpu()

    @classmethod
    def from_options(
        cls,
        options: FastGreedyConfig,
        *,
        decoder_model: torch.nn.Module,
        joint_model: torch.nn.Module,
        blank_index: int,
        max_symbols_per_step: int | None = None,
        **nemo_arguments: Any,
    ) -> FastGreedyBatchedInfer:
        """The decoder for ``options`` (validated already: fusion needs the label loop, ...), the one place that maps
        them to the constructor's arguments.

        ``max_symbols_per_step``: the value the section sets, as NeMo reads it (``max_symbols``, else
        ``max_symbols_per_step``; :func:`~nemo_fastdecode.config.greedy_max_symbols_setting`); resolved here, once.
        ``nemo_arguments``: NeMo's arguments as its set-up resolved them (durations, alignments, confidence, fusion
        models, per-stream biasing)."""
        infer = cls(
            decoder_model=decoder_model,
            joint_model=joint_model,
            blank_index=blank_index,
            max_symbols_per_step=max_symbols_per_step,
            loop_labels=options.loop_labels,
            use_cuda_graph_decoder=options.use_cuda_graph_decoder,
            graph_mode=options.graph_mode,
            fused_kernels=options.fused_kernels,
            fast_math=bool(options.fast_math),
            exact_predictor=options.exact_predictor,
            **nemo_arguments,
        )
        infer.options = options
        # read by the model's transcribe (nemo.offline_transcribe)
        infer.offline_batching, infer.fast_encoder = options.offline_batching, options.fast_encoder
        return infer

    def _warm_up_on_gpu(self) -> float | None:
        """Decode two frames of zeros once where the networks already sit on a GPU, in the parameters' dtype and, where
        decodes keep the caller's autocast (graphs off; the frame loop), also under bfloat16 autocast, as users
        decode with ``amp``; returns the seconds it took (``None``: not done). The first ``transcribe`` then finds
        every kernel loaded (Triton's from its disk cache, the prediction network's cuDNN LSTM, PyTorch's own, which
        CUDA loads on first launch) and only captures its graphs at the real size.
        ``NEMO_FASTDECODE_DECODER_WARM_UP=0`` skips it."""
        if os.environ.get("NEMO_FASTDECODE_DECODER_WARM_UP", "1") == "0":
            return None
        parameter = next(self.joint.parameters(), None)
        hidden = getattr(self.joint, "encoder_hidden", None)
        if parameter is None or parameter.device.type != "cuda" or not isinstance(hidden, int):
            return None
        started = time.perf_counter()
        try:
            with eval_mode(self.decoder, self.joint), torch.inference_mode():
                frames = torch.zeros(1, 2, hidden, device=parameter.device, dtype=parameter.dtype)
                lengths = torch.full([1], 2, dtype=torch.long, device=parameter.device)
                self.computer(frames, lengths)
                if self.computer.keeps_caller_autocast(parameter.device) and torch.cuda.is_bf16_supported():
                    # cuDNN's bf16 LSTM pays a one-time set-up on its first call in a process, at any batch size;
                    # an fp32 call does not pay it
                    self.computer.reset_graphs()  # captured anew under autocast, not replayed
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        self.computer(frames, lengths)
        except Exception as error:  # a warm-up only: the first decode does the same work and reports any error
            logger.warning("nemo_fastdecode: the greedy decoder's warm-up failed (%s); the first decode pays it", error)
            return None
        finally:
            self.computer.reset_graphs()  # the first real batch captures at its own size
        torch.cuda.synchronize(parameter.device)
        return time.perf_counter() - started

    def _drop_captured_graphs(self) -> None:
        computer = getattr(self, "computer", None)  # None while the constructor builds it
        if computer is not None:
            computer.reset_graphs()

    # NeMo's hooks around training and validation; as NeMo's, they go through the decoding computer
    def disable_cuda_graphs(self) -> bool:
        return self.decoding_computer.disable_cuda_graphs()

    def maybe_enable_cuda_graphs(self) -> bool:
        """Graphs back on, unless ``use_cuda_graph_decoder=False`` disallowed them."""
        return self.decoding_computer.maybe_enable_cuda_graphs()

    @typecheck()
    def forward(
        self,
        encoder_output: torch.Tensor,
        encoded_lengths: torch.Tensor,
        partial_hypotheses: list[Hypothesis | None] | None = None,
    ) -> tuple[list[Hypothesis]]:
        """Decode ``encoder_output [B, D, T]`` with ``encoded_lengths [B]``; returns ``(hypotheses,)``."""
        inputs = check_decoder_inputs(encoder_output, encoded_lengths, partial_hypotheses)
        previous_states = None
        if partial_hypotheses is not None:
            previous_states = [_state_of(h) for h in partial_hypotheses]
        model_ids = None
        if self.decoding_computer.per_stream_biasing_enabled:
            model_ids = _biasing_ids_of(partial_hypotheses, encoded_lengths.shape[0], encoder_output.device)
        with eval_mode(self.decoder, self.joint), torch.inference_mode():
            hyps = self.computer(
                encoder_output.transpose(1, 2),
                inputs.lengths,
                previous_states,
                with_durations=self.include_duration,
                model_ids=model_ids,
            )
            if partial_hypotheses is not None:  # continue the previous chunk's hypotheses, as NeMo does
                hyps = [
                    hyp if previous is None else previous.merge_(hyp)
                    for previous, hyp in zip(partial_hypotheses, hyps, strict=True)
                ]
            # NeMo's pack_hypotheses: the encoded length of each row as a 0-d CPU tensor (labels are int64 already)
            for hyp, length in zip(hyps, inputs.lengths_on_host.unbind(0), strict=True):
                hyp.length = length
            mark_nonfinite(hyps, inputs.nonfinite_rows)
            return (hyps,)


def _biasing_ids_of(
    partial_hypotheses: list[Hypothesis | None] | None, batch_size: int, device: torch.device
) -> torch.Tensor:
    """``[B]`` int64: each row's tree in the biasing multi-model, from its hypothesis' ``biasing_cfg`` (``-1``: none).

    As NeMo's greedy decoders: a request whose tree is not in the multi-model yet (``multi_model_id`` None) is
    skipped with a warning.
    """
    ids = np.full([batch_size], fill_value=-1, dtype=np.int64)
    for row, hyp in enumerate(partial_hypotheses or []):
        if hyp is None or not hyp.has_biasing_request():
            continue
        if hyp.biasing_cfg.multi_model_id is None:
            logger.warning("Boosting tree requested in index %d, not compiled, skipping", row)
            continue
        ids[row] = hyp.biasing_cfg.multi_model_id
    return torch.from_numpy(ids).to(device=device)


def _state_of(hyp: Hypothesis | None) -> LabelLoopingStateItem | None:
    if hyp is None or hyp.dec_state is None:
        return None
    if not isinstance(hyp.dec_state, LabelLoopingStateItem):
        raise ValueError(
            f"partial_hypotheses carry a decoder state of type {type(hyp.dec_state).__name__}; fast_greedy can only "
            "continue from hypotheses it produced itself or that NeMo's label-looping greedy decoding produced "
            "(LabelLoopingStateItem). Decode the stream with one of these."
        )
    return hyp.dec_state
