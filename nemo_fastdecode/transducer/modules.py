"""Module introspection that greedy, beam and streaming decoding share: a module's device and dtype, the joint's
output layout (blank last), the prediction network's state layout (its batch dimension)."""

from __future__ import annotations

import itertools

import torch


def module_device(module: torch.nn.Module, default: torch.device | str = "cpu") -> torch.device:
    """The device of ``module``'s first parameter (else buffer); ``default`` for a module that has neither.

    NeMo's decoders accept prediction networks and joints without any (its tests build such stand-ins from
    ``AbstractRNNTDecoder`` / ``AbstractRNNTJoint``), where ``next(module.parameters())`` raises ``StopIteration``.
    """
    tensor = next(itertools.chain(module.parameters(), module.buffers()), None)
    return tensor.device if tensor is not None else torch.device(default)


def module_dtype(module: torch.nn.Module, default: torch.dtype = torch.float32) -> torch.dtype:
    """The dtype of ``module``'s first floating-point parameter (else buffer); ``default`` where it has none."""
    tensors = itertools.chain(module.parameters(), module.buffers())
    return next((t.dtype for t in tensors if t.is_floating_point()), default)


def check_blank_is_last_token(
    joint: torch.nn.Module,
    blank_index: int,
    num_durations: int,
    strategy: str = "fast_greedy",
    nemo_strategy: str = "greedy_batch",
) -> None:
    """Raise a ValueError unless ``blank_index`` is the joint's last token output, where ``strategy`` takes it.

    The joint's outputs are ``[tokens..., blank, TDT durations...]`` (NeMo's ``RNNTJoint``: ``num_classes_with_blank
    = V + 1 + num_extra_outputs``). The greedy loops pick the best of outputs ``0..blank_index``, where NeMo's
    ``greedy_batch`` also picks among the outputs past a blank that is not last, as labels; NeMo's TDT
    ``malsd_batch`` scores a forced blank by the last token output whatever ``blank_index`` is. The error names
    ``nemo_strategy``, which decodes the layout. A joint that does not report its outputs (``num_classes_with_blank``
    not implemented) is not checked.
    """
    try:
        num_outputs = int(joint.num_classes_with_blank)
    except (AttributeError, NotImplementedError):
        return
    last_token = num_outputs - num_durations - 1
    if blank_index != last_token:
        durations = f", the last {num_durations} of them TDT durations" if num_durations else ""
        raise ValueError(
            f"{strategy} needs blank_index to be the joint's last token output: {type(joint).__name__} has "
            f"{num_outputs} outputs{durations}, the last token output is {last_token}, got blank_index={blank_index}. "
            f"Use strategy {nemo_strategy}, which also decodes with the blank elsewhere"
        )


def predictor_state_batch_dim(decoder: torch.nn.Module) -> int:
    """The batch dimension of every tensor of the prediction network's state, from its ``initialize_state``.

    NeMo's LSTM ``RNNTDecoder`` keeps ``(h, c)``, each ``[L, B, H]`` (dimension 1); its ``StatelessTransducerDecoder``
    keeps ``[labels [B, context_size - 1]]`` (dimension 0). Found by asking the decoder for the state of two batch
    sizes, so that any decoder whose state tensors share one batch dimension is handled alike. A decoder without
    parameters or buffers (a hand-written ``AbstractRNNTDecoder``) is asked on the CPU: only the shapes matter.
    """
    device = module_device(decoder)
    shapes = [[s.shape for s in decoder.initialize_state(torch.zeros([n, 1, 1], device=device))] for n in (2, 3)]
    dims = {
        dim
        for two, three in zip(*shapes, strict=True)
        for dim, (a, b) in enumerate(zip(two, three, strict=True))
        if a != b
    }
    if len(dims) != 1:
        raise ValueError(
            f"nemo_fastdecode needs a prediction network whose state tensors share one batch dimension; "
            f"{type(decoder).__name__}.initialize_state gives shapes {shapes[0]} (batch 2) and {shapes[1]} (batch 3)"
        )
    return dims.pop()
