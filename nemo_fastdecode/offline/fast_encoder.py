"""The opt-in fast encoder of the offline path: NeMo's Conformer convolution modules channels last, with one kernel
between their two GEMMs.

NeMo's ``ConformerConvolution`` turns ``[B, T, D]`` into ``[B, D, T]``, runs its pointwise convolutions on cuDNN and
everything between them as five further passes, and transposes back. Inside :func:`fast_encoder`, each module of the
model's encoder that can (GLU, batch norm, a stride-1 depthwise convolution, inference without a streaming cache)
runs the pointwise convolutions as GEMMs on ``[B, T, D]`` and the rest as
:func:`~nemo_fastdecode.kernels.conv_module.glu_depthwise_norm_swish`. The weights are NeMo's, used in place; the
arithmetic differs from NeMo's by rounding (fp32 sums, other GEMM kernels), so a near-tie can decode the other way:
the option is opt-in and the transcribe benchmark reports its agreement.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from nemo_fastdecode.kernels import triton_runs_on
from nemo_fastdecode.kernels.conv_module import glu_depthwise_norm_swish
from nemo_fastdecode.logs import logger

__all__ = ["fast_encoder", "fusable_conv_module"]


def fusable_conv_module(module: torch.nn.Module) -> str | None:
    """``None`` where ``module`` is a convolution module :func:`fast_encoder` runs fused, else why not."""
    depthwise = getattr(module, "depthwise_conv", None)
    norm = getattr(module, "batch_norm", None)
    if getattr(module, "pointwise_activation", None) != "glu_":
        return f"pointwise activation {getattr(module, 'pointwise_activation', None)!r} (fused: 'glu_')"
    if not isinstance(norm, torch.nn.BatchNorm1d) or norm.running_mean is None:
        return f"norm {type(norm).__name__} (fused: BatchNorm1d with running statistics)"
    if not isinstance(depthwise, torch.nn.Conv1d) or depthwise.groups != depthwise.in_channels:
        return "the depthwise convolution is not a depthwise Conv1d"
    if depthwise.stride != (1,) or depthwise.dilation != (1,):
        return f"depthwise stride {depthwise.stride} / dilation {depthwise.dilation} (fused: 1 / 1)"
    left = getattr(depthwise, "_left_padding", None)
    right = getattr(depthwise, "_right_padding", None)
    if left is None or right is None or left + right != depthwise.kernel_size[0] - 1:
        return "the depthwise convolution's padding does not keep the length"
    return None


def _fused_forward(module: torch.nn.Module, nemo_forward: Callable[..., Any]) -> Callable[..., Any]:
    pointwise1, depthwise, norm, pointwise2 = (
        module.pointwise_conv1,
        module.depthwise_conv,
        module.batch_norm,
        module.pointwise_conv2,
    )
    with torch.no_grad():
        # batch norm as y * scale + shift, in fp32, from the running statistics as they are now
        scale = norm.weight.float() * torch.rsqrt(norm.running_var.float() + norm.eps)
        shift = norm.bias.float() - norm.running_mean.float() * scale
    left = depthwise._left_padding

    def forward(x: torch.Tensor, pad_mask: torch.Tensor | None = None, cache: Any = None) -> Any:
        if cache is not None or module.training or not triton_runs_on(x.device):
            return nemo_forward(x, pad_mask=pad_mask, cache=cache)
        h = F.linear(x, pointwise1.weight.squeeze(-1), pointwise1.bias)  # [B, T, 2D]
        y = glu_depthwise_norm_swish(
            h, pad_mask, depthwise.weight.squeeze(1), depthwise.bias, scale, shift, left
        )  # [B, T, D]
        return F.linear(y, pointwise2.weight.squeeze(-1), pointwise2.bias)

    return forward


@contextlib.contextmanager
def fast_encoder(model: torch.nn.Module) -> Iterator[int]:
    """Run the fusable convolution modules of ``model.encoder`` fused while the block runs; yields how many.

    Modules that cannot be fused (:func:`fusable_conv_module` says why, logged once per call) run as NeMo's; so does
    every module in training mode, with a streaming cache, or on a device where Triton does not run (the CPU).
    """
    encoder = getattr(model, "encoder", None)
    fused: list[torch.nn.Module] = []
    reasons: set[str] = set()
    if encoder is not None:
        for module in encoder.modules():
            if type(module).__name__ != "ConformerConvolution":
                continue
            reason = fusable_conv_module(module)
            if reason is not None:
                reasons.add(reason)
                continue
            module.forward = _fused_forward(module, module.forward)
            fused.append(module)
    if reasons:
        logger.info("nemo_fastdecode: fast_encoder leaves some convolution modules as NeMo's: %s", "; ".join(reasons))
    try:
        yield len(fused)
    finally:
        for module in fused:
            module.__dict__.pop("forward", None)
