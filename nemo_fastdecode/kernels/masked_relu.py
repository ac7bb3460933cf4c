"""ReLU, time mask and zero padding in one pass: the elementwise work between NeMo's subsampling convolutions.

NeMo's causal ``dw_striding`` subsampling (``ConvSubsampling`` with ``MaskedConvSequential``) multiplies its
activations by a time mask before every layer, applies ReLU as a layer of its own, and each ``CausalConv2D`` pads
its input with ``F.pad``. Between a convolution and the next strided depthwise convolution that is five passes over
the subsampling's largest tensor (``[B, C, T/2, F/2]``: 256 x 256 x 13 x 40 floats for 256 streams of the 17 x 512
model). :func:`masked_relu_pad` does them in one: ``out = pad(relu(x) * mask)``, where ``mask[b, t] = t < lengths[b]``
(the same values: the mask is 0 or 1, so masking before and after ReLU equals masking once after it).

:func:`masked_relu_pad_reference` is the torch version (CPU path and the tests' reference); Triton's interpreter
runs the kernel on the CPU in tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # Triton is optional: without it only the torch reference runs.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

__all__ = ["masked_relu_pad", "masked_relu_pad_reference"]

_BLOCK = 1024

if triton is not None:

    @triton.jit
    def _masked_relu_pad_kernel(
        x_ptr, out_ptr, lengths_ptr, lengths_stride, total, channels, time, freq, time_before, freq_before,
        OUT_TIME: tl.constexpr, OUT_FREQ: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        # one element of the padded output [B, C, out_time, out_freq] per lane; x is contiguous [B, C, T, F]. The
        # divisions below are by constants and in int32 unless the tensor needs int64 offsets (WIDE): emulated
        # 64-bit divisions made this pass several times slower than its memory traffic
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        if WIDE:
            offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        out_time, out_freq = OUT_TIME, OUT_FREQ
        in_range = offs < total
        f = offs % out_freq
        t = (offs // out_freq) % out_time
        plane = offs // (out_freq * out_time)  # b * C + c
        b = plane // channels
        t_in, f_in = t - time_before, f - freq_before
        length = tl.load(lengths_ptr + b * lengths_stride, mask=in_range, other=0)
        inside = in_range & (t_in >= 0) & (t_in < time) & (f_in >= 0) & (f_in < freq) & (t_in < length)
        x = tl.load(x_ptr + (plane * time + t_in) * freq + f_in, mask=inside, other=0.0)
        tl.store(out_ptr + offs, tl.where(inside, tl.maximum(x, 0.0), 0.0), mask=in_range)


def masked_relu_pad(
    x: torch.Tensor,
    lengths: torch.Tensor,
    time_pad: tuple[int, int] = (0, 0),
    freq_pad: tuple[int, int] = (0, 0),
) -> torch.Tensor:
    """``F.pad(relu(x) * mask, (*freq_pad, *time_pad))`` with ``mask[b, :, t, :] = t < lengths[b]``, in one pass.

    Args:
        x: ``[B, C, T, F]`` float32 on CUDA (or the CPU under ``TRITON_INTERPRET=1``).
        lengths: ``[B]`` integer valid time steps of each row (any integer dtype; NeMo's float lengths
            truncated with ``.long()`` first).
        time_pad, freq_pad: zeros added before and after the time and the frequency axes.

    Returns:
        ``[B, C, T + sum(time_pad), F + sum(freq_pad)]`` contiguous float32.
    """
    if x.dim() != 4:
        raise ValueError(f"x must be [B, C, T, F], got shape {tuple(x.shape)}")
    if x.dtype != torch.float32:
        raise TypeError(f"x dtype {x.dtype} is not supported; valid: torch.float32")
    if lengths.shape != (x.shape[0],) or lengths.dtype.is_floating_point or lengths.device != x.device:
        raise ValueError(
            f"lengths must be an integer [B] = ({x.shape[0]},) tensor on {x.device}, got {tuple(lengths.shape)} "
            f"{lengths.dtype} on {lengths.device}"
        )
    if min(*time_pad, *freq_pad) < 0:
        raise ValueError(f"paddings must be >= 0, got time_pad={time_pad}, freq_pad={freq_pad}")
    b, c, t, f = x.shape
    out = torch.empty(b, c, t + sum(time_pad), f + sum(freq_pad), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    x = x.contiguous()
    grid = (triton.cdiv(out.numel(), _BLOCK),)
    _masked_relu_pad_kernel[grid](
        x,
        out,
        lengths,
        lengths.stride(0),
        out.numel(),
        c,
        t,
        f,
        time_pad[0],
        freq_pad[0],
        OUT_TIME=out.shape[2],
        OUT_FREQ=out.shape[3],
        WIDE=max(out.numel(), x.numel()) + _BLOCK >= 2**31,
        BLOCK=_BLOCK,
    )
    return out


def masked_relu_pad_reference(
    x: torch.Tensor,
    lengths: torch.Tensor,
    time_pad: tuple[int, int] = (0, 0),
    freq_pad: tuple[int, int] = (0, 0),
) -> torch.Tensor:
    """Torch version of :func:`masked_relu_pad` (inputs unchecked)."""
    mask = torch.arange(x.shape[2], device=x.device)[None, :] < lengths[:, None]  # [B, T]
    return F.pad(torch.relu(x) * mask[:, None, :, None].to(x.dtype), (*freq_pad, *time_pad))
