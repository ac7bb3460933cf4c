"""A strided depthwise convolution of NeMo's causal ``dw_striding`` subsampling with the masked ReLU before it, and
(first stage) the first convolution before that, in one kernel.

``MaskedConvSequential`` runs ``CausalConv2D(1 -> C)``, ReLU, then ``(CausalConv2D depthwise, Conv2d 1x1, ReLU)``
per further stage, multiplying by a time mask before every layer; each ``CausalConv2D`` zero-pads its input by
``(K - 1, S - 1)`` on both axes. Its largest tensor is the first convolution's output ``[B, C, T/2, F/2]`` (256 x 256
x 13 x 40 floats for 256 streams of the 17 x 512 model), written and read back three times in torch. Here each
program computes a ``[channels, positions]`` tile of the depthwise output straight from its inputs:

    a[b, c, t, f] = relu(src[b, c, t, f]) if 0 <= t < lengths[b] and 0 <= f < F else 0   (mask, ReLU, padding)
    out[b, c, t2, f2] = bias[c] + sum_{i, j} weight[c, i, j] * a[b, c, S * t2 + i - (K - 1), S * f2 + j - (K - 1)]

where, on the first stage, ``src`` is itself the first convolution of the (masked, padded) features, recomputed
per tap instead of stored: ``src[b, c, t, f] = bias1[c] + sum_{u, v} weight1[c, u, v] * x[b, S1 t + u - (K1 - 1),
S1 f + v - (K1 - 1)]``. Every depthwise output position is written, as NeMo's convolution writes them (the next
layers mask what lies past each row's length).

The sums run in fp32 in tap order, so results differ from cuDNN's in the last bits only (the ``tf32x3`` streaming
path is held to NeMo's encoder output within 1e-4, relative). :func:`masked_depthwise_conv_reference` is the torch
version (NeMo's masks and convolutions); Triton's interpreter runs the kernel on the CPU in tests.
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

__all__ = ["FirstConv", "masked_depthwise_conv", "masked_depthwise_conv_reference"]


class FirstConv:
    """The first stage's ``CausalConv2D(1 -> C)`` for :func:`masked_depthwise_conv`: features in, not activations.

    Attributes:
        weight: ``[C, 1, K1, K1]``; bias: ``[C]``; stride: ``S1`` (both axes).
        lengths: ``[B]`` valid frames of the features (the input mask before the first convolution).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, stride: int, lengths: torch.Tensor):
        self.weight, self.bias, self.stride, self.lengths = weight, bias, stride, lengths

    def output_size(self, time: int, freq: int) -> tuple[int, int]:
        return _conv_size(time, self.weight.shape[-1], self.stride), _conv_size(
            freq, self.weight.shape[-1], self.stride
        )


def _conv_size(size: int, kernel: int, stride: int) -> int:
    """Output size of a causal convolution: padding ``(K - 1, S - 1)``, as NeMo's ``CausalConv2D``."""
    return (size + kernel - 1 + stride - 1 - kernel) // stride + 1


