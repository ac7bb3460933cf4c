"""One cache-aware streaming step of a NeMo FastConformer for many desynchronised streams.

Reimplements NeMo's ``ConformerEncoder.cache_aware_stream_step`` (``forward_internal`` with
``cache_last_channel`` / ``cache_last_time`` / ``cache_last_channel_len``, ``ConformerLayer``,
``RelPositionMultiHeadAttention``, the causal depthwise convolution and the pre-encode cache) with the
NeMo module's own weights, for ``N`` streams that each sit at their own position:

* the caches live in a :class:`~nemo_fastdecode.streaming.slots.SlotState` and are read and written in
  place through slot ids (no gather of whole caches into a batch, no scatter back);
* attention over the cached left context runs in :func:`~nemo_fastdecode.kernels.indexed_attention.indexed_attention`
  (Triton on CUDA, its torch reference on the CPU) with NeMo's relative-position term, on projected keys;
* every tensor op is free of host synchronisation and of data-dependent shapes, so a step can be
  captured once per batch size as a CUDA graph and replayed.

Row layout inside a step: a stream's ``T_i <= Tq`` new encoder frames are right-aligned in its ``Tq``
rows (``Tq - T_i`` padding rows first), because the attention kernel places query ``t`` at cache
position ``length - Tq + t``. Streams differ in ``T_i`` only at their first and last chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nemo_fastdecode.kernels import matmul, triton_runs_on
from nemo_fastdecode.kernels.indexed_attention import build_rel_pos_table, indexed_attention
from nemo_fastdecode.kernels.layer_norm import layer_norm_with_stats
from nemo_fastdecode.kernels.pre_encode_window import pre_encode_window, pre_encode_window_reference
from nemo_fastdecode.kernels.streaming_conv import glu_depthwise_conv_step, join_conv_cache
from nemo_fastdecode.streaming.slots import SlotState
from nemo_fastdecode.streaming.subsampling import CausalSubsampling

# how the streaming encoder's Linear and pointwise-convolution GEMMs run: "fp32" = NeMo's modules (cuBLAS/cuDNN fp32,
# the exact reference); "tf32x3" = kernels/matmul.py on tensor cores (near fp32; CUDA and fp32 compute only);
# "tf32" = the same kernels with one TF32 product (10-bit mantissas: what NeMo runs with matmul_precision=high)
ENCODER_MATMULS = ("fp32", "tf32x3", "tf32")

__all__ = ["ENCODER_MATMULS", "StreamingEncoderStep", "check_precision", "check_streaming_encoder"]


def check_precision(dtype: str, encoder_matmul: str) -> None:
    """Configs' precision options: ``dtype`` float32 / bfloat16; ``encoder_matmul`` one of :data:`ENCODER_MATMULS`,
    anything but ``fp32`` with float32 only. Raises ``ValueError`` naming the bad value and the valid ones."""
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype={dtype!r} is not valid; valid values: float32, bfloat16")
    if encoder_matmul not in ENCODER_MATMULS:
        raise ValueError(f"encoder_matmul={encoder_matmul!r} is not valid; valid values: {', '.join(ENCODER_MATMULS)}")
    if encoder_matmul != "fp32" and dtype != "float32":
        raise ValueError(f"encoder_matmul={encoder_matmul!r} needs dtype=float32, got {dtype}")


def check_streaming_encoder(encoder: torch.nn.Module) -> None:
    """Raise ``ValueError`` naming the setting if ``encoder`` is not a cache-aware FastConformer we support."""
    from nemo.collections.asr.modules import ConformerEncoder

    if not isinstance(encoder, ConformerEncoder):
        raise ValueError(f"need a NeMo ConformerEncoder, got {type(encoder).__name__}")
    problems = []
    if encoder.self_attention_model != "rel_pos":
        problems.append(f"self_attention_model={encoder.self_attention_model!r} (valid: 'rel_pos')")
    if encoder.att_context_style != "chunked_limited":
        problems.append(f"att_context_style={encoder.att_context_style!r} (valid: 'chunked_limited')")
    left, right = encoder.att_context_size[0], encoder.att_context_size[1]
    if left < 0 or right < 0:
        problems.append(
            f"att_context_size={list(encoder.att_context_size)} (valid: limited left context and look-ahead)"
        )
    if encoder.conv_context_size[1] != 0:
        problems.append(f"conv_context_size={encoder.conv_context_size} (valid: 'causal', i.e. [K - 1, 0])")
    if encoder.reduction_subsampling is not None:
        problems.append("reduction_subsampling (valid: none)")
    if isinstance(encoder.pre_encode, torch.nn.Linear) or not getattr(encoder.pre_encode, "is_causal", False):
        problems.append("subsampling without causal_downsampling=true (valid: causal ConvSubsampling)")
    conv = encoder.layers[0].conv
    if conv.pointwise_activation != "glu_":
        problems.append(f"conv pointwise_activation={conv.pointwise_activation!r} (valid: 'glu_')")
    if problems:
        raise ValueError("unsupported cache-aware streaming encoder: " + "; ".join(problems))


class StreamingEncoderStep:
    """The encoder step over slot caches: ``__call__(slot_ids, features, feature_lengths)``.

    Args:
        encoder: a NeMo ``ConformerEncoder`` in eval mode, set up for cache-aware streaming (see
            :func:`check_streaming_encoder`); its look-ahead is ``encoder.att_context_size``.
        slots: the slot caches (its geometry must be the encoder's).
        use_triton: the step's Triton kernels (indexed attention, the pre-encode window, the subsampling's) or their
            torch references; ``None``: Triton on CUDA (tf32x3 runs Triton whatever this says).
        matmul_precision: one of :data:`ENCODER_MATMULS`: ``"fp32"`` (default) runs NeMo's modules' own products
            (the pointwise convolutions as the same GEMMs over ``[B, T, C]``) and, with fp32 slots, the
            subsampling's convolutions with their masks and ReLUs in fewer passes
            (:mod:`~nemo_fastdecode.streaming.subsampling`), its output Linear on the kept frames only;
            ``"tf32x3"`` (opt-in, fp32 slots; Triton's interpreter on the CPU) runs the GEMMs on the 3xTF32 Triton
            kernel, the convolution module between them as one kernel (:mod:`~nemo_fastdecode.kernels.streaming_conv`)
            where it has NeMo's shape, q, k, v as one GEMM, and the subsampling's convolutions fused with their ReLUs,
            masks and paddings. ``"tf32"`` (opt-in): all of that with single-TF32 products (NeMo's
            ``matmul_precision=high``).
    """

    def __init__(
        self,
        encoder: torch.nn.Module,
        slots: SlotState,
        use_triton: bool | None = None,
        matmul_precision: str = "fp32",
    ):
        check_streaming_encoder(encoder)
        if matmul_precision not in ENCODER_MATMULS:
            raise ValueError(f"matmul_precision must be one of {ENCODER_MATMULS}, got {matmul_precision!r}")
        if matmul_precision != "fp32" and slots.dtype != torch.float32:
            raise ValueError(
                f"matmul_precision={matmul_precision!r} needs fp32 compute, got {slots.dtype}: with "
                f"{slots.dtype} the encoder's GEMMs already run on tensor cores (use 'fp32')"
            )
        if matmul_precision != "fp32" and not triton_runs_on(slots.device):
            raise ValueError(
                f"matmul_precision={matmul_precision!r} runs a Triton kernel: needs CUDA (or TRITON_INTERPRET=1 on "
                f"the CPU), got device {slots.device}"
            )
        self.encoder, self.slots, self.use_triton = encoder, slots, use_triton
        self.tensor_core_matmul = matmul_precision != "fp32"
        self.matmul_precision = matmul_precision
        g = self.geometry = slots.geometry
        self.tq = g.out_frames
        self.num_heads = encoder.layers[0].self_attn.h
        self.head_dim = encoder.layers[0].self_attn.d_k
        self.scale = 1.0 / math.sqrt(self.head_dim)
        device = slots.device
        self._rows = torch.arange(self.tq, device=device)
        self._conv_pos = torch.arange(g.conv_cache + self.tq, device=device)
        # NeMo's positional table for [W cached + Tq new] frames projected once per layer (it depends on
        # the weights only); NeMo re-projects the same rows every step.
        with torch.inference_mode():
            _, pos_emb = encoder.pos_enc(
                x=torch.zeros(1, self.tq, encoder.d_model, device=device), cache_len=g.att_cache
            )
            self.pos_tables = [
                build_rel_pos_table(pos_emb, layer.self_attn.linear_pos, self.num_heads).to(slots.dtype).contiguous()
                for layer in encoder.layers
            ]
            self.pos_bias = [
                (layer.self_attn.pos_bias_u.to(slots.dtype), layer.self_attn.pos_bias_v.to(slots.dtype))
                for layer in encoder.layers
            ]
            # tf32x3: the convolution module between its pointwise GEMMs as one kernel where it has NeMo's shape
            # (layer or batch norm, Swish); its weights prepared once (like the tables above)
            self.fused_conv = [
                fused_conv_weights(layer.conv, g.conv_cache) if self.tensor_core_matmul else None
                for layer in encoder.layers
            ]
            self.kernels = self.tensor_core_matmul or (device.type == "cuda" if use_triton is None else use_triton)
            # the subsampling's convolutions with their masks, ReLUs and paddings in fewer passes: fp32 compute with
            # NeMo's own convolutions; tf32x3, and bf16 compute where Triton runs, fused with them in fp32 (NeMo's
            # module in bf16 makes several passes over [B, C, T/2, F/2], a large share of a step at thousands of
            # streams). None (bf16
            # on torch, other subsamplings): NeMo's module
            fused = self.tensor_core_matmul or (self.kernels and slots.dtype != torch.float32)
            self.subsampling = (
                CausalSubsampling.from_module(
                    encoder.pre_encode, use_triton=self.kernels, max_frames=g.max_input_frames, fuse_convolutions=fused
                )
                if slots.dtype == torch.float32 or fused
                else None
            )
            # tf32x3: q, k and v as one GEMM over the three weights stacked (one launch instead of three)
            self.fused_qkv = [
                stacked_qkv_projection(layer.self_attn) if self.tensor_core_matmul else None for layer in encoder.layers
            ]

    # ------------------------------------------------------------------------------------------
    def __call__(
        self, slot_ids: torch.Tensor, features: torch.Tensor, feature_lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Advance streams by one chunk each, updating their slots in place.

        Args:
            slot_ids: ``[B]`` int64, distinct open slots; padding rows use the dummy slot with length 0.
            features: ``[B, F, G]`` new mel-feature frames of each stream, left-aligned (``G <= geometry.chunk``);
                no pre-encode cache, the slots hold it.
            feature_lengths: ``[B]`` int64 valid frames of each row (at most ``first_chunk`` for a stream's
                first step, ``chunk`` later; 0 for padding rows).

        Returns:
            ``(encoded [B, Tq, d_model], lengths [B])``: each stream's new encoder frames, left-aligned.
        """
        enc, s, g = self.encoder, self.slots, self.geometry
        started = s.started.index_select(0, slot_ids)
        x, frames = self._pre_encode(slot_ids, features, feature_lengths, started)
        if enc.xscale:
            x = x * enc.xscale

        att_len = s.att_len.index_select(0, slot_ids)  # cached frames before this chunk
        ring_start = s.ring_start.index_select(0, slot_ids)
        pad = self.tq - frames  # leading padding rows of each stream
        valid = self._rows[None, :] >= pad[:, None]  # [B, Tq]
        # cache position of row r: logical att_len + r - pad in the slot's ring; padding rows write into the dummy slot
        write_slot = torch.where(valid, slot_ids[:, None], s.dummy_slot).reshape(-1)
        logical = att_len[:, None] + self._rows[None, :] - pad[:, None]
        write_pos = torch.where(valid, (ring_start[:, None] + logical) % s.capacity, 0).reshape(-1)
        # the q-k-v GEMMs (all of one shape) write k and v in their epilogue where they run on the kernel
        qkv = self.fused_qkv[0]
        scatter_kv = qkv is not None and self._on_kernel(qkv.weight, write_slot.shape[0])
        writes = _CacheWrites(write_slot, write_pos, s.key_values if scatter_kv else None)
        lengths = att_len + frames
        # convolution input gathered as [padding, cache (K - 1), new frames]: row p reads p, or the cache
        conv_src = torch.where(
            self._conv_pos[None, :] >= pad[:, None] + g.conv_cache,
            self._conv_pos[None, :],
            (self._conv_pos[None, :] - pad[:, None]).clamp(min=0),
        )  # [B, K - 1 + Tq]

        stats = None  # row statistics of x, where a kernel kept them (tf32x3)
        for index, layer in enumerate(enc.layers):
            x, stats = self._layer(index, layer, x, stats, slot_ids, writes, lengths, ring_start, conv_src)

        self._drop_oldest_frames(slot_ids, lengths, ring_start)
        s.started.index_copy_(0, slot_ids, started | (feature_lengths > 0))
        if enc.out_proj is not None:
            x = enc.out_proj(x)
        # left-align each stream's frames for the decoder: out[i, t] = x[i, pad_i + t]
        src = (self._rows[None, :] + pad[:, None]).clamp(max=self.tq - 1)
        out = x.gather(1, src[:, :, None].expand(-1, -1, x.shape[2]))
        return out, frames

    # ------------------------------------------------------------------------------------------
    def _pre_encode(self, slot_ids, features, feature_lengths, started):
        """Subsample ``[pre-encode cache, chunk]`` (later chunks) or ``[chunk]`` (first chunks) in one call.

        Returns the new frames right-aligned in ``[B, Tq, d_model]`` and their number ``[B]``.
        """
        s, g = self.slots, self.geometry
        window = pre_encode_window if self.kernels else pre_encode_window_reference  # one kernel / torch (a copy)
        x = window(features.float(), feature_lengths, started, s.pre_encode, slot_ids, g.max_input_frames)
        in_lengths = feature_lengths + torch.where(started, g.pre_encode_cache, 0)

        if self.subsampling is None:
            sub, sub_lengths = self.encoder.pre_encode(x=x.transpose(1, 2), lengths=in_lengths)  # [B, T', d]
        else:  # the convolutions only, in fp32 (its kernels' dtype): the output Linear runs on the kept frames below
            # the window is zero past each row's frames already: NeMo's first mask would change nothing
            with torch.autocast(x.device.type, enabled=False):
                conv, sub_lengths = self.subsampling(x.transpose(1, 2), in_lengths, input_masked=True)  # [B, C, T', F']
        drop = torch.where(started, g.drop_extra, 0)
        frames = (sub_lengths.to(torch.long) - drop).clamp(min=0, max=self.tq)
        frames = torch.where(feature_lengths > 0, frames, 0)
        # right-align: row r holds sub-frame drop + frames - Tq + r
        src = (drop + frames - self.tq)[:, None] + self._rows[None, :]
        if self.subsampling is None:
            src = src.clamp(min=0, max=sub.shape[1] - 1)
            return sub.gather(1, src[:, :, None].expand(-1, -1, sub.shape[2])), frames
        b, channels, time, freq = conv.shape
        src = src.clamp(min=0, max=time - 1)
        kept = conv.gather(2, src[:, None, :, None].expand(b, channels, self.tq, freq))  # [B, C, Tq, F']
        # NeMo's flattening (channels, then frequency) and its output Linear, on Tq frames instead of T'
        return self._linear(self.encoder.pre_encode.out, kept.transpose(1, 2).reshape(b, self.tq, -1)), frames

    def _linear(
        self,
        module: torch.nn.Module,
        x: torch.Tensor | _Normalized,
        activation: torch.nn.Module | None = None,
        residual: torch.Tensor | None = None,
        residual_scale: float = 1.0,
        keep_stats: bool = False,
        scatter: matmul.ColumnScatter | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, matmul.RowStats | None]:
        """A Linear (or a kernel-size-1 Conv1d, on ``[B, T, C]``) applied to the last dim of ``x``, then
        ``activation``, then ``residual + residual_scale * y``: in the GEMM's epilogue on the 3xTF32 kernel (Swish),
        else as NeMo's torch ops in NeMo's order. ``x`` may be a :class:`_Normalized` (a layer norm the 3xTF32 kernel
        applies while loading the rows, given their statistics). ``keep_stats``: return ``(y, row statistics of y or
        None)``, the statistics where the 3xTF32 kernel computed ``y``. ``scatter`` (on the kernel only): the output's
        last columns go to their cache places in the GEMM's epilogue (:class:`~nemo_fastdecode.kernels.matmul.
        ColumnScatter`), the first ones are returned."""
        normalized = x if isinstance(x, _Normalized) else None
        weight = _weight(module)
        swish = activation is not None and is_swish(activation)
        rows = (normalized.x if normalized is not None else x).shape[:-1].numel()
        on_kernel = self._on_kernel(weight, rows, activation)
        if scatter is not None and not on_kernel:
            raise ValueError("scatter is the 3xTF32 kernel's epilogue: check _on_kernel first")
        layer_norm = normalized.fusable() if on_kernel and normalized is not None else None
        if normalized is not None:  # the kernel normalises the rows of normalized.x as it loads them, or torch does
            x = normalized.x if layer_norm is not None else normalized.compute()
        if on_kernel:
            return matmul.linear(
                x, weight, module.bias, swish=swish, residual=residual, residual_scale=residual_scale,
                layer_norm=layer_norm, row_stats=keep_stats, precision=self.matmul_precision, scatter=scatter,
            )  # fmt: skip
        # fp32: NeMo's Linear (a Conv1d's product as the same GEMM); tf32x3 off the kernel: cuBLAS fp32 where the 3xTF32
        # kernel would be slower
        plain = self.tensor_core_matmul or not isinstance(module, torch.nn.Linear)
        y = F.linear(x, weight, module.bias) if plain else module(x)
        if activation is not None:
            y = activation(y)
        if residual is not None:
            y = residual + y if residual_scale == 1.0 else residual + residual_scale * y
        return (y, None) if keep_stats else y

    def _on_kernel(self, weight: torch.Tensor, rows: int, activation: torch.nn.Module | None = None) -> bool:
        """Whether :meth:`_linear` runs this GEMM on the 3xTF32 kernel (tf32x3, an epilogue it has, and a shape where
        it beat cuBLAS). Shapes are fixed per batch-size bucket, so each captured graph makes this choice once."""
        return (
            self.tensor_core_matmul
            and (activation is None or is_swish(activation))
            and matmul.tensor_cores_win(rows, weight.shape[0], weight.shape[1])
        )

    def _feed_forward(
        self, ff: torch.nn.Module, x: torch.Tensor | _Normalized, residual: torch.Tensor, keep_stats: bool = False
    ):
        """``residual + 0.5 * ConformerFeedForward.forward(x)`` (eval mode: dropout is identity)."""
        hidden = self._linear(ff.linear1, x, activation=ff.activation)
        return self._linear(ff.linear2, hidden, residual=residual, residual_scale=0.5, keep_stats=keep_stats)

    def _layer(self, index, layer, x, x_stats, slot_ids, writes, lengths, ring_start, conv_src):
        """``ConformerLayer.forward`` with the caches of the slots (eval mode: dropout is identity); each residual
        addition rides on the GEMM before it, and (tf32x3) four of the five layer norms on the GEMM after it, given
        the row statistics of their input (``x_stats``: of ``x``). Returns the layer's output and its statistics."""
        residual, stats = self._feed_forward(
            layer.feed_forward1, _Normalized(x, layer.norm_feed_forward1, x_stats), residual=x, keep_stats=True
        )
        residual, stats = self._attention(
            index, layer.self_attn, _Normalized(residual, layer.norm_self_att, stats), slot_ids, writes, lengths,
            ring_start, residual,
        )  # fmt: skip
        residual, stats = self._convolution(
            index, layer.conv, _Normalized(residual, layer.norm_conv, stats), slot_ids, conv_src, residual
        )
        residual = self._feed_forward(
            layer.feed_forward2, _Normalized(residual, layer.norm_feed_forward2, stats), residual=residual
        )
        if self.tensor_core_matmul and is_plain_layer_norm(layer.norm_out, residual.shape[-1]):
            return layer_norm_with_stats(residual, layer.norm_out)  # the next layer's first norm rides on a GEMM
        return layer.norm_out(residual), None

    def _attention(self, index, attn, x, slot_ids, writes, lengths, ring_start, residual):
        """``residual + RelPositionMultiHeadAttention`` over [cached left context, this chunk], keys read in place."""
        s = self.slots
        b, tq, d = residual.shape
        h, dh = self.num_heads, self.head_dim
        # same as: keys[slot, pos] = k, values[slot, pos] = v for every valid row (in place, no concatenation)
        where = (writes.slot, writes.pos)
        fused = self.fused_qkv[index]
        if fused is not None and writes.kv_offsets is not None:
            # one GEMM of [q, k, v]: q comes back, k and v (side by side, as stored) go straight to their slots
            q = self._linear(fused, x, scatter=matmul.ColumnScatter(d, s.key_values[index], writes.kv_offsets))
        elif fused is not None:  # one [B, Tq, 3 d] output, then k and v scattered into the slots
            q, kv = self._linear(fused, x).split([d, 2 * d], dim=-1)
            s.key_values[index].index_put_(where, kv.reshape(b * tq, 2, h, dh).to(s.dtype))
        else:
            x = x.compute() if isinstance(x, _Normalized) else x  # once for the three projections
            q, k, v = (self._linear(linear, x) for linear in (attn.linear_q, attn.linear_k, attn.linear_v))
            s.keys[index].index_put_(where, k.reshape(b * tq, h, dh).to(s.dtype))
            s.values[index].index_put_(where, v.reshape(b * tq, h, dh).to(s.dtype))
        q = q.view(b, tq, h, dh)
        keys, values = s.keys[index], s.values[index]  # [S + 1, W + Tq, H, Dh] views
        bias_u, bias_v = self.pos_bias[index]
        # written as [B, Tq, H, Dh], the layout linear_out reads as [B, Tq, d]: no transpose copy
        out = torch.empty(b, tq, h, dh, dtype=s.dtype, device=residual.device)
        indexed_attention(
            q.transpose(1, 2).to(s.dtype),
            keys.permute(0, 2, 1, 3),
            values.permute(0, 2, 1, 3),
            slot_ids,
            lengths,
            self.scale,
            pos_bias_u=bias_u,
            pos_bias_v=bias_v,
            pos_emb=self.pos_tables[index],
            use_triton=self.use_triton,
            check_values=False,  # slot ids are checked on the host once per step; lengths are in range
            key_starts=ring_start,
            out=out.transpose(1, 2),
        )
        return self._linear(attn.linear_out, out.view(b, tq, d).to(residual.dtype), residual=residual, keep_stats=True)

    def _convolution(self, index, conv, x, slot_ids, conv_src, residual):
        """``residual + ConformerConvolution`` with the causal depthwise convolution's left context from the slots."""
        s = self.slots
        if self.fused_conv[index] is not None:  # GLU .. Swish in one kernel, time-major, caches in place
            hidden = self._linear(conv.pointwise_conv1, x)  # [B, Tq, 2C]
            x = glu_depthwise_conv_step(hidden, s.conv[index], slot_ids, conv_src, *self.fused_conv[index])
            return self._linear(conv.pointwise_conv2, x, residual=residual, keep_stats=True)
        # the pointwise convolutions as GEMMs over [B, Tq, C]: as Conv1d over [B, C, Tq] cuDNN runs them far
        # slower (a 2-frame "image" per stream is a shape its convolution kernels are not made for; bf16 worst)
        x = F.glu(self._linear(conv.pointwise_conv1, x).transpose(1, 2), dim=1)  # [B, C, Tq]
        joined = join_conv_cache(x, s.conv[index], slot_ids, conv_src)  # [B, C, K - 1 + Tq]
        dw = conv.depthwise_conv
        x = F.conv1d(joined, dw.weight, dw.bias, stride=1, padding=0, dilation=dw.dilation, groups=dw.groups)
        # NeMo's layer_norm variant normalises over channels, time-major
        layer_norm = conv.norm_type == "layer_norm"
        x = conv.batch_norm(x.transpose(1, 2)).transpose(1, 2) if layer_norm else conv.batch_norm(x)
        return self._linear(
            conv.pointwise_conv2, conv.activation(x).transpose(1, 2), residual=residual, keep_stats=True
        )

    def _drop_oldest_frames(self, slot_ids, lengths, ring_start):
        """Keep each slot's last ``W`` attention frames (NeMo's cache_last_channel update) by moving its ring start.

        Copying the window back to position 0 instead read and wrote every layer's whole window every step
        (~300 MB per step at 256 streams of a 17-layer, 512-wide encoder).
        """
        s, w = self.slots, self.geometry.att_cache
        new_len = lengths.clamp(max=w)
        s.ring_start.index_copy_(0, slot_ids, (ring_start + lengths - new_len) % s.capacity)
        s.att_len.index_copy_(0, slot_ids, new_len)


def _weight(module: torch.nn.Module) -> torch.Tensor:
    """A Linear's weight ``[N, K]``, or a kernel-size-1 Conv1d's as one."""
    return module.weight if module.weight.dim() == 2 else module.weight[:, :, 0]


class _CacheWrites:
    """Where this step's rows go in the slots' caches: ``(slot [B * Tq], pos [B * Tq])`` per row (padding rows: the
    dummy slot), and, given float32 key/value caches ``[Ly, S + 1, W + Tq, 2 d]`` for the q-k-v GEMMs' epilogue,
    each row's element offset into one layer's cache (``None`` otherwise: k and v go in with ``index_put_``)."""

    def __init__(self, slot: torch.Tensor, pos: torch.Tensor, key_values: torch.Tensor | None):
        self.slot, self.pos = slot, pos
        self.kv_offsets = None
        if key_values is not None and key_values.dtype == torch.float32 and key_values.is_contiguous():
            self.kv_offsets = slot * key_values.stride(1) + pos * key_values.stride(2)


@dataclass(frozen=True)
class _Normalized:
    """``norm(x)`` not computed yet: a GEMM on the 3xTF32 kernel normalises the rows of ``x`` while loading them
    when ``stats`` (kept by the GEMM that wrote ``x``) are there and ``norm`` is a plain LayerNorm over the last
    dim; any other consumer calls :meth:`compute` (NeMo's module)."""

    x: torch.Tensor
    norm: torch.nn.Module
    stats: matmul.RowStats | None

    def compute(self) -> torch.Tensor:
        return self.norm(self.x)

    def fusable(self) -> matmul.LayerNormInput | None:
        """What ``matmul.linear(layer_norm=...)`` needs, or None where the norm must be computed."""
        if self.stats is None or not is_plain_layer_norm(self.norm, self.x.shape[-1]):
            return None
        return matmul.LayerNormInput(self.stats, self.norm.weight, self.norm.bias, float(self.norm.eps))


def is_plain_layer_norm(norm: torch.nn.Module, features: int) -> bool:
    """``norm`` is torch's affine LayerNorm over a last dim of ``features`` (what the fused kernels compute)."""
    return (
        type(norm) is torch.nn.LayerNorm
        and tuple(norm.normalized_shape) == (features,)
        and norm.weight is not None
        and norm.bias is not None
    )


def is_swish(module: torch.nn.Module) -> bool:
    """NeMo's ``Swish`` or torch's ``SiLU``: ``x * sigmoid(x)``, which the fused kernels compute."""
    return type(module).__name__ in ("Swish", "SiLU")


def stacked_qkv_projection(attn: torch.nn.Module) -> torch.nn.Linear | None:
    """One ``Linear(d_model, 3 d_model)`` whose output is ``[q, k, v]`` of ``attn`` (a copy of its three weights),
    or ``None`` where the three projections differ in shape or in having a bias."""
    linears = (attn.linear_q, attn.linear_k, attn.linear_v)
    if not all(isinstance(linear, torch.nn.Linear) for linear in linears):
        return None
    shapes = {linear.weight.shape for linear in linears}
    with_bias = {linear.bias is not None for linear in linears}
    if len(shapes) != 1 or len(with_bias) != 1:
        return None
    out_features, in_features = attn.linear_q.weight.shape
    weight = attn.linear_q.weight
    stacked = torch.nn.Linear(
        in_features, 3 * out_features, bias=with_bias == {True}, device=weight.device, dtype=weight.dtype
    )
    stacked.weight.copy_(torch.cat([linear.weight for linear in linears]))
    if stacked.bias is not None:
        stacked.bias.copy_(torch.cat([linear.bias for linear in linears]))
    return stacked.requires_grad_(False).eval()


def fused_conv_weights(conv: torch.nn.Module, conv_cache: int) -> tuple | None:
    """``(weight [C, K], bias [C], scale [C], shift [C], layer_norm_eps)`` of a ``ConformerConvolution`` for
    :func:`~nemo_fastdecode.kernels.streaming_conv.glu_depthwise_conv_step`: its layer norm's weight and bias and
    eps (NeMo's streaming models), or its eval-mode batch norm folded into ``scale`` / ``shift`` (in float64;
    eps ``None``). ``None`` where the module has another shape (another norm or activation, dilation, a kernel
    that does not match the cache)."""
    dw, norm = conv.depthwise_conv, conv.batch_norm
    layer_norm = isinstance(norm, torch.nn.LayerNorm) and tuple(norm.normalized_shape) == (dw.weight.shape[0],)
    batch_norm = isinstance(norm, torch.nn.BatchNorm1d) and norm.track_running_stats
    fits = (
        (layer_norm or batch_norm)
        and is_swish(conv.activation)
        and dw.weight.dim() == 3
        and dw.weight.shape[1] == 1
        and dw.groups == dw.weight.shape[0]
        and tuple(dw.dilation) == (1,)
        and tuple(dw.stride) == (1,)
        and dw.weight.shape[2] == conv_cache + 1
    )
    if not fits:
        return None
    channels = dw.weight.shape[0]
    ones = torch.ones(channels, dtype=torch.float64, device=dw.weight.device)
    bias = dw.bias.double() if dw.bias is not None else torch.zeros_like(ones)
    affine = norm.elementwise_affine if layer_norm else norm.affine
    gamma = norm.weight.double() if affine else ones
    beta = norm.bias.double() if affine and norm.bias is not None else torch.zeros_like(ones)
    if layer_norm:
        scale, shift, eps = gamma, beta, float(norm.eps)
    else:
        scale = gamma / torch.sqrt(norm.running_var.double() + norm.eps)
        shift, eps = beta - norm.running_mean.double() * scale, None
    weights = tuple(t.float().contiguous() for t in (dw.weight[:, 0, :].double(), bias, scale, shift))
    return (*weights, eps)
