"""NeMo's blank-run end of utterance (``RNNTGreedyEndpointing``), decided for every stepped stream at once.

NeMo 3.0's ``CacheAwareRNNTPipeline.run_greedy_decoder`` keeps per stream a buffer of the labels of its last
``L = H + r`` encoder frames (``H = ceil(stop_history_eou / ms_per_frame)``, ``r = residue_tokens_at_end``; a
frame's label is the last token emitted at it, else blank; the buffer starts full of blanks and is never reset
mid-stream), shifts in each step's frames, and ends the utterance when
``detect_eou_near_pivot(buffer, pivot=L - 1)`` says so. Unrolled for that pivot:

* ``r >= 1``: its forward search stops at ``L - r = H``, before the pivot, so only the run of blanks that ends just
  before the pivot counts, and it must be longer than ``H``: the ``H + 1`` frames before the newest frame are blank.
  The buffer holds ``H + r - 1`` frames before the newest, so this can happen only when ``r >= 2``.
* ``r = 0``: the pivot must be blank too and the whole run then has at most ``L = H`` frames: never.

So after a step that leaves ``n`` frames decoded, the utterance ends iff ``r >= 2`` and no token was emitted at
frames ``n - 2 - H .. n - 2`` (frames before the stream's start count as blank). :func:`blank_run_end` decides this
on the device from the frames of each stream's last ``max_symbols + 1`` tokens (the newest frame holds at most
``max_symbols``, so the last token before it is among them); tests/test_streaming_endpointing.py checks it against
NeMo's ``detect_eou_near_pivot`` on NeMo's label buffer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from nemo_fastdecode.streaming.decoding import SlotDecoder
    from nemo_fastdecode.streaming.events import EndpointingOptions

__all__ = ["BlankRunEndpointer", "blank_run_end", "blank_run_frames"]


def blank_run_frames(milliseconds: float, ms_per_frame: float) -> int:
    """NeMo's ``millisecond_to_frames``: ``ceil(ms / ms_per_frame)`` as NeMo computes it."""
    return int((milliseconds + ms_per_frame - 1) // ms_per_frame)


def blank_run_end(
    recent: torch.Tensor, decoded: torch.Tensor, history: torch.Tensor, residue: torch.Tensor
) -> torch.Tensor:
    """``[N]`` bool: NeMo's blank-run rule ends each stream's utterance now (see the module docstring).

    Args:
        recent: ``[N, K]`` encoder frames of each stream's last ``K >= max_symbols + 1`` tokens, ``-1`` where it has
            fewer tokens.
        decoded: ``[N]`` encoder frames decoded so far (``n``).
        history: ``[N]`` ``H`` in frames (0: the rule is off for that stream).
        residue: ``[N]`` NeMo's ``residue_tokens_at_end``.
    """
    newest = decoded - 1
    before = torch.where((recent >= 0) & (recent < newest[:, None]), recent, -1).amax(dim=1)  # -1: no token before
    quiet = (before < 0) | (before < newest - 1 - history)  # frames newest - 1 - H .. newest - 1 emitted nothing
    return quiet & (history > 0) & (residue >= 2)


class BlankRunEndpointer:
    """Per-slot settings of NeMo's blank-run rule, and its decision for the streams that just stepped.

    Args:
        num_slots: ``S``.
        ms_per_frame: milliseconds per encoder frame (NeMo's ``model_stride_in_milliseconds``: window stride x
            subsampling factor x 1000).
        device: where the decoder's token storage lives.
    """

    def __init__(self, num_slots: int, ms_per_frame: float, device: torch.device):
        self.ms_per_frame = ms_per_frame
        self.device = device
        self.history = np.zeros(num_slots, dtype=np.int64)  # H per slot, 0: off
        self.residue = np.zeros(num_slots, dtype=np.int64)

    def open(self, slot: int, options: EndpointingOptions) -> None:
        """A new stream in ``slot`` with ``options``' rule (off unless ``blank_run_ms`` is set)."""
        ms = options.blank_run_ms
        self.history[slot] = 0 if ms is None else blank_run_frames(ms, self.ms_per_frame)
        self.residue[slot] = options.residue_tokens_at_end

    def decide(self, decoder: SlotDecoder, slots: np.ndarray) -> torch.Tensor:
        """``[N]`` bool on the device: the utterance of each of ``slots`` ends after the step it just made."""
        rows = torch.from_numpy(slots).to(self.device)
        settings = torch.from_numpy(np.stack([self.history[slots], self.residue[slots]])).to(self.device)
        k = decoder.max_symbols + 1
        positions = decoder.counts.index_select(0, rows)[:, None] - k + torch.arange(k, device=self.device)
        recent = decoder.timestamps[rows[:, None], positions.clamp(min=0)]  # [N, k] frames of the last k tokens
        recent = torch.where(positions >= 0, recent, -1)
        decoded = decoder.state.decoded_lengths.index_select(0, rows)
        return blank_run_end(recent, decoded, settings[0], settings[1])
