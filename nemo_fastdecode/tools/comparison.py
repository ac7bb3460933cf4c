"""Decode batches of encoder outputs and compare hypotheses token by token (tokens, frames, scores)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis

Batches = Sequence[tuple[torch.Tensor, torch.Tensor]]  # (encoder output [B, D, T], lengths [B]) per batch


def decode_all(decoder: Any, batches: Batches) -> list[Hypothesis]:
    """Every batch through ``decoder`` (a NeMo greedy infer object); hypotheses in batch order."""
    hyps: list[Hypothesis] = []
    with torch.inference_mode():
        for encoder_output, lengths in batches:
            hyps.extend(decoder(encoder_output=encoder_output, encoded_lengths=lengths)[0])
    return hyps


def as_int_list(value: Any) -> list[int]:
    """Token ids or frame indices as a list of ints (NeMo gives lists or tensors)."""
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.reshape(-1).tolist()]
    return [int(v) for v in value]


def agreement(reference: Sequence[Hypothesis], hyps: Sequence[Hypothesis]) -> tuple[float, float]:
    """(share of hypotheses with the reference's tokens and frames, largest absolute score difference)."""
    same, worst = 0, 0.0
    for r, h in zip(reference, hyps, strict=True):
        same += as_int_list(r.y_sequence) == as_int_list(h.y_sequence) and as_int_list(r.timestamp) == as_int_list(
            h.timestamp
        )
        worst = max(worst, abs(float(r.score) - float(h.score)))
    return same / max(len(reference), 1), worst