if triton is not None:

    @triton.jit
    def _masked_depthwise_kernel(
        src_ptr, src_sb, src_sc, src_st, src_sf, lengths_ptr, lengths_stride, w_ptr, bias_ptr, out_ptr,
        first_lengths_ptr, first_lengths_stride, first_w_ptr, first_bias_ptr,
        channels, src_time, src_freq, time, freq,
        OUT_TIME: tl.constexpr, OUT_FREQ: tl.constexpr, KERNEL: tl.constexpr, STRIDE: tl.constexpr,
        FIRST: tl.constexpr, FIRST_KERNEL: tl.constexpr, FIRST_STRIDE: tl.constexpr,
        BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr,
    ):  # fmt: skip
        # program (position block, channel block, row); positions are the flattened [OUT_TIME, OUT_FREQ] plane
        b = tl.program_id(2).to(tl.int64)
        offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        p_ok = offs_p < OUT_TIME * OUT_FREQ
        t2, f2 = offs_p // OUT_FREQ, offs_p % OUT_FREQ
        offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        c_ok = offs_c < channels
        length = tl.load(lengths_ptr + b * lengths_stride)  # valid time steps of the activations (time x freq)
        acc = tl.zeros([BLOCK_C, BLOCK_P], dtype=tl.float32)
        if FIRST:
            first_length = tl.load(first_lengths_ptr + b * first_lengths_stride)
            first_bias = tl.load(first_bias_ptr + offs_c, mask=c_ok, other=0.0)
        for i in tl.static_range(KERNEL):
            t = t2 * STRIDE + i - (KERNEL - 1)
            for j in tl.static_range(KERNEL):
                f = f2 * STRIDE + j - (KERNEL - 1)
                inside = p_ok & (t >= 0) & (t < time) & (t < length) & (f >= 0) & (f < freq)  # [BLOCK_P]
                if FIRST:  # the first convolution's output at (t, f), from the features
                    a = tl.zeros([BLOCK_C, BLOCK_P], dtype=tl.float32)
                    for u in tl.static_range(FIRST_KERNEL):
                        t0 = t * FIRST_STRIDE + u - (FIRST_KERNEL - 1)
                        for v in tl.static_range(FIRST_KERNEL):
                            f0 = f * FIRST_STRIDE + v - (FIRST_KERNEL - 1)
                            ok = inside & (t0 >= 0) & (t0 < src_time) & (t0 < first_length) & (f0 >= 0)
                            ok = ok & (f0 < src_freq)
                            x = tl.load(src_ptr + b * src_sb + t0 * src_st + f0 * src_sf, mask=ok, other=0.0)
                            w = tl.load(first_w_ptr + offs_c * (FIRST_KERNEL * FIRST_KERNEL) + u * FIRST_KERNEL + v,
                                        mask=c_ok, other=0.0)  # fmt: skip
                            a += w[:, None] * x[None, :]
                    a += first_bias[:, None]
                else:
                    ptrs = src_ptr + b * src_sb + offs_c[:, None] * src_sc + t[None, :] * src_st + f[None, :] * src_sf
                    a = tl.load(ptrs, mask=c_ok[:, None] & inside[None, :], other=0.0)
                a = tl.where(inside[None, :], tl.maximum(a, 0.0), 0.0)
                w = tl.load(w_ptr + offs_c * (KERNEL * KERNEL) + i * KERNEL + j, mask=c_ok, other=0.0)
                acc += w[:, None] * a
        acc += tl.load(bias_ptr + offs_c, mask=c_ok, other=0.0)[:, None]
        plane = OUT_TIME * OUT_FREQ
        out = out_ptr + (b * channels + offs_c[:, None]).to(tl.int64) * plane + offs_p[None, :]
        tl.store(out, acc, mask=c_ok[:, None] & p_ok[None, :])


def _check(x: torch.Tensor, lengths: torch.Tensor, name: str) -> None:
    if lengths.shape != (x.shape[0],) or lengths.dtype.is_floating_point or lengths.device != x.device:
        raise ValueError(
            f"{name} must be an integer [B] = ({x.shape[0]},) tensor on {x.device}, got {tuple(lengths.shape)} "
            f"{lengths.dtype} on {lengths.device}"
        )


def _square_kernel(weight: torch.Tensor, channels: int, name: str) -> int:
    if weight.dim() != 4 or weight.shape[:2] != (channels, 1) or weight.shape[2] != weight.shape[3]:
        raise ValueError(f"{name} must be [{channels}, 1, K, K], got shape {tuple(weight.shape)}")
    return weight.shape[-1]


