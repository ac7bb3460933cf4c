"""NeMo-facing beam search: what ``decoding.strategy: fast_beam`` puts in ``model.decoding.decoding``.

It has the interface of NeMo's ``BeamBatchedRNNTInfer`` / ``BeamBatchedTDTInfer`` with
``search_type='malsd_batch'`` (called with ``[B, D, T]`` encoder output, returns a 1-tuple with the best
``Hypothesis`` per utterance or its ``NBestHypotheses``; exposes a ``decoding_computer`` that continues streams
chunk by chunk) and runs our :class:`MALSDBeamComputer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis, NBestHypotheses
from nemo.collections.common.parts.optional_cuda_graphs import WithOptionalCudaGraphs
from nemo.core.classes import Typing, typecheck
from nemo.core.neural_types import AcousticEncodedRepresentation, HypothesisType, LengthsType, NeuralType

from nemo_fastdecode.beam.malsd import MALSDBeamComputer
from nemo_fastdecode.beam.nemo_computer import NemoBeamComputer
from nemo_fastdecode.config import DEFAULT_MAX_SYMBOLS, FastBeamConfig, nemo_max_symbols
from nemo_fastdecode.decode_call import check_decoder_inputs, eval_mode, mark_nonfinite
from nemo_fastdecode.graphs import GraphMode
from nemo_fastdecode.graphs.owner import ComputerGraphsSwitch
from nemo_fastdecode.transducer.fusion import FusionModels

# max_symbols_per_step left out: NeMo's RNN-T and TDT classes differ
_CLASS_DEFAULT = object()


class FastBeamBatchedInfer(ComputerGraphsSwitch, Typing, WithOptionalCudaGraphs):
    """Batched beam search for RNN-T and TDT, exactly NeMo's ``malsd_batch``, as CUDA graphs where possible.

    Args:
        decoder_model / joint_model / blank_index / beam_size: as in NeMo's ``BeamBatchedRNNTInfer``.
        max_symbols_per_step: most labels per frame and hypothesis (NeMo's ``beam.max_symbols``); ``None``: as NeMo's
            ``malsd_batch`` makes of it (:func:`~nemo_fastdecode.config.nemo_max_symbols`: 10 when CUDA graphs are
            allowed, else no limit). Left out, NeMo's class defaults: 10 for RNN-T (``BeamBatchedRNNTInfer``),
            ``None`` for TDT (``BeamBatchedTDTInfer``).
        durations: TDT durations (``None`` for RNN-T).
        score_norm: rank hypotheses by score / (tokens + 1) when picking the best and ordering the n-best.
        return_best_hypothesis: return the best ``Hypothesis`` per utterance (else ``NBestHypotheses``).
        allow_cuda_graphs: allow CUDA graphs (ignored on the CPU).
        graph_mode: "auto" (default), "full_graph", "no_while_graph" or "eager".
        fused_topk: ``None`` (default): the Triton beam-step kernels (top-k, candidate selection) on CUDA, their torch
            references elsewhere;
            ``True``/``False`` force one (``False`` gives PyTorch's log-softmax bit for bit on CUDA too).
        fast_math: opt-in near-fp32 tensor-core prediction network and joint output layer
            (:mod:`nemo_fastdecode.prediction`); faster, not bit-identical to ``malsd_batch``.
        compiled_step: experimental: each step's pure-torch parts (candidate selection, hypothesis update,
            state gathers) compiled by ``torch.compile`` on CUDA.
        fusion_models / fusion_models_alpha: as in NeMo's ``BeamBatchedRNNTInfer``: n-gram LMs / boosting trees
            (NeMo's objects) and one weight each, fused as ``malsd_batch`` fuses them; ``None``: no fusion.
        pruning_mode / blank_lm_score_mode: as in NeMo's classes; ``None``: the defaults of
            NeMo's ``malsd_batch`` set-up (``late``, ``lm_weighted_full``).

    :meth:`from_options` builds one from our options dataclass (``decoding.beam`` of ``strategy: fast_beam`` parsed:
    :class:`~nemo_fastdecode.config.FastBeamConfig`), as the registry does.

    Attributes:
        options: the :class:`~nemo_fastdecode.config.FastBeamConfig` it was built from (``None``: built from keyword
            arguments).
        computer: our beam search (:class:`MALSDBeamComputer`).
        decoding_computer: the same search behind NeMo's modified-ALSD computer interface
            (:class:`~nemo_fastdecode.beam.nemo_computer.NemoBeamComputer`): chunk-by-chunk decoding of streams with
            ``prev_batched_state``, NeMo's only way of continuing a ``malsd_batch`` search.
    """

    @property
    def input_types(self):
        return {
            "encoder_output": NeuralType(("B", "D", "T"), AcousticEncodedRepresentation()),
            "encoded_lengths": NeuralType(tuple("B"), LengthsType()),
            "partial_hypotheses": [NeuralType(elements_type=HypothesisType(), optional=True)],
        }

    @property
    def output_types(self):
        return {"predictions": [NeuralType(elements_type=HypothesisType())]}

    def __init__(
        self,
        decoder_model: torch.nn.Module,
        joint_model: torch.nn.Module,
        blank_index: int,
        beam_size: int,
        max_symbols_per_step: int | None | object = _CLASS_DEFAULT,
        durations: Sequence[int] | None = None,
        score_norm: bool = True,
        return_best_hypothesis: bool = True,
        allow_cuda_graphs: bool = True,
        graph_mode: str | GraphMode | None = "auto",
        fused_topk: bool | None = None,
        fast_math: bool = False,
        compiled_step: bool = False,
        fusion_models: Sequence[torch.nn.Module] | None = None,
        fusion_models_alpha: Sequence[float] | None = None,
        pruning_mode: str | None = None,
        blank_lm_score_mode: str | None = None,
    ):
        super().__init__()
        if max_symbols_per_step is _CLASS_DEFAULT:
            max_symbols_per_step = None if durations else DEFAULT_MAX_SYMBOLS
        self.decoder, self.joint = decoder_model, joint_model
        self.blank_index, self.beam_size = blank_index, beam_size
        self.score_norm, self.return_best_hypothesis = score_norm, return_best_hypothesis
        self.computer = MALSDBeamComputer(
            decoder=decoder_model,
            joint=joint_model,
            blank_index=blank_index,
            beam_size=beam_size,
            max_symbols=nemo_max_symbols(max_symbols_per_step, graphs_allowed=allow_cuda_graphs),
            durations=durations,
            use_cuda_graphs=allow_cuda_graphs,
            graph_mode=GraphMode.parse(graph_mode),
            fused_topk=fused_topk,
            fast_math=fast_math,
            compiled_step=compiled_step,
            fusion=FusionModels(fusion_models, fusion_models_alpha or []) if fusion_models else None,
            pruning_mode=pruning_mode,
            blank_lm_score_mode=blank_lm_score_mode,
        )
        self.decoding_computer = NemoBeamComputer(self.computer, allow_cuda_graphs=allow_cuda_graphs)
        self.options: FastBeamConfig | None = None
        self.offline_batching = False
        self.fast_encoder = False

    @classmethod
    def from_options(
        cls,
        options: FastBeamConfig,
        *,
        decoder_model: torch.nn.Module,
        joint_model: torch.nn.Module,
        blank_index: int,
        **nemo_arguments: Any,
    ) -> FastBeamBatchedInfer:
        """The search for ``options`` (validated already), the one place that maps them to the constructor's
        arguments; ``nemo_arguments``: NeMo's, as its set-up resolved them (durations, fusion models and modes)."""
        search = cls(
            decoder_model=decoder_model,
            joint_model=joint_model,
            blank_index=blank_index,
            beam_size=options.beam_size,
            max_symbols_per_step=options.max_symbols,
            score_norm=options.score_norm,
            return_best_hypothesis=options.return_best_hypothesis,
            allow_cuda_graphs=options.allow_cuda_graphs,
            graph_mode=options.graph_mode,
            fused_topk=options.fused_topk,
            fast_math=bool(options.fast_math),
            compiled_step=bool(options.compiled_step),
            **nemo_arguments,
        )
        search.options = options
        # read by the model's transcribe (nemo.offline_transcribe)
        search.offline_batching, search.fast_encoder = options.offline_batching, options.fast_encoder
        return search

    # NeMo's hooks around training and validation; as NeMo's, they go through the decoding computer
    def disable_cuda_graphs(self) -> bool:
        return self.decoding_computer.disable_cuda_graphs()

    def maybe_enable_cuda_graphs(self) -> bool:
        """Graphs back on, unless ``allow_cuda_graphs=False`` disallowed them."""
        return self.decoding_computer.maybe_enable_cuda_graphs()

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    @typecheck()
    def forward(
        self,
        encoder_output: torch.Tensor,
        encoded_lengths: torch.Tensor,
        partial_hypotheses: list[Hypothesis | None] | None = None,
    ) -> tuple[list[Hypothesis] | list[NBestHypotheses]]:
        """Search ``encoder_output [B, D, T]`` with ``encoded_lengths [B]``; returns ``(hypotheses,)``."""
        if partial_hypotheses is not None:
            raise NotImplementedError(
                "fast_beam does not continue partial_hypotheses, as NeMo's malsd_batch does not; decode a stream "
                "chunk by chunk with decoding_computer(x, out_len, prev_batched_state), as NeMo's malsd_batch does"
            )
        inputs = check_decoder_inputs(encoder_output, encoded_lengths, None)
        batch_size = encoder_output.shape[0]
        if batch_size == 0:
            return ([],)
        with eval_mode(self.decoder, self.joint), torch.inference_mode():
            hyps = self.computer(encoder_output.transpose(1, 2), inputs.lengths)
            nbest = not self.return_best_hypothesis
            hypotheses = hyps.to_hypotheses(batch_size, score_norm=self.score_norm, nbest=nbest)
            mark_nonfinite(hypotheses, inputs.nonfinite_rows)
            return (hypotheses,)
