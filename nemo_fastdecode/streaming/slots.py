"""Pre-allocated per-slot caches of a cache-aware streaming FastConformer, updated in place.

One slot per stream, ``S`` slots plus one dummy slot (index ``S``) that absorbs the writes of padding
rows, so a step's batch can be padded to a fixed bucket size without branches (CUDA graphs). Layouts
(``Ly`` layers, ``H`` heads of ``Dh``, ``W`` attention left context, ``Tq`` frames per chunk)::

    key_values     [Ly, S + 1, W + Tq, 2, H, Dh]  projected keys and values (linear_k/linear_v of the layer
                   input), side by side per frame so that one scatter writes both; ``keys`` and ``values`` are its
                   two [Ly, S + 1, W + Tq, H, Dh] views. A ring buffer per slot: logical frame j at
                   (ring_start + j) mod (W + Tq); a slot holds its last <= W frames at logical [0, att_len), then
                   this step's frames after them
    conv           [Ly, S + 1, C, K - 1]       last K - 1 inputs of each depthwise convolution (NeMo's
                                               cache_last_time)
    pre_encode     [S + 1, F, P]               last P feature frames (NeMo's pre-encode cache)
    att_len        [S + 1]                     valid frames in the attention caches (cache_last_channel_len)
    ring_start     [S + 1]                     where a slot's logical frame 0 sits in its ring buffer
    started        [S + 1]                     the stream's first chunk was processed

Keys are stored projected (not the layer inputs, as NeMo's ``cache_last_channel`` does): the left
context is not re-projected every step, and the attention kernel reads them where they are. The
caches are kept in ``dtype`` (fp32 by default; bf16 halves their memory). Dropping the oldest frames of
the window moves ``ring_start`` instead of copying the window every step.
"""

from __future__ import annotations

import torch

from nemo_fastdecode.streaming.geometry import StreamingGeometry

__all__ = ["SlotState"]


class SlotState:
    """The caches of ``num_slots`` streams (plus a dummy slot) for one encoder and geometry.

    Args:
        num_slots: ``S``, the most streams open at once.
        num_layers, num_heads, head_dim, d_model: the encoder's sizes.
        conv_channels: channels of the depthwise convolution (``d_model`` for NeMo's GLU module).
        geometry: the chunk geometry (attention/conv/pre-encode cache sizes, frames per chunk).
        device, dtype: where and in which dtype the attention and convolution caches live.
    """

    def __init__(
        self,
        num_slots: int,
        *,
        num_layers: int,
        num_heads: int,
        head_dim: int,
        conv_channels: int,
        geometry: StreamingGeometry,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
    ):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots, self.geometry, self.device, self.dtype = num_slots, geometry, device, dtype
        rows = num_slots + 1  # + the dummy slot
        self.capacity = geometry.att_cache + geometry.out_frames  # W + Tq
        kv_shape = (num_layers, rows, self.capacity, 2, num_heads, head_dim)
        self.key_values = torch.zeros(kv_shape, device=device, dtype=dtype)
        self.keys, self.values = self.key_values.unbind(3)  # views
        self.conv = torch.zeros((num_layers, rows, conv_channels, geometry.conv_cache), device=device, dtype=dtype)
        # features stay fp32: the subsampling runs on them as NeMo does
        self.pre_encode = torch.zeros((rows, geometry.feat_in, geometry.pre_encode_cache), device=device)
        self.att_len = torch.zeros(rows, dtype=torch.long, device=device)
        self.ring_start = torch.zeros(rows, dtype=torch.long, device=device)
        self.started = torch.zeros(rows, dtype=torch.bool, device=device)

    @property
    def dummy_slot(self) -> int:
        """Index of the slot that padding rows read and write (never open)."""
        return self.num_slots

    def reset_(self, rows: torch.Tensor) -> None:
        """Empty the slots ``rows`` (``[N]`` int64 on the caches' device) for new streams (zeros, as NeMo's
        ``get_initial_cache_state``): one fill per tensor, however many slots."""
        self.key_values.index_fill_(1, rows, 0)
        self.conv.index_fill_(1, rows, 0)
        for state in (self.pre_encode, self.att_len, self.ring_start, self.started):
            state.index_fill_(0, rows, 0)

    def nbytes(self) -> int:
        """Memory held by the caches."""
        tensors = (self.key_values, self.conv, self.pre_encode, self.att_len, self.ring_start, self.started)
        return sum(t.numel() * t.element_size() for t in tensors)
