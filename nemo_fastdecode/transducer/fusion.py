"""N-gram LM and boosting-tree fusion in the greedy label loop, as NeMo 3.0's label-looping computers apply it.

The fusion models are NeMo's own objects (``NGramGPULanguageModel``, ``GPUBoostingTreeModel``, built by NeMo's
``RNNTDecoding`` from ``greedy.ngram_lm_model`` / ``greedy.boosting_tree``); this module only wires their calls
into our loop buffers. Each model keeps one state per row. At the start of every outer iteration each model
``advance``\\ s the rows' states: scores ``[B, V]`` (times the model's alpha) and the next state for every label
``[B, V]``. A look then decides blank against non-blank on the joint's own logits, and picks the non-blank label
on the logits plus every model's scores (NeMo's rule: fusion never turns a blank into a label or back). After the
emission, the rows that emitted a label move their states to that label's candidate.

Scores follow NeMo's eager label loop (``torch_impl``, its decoder without CUDA graphs, on the CPU and the GPU):
a label found at an iteration's first look scores its fused logit; one found after blanks (the inner loop) scores
the joint's unfused best logit, as NeMo's eager loop leaves it. (NeMo's CUDA-graph loop scores the latter fused
too; tokens and timestamps are the same in both.)

Per-row boosting (NeMo's per-stream biasing, ``enable_per_stream_biasing``): NeMo's ``GPUBiasingMultiModel`` holds
many boosting trees in one structure, each with its own weight; every row names its tree by id (``-1``: none, scores
0). It is one more fusion model with one state per row, advanced with the rows' ids and weighted by the multi-model
itself, as NeMo's ``advance_fusion_models`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nemo_fastdecode.graphs import GraphMode
from nemo_fastdecode.logs import logger

__all__ = ["FusionBuffers", "FusionModels"]


@dataclass
class FusionBuffers:
    """Per-row fusion state for ``B`` rows, one entry per model: every tensor the loop touches, allocated once.

    Attributes:
        states: ``[B]`` int64 each: the model's state of every row during the loop.
        initial_states: ``[B]``: where each row starts (after ``<BOS>``, or the previous chunk's state).
        scores: ``[B, V]`` the model's scores (times alpha) for every non-blank label from the current states.
        candidates: ``[B, V]`` int64: the state each label leads to.
        continuing: ``[B]`` rows whose look at an iteration's start continues a search over blanks (one-level
            loop): NeMo scores their label as a look of its inner loop.
        model_ids: ``[B]`` int64, with a per-row model only: each row's tree in it (``-1``: none); else ``None``.
    """

    states: list[torch.Tensor]
    initial_states: list[torch.Tensor]
    scores: list[torch.Tensor]
    candidates: list[torch.Tensor]
    continuing: torch.Tensor
    model_ids: torch.Tensor | None = None


class FusionModels:
    """NeMo's fusion models (n-gram LMs, boosting trees) with their weights, applied to the greedy label loop.

    Args:
        models: NeMo ``NGramGPULanguageModel`` / ``GPUBoostingTreeModel`` objects (``advance(states) -> (scores [B, V],
            next_states [B, V])``, ``get_init_states(batch_size, bos)``), over the model's ``V`` non-blank labels.
        alphas: one weight per model (``ngram_lm_alpha``, ``boosting_tree_alpha``).
        per_row: NeMo's ``GPUBiasingMultiModel`` (``advance(states, model_ids)``, weights of its own), fused after
            ``models``; the rows' model ids are loaded with each batch (:meth:`load_model_ids`).
    """

    def __init__(
        self,
        models: Sequence[torch.nn.Module],
        alphas: Sequence[float],
        per_row: torch.nn.Module | None = None,
    ):
        if len(models) != len(alphas):
            raise ValueError(
                f"fusion_models_alpha needs one weight per fusion model: {len(models)} models, {len(alphas)} weights"
            )
        if not models and per_row is None:
            raise ValueError("FusionModels needs at least one fusion model")
        self.models, self.alphas = list(models), [float(a) for a in alphas]
        self.per_row = per_row

    def __len__(self) -> int:
        """Fusion states per row: one per model, the per-row model included."""
        return len(self._all())

    def _all(self) -> list[torch.nn.Module]:
        return self.models + ([] if self.per_row is None else [self.per_row])

    def compatible_with_cuda_graphs(self) -> bool:
        """Whether every model's ``advance`` runs without host synchronisation (NeMo's Triton kernel: ``use_triton``)."""
        return all(model.compatible_with_cuda_graphs() for model in self._all())

    def allow_graphs(self, forced_mode: GraphMode | None, use_cuda_graphs: bool, search: str) -> bool:
        """Whether the ``search`` (for the log line) may keep CUDA graphs (``use_cuda_graphs``): only where every
        model's ``advance`` can be captured; a ``forced_mode`` other than eager is
        refused otherwise."""
        if self.compatible_with_cuda_graphs():
            return use_cuda_graphs
        if forced_mode is not None and forced_mode is not GraphMode.EAGER:
            raise ValueError(
                f"graph_mode={forced_mode.value} needs fusion models whose advance can be captured in a CUDA "
                "graph (NeMo's Triton kernels, use_triton=True); use graph_mode eager or auto"
            )
        if use_cuda_graphs:
            logger.info(
                "nemo_fastdecode: %s with fusion runs without CUDA graphs: a fusion model's advance "
                "synchronises with the host (use_triton=False)",
                search,
            )
        return False

    def check_vocabulary(self, vocab_size: int) -> None:
        """Each model scores the decoder's ``vocab_size`` non-blank labels (blank is not a label of the LM)."""
        for model in self._all():
            if model.vocab_size != vocab_size:
                raise ValueError(
                    f"fusion model {type(model).__name__} has a vocabulary of {model.vocab_size} labels, the decoder "
                    f"{vocab_size} (without blank)"
                )

    def to(self, device: torch.device) -> None:
        """Move the models to ``device`` (as NeMo does before each decode; outside inference mode, as NeMo does)."""
        with torch.inference_mode(mode=False):
            for model in self._all():
                model.to(device)

    def initial_states(self, batch_size: int, device: torch.device) -> list[torch.Tensor]:
        """Each model's state after ``<BOS>`` for ``batch_size`` rows: ``[B]`` int64 each."""
        return [model.get_init_states(batch_size=batch_size, bos=True).to(device) for model in self._all()]

    def allocate(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> FusionBuffers:
        """The loop's fusion buffers for ``batch_size`` rows; ``dtype``: the joint's logits (the scores add to them)."""
        models = self._all()
        vocab_size = models[0].vocab_size
        initial = self.initial_states(batch_size, device)
        return FusionBuffers(
            states=[s.clone() for s in initial],
            initial_states=initial,
            scores=[torch.zeros([batch_size, vocab_size], dtype=dtype, device=device) for _ in models],
            candidates=[torch.zeros([batch_size, vocab_size], dtype=torch.long, device=device) for _ in models],
            continuing=torch.zeros([batch_size], dtype=torch.bool, device=device),
            model_ids=None if self.per_row is None else torch.full([batch_size], -1, dtype=torch.long, device=device),
        )

    def load_model_ids(self, buffers: FusionBuffers, model_ids: torch.Tensor | None) -> None:
        """The per-row model's tree of each of the batch's first ``N`` rows (``model_ids [N]``; ``None``: none);
        the rows after them have none. Device work only."""
        if buffers.model_ids is None:
            if model_ids is not None:
                raise ValueError("per-row model ids were given to a decoder without a per-row (multi-)model")
            return
        buffers.model_ids.fill_(-1)
        if model_ids is not None:
            buffers.model_ids[: model_ids.shape[0]].copy_(model_ids)

    def reset_initial_states(self, buffers: FusionBuffers) -> None:
        """Every row starts after ``<BOS>``."""
        fresh = self.initial_states(buffers.continuing.shape[0], buffers.continuing.device)
        for initial, state in zip(buffers.initial_states, fresh, strict=True):
            initial.copy_(state)

    def advance(self, buffers: FusionBuffers) -> None:
        """Scores and candidate states of every label from the rows' current states (NeMo's ``advance_fusion_models``)."""
        alphas = self.alphas + ([] if self.per_row is None else [None])
        for model, alpha, states, scores_out, candidates_out in zip(
            self._all(), alphas, buffers.states, buffers.scores, buffers.candidates, strict=True
        ):
            if alpha is None:  # the per-row model weighs each row by its own tree's weight
                scores, candidates = model.advance(states=states, model_ids=buffers.model_ids)
                scores = scores.to(dtype=scores_out.dtype)
            else:
                scores, candidates = model.advance(states=states)
                scores = scores.to(dtype=scores_out.dtype)
                scores *= alpha  # as NeMo: the scores' dtype first, then the weight
            scores_out.copy_(scores)
            candidates_out.copy_(candidates)

    @staticmethod
    def best_token(
        buffers: FusionBuffers, logits: torch.Tensor, num_tokens: int, blank_index: int, start: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The look's label and score ``[B]`` from the joint's ``logits [B, N]`` (tokens, blank, TDT durations).

        Blank or not is the joint's own decision; a non-blank label is the best of ``logits[:, :V]`` plus every
        model's scores (added one by one, as NeMo adds them). ``start``: an iteration's first look, where a label
        scores its fused logit (except for rows continuing over blanks, see :class:`FusionBuffers`).
        """
        scores, labels = logits[:, :num_tokens].max(dim=-1)
        fused = logits[:, :blank_index].clone()
        for fusion_scores in buffers.scores:
            fused += fusion_scores
        fused_scores, fused_labels = fused.max(dim=-1)
        is_blank = labels == blank_index
        labels = torch.where(is_blank, labels, fused_labels)
        if start:
            # same as: scores[~is_blank & ~continuing] = fused_scores[...]
            keep = torch.logical_or(is_blank, buffers.continuing)
            scores = torch.where(keep, scores, fused_scores)
        return scores, labels

    @staticmethod
    def select(buffers: FusionBuffers, labels: torch.Tensor, emitted: torch.Tensor) -> None:
        """Rows in ``emitted [B]`` move each model's state to the candidate of their ``labels [B]``; others keep it."""
        index = (labels * emitted)[:, None]  # blank (out of the candidates' range) only where not emitted
        for states, candidates in zip(buffers.states, buffers.candidates, strict=True):
            # same as: states[emitted] = candidates[rows, labels][emitted]
            torch.where(emitted, candidates.gather(1, index)[:, 0], states, out=states)
