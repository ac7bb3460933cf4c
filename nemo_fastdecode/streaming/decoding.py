"""Per-slot greedy decoding state: each stream's partial hypothesis, continued chunk after chunk.

The decoder is ``fast_greedy``'s :class:`~nemo_fastdecode.greedy.infer.FastGreedyBatchedInfer` (the label
loop by default), called as NeMo's streaming step calls its decoder: the chunk's encoder frames plus
the streams' previous hypotheses (``partial_hypotheses``), whose ``dec_state`` carries the prediction
network's state (:class:`~nemo_fastdecode.greedy.state.GreedyStateItem`). Any subset of streams decodes
together; each keeps its own state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis

from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

__all__ = ["SlotDecoder"]


class SlotDecoder:
    """Greedy transducer decoding for ``num_slots`` streams, state kept per slot.

    Args:
        model: a NeMo transducer model (RNN-T, TDT or hybrid; its RNN-T head decodes).
        num_slots: number of slots.
        max_symbols: most labels per frame; default the model's ``decoding.greedy.max_symbols`` (or 10).
        loop_labels: label looping (default) or frame looping (RNN-T only).
        use_cuda_graphs: let the greedy decoder use CUDA graphs on a GPU.
    """

    def __init__(
        self,
        model: ASRModel,
        num_slots: int,
        *,
        max_symbols: int | None = None,
        loop_labels: bool = True,
        use_cuda_graphs: bool = True,
    ):
        decoding_cfg = model.cfg.get("decoding", {}) or {}
        greedy = decoding_cfg.get("greedy", {}) or {}
        if max_symbols is None:
            max_symbols = greedy.get("max_symbols", None) or greedy.get("max_symbols_per_step", None) or 10
        durations = decoding_cfg.get("durations", None) or None
        self.model = model
        self.infer = FastGreedyBatchedInfer(
            decoder_model=model.decoder,
            joint_model=model.joint,
            blank_index=int(model.decoding.blank_id),
            max_symbols_per_step=int(max_symbols),
            durations=list(durations) if durations else None,
            loop_labels=loop_labels,
            use_cuda_graph_decoder=use_cuda_graphs,
        )
        self._hyps: list[Hypothesis | None] = [None] * num_slots

    def reset(self, slot: int) -> None:
        """Forget a slot's hypothesis (a new stream starts from scratch)."""
        self._hyps[slot] = None

    def hypothesis(self, slot: int) -> Hypothesis | None:
        """The slot's hypothesis so far (``None`` before its first decoded frame)."""
        return self._hyps[slot]

    def decode(self, slots: Sequence[int], encoded: torch.Tensor, lengths: torch.Tensor) -> list[Hypothesis]:
        """Continue the streams in ``slots`` with their new frames.

        Args:
            slots: ``N`` distinct slots.
            encoded: ``[N, T, D]`` new encoder frames of each stream (left-aligned).
            lengths: ``[N]`` valid frames of each row.

        Returns:
            The ``N`` updated hypotheses (token ids so far in ``y_sequence``, frame indices from the
            stream's start in ``timestamp``).
        """
        previous = [self._hyps[slot] for slot in slots]
        (hyps,) = self.infer(
            encoder_output=encoded.transpose(1, 2), encoded_lengths=lengths, partial_hypotheses=previous
        )
        for slot, hyp in zip(slots, hyps, strict=True):
            self._hyps[slot] = hyp
        return hyps

    def text(self, hyp: Hypothesis | None) -> str:
        """The text of a hypothesis (the model's tokenizer or labels)."""
        if hyp is None:
            return ""
        ids = hyp.y_sequence.tolist() if isinstance(hyp.y_sequence, torch.Tensor) else list(hyp.y_sequence)
        return self.model.decoding.decode_ids_to_str([int(i) for i in ids])