def masked_depthwise_conv(
    x: torch.Tensor,
    lengths: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    stride: int,
    first: FirstConv | None = None,
    *,
    block_c: int | None = None,
    block_p: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """``depthwise(pad(relu(x) * mask))`` in one kernel, ``x`` being the first convolution's output when ``first``.

    Args:
        x: ``[B, C, T, F]`` float32 activations or, with ``first``, ``[B, T0, F0]`` float32 features (any strides).
        lengths: ``[B]`` integer valid time steps of the activations (after ``first``, when given).
        weight: ``[C, 1, K, K]`` depthwise weights; bias: ``[C]``; stride: ``S`` on both axes; padding ``(K - 1,
            S - 1)`` on both axes, as NeMo's ``CausalConv2D``.
        first: the first convolution, recomputed inside the kernel (its output is never stored).
        block_c, block_p, num_warps: the tile (channels x output positions, powers of two) and warps; ``None``:
            up to 64 positions and 2048 outputs per tile (``benchmarks/bench_subsampling.py`` times others).

    Returns:
        ``[B, C, T', F']`` contiguous float32, ``T' = (T + K - 1 + S - 1 - K) // S + 1`` (the same for ``F'``).
    """
    if x.dtype != torch.float32:
        raise TypeError(f"x dtype {x.dtype} is not supported; valid: torch.float32")
    channels = weight.shape[0]
    kernel = _square_kernel(weight, channels, "weight")
    if first is None:
        if x.dim() != 4 or x.shape[1] != channels:
            raise ValueError(f"x must be [B, {channels}, T, F] activations, got shape {tuple(x.shape)}")
        time, freq = x.shape[2], x.shape[3]
        strides = x.stride()
        first_args = (lengths, 0, weight, bias)  # unused (FIRST=False)
        first_kernel = first_stride = 1
    else:
        if x.dim() != 3:
            raise ValueError(f"x must be [B, T, F] features before the first convolution, got shape {tuple(x.shape)}")
        first_kernel = _square_kernel(first.weight, channels, "first.weight")
        _check(x, first.lengths, "first.lengths")
        time, freq = first.output_size(x.shape[1], x.shape[2])
        strides = (x.stride(0), 0, x.stride(1), x.stride(2))
        first_args = (first.lengths, first.lengths.stride(0), first.weight.contiguous(), first.bias.contiguous())
        first_stride = first.stride
    _check(x, lengths, "lengths")
    batch = x.shape[0]
    out_time, out_freq = _conv_size(time, kernel, stride), _conv_size(freq, kernel, stride)
    out = torch.empty(batch, channels, out_time, out_freq, dtype=torch.float32, device=x.device)
    if out.numel() == 0:
        return out
    plane = out_time * out_freq
    block_p = block_p or min(64, triton.next_power_of_2(plane))
    block_c = block_c or min(triton.next_power_of_2(channels), 2048 // block_p)
    grid = (triton.cdiv(plane, block_p), triton.cdiv(channels, block_c), batch)
    _masked_depthwise_kernel[grid](
        x, *strides, lengths, lengths.stride(0), weight.contiguous(), bias.contiguous(), out, *first_args,
        channels, x.shape[-2], x.shape[-1], time, freq,
        OUT_TIME=out_time, OUT_FREQ=out_freq, KERNEL=kernel, STRIDE=stride,
        FIRST=first is not None, FIRST_KERNEL=first_kernel, FIRST_STRIDE=first_stride,
        BLOCK_C=block_c, BLOCK_P=block_p, num_warps=num_warps,
    )  # fmt: skip
    return out


def masked_depthwise_conv_reference(
    x: torch.Tensor,
    lengths: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    stride: int,
    first: FirstConv | None = None,
) -> torch.Tensor:
    """Torch version of :func:`masked_depthwise_conv` (NeMo's order of masks, padding and convolutions)."""
    if first is not None:
        k1 = first.weight.shape[-1]
        mask0 = torch.arange(x.shape[1], device=x.device)[None, :] < first.lengths[:, None]
        x = F.pad((x * mask0[:, :, None].to(x.dtype)).unsqueeze(1), (k1 - 1, first.stride - 1) * 2)
        x = F.conv2d(x, first.weight, first.bias, stride=first.stride)
    mask = (torch.arange(x.shape[2], device=x.device)[None, :] < lengths[:, None]).to(x.dtype)[:, None, :, None]
    k = weight.shape[-1]
    a = F.pad(torch.relu(x * mask) * mask, (k - 1, stride - 1) * 2)
    return F.conv2d(a, weight, bias, stride=stride, groups=weight.shape[0])
