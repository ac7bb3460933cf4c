"""The middle of FastConformer's convolution module for one streaming step, over slot caches, in one kernel.

``ConformerConvolution`` runs pointwise conv 1 -> GLU -> causal depthwise conv -> batch norm -> Swish ->
pointwise conv 2. In cache-aware streaming the depthwise convolution also reads each stream's last ``K - 1``
inputs (its cache) and leaves the newest ``K - 1`` there. Between the two pointwise GEMMs that is a dozen small
kernels per layer in torch (GLU, layout transposes, cache gather, concatenation, cuDNN's convolution, batch norm,
Swish, cache scatter). :func:`glu_depthwise_conv_step` does all of it in one kernel, time-major (``[B, T, C]``,
the GEMMs' layout: no transposes) and reads and writes the caches in place through ``slot_ids``.

Semantics, for row ``b`` (``s = slot_ids[b]``), channel ``c``, with ``P = K - 1 + T`` joined positions::

    x[t, c]      = hidden[b, t, c] * sigmoid(hidden[b, t, C + c])                      (GLU)
    joined[p, c] = cache[s, c, p] if p < K - 1 else x[p - (K - 1), c]
    src[p, c]    = joined[sources[b, p], c]                                             (per-row alignment)
    y[t, c]      = bias[c] + sum_k weight[c, k] * src[t + k, c]
    out[b, t, c] = swish(norm(y)[t, c])
    cache[s, c, j] = src[T + j, c]                                                      (afterwards)

``norm`` is NeMo's ``conv_norm_type``: ``layer_norm`` (cache-aware streaming models) normalises each frame over
its channels, ``(y - mean) / sqrt(var + eps) * scale + shift``; ``batch_norm`` in eval mode is a per-channel
``y * scale + shift`` (folded by the caller; ``layer_norm_eps=None``). The sums run in fp32 in order
``k = 0 .. K - 1``, so results differ from cuDNN's in the last bits only (the streaming encoder is held to
NeMo's output within 1e-4, relative). :func:`glu_depthwise_conv_step_reference` is the torch reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _load_source(hidden_ptr, hidden_stride_b, hidden_stride_t, cache_ptr, cache_stride_s, cache_stride_c, slot, b,
                 src, channels, channel_ok, n_channels, KM1: tl.constexpr):  # fmt: skip
    """``src[p, c]`` for a tile of joined positions ``src [P]`` (already mapped through ``sources``)."""
    from_cache = src < KM1
    cache_mask = from_cache[:, None] & channel_ok[None, :]
    cached = tl.load(cache_ptr + slot * cache_stride_s + channels[None, :] * cache_stride_c + src[:, None],
                     mask=cache_mask, other=0.0)  # fmt: skip
    t = tl.maximum(src - KM1, 0)
    new_mask = (src >= KM1)[:, None] & channel_ok[None, :]
    row = hidden_ptr + b * hidden_stride_b + t[:, None] * hidden_stride_t + channels[None, :]
    value = tl.load(row, mask=new_mask, other=0.0)
    gate = tl.load(row + n_channels, mask=new_mask, other=0.0)
    return tl.where(from_cache[:, None], cached, value * tl.sigmoid(gate))


@triton.jit
def _glu_depthwise_conv_kernel(
    hidden_ptr, hidden_stride_b, hidden_stride_t, cache_ptr, cache_stride_s, cache_stride_c, slot_ids_ptr,
    sources_ptr, sources_stride, weight_ptr, bias_ptr, scale_ptr, shift_ptr, out_ptr, out_stride_b, out_stride_t,
    n_channels, frames, eps,
    KERNEL: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_KM1: tl.constexpr,
    LAYER_NORM: tl.constexpr,
):  # fmt: skip
    # one program per (row, channel block); with LAYER_NORM the block holds all channels (a frame's statistics)
    b = tl.program_id(0)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    channel_ok = channels < n_channels
    slot = tl.load(slot_ids_ptr + b)
    # the depthwise convolution over this step's frames, tap by tap (fp32, k = 0 .. K - 1)
    t = tl.arange(0, BLOCK_T)
    t_ok = t < frames
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for k in tl.static_range(KERNEL):
        src = tl.load(sources_ptr + b * sources_stride + t + k, mask=t_ok, other=0)
        x = _load_source(hidden_ptr, hidden_stride_b, hidden_stride_t, cache_ptr, cache_stride_s, cache_stride_c,
                         slot, b, src, channels, channel_ok, n_channels, KERNEL - 1)  # fmt: skip
        acc += tl.load(weight_ptr + channels * KERNEL + k, mask=channel_ok, other=0.0)[None, :] * x
    y = acc + tl.load(bias_ptr + channels, mask=channel_ok, other=0.0)[None, :]
    if LAYER_NORM:
        y = tl.where(channel_ok[None, :], y, 0.0)
        mean = tl.sum(y, axis=1) / n_channels
        centred = tl.where(channel_ok[None, :], y - mean[:, None], 0.0)
        variance = tl.sum(centred * centred, axis=1) / n_channels
        y = centred / tl.sqrt(variance + eps)[:, None]
    y = y * tl.load(scale_ptr + channels, mask=channel_ok, other=0.0)[None, :]
    y = y + tl.load(shift_ptr + channels, mask=channel_ok, other=0.0)[None, :]
    y = y * tl.sigmoid(y)  # Swish
    out_mask = t_ok[:, None] & channel_ok[None, :]
    tl.store(out_ptr + b * out_stride_b + t[:, None] * out_stride_t + channels[None, :], y, mask=out_mask)
    # the newest K - 1 inputs become the cache: read everything first, then overwrite (other threads of this
    # program read the old cache above)
    j = tl.arange(0, BLOCK_KM1)
    j_ok = j < KERNEL - 1
    src = tl.load(sources_ptr + b * sources_stride + frames + j, mask=j_ok, other=0)
    newest = _load_source(hidden_ptr, hidden_stride_b, hidden_stride_t, cache_ptr, cache_stride_s, cache_stride_c,
                          slot, b, src, channels, channel_ok, n_channels, KERNEL - 1)  # fmt: skip
    tl.debug_barrier()
    tl.store(cache_ptr + slot * cache_stride_s + channels[None, :] * cache_stride_c + j[:, None], newest,
             mask=j_ok[:, None] & channel_ok[None, :])  # fmt: skip


def _check(hidden, cache, slot_ids, sources, weight, bias, scale, shift, dtype=torch.float32) -> tuple[int, int, int]:
    if hidden.dim() != 3 or hidden.shape[2] % 2:
        raise ValueError(
            f"hidden must be [B, T, 2C] (the first pointwise convolution's output), got {tuple(hidden.shape)}"
        )
    batch, frames, two_c = hidden.shape
    channels, kernel = two_c // 2, weight.shape[-1]
    if cache.dim() != 3 or cache.shape[1:] != (channels, kernel - 1):
        raise ValueError(f"cache must be [S, C={channels}, K-1={kernel - 1}], got {tuple(cache.shape)}")
    if weight.shape != (channels, kernel) or any(v.shape != (channels,) for v in (bias, scale, shift)):
        raise ValueError(
            f"weight must be [C, K] = [{channels}, {kernel}] and bias/scale/shift [C]; got weight "
            f"{tuple(weight.shape)}, bias {tuple(bias.shape)}, scale {tuple(scale.shape)}, shift {tuple(shift.shape)}"
        )
    if slot_ids.shape != (batch,) or sources.shape != (batch, kernel - 1 + frames):
        raise ValueError(
            f"slot_ids must be [B]={batch} and sources [B, K-1+T]=[{batch}, {kernel - 1 + frames}], got "
            f"{tuple(slot_ids.shape)} and {tuple(sources.shape)}"
        )
    for name, tensor in (("hidden", hidden), ("cache", cache), ("weight", weight), ("bias", bias),
                         ("scale", scale), ("shift", shift)):  # fmt: skip
        if tensor.dtype != dtype:
            raise ValueError(f"the fused convolution computes in {dtype}; {name} is {tensor.dtype}")
    return batch, frames, channels


def glu_depthwise_conv_step(
    hidden: torch.Tensor,
    cache: torch.Tensor,
    slot_ids: torch.Tensor,
    sources: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    layer_norm_eps: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """GLU, causal depthwise convolution over ``[cache, new frames]``, layer or batch norm and Swish; updates the
    caches of ``slot_ids`` in place (module doc).

    Shapes: hidden ``[B, T, 2C]`` (unit stride in the last dim); cache ``[S, C, K - 1]``; slot_ids ``[B]`` int64,
    distinct except for padding rows that share a dummy slot (their outputs and that slot are junk); sources
    ``[B, K - 1 + T]`` int64 in ``[0, K - 1 + T)``; weight ``[C, K]``; bias, scale, shift ``[C]``; out
    ``[B, T, C]`` (allocated when ``None``). Everything float32. ``layer_norm_eps``: normalise each frame over its
    channels (layer norm; ``scale`` / ``shift`` its weight and bias); ``None``: ``scale`` / ``shift`` are a folded
    batch norm.
    """
    batch, frames, channels = _check(hidden, cache, slot_ids, sources, weight, bias, scale, shift)
    assert hidden.stride(2) == 1 and cache.stride(2) == 1 and sources.stride(1) == 1
    if out is None:
        out = torch.empty([batch, frames, channels], dtype=torch.float32, device=hidden.device)
    kernel = weight.shape[1]
    layer_norm = layer_norm_eps is not None
    # layer norm needs a frame's channels in one program; else 128-channel blocks spread the rows over more SMs
    block_c = triton.next_power_of_2(channels) if layer_norm else min(triton.next_power_of_2(channels), 128)
    weight = weight.contiguous()
    _glu_depthwise_conv_kernel[(batch, triton.cdiv(channels, block_c))](
        hidden, hidden.stride(0), hidden.stride(1), cache, cache.stride(0), cache.stride(1), slot_ids,
        sources, sources.stride(0), weight, bias, scale, shift, out, out.stride(0), out.stride(1),
        channels, frames, float(layer_norm_eps or 0.0),
        KERNEL=kernel, BLOCK_T=triton.next_power_of_2(frames), BLOCK_C=block_c,
        BLOCK_KM1=triton.next_power_of_2(max(kernel - 1, 1)), LAYER_NORM=layer_norm,
        num_warps=8 if block_c >= 1024 else 4,
    )  # fmt: skip
    return out


def join_conv_cache(
    x: torch.Tensor, cache: torch.Tensor, slot_ids: torch.Tensor, sources: torch.Tensor
) -> torch.Tensor:
    """The depthwise convolution's input ``[cache, new frames]`` of each row, aligned by ``sources``, in torch; the
    newest ``K - 1`` inputs become the slots' caches (in the cache's dtype).

    Shapes: x ``[B, C, T]``; cache ``[S, C, K - 1]``; slot_ids ``[B]``; sources ``[B, K - 1 + T]``. Returns
    ``[B, C, K - 1 + T]`` in ``x``'s dtype.
    """
    joined = torch.cat([cache.index_select(0, slot_ids).to(x.dtype), x], 2)
    joined = joined.gather(2, sources[:, None, :].expand(-1, joined.shape[1], -1))
    cache.index_copy_(0, slot_ids, joined[:, :, x.shape[2] :].to(cache.dtype))
    return joined


def glu_depthwise_conv_step_reference(
    hidden: torch.Tensor,
    cache: torch.Tensor,
    slot_ids: torch.Tensor,
    sources: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    layer_norm_eps: float | None = None,
) -> torch.Tensor:
    """:func:`glu_depthwise_conv_step` in torch ops (channel-major, as the unfused streaming path computes it), in
    the dtype of its inputs (float64 for the tests' reference)."""
    _check(hidden, cache, slot_ids, sources, weight, bias, scale, shift, dtype=hidden.dtype)
    x = torch.nn.functional.glu(hidden.transpose(1, 2), dim=1)  # [B, C, T]
    joined = join_conv_cache(x, cache, slot_ids, sources)
    y = torch.nn.functional.conv1d(joined, weight[:, None, :], bias, groups=weight.shape[0])
    if layer_norm_eps is not None:  # over channels, time-major
        y = torch.nn.functional.layer_norm(y.transpose(1, 2), [y.shape[1]], scale, shift, layer_norm_eps)
        return torch.nn.functional.silu(y)
    y = y * scale[:, None] + shift[:, None]
    return torch.nn.functional.silu(y).transpose(1, 2)
