"""The middle of a Conformer convolution module in one pass, channels last: GLU, pad mask, depthwise convolution,
batch norm (inference) and Swish.

NeMo's ``ConformerConvolution`` transposes its input to ``[B, D, T]`` and runs, one kernel each, a pointwise
convolution to ``2D`` channels, GLU, ``masked_fill`` of the padded frames, the depthwise convolution, batch norm,
Swish and the second pointwise convolution, then transposes back: seven passes over ``[B, 2D | D, T]`` tensors
between the two GEMMs. With the pointwise convolutions taken as GEMMs on ``[B, T, D]`` (no transposes),
:func:`glu_depthwise_norm_swish` does everything between them in one kernel:

    a[b, t, c]   = h[b, t, c] * sigmoid(h[b, t, D + c])   if 0 <= t < T and not pad_mask[b, t] else 0
    y[b, t, c]   = bias[c] + sum_k weight[c, k] * a[b, t + k - left, c]
    out[b, t, c] = swish(y[b, t, c] * scale[c] + shift[c])          (scale, shift: batch norm's running statistics)

The sums run in fp32 in tap order from ``h`` as stored (fp32 or bf16), and the output is stored in ``h``'s dtype:
NeMo rounds every intermediate to the working dtype and lets cuDNN order the sums, so the results agree with NeMo's to
rounding, not bit for bit (the offline path's ``fast_encoder`` is opt-in for that reason).
:func:`glu_depthwise_norm_swish_reference` is the torch version (NeMo's ops, channels last); Triton's interpreter
runs the kernel on the CPU in tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nemo_fastdecode.kernels import triton_runs_on

try:  # Triton is optional: without it only the torch reference runs.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

__all__ = ["glu_depthwise_norm_swish", "glu_depthwise_norm_swish_reference"]

_BLOCK_T = 32
_BLOCK_C = 128

if triton is not None:

    @triton.jit
    def _glu_depthwise_norm_swish_kernel(
        h_ptr, mask_ptr, weight_ptr, bias_ptr, scale_ptr, shift_ptr, out_ptr,
        time, channels, h_batch_stride, h_time_stride, mask_batch_stride, out_batch_stride, out_time_stride,
        KERNEL: tl.constexpr, LEFT: tl.constexpr, HAS_MASK: tl.constexpr,
        BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
    ):  # fmt: skip
        # one [BLOCK_T, BLOCK_C] tile of out[b] per program; the GLU of each input row is recomputed per tap (KERNEL
        # loads of a tile that stays in L1/L2 cost less than another pass over memory)
        b = tl.program_id(0).to(tl.int64)
        t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        c_ok = c < channels
        acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        rows = h_ptr + b * h_batch_stride
        for k in tl.static_range(KERNEL):
            source = t + (k - LEFT)
            valid = (source >= 0) & (source < time)
            if HAS_MASK:
                padded = tl.load(mask_ptr + b * mask_batch_stride + source, mask=valid, other=1)
                valid = valid & (padded == 0)
            tile = valid[:, None] & c_ok[None, :]
            offsets = source[:, None] * h_time_stride + c[None, :]
            value = tl.load(rows + offsets, mask=tile, other=0.0).to(tl.float32)
            gate = tl.load(rows + offsets + channels, mask=tile, other=0.0).to(tl.float32)
            glu = value * tl.sigmoid(gate)
            w = tl.load(weight_ptr + c * KERNEL + k, mask=c_ok, other=0.0).to(tl.float32)
            acc += tl.where(tile, glu, 0.0) * w[None, :]
        acc += tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        scale = tl.load(scale_ptr + c, mask=c_ok, other=0.0)
        shift = tl.load(shift_ptr + c, mask=c_ok, other=0.0)
        y = acc * scale[None, :] + shift[None, :]
        y = y * tl.sigmoid(y)
        store = (t < time)[:, None] & c_ok[None, :]
        out = out_ptr + b * out_batch_stride + t[:, None] * out_time_stride + c[None, :]
        tl.store(out, y.to(out_ptr.dtype.element_ty), mask=store)


def _check(h: torch.Tensor, pad_mask: torch.Tensor | None, weight: torch.Tensor, left: int) -> tuple[int, int, int]:
    if h.dim() != 3 or h.shape[2] % 2:
        raise ValueError(f"h must be [B, T, 2D], got shape {tuple(h.shape)}")
    batch, time, double = h.shape
    channels = double // 2
    if weight.dim() != 2 or weight.shape[0] != channels:
        raise ValueError(f"weight must be [D={channels}, K], got shape {tuple(weight.shape)}")
    if not 0 <= left < weight.shape[1]:
        raise ValueError(f"left padding must be in [0, {weight.shape[1] - 1}], got {left}")
    if pad_mask is not None and tuple(pad_mask.shape) != (batch, time):
        raise ValueError(f"pad_mask must be [B={batch}, T={time}], got shape {tuple(pad_mask.shape)}")
    return batch, time, channels


def glu_depthwise_norm_swish_reference(
    h: torch.Tensor,
    pad_mask: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    scale: torch.Tensor,
    shift: torch.Tensor,
    left: int,
) -> torch.Tensor:
    """NeMo's ops on ``[B, T, 2D]`` in ``h``'s dtype: see :func:`glu_depthwise_norm_swish`."""
    _, _, channels = _check(h, pad_mask, weight, left)
    kernel = weight.shape[1]
    a = F.glu(h, dim=-1)
    if pad_mask is not None:
        a = a.masked_fill(pad_mask.unsqueeze(-1), 0.0)
    a = F.pad(a.transpose(1, 2), (left, kernel - 1 - left))
    y = F.conv1d(a, weight.to(a.dtype).unsqueeze(1), None if bias is None else bias.to(a.dtype), groups=channels)
    y = y * scale.to(y.dtype).unsqueeze(-1) + shift.to(y.dtype).unsqueeze(-1)
    return F.silu(y).transpose(1, 2)


def glu_depthwise_norm_swish(
    h: torch.Tensor,
    pad_mask: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    scale: torch.Tensor,
    shift: torch.Tensor,
    left: int,
) -> torch.Tensor:
    """GLU, pad mask, depthwise convolution, batch norm and Swish of a Conformer convolution module, channels last.

    Args:
        h: the first pointwise convolution's output, ``[B, T, 2D]`` (rows contiguous in the channels; fp32 or bf16).
        pad_mask: ``[B, T]`` bool, ``True`` at padded frames (zeroed before the convolution); ``None``: no padding.
        weight: the depthwise kernels, ``[D, K]``.
        bias: the depthwise convolution's bias ``[D]``, or ``None``.
        scale, shift: batch norm as ``y * scale + shift`` (``[D]``, fp32: ``gamma / sqrt(var + eps)`` and
            ``beta - mean * scale``).
        left: zero frames before the first (``K - 1 - left`` after the last): the convolution's padding.

    Returns:
        ``[B, T, D]`` in ``h``'s dtype. The torch reference runs where Triton or a CUDA device is missing.
    """
    batch, time, channels = _check(h, pad_mask, weight, left)
    if triton is None or not triton_runs_on(h.device):
        return glu_depthwise_norm_swish_reference(h, pad_mask, weight, bias, scale, shift, left)
    if h.stride(2) != 1:
        h = h.contiguous()
    out = torch.empty(batch, time, channels, device=h.device, dtype=h.dtype)
    if out.numel() == 0:
        return out
    mask = None if pad_mask is None else pad_mask.contiguous().view(torch.uint8)
    bias = torch.zeros(channels, device=h.device, dtype=torch.float32) if bias is None else bias
    grid = (batch, triton.cdiv(time, _BLOCK_T), triton.cdiv(channels, _BLOCK_C))
    _glu_depthwise_norm_swish_kernel[grid](
        h, out if mask is None else mask, weight.contiguous(), bias.contiguous(), scale.float().contiguous(),
        shift.float().contiguous(), out,
        time, channels, h.stride(0), h.stride(1), 0 if mask is None else mask.stride(0), out.stride(0), out.stride(1),
        KERNEL=weight.shape[1], LEFT=left, HAS_MASK=mask is not None, BLOCK_T=_BLOCK_T, BLOCK_C=_BLOCK_C,
        num_warps=4,
    )  # fmt: skip
    return out
