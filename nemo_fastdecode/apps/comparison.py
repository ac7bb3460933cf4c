"""Encode audio once, decode the same encoder outputs with several decoders, compare hypotheses token by token."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis

from nemo_fastdecode.nemo.context import eval_mode

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

Batches = Sequence[tuple[torch.Tensor, torch.Tensor]]  # (encoder output [B, D, T], lengths [B]) per batch


def encode(
    model: ASRModel,
    audios: Sequence[np.ndarray | torch.Tensor],
    batch_size: int,
    device: str | torch.device,
    dtype: torch.dtype | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Run the model's preprocessor and encoder once, batch by batch, in the given order.

    Args:
        model: a NeMo ASR model, already on ``device``. It runs in eval mode (dropout off) whatever
            its modules' training flags, which are restored afterwards.
        audios: mono 16 kHz signals (float in [-1, 1]); batches are taken in this order, so sort
            them (e.g. longest first) beforehand to limit padding.
        batch_size: utterances per batch.
        device: the model's device; audio is moved there.
        dtype: ``None`` runs in fp32; ``torch.bfloat16`` / ``torch.float16`` run the encoder under
            autocast (the outputs then come back in whatever dtype autocast produced).

    Returns:
        ``(encoded, lengths)``: per batch, the encoder output ``[B, D, T]`` and its lengths ``[B]``
        (int64), on ``device``. Feed them to a transducer decoder, e.g.
        ``model.decoding.rnnt_decoder_predictions_tensor(encoder_output=encoded[i], encoded_lengths=lengths[i])``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if dtype not in (None, torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype must be None, torch.float32, torch.bfloat16 or torch.float16, got {dtype}")
    device = torch.device(device)
    model_device = next(model.parameters()).device
    if model_device.type != device.type or (device.index is not None and model_device != device):
        raise ValueError(f"model is on {model_device} but device={device}; move it with model.to({str(device)!r})")
    encoded: list[torch.Tensor] = []
    lengths: list[torch.Tensor] = []
    use_autocast = dtype in (torch.bfloat16, torch.float16)
    with torch.inference_mode(), eval_mode(model):
        for start in range(0, len(audios), batch_size):
            chunk = [torch.as_tensor(a, dtype=torch.float32).reshape(-1) for a in audios[start : start + batch_size]]
            lens = torch.tensor([c.numel() for c in chunk], dtype=torch.int64)
            signal = torch.zeros(len(chunk), int(lens.max()), dtype=torch.float32)
            for row, c in enumerate(chunk):
                signal[row, : c.numel()] = c
            signal, lens = signal.to(device), lens.to(device)
            autocast = (
                torch.autocast(device_type=device.type, dtype=dtype) if use_autocast else contextlib.nullcontext()
            )
            with autocast:
                feats, feat_lens = model.preprocessor(input_signal=signal, length=lens)
                enc, enc_lens = model.encoder(audio_signal=feats, length=feat_lens)
            encoded.append(enc)
            lengths.append(enc_lens.to(torch.int64))
    return encoded, lengths


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
