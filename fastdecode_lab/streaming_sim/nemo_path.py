"""NeMo's own path for many desynchronised streams, the baseline of the streaming benchmark.

NeMo keeps per-stream caches in slots and, every step, gathers the stepping streams' caches into a
fresh batch (``cache[:, slot_ids]``), runs ``model.conformer_stream_step`` (encoder + the model's own
decoding strategy with ``previous_hypotheses``), and scatters the caches back. The pre-encode cache is
prefixed to each chunk as ``CacheAwareStreamingAudioBuffer`` does. Streams at their first chunk use
``drop_extra_pre_encoded=0`` (NeMo's streaming script), so a step with first and later chunks runs as
two NeMo calls. Chunks of different lengths in one call are zero-padded (NeMo's batch semantics).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis

from nemo_fastdecode.streaming.geometry import StreamingGeometry

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

__all__ = ["NemoSlotStreamer"]


class NemoSlotStreamer:
    """Slot caches + gather/scatter + ``conformer_stream_step``, with the interface of the fast streamer.

    Args:
        model: the same NeMo model (its encoder's current ``att_context_size`` is used).
        num_slots: number of slots.
    """

    def __init__(self, model: ASRModel, num_slots: int):
        self.model, self.num_slots = model, num_slots
        encoder = model.encoder
        self.geometry = StreamingGeometry.from_encoder(encoder)
        self.device = next(model.parameters()).device
        channel, time, channel_len = encoder.get_initial_cache_state(batch_size=num_slots, device=self.device)
        self.cache_last_channel, self.cache_last_time, self.cache_last_channel_len = channel, time, channel_len
        self.pre_encode = torch.zeros(
            num_slots, self.geometry.feat_in, self.geometry.pre_encode_cache, device=self.device
        )
        self._hyps: list[Hypothesis | None] = [None] * num_slots
        self._started = [False] * num_slots
        self._free = list(range(num_slots))[::-1]

    def open(self) -> int:
        """Start a stream in a free slot (caches zeroed, as ``get_initial_cache_state``)."""
        slot = self._free.pop()
        self.cache_last_channel[:, slot].zero_()
        self.cache_last_time[:, slot].zero_()
        self.cache_last_channel_len[slot] = 0
        self.pre_encode[slot].zero_()
        self._hyps[slot], self._started[slot] = None, False
        return slot

    def flush(self, slot: int) -> Hypothesis | None:
        """End of stream: the final hypothesis; the slot is freed."""
        self._free.append(slot)
        return self._hyps[slot]

    def hypothesis(self, slot: int) -> Hypothesis | None:
        return self._hyps[slot]

    @torch.inference_mode()
    def step(self, slot_ids: Sequence[int], chunks: Sequence[torch.Tensor]) -> list[Hypothesis]:
        """One chunk ``[feat_in, T_i]`` for each stream in ``slot_ids``; returns their hypotheses."""
        slots = list(slot_ids)
        first = [i for i, slot in enumerate(slots) if not self._started[slot]]
        later = [i for i, slot in enumerate(slots) if self._started[slot]]
        for rows, is_first in ((first, True), (later, False)):
            if rows:
                self._step_group([slots[i] for i in rows], [chunks[i] for i in rows], is_first)
        for slot in slots:
            self._started[slot] = True
        return [self._hyps[slot] for slot in slots]

    def _step_group(self, slots: list[int], chunks: list[torch.Tensor], first: bool) -> None:
        g = self.geometry
        idx = torch.tensor(slots, device=self.device)
        lengths = [c.shape[1] for c in chunks]
        prefix = 0 if first else g.pre_encode_cache
        signal = torch.zeros(len(slots), g.feat_in, prefix + max(lengths), device=self.device)
        for row, chunk in enumerate(chunks):
            signal[row, :, prefix : prefix + lengths[row]] = chunk.to(self.device, torch.float32)
        if prefix:
            signal[:, :, :prefix] = self.pre_encode.index_select(0, idx)
        # the next pre-encode cache: the last P frames of [cache, chunk]
        full = signal if prefix else torch.cat([self.pre_encode.index_select(0, idx), signal], 2)
        ends = torch.tensor(lengths, device=self.device) + g.pre_encode_cache
        cache_pos = ends[:, None] - g.pre_encode_cache + torch.arange(g.pre_encode_cache, device=self.device)
        self.pre_encode[idx] = full.gather(2, cache_pos[:, None, :].expand(-1, g.feat_in, -1))

        out = self.model.conformer_stream_step(
            processed_signal=signal,
            processed_signal_length=torch.tensor(lengths, device=self.device) + prefix,
            cache_last_channel=self.cache_last_channel[:, idx],  # gather
            cache_last_time=self.cache_last_time[:, idx],
            cache_last_channel_len=self.cache_last_channel_len[idx],
            keep_all_outputs=True,
            previous_hypotheses=[self._hyps[slot] for slot in slots] if not first else None,
            drop_extra_pre_encoded=0 if first else g.drop_extra,
            return_transcription=True,
        )
        _, _, channel, time, channel_len, hyps = out
        self.cache_last_channel[:, idx] = channel  # scatter
        self.cache_last_time[:, idx] = time
        self.cache_last_channel_len[idx] = channel_len
        for slot, hyp in zip(slots, hyps, strict=True):
            self._hyps[slot] = hyp
