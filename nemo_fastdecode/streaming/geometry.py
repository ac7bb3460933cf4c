"""Chunk geometry of a NeMo cache-aware streaming encoder, and NeMo's chunk schedule for a feature stream.

NeMo's ``CacheAwareStreamingAudioBuffer`` (``nemo/collections/asr/parts/utils/streaming_utils.py``) feeds a
FastConformer with causal subsampling in chunks of mel-feature frames: the first chunk is shorter
(``chunk_size[0]``, e.g. ``1 + 8 * lookahead``) and has no pre-encode cache; every later chunk
(``chunk_size[1]``, e.g. ``8 * (1 + lookahead)``) is prefixed with the last ``pre_encode_cache_size[1]``
feature frames before it (zeros where the stream is younger), and the subsampling's first
``drop_extra_pre_encoded`` output frames are dropped. Each chunk then gives ``1 + lookahead`` encoder
frames (fewer for a stream's last, partial chunk). :class:`StreamingGeometry` reads these numbers once
from ``encoder.streaming_cfg``; :func:`split_features` cuts one stream's features the way the buffer does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["StreamingGeometry", "split_features"]


def _pair(value: int | list[int]) -> tuple[int, int]:
    """NeMo stores (first chunk, later chunks) pairs as lists, or one int for both."""
    if isinstance(value, int):
        return value, value
    first, later = (int(v) for v in value)
    return first, later


@dataclass(frozen=True)
class StreamingGeometry:
    """Sizes of one cache-aware streaming step, for the encoder's current look-ahead.

    Attributes:
        att_context_size: ``[left, lookahead]`` attention context in encoder frames.
        feat_in: mel features per frame.
        first_chunk: feature frames of a stream's first chunk (NeMo ``chunk_size[0]``).
        chunk: feature frames of every later chunk (``chunk_size[1]``).
        pre_encode_cache: feature frames prefixed to later chunks (``pre_encode_cache_size[1]``).
        drop_extra: subsampled frames dropped from later chunks (``drop_extra_pre_encoded``).
        min_last_chunk: a later chunk shorter than this is not fed (NeMo's buffer stops there).
        out_frames: encoder frames per full chunk (``valid_out_len``).
        att_cache: attention left context in frames (``last_channel_cache_size``).
        conv_cache: depthwise-convolution left context in frames (``conv_context_size[0]``).
        subsampling_factor: feature frames per encoder frame.
    """

    att_context_size: tuple[int, int]
    feat_in: int
    first_chunk: int
    chunk: int
    pre_encode_cache: int
    drop_extra: int
    min_last_chunk: int
    out_frames: int
    att_cache: int
    conv_cache: int
    subsampling_factor: int

    @classmethod
    def from_encoder(cls, encoder: torch.nn.Module) -> StreamingGeometry:
        """Read the geometry of a NeMo ``ConformerEncoder`` (after ``set_default_att_context_size``)."""
        if encoder.streaming_cfg is None:
            encoder.setup_streaming_params()
        cfg = encoder.streaming_cfg
        first_chunk, chunk = _pair(cfg.chunk_size)
        first_cache, pre_encode_cache = _pair(cfg.pre_encode_cache_size)
        shift_first, shift = _pair(cfg.shift_size)
        if first_cache != 0 or (shift_first, shift) != (first_chunk, chunk) or cfg.cache_drop_size != 0:
            raise ValueError(
                "only NeMo's chunked_limited cache-aware streaming with causal subsampling is supported "
                f"(non-overlapping chunks, no first-chunk pre-encode cache); got chunk_size={cfg.chunk_size}, "
                f"shift_size={cfg.shift_size}, pre_encode_cache_size={cfg.pre_encode_cache_size}, "
                f"cache_drop_size={cfg.cache_drop_size}"
            )
        sampling = getattr(encoder.pre_encode, "get_sampling_frames", lambda: 1)()
        return cls(
            att_context_size=(int(encoder.att_context_size[0]), int(encoder.att_context_size[1])),
            feat_in=int(encoder._feat_in),
            first_chunk=first_chunk,
            chunk=chunk,
            pre_encode_cache=pre_encode_cache,
            drop_extra=int(cfg.drop_extra_pre_encoded),
            min_last_chunk=_pair(sampling)[1],
            out_frames=int(cfg.valid_out_len),
            att_cache=int(cfg.last_channel_cache_size),
            conv_cache=int(encoder.conv_context_size[0]),
            subsampling_factor=int(encoder.subsampling_factor),
        )

    @property
    def max_input_frames(self) -> int:
        """Width of the subsampling input for one step: pre-encode cache + a full later chunk."""
        return self.pre_encode_cache + self.chunk

    @property
    def chunk_seconds(self) -> float:
        """Audio per full chunk at NeMo's 10 ms feature hop."""
        return self.chunk * 0.01

    def max_chunk(self, first: bool) -> int:
        """Most feature frames a chunk may have: ``first_chunk`` for a stream's first step, else ``chunk``."""
        return self.first_chunk if first else self.chunk


def split_features(features: torch.Tensor, geometry: StreamingGeometry) -> list[torch.Tensor]:
    """Cut one stream's features ``[feat_in, T]`` into NeMo's chunks (views, without pre-encode cache).

    Same schedule as ``CacheAwareStreamingAudioBuffer``: ``first_chunk`` frames, then ``chunk`` frames at
    a time; a trailing later chunk shorter than ``min_last_chunk`` frames is dropped, as NeMo drops it.
    """
    if features.dim() != 2 or features.shape[0] != geometry.feat_in:
        raise ValueError(f"features must be [feat_in={geometry.feat_in}, T], got shape {tuple(features.shape)}")
    chunks, start, total = [], 0, features.shape[1]
    while start < total:
        size = geometry.max_chunk(first=start == 0)
        piece = features[:, start : start + size]
        if start > 0 and piece.shape[1] < geometry.min_last_chunk:
            break
        chunks.append(piece)
        start += size
    return chunks
