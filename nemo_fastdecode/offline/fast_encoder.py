"""The opt-in fast encoder of the offline path: NeMo's Conformer convolution and attention modules with fused kernels.

Inside :func:`fast_encoder`, the modules of the model's encoder that can run differently:

* each convolution module (``ConformerConvolution``: GLU, batch norm, a stride-1 depthwise convolution) runs its
  pointwise convolutions as GEMMs on ``[B, T, D]`` rather than cuDNN convolutions on a transposed copy, and GLU,
  the pad mask, the depthwise convolution, batch norm and Swish between them as one kernel
  (:func:`~nemo_fastdecode.kernels.conv_module.glu_depthwise_norm_swish`); in fp32 the GEMMs take TF32 where
  cuDNN's convolutions may (``torch.backends.cudnn.allow_tf32``, PyTorch's default), as NeMo's do;
* each relative-position attention (``RelPositionMultiHeadAttention``) keeps its projections and its position term's
  GEMM and does the shift, the scores, the softmax and the weighted sum of the values in one pass
  (:func:`~nemo_fastdecode.kernels.rel_pos_attention.rel_pos_attention`), in bf16 (autocast or weights); fp32
  attention on CUDA stays NeMo's, whose full-fp32 GEMMs the kernel would not beat.

The weights are NeMo's, used in place. Only inference runs fused (training mode and streaming caches run NeMo's
modules). The arithmetic differs from NeMo's by rounding (fp32 sums, other GEMM kernels), so a near-tie can decode
the other way: the option is opt-in and the transcribe benchmark reports its agreement.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from nemo_fastdecode.kernels import triton_runs_on
from nemo_fastdecode.kernels.conv_module import glu_depthwise_norm_swish
from nemo_fastdecode.kernels.rel_pos_attention import rel_pos_attention
from nemo_fastdecode.logs import logger

__all__ = ["fast_encoder", "fusable_attention", "fusable_conv_module"]


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


def fusable_attention(module: torch.nn.Module) -> str | None:
    """``None`` where ``module`` is an attention :func:`fast_encoder` runs fused, else why not."""
    if type(module).__name__ != "RelPositionMultiHeadAttention":
        return f"attention {type(module).__name__} (fused: RelPositionMultiHeadAttention)"
    dim = int(getattr(module, "d_k", 0))
    if dim < 16 or dim & (dim - 1):
        return f"head size {dim} (fused: a power of two >= 16)"
    if getattr(module, "pos_bias_u", None) is None or getattr(module, "pos_bias_v", None) is None:
        return "attention without position biases"
    return None


@contextlib.contextmanager
def _matmul_tf32(enabled: bool) -> Iterator[None]:
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def _sixteen_bit(module: torch.nn.Module, x: torch.Tensor) -> bool:
    """Whether ``module`` computes in 16 bits here: bf16/fp16 weights or inputs, or a 16-bit autocast."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type) in (torch.bfloat16, torch.float16)
    return x.dtype in (torch.bfloat16, torch.float16) or next(module.parameters()).dtype != torch.float32


def _fused_conv_forward(module: torch.nn.Module, nemo_forward: Callable[..., Any]) -> Callable[..., Any]:
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
        tf32 = x.is_cuda and torch.backends.cudnn.allow_tf32 and not _sixteen_bit(module, x)
        with _matmul_tf32(tf32) if tf32 else contextlib.nullcontext():
            h = F.linear(x, pointwise1.weight.squeeze(-1), pointwise1.bias)  # [B, T, 2D]
            y = glu_depthwise_norm_swish(
                h, pad_mask, depthwise.weight.squeeze(1), depthwise.bias, scale, shift, left
            )  # [B, T, D]
            return F.linear(y, pointwise2.weight.squeeze(-1), pointwise2.bias)

    return forward


def _fused_attention_forward(module: torch.nn.Module, nemo_forward: Callable[..., Any]) -> Callable[..., Any]:
    from nemo.utils.cast_utils import avoid_float16_autocast_context

    heads, dim = int(module.h), int(module.d_k)

    def forward(query, key, value, mask, pos_emb=None, cache=None):  # noqa: ANN001, ANN202 -- NeMo's signature
        nemo = cache is not None or module.training or pos_emb is None or not triton_runs_on(query.device)
        if nemo or (query.is_cuda and not _sixteen_bit(module, query)):
            return nemo_forward(query, key, value, mask, pos_emb, cache=cache)
        with avoid_float16_autocast_context():  # NeMo's precision context for these products
            n = query.size(0)
            q = module.linear_q(query).view(n, -1, heads, dim)
            k = module.linear_k(key).view(n, -1, heads, dim)
            v = module.linear_v(value).view(n, -1, heads, dim)
            p = module.linear_pos(pos_emb).view(pos_emb.size(0), -1, heads, dim)
            bd = torch.matmul((q + module.pos_bias_v).transpose(1, 2), p.permute(0, 2, 3, 1))  # [B, H, T, 2T - 1]
            out = rel_pos_attention(q, k, v, module.pos_bias_u, bd, mask, 1.0 / module.s_d_k)  # [B, T, H * d]
            return module.linear_out(out)

    return forward


@contextlib.contextmanager
def fast_encoder(model: torch.nn.Module) -> Iterator[int]:
    """Run the fusable convolution and attention modules of ``model.encoder`` fused while the block runs; yields how
    many modules.

    Modules that cannot be fused (:func:`fusable_conv_module` and :func:`fusable_attention` say why, logged once per
    call) run as NeMo's; so does every module in training mode, with a streaming cache, or on a device where Triton
    does not run (the CPU outside Triton's interpreter).
    """
    encoder = getattr(model, "encoder", None)
    fused: list[torch.nn.Module] = []
    reasons: set[str] = set()
    if encoder is not None:
        for layer in getattr(encoder, "layers", []):
            for name, check, fuse in (
                ("conv", fusable_conv_module, _fused_conv_forward),
                ("self_attn", fusable_attention, _fused_attention_forward),
            ):
                module = getattr(layer, name, None)
                reason = f"a layer without {name}" if module is None else check(module)
                if reason is not None:
                    reasons.add(reason)
                    continue
                module.forward = fuse(module, module.forward)
                fused.append(module)
    if reasons:
        logger.info("nemo_fastdecode: fast_encoder leaves some convolution modules as NeMo's: %s", "; ".join(reasons))
    try:
        yield len(fused)
    finally:
        for module in fused:
            module.__dict__.pop("forward", None)
