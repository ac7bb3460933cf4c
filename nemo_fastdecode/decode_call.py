"""What every NeMo-facing decoder does around a decode: check its inputs, run its modules in eval mode."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["check_decoder_inputs", "eval_mode"]


def check_decoder_inputs(
    encoder_output: torch.Tensor, encoded_lengths: torch.Tensor, partial_hypotheses: Sequence[Any] | None
) -> torch.Tensor:
    """Raise a ValueError naming what is wrong with a decoder's inputs; returns ``encoded_lengths`` on the CPU."""
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
    lengths_on_host = encoded_lengths.cpu()  # one host synchronisation
    if batch_size:
        shortest, longest = (int(v) for v in torch.aminmax(lengths_on_host))
        if shortest < 0 or longest > max_time:
            raise ValueError(f"encoded_lengths must be in [0, T={max_time}], got min {shortest} max {longest}")
    if partial_hypotheses is not None and len(partial_hypotheses) != batch_size:
        raise ValueError(f"partial_hypotheses has {len(partial_hypotheses)} entries for a batch of {batch_size}")
    return lengths_on_host


@contextmanager
def eval_mode(*modules: torch.nn.Module) -> Iterator[None]:
    """The modules in eval mode for a decode, their training flags restored after it.

    Only modules in training mode are switched: ``Module.train`` walks every submodule, which cost about 0.4 ms
    of host time per batch on the decoders' hot path when done unconditionally.
    """
    training = [m for m in modules if m.training]
    for module in training:
        module.eval()
    try:
        yield
    finally:
        for module in training:
            module.train()
