"""N-gram LM and boosting-tree fusion in the beam search, as NeMo 3.0's modified-ALSD computers apply it.

The models are NeMo's (``NGramGPULanguageModel``, ``GPUBoostingTreeModel``), held with their weights by
:class:`~nemo_fastdecode.transducer.fusion.FusionModels`, one state per beam (``B*K`` rows). Every step (NeMo's
``topk_fusion_model``) every non-blank label gets the models' scores (each times its alpha), and with
``blank_lm_score_mode=lm_weighted_full`` (the default) also ``log(1 - p(blank)) * sum(alphas)`` while blank's
log-probability is multiplied by ``1 + sum(alphas)``; ``no_score`` leaves blank as it is. With
``pruning_mode=late`` (the default of NeMo's ``malsd_batch`` set-up) the joint's log-probabilities are changed in
place before the top-k, and a forced blank scores the changed blank; with ``early`` the top-k of the unchanged ones
is changed, and a forced blank scores the unchanged blank. After the selection each kept beam takes its parent's
state, moved to the candidate of its label when it emitted one.

A per-row multi-model (NeMo's ``GPUBiasingMultiModel``, one boosting tree per stream) is fused after the models: each
row (every beam of a stream) names its tree and its tree's weight (:meth:`BeamFusion.load_rows`), so the sum of the
weights that scales blank is per row: the models' weights plus the row's tree's (plus 0 for a row without a tree).
That is NeMo's arithmetic for a search fusing ``[models..., that row's tree]``: the sum taken in double precision
(NeMo sums Python floats), then rounded to the scores' dtype as PyTorch rounds a Python scalar factor.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from nemo.collections.asr.parts.utils.batched_beam_decoding_utils import BlankLMScoreMode, PruningMode

from nemo_fastdecode.kernels.beam_topk import BLANK_PROB_EPS, MAX_SINGLE_BLOCK_V, log_softmax_topk_fused
from nemo_fastdecode.transducer.fusion import FusionBuffers, FusionModels

__all__ = ["BeamFusion", "BeamFusionBuffers", "parse_fusion_modes"]


def parse_fusion_modes(
    pruning_mode: str | PruningMode | None, blank_lm_score_mode: str | BlankLMScoreMode | None
) -> tuple[PruningMode, BlankLMScoreMode]:
    """NeMo's fusion modes from their names; ``None`` values are the defaults of NeMo's ``malsd_batch`` set-up
    (``RNNTDecoding``: ``late`` pruning, ``lm_weighted_full``). A name NeMo does not know raises a ValueError."""
    modes = []
    for name, value, enum, default in (
        ("pruning_mode", pruning_mode, PruningMode, PruningMode.LATE),
        ("blank_lm_score_mode", blank_lm_score_mode, BlankLMScoreMode, BlankLMScoreMode.LM_WEIGHTED_FULL),
    ):
        try:
            modes.append(default if value is None else enum(value))
        except ValueError:
            raise ValueError(f"{name}={value!r}: valid are {[m.value for m in enum]}") from None
    return modes[0], modes[1]


@dataclass
class BeamFusionBuffers(FusionBuffers):
    """The greedy loop's fusion buffers for ``B*K`` beams, with the per-row weight sums of a per-row model.

    Attributes:
        alpha_sums: ``[B*K]`` (scores' dtype), only with a per-row model: each beam's sum of the fusion weights (what
            ``log(1 - p(blank))`` is scaled by); else ``None`` (the sum is one number).
        blank_scales: ``[B*K]``: ``1 + alpha_sums`` (what blank's log-probability is scaled by).
    """

    alpha_sums: torch.Tensor | None = None
    blank_scales: torch.Tensor | None = None


class BeamFusion:
    """Fusion of ``models`` into a beam search of ``beam_size`` beams per row.

    Args:
        models: NeMo's fusion models with their weights.
        beam_size: beams per row ``K``.
        pruning_mode / blank_lm_score_mode: when the scores join the ranking, how blank is scored
            (:func:`parse_fusion_modes`).
    """

    def __init__(
        self, models: FusionModels, beam_size: int, pruning_mode: PruningMode, blank_lm_score_mode: BlankLMScoreMode
    ):
        self.models, self.beam_size = models, beam_size
        self.pruning_mode, self.blank_lm_score_mode = pruning_mode, blank_lm_score_mode
        self.alpha_sum = sum(models.alphas)  # as NeMo: a Python sum of the weights

    def allocate(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> BeamFusionBuffers:
        """Buffers for ``batch_size`` rows x ``K`` beams (row-major, as the networks see the beams)."""
        plain = self.models.allocate(batch_size * self.beam_size, device, dtype)
        buffers = BeamFusionBuffers(**{f.name: getattr(plain, f.name) for f in fields(plain)})
        if self.models.per_row is not None:
            beams = batch_size * self.beam_size
            buffers.alpha_sums = torch.full([beams], self.alpha_sum, dtype=dtype, device=device)
            buffers.blank_scales = torch.full([beams], 1 + self.alpha_sum, dtype=dtype, device=device)
        return buffers

    def load_rows(
        self, buffers: BeamFusionBuffers, model_ids: torch.Tensor | None, weights: torch.Tensor | None
    ) -> None:
        """The per-row model's tree of each of the batch's first ``N`` rows (``model_ids [N]``, ``-1``: none) and its
        weight (``weights [N]``, float64, 0 without a tree): every beam of a row fuses the row's tree; rows after them
        (and all rows when ``model_ids`` is ``None``) have none. Device work only."""
        if (model_ids is None) != (weights is None):
            raise ValueError("per-row model ids and their weights go together: give both or neither")
        expanded = None if model_ids is None else model_ids.repeat_interleave(self.beam_size)
        self.models.load_model_ids(buffers, expanded)
        if buffers.alpha_sums is None:
            return
        # NeMo's sum(fusion_models_alpha) of [models..., the row's tree] in double, rounded as a Python scalar factor
        sums = torch.full(
            buffers.alpha_sums.shape, self.alpha_sum, dtype=torch.float64, device=buffers.model_ids.device
        )
        if weights is not None:
            rows = weights.shape[0] * self.beam_size
            sums[:rows] += weights.to(device=sums.device, dtype=torch.float64).repeat_interleave(self.beam_size)
        buffers.alpha_sums.copy_(sums)
        buffers.blank_scales.copy_(1 + sums)

    def kernel_applies(self, token_logits: torch.Tensor, dtype: torch.dtype) -> bool:
        """Whether :meth:`top_k` can run on the fused beam-step kernel (:func:`log_softmax_topk_fused`): late pruning
        on float32 logits that fit one block, with one weight sum for every row (no per-row model)."""
        return (
            self.pruning_mode is PruningMode.LATE
            and self.models.per_row is None
            and dtype == torch.float32
            and token_logits.dtype == torch.float32
            and token_logits.shape[-1] <= MAX_SINGLE_BLOCK_V
        )

    def top_k(
        self,
        buffers: BeamFusionBuffers,
        token_logits: torch.Tensor,
        blank_index: int,
        dtype: torch.dtype,
        use_kernel: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Each beam's candidates from the joint's token logits ``token_logits [B*K, V+1]`` (blank last), as NeMo's
        ``topk_fusion_model``: late pruning gives the fused log-probabilities' ``K`` best non-blank labels, then
        blank: ``(values, ids) [B*K, K+1]`` (the beam-step kernel's layout) and ``None``; early pruning gives the
        ``K`` best of the unfused log-probabilities with the fusion scores added, ``[B*K, K]``, and what a forced blank
        scores ``[B*K]`` (blank's unfused log-probability). ``use_kernel`` (where :meth:`kernel_applies`): late pruning
        in one kernel, equal to NeMo's ops up to float32 rounding."""
        # advance here: the beams' states are those the previous step selected (NeMo advances right after)
        self.models.advance(buffers)
        weighted = self.blank_lm_score_mode is BlankLMScoreMode.LM_WEIGHTED_FULL
        if use_kernel:
            # one model's scores are their own sum (0 + s == s); several are summed in NeMo's order
            scores = buffers.scores[0] if len(buffers.scores) == 1 else sum(buffers.scores)
            values, ids = log_softmax_topk_fused(token_logits, self.beam_size, scores, self.alpha_sum, weighted)
            return values, ids, None
        log_probs = F.log_softmax(token_logits, dim=-1, dtype=dtype)
        fusion_scores_sum = sum(buffers.scores)  # NeMo's order: 0 + first + second
        # the weights' sum and 1 + it: one number, or one per beam with a per-row model
        alpha_sum, blank_scale = self.alpha_sum, 1 + self.alpha_sum
        if buffers.alpha_sums is not None:
            alpha_sum, blank_scale = buffers.alpha_sums[:, None], buffers.blank_scales
        if weighted:
            non_blank_logprob = torch.log1p(-torch.clamp(torch.exp(log_probs[..., -1]), max=1.0 - BLANK_PROB_EPS))
        if self.pruning_mode is PruningMode.EARLY:
            values, ids = torch.topk(log_probs, self.beam_size, dim=-1, largest=True, sorted=True)
            is_blank = ids == blank_index
            label_scores = torch.gather(fusion_scores_sum, dim=-1, index=torch.where(is_blank, 0, ids))
            if weighted:
                fused = values + non_blank_logprob.unsqueeze(-1) * alpha_sum + label_scores
                scale = blank_scale[:, None] if isinstance(blank_scale, torch.Tensor) else blank_scale
                values = torch.where(is_blank, values * scale, fused)
            else:
                values = torch.where(is_blank, values, values + label_scores)
            return values, ids, log_probs[:, blank_index]
        if weighted:
            log_probs[..., :-1] += non_blank_logprob.unsqueeze(-1) * alpha_sum + fusion_scores_sum
            log_probs[..., -1] *= blank_scale
        else:
            log_probs[..., :-1] += fusion_scores_sum
        top_values, top_ids = log_probs[:, :blank_index].topk(self.beam_size, dim=-1, largest=True, sorted=True)
        blank_ids = torch.full_like(top_ids[:, :1], blank_index)
        values = torch.cat((top_values, log_probs[:, blank_index:]), dim=1)
        return values, torch.cat((top_ids, blank_ids), dim=1), None

    def select(self, buffers: FusionBuffers, parents: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor) -> None:
        """Each new beam's states: its parent's (``parents [B, K]``), moved to the candidate of its label
        (``labels [B*K]``) where it emitted one (``keep [B*K]``: it did not)."""
        batch, k = parents.shape
        keep, index = keep.view(batch, k), labels.view(batch, k, 1)
        index = torch.where(keep[..., None], 0, index)  # blank has no candidate
        for states, candidates in zip(buffers.states, buffers.candidates, strict=True):
            vocab = candidates.shape[-1]
            parent_candidates = candidates.view(batch, k, vocab).gather(1, parents[:, :, None].expand(batch, k, vocab))
            parent_states = states.view(batch, k).gather(1, parents)
            moved = parent_candidates.gather(2, index)[..., 0]
            torch.where(keep, parent_states, moved, out=states.view(batch, k))
