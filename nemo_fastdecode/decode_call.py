"""What every NeMo-facing decoder does around a decode: check its inputs, run its modules in eval mode."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from nemo_fastdecode.logs import logger

__all__ = ["DecoderInputs", "check_decoder_inputs", "eval_mode", "mark_nonfinite", "true_fp32"]


@dataclass(frozen=True)
class DecoderInputs:
    """What :func:`check_decoder_inputs` found.

    Attributes:
        lengths: ``encoded_lengths`` to decode with, on the input's device ``[B]``: rows with non-finite
            encoder output have length 0 (they decode to an empty hypothesis).
        lengths_on_host: the caller's ``encoded_lengths`` on the CPU ``[B]`` (what NeMo reports as ``length``).
        nonfinite_rows: batch rows whose encoder output has NaN or inf in a frame they decode.
    """

    lengths: torch.Tensor
    lengths_on_host: torch.Tensor
    nonfinite_rows: list[int]


def check_decoder_inputs(
    encoder_output: torch.Tensor, encoded_lengths: torch.Tensor, partial_hypotheses: Sequence[Any] | None
) -> DecoderInputs:
    """Raise a ValueError naming what is wrong with a decoder's inputs; find rows with non-finite encoder output.

    NaN or inf in an utterance's encoder output would decode to meaningless tokens (NeMo decodes them anyway);
    here such a row is decoded as empty and reported (:func:`mark_nonfinite`), and the other rows decode as usual.
    One host synchronisation reads the lengths and the rows together.
    """
    if encoder_output.dim() != 3:
        raise ValueError(f"encoder_output must be [B, D, T], got shape {tuple(encoder_output.shape)}")
    if not encoder_output.is_floating_point():
        raise ValueError(f"encoder_output must be a float tensor, got {encoder_output.dtype}")
    batch_size, _, max_time = encoder_output.shape
    if encoded_lengths.shape != (batch_size,):
        raise ValueError(f"encoded_lengths must be [B]=[{batch_size}], got shape {tuple(encoded_lengths.shape)}")
    if encoded_lengths.is_floating_point() or encoded_lengths.dtype == torch.bool:
        raise ValueError(f"encoded_lengths must be an integer tensor, got {encoded_lengths.dtype}")
    if encoded_lengths.device != encoder_output.device:
        raise ValueError(
            f"encoded_lengths is on {encoded_lengths.device} but encoder_output on {encoder_output.device}"
        )
    if partial_hypotheses is not None and len(partial_hypotheses) != batch_size:
        raise ValueError(f"partial_hypotheses has {len(partial_hypotheses)} entries for a batch of {batch_size}")
    # a frame counts if some row decodes it: [B, T] -> per row, any non-finite value in its frames
    decoded = torch.arange(max_time, device=encoder_output.device)[None, :] < encoded_lengths[:, None]
    nonfinite = (~torch.isfinite(encoder_output)).any(dim=1).logical_and_(decoded).any(dim=1)  # [B]
    on_host = torch.stack([encoded_lengths.to(torch.int64), nonfinite.to(torch.int64)]).cpu()  # one synchronisation
    lengths_on_host, rows = on_host[0].to(encoded_lengths.dtype), on_host[1].nonzero().flatten().tolist()
    if batch_size:
        shortest, longest = (int(v) for v in torch.aminmax(lengths_on_host))
        if shortest < 0 or longest > max_time:
            raise ValueError(f"encoded_lengths must be in [0, T={max_time}], got min {shortest} max {longest}")
    lengths = encoded_lengths.masked_fill(nonfinite, 0) if rows else encoded_lengths
    return DecoderInputs(lengths, lengths_on_host, rows)


def mark_nonfinite(hypotheses: Sequence[Any], rows: Sequence[int]) -> None:
    """Give the hypotheses of ``rows`` (decoded empty) a NaN score, and say which rows in one warning.

    ``hypotheses``: one ``Hypothesis`` or ``NBestHypotheses`` per batch row.
    """
    if not rows:
        return
    for row in rows:
        entry = hypotheses[row]
        for hyp in getattr(entry, "n_best_hypotheses", None) or [entry]:
            hyp.score = float("nan")
    logger.warning(
        "nemo_fastdecode: encoder output has NaN or inf values in batch row(s) %s; decoded as empty hypotheses "
        "with score NaN (check the audio, and the model's precision)",
        list(rows),
    )


@contextmanager
def true_fp32(enabled: bool = True) -> Iterator[None]:
    """cuBLAS and cuDNN in true fp32 inside (no TF32), the previous settings restored after.

    PyTorch lets cuDNN convolutions and RNNs use TF32 by default (``torch.backends.cudnn.allow_tf32``), and NeMo's
    streaming scripts turn TF32 matmuls on; the exact fp32 paths need neither. Kernels chosen while a CUDA graph is
    captured inside stay in the graph. ``enabled=False``: nothing changes.

    ``torch.set_float32_matmul_precision("high")`` (NeMo's streaming pipeline builder calls it) also lets oneDNN
    round CPU matmuls to TF32, so the CPU's flags are set too: CPU references stay exact.

    PyTorch has two APIs for these flags, and once a process has set one, reading the other raises. This uses the
    legacy flags (``allow_tf32``, ``set_float32_matmul_precision``), as NeMo does, unless the process set the newer
    ``fp32_precision`` ones.
    """
    if not enabled:
        yield
        return
    flags = _legacy_tf32_flags() or _fp32_precision_flags()
    previous = [(owner, name, getattr(owner, name)) for owner, name, _ in flags]
    for owner, name, exact in flags:
        setattr(owner, name, exact)
    try:
        yield
    finally:
        for owner, name, value in reversed(previous):
            setattr(owner, name, value)


def _legacy_tf32_flags() -> list[tuple[Any, str, Any]]:
    """``(owner, attribute, exact value)`` of the legacy TF32 flags; empty when the process uses the newer API."""
    try:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32  # noqa: B018  (reading raises)
        torch.get_float32_matmul_precision()
    except RuntimeError:
        return []
    return [
        (torch.backends.cuda.matmul, "allow_tf32", False),
        (torch.backends.cudnn, "allow_tf32", False),
        (_MATMUL_PRECISION, "value", "highest"),  # CUDA's and oneDNN's (CPU) matmuls
    ]


def _fp32_precision_flags() -> list[tuple[Any, str, Any]]:
    """``(owner, attribute, exact value)`` of the newer per-backend fp32 precision flags."""
    cudnn, mkldnn = torch.backends.cudnn, torch.backends.mkldnn
    backends = [torch.backends.cuda.matmul, cudnn.conv, cudnn.rnn]
    backends += [getattr(mkldnn, op) for op in ("matmul", "conv", "rnn") if hasattr(mkldnn, op)]  # the CPU's
    return [(backend, "fp32_precision", "ieee") for backend in backends]


class _Float32MatmulPrecision:
    """``torch.get/set_float32_matmul_precision`` as an attribute, for :func:`true_fp32`'s flag list."""

    @property
    def value(self) -> str:
        return torch.get_float32_matmul_precision()

    @value.setter
    def value(self, precision: str) -> None:
        torch.set_float32_matmul_precision(precision)


_MATMUL_PRECISION = _Float32MatmulPrecision()


@contextmanager
def eval_mode(*modules: torch.nn.Module) -> Iterator[None]:
    """The modules in eval mode for a decode, their training flags restored after it.

    Only modules in training mode are switched: ``Module.train`` walks every submodule, which costs host time per
    batch on the decoders' hot path when done unconditionally.
    """
    training = [m for m in modules if m.training]
    for module in training:
        module.eval()
    try:
        yield
    finally:
        for module in training:
            module.train()
