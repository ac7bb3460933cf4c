"""NeMo's chunk schedule, incrementally: the feature frames waiting per stream and which chunk each steps next.

:func:`~nemo_fastdecode.streaming.geometry.split_features` cuts a whole stream the way NeMo's
``CacheAwareStreamingAudioBuffer`` does: ``first_chunk`` frames, then ``chunk`` frames at a time, and at the end
the rest, unless it is a later chunk shorter than ``min_last_chunk`` (NeMo drops it). A live stream's frames arrive
a few at a time, so :class:`ChunkSchedule` makes the same cuts as they become possible: a stream steps when it has
a whole chunk waiting, or, once its last frame is known, its remainder. :class:`FeatureQueue` keeps the waiting
frames of every slot on the device, written and read for all streams at once. Both are vectorised over the slots:
a cycle's host work does not loop over frames.
"""

from __future__ import annotations

import numpy as np
import torch

from nemo_fastdecode.streaming.geometry import StreamingGeometry
from nemo_fastdecode.streaming.staging import HostStaging

__all__ = ["ChunkSchedule", "FeatureQueue"]


class ChunkSchedule:
    """Per slot: feature frames received, frames stepped, and (once the stream ended) its frame count.

    Args:
        geometry: the encoder's chunk sizes.
        num_slots: ``S``.
    """

    def __init__(self, geometry: StreamingGeometry, num_slots: int):
        self.geometry = geometry
        self.received = np.zeros(num_slots, dtype=np.int64)  # frames written to the queue so far
        self.stepped = np.zeros(num_slots, dtype=np.int64)  # frames consumed by steps (or dropped at the end)
        self.ended = np.zeros(num_slots, dtype=bool)  # every frame of the stream has been received

    def reset(self, slot: int) -> None:
        """A new stream in ``slot``."""
        self.received[slot] = self.stepped[slot] = 0
        self.ended[slot] = False

    @property
    def backlog(self) -> np.ndarray:
        """``[S]`` frames received and not yet stepped."""
        return self.received - self.stepped

    def add(self, slots: np.ndarray, counts: np.ndarray) -> None:
        """``counts[i]`` new frames of each (distinct) ``slots[i]``."""
        self.received[slots] += counts

    def end(self, slots: np.ndarray) -> None:
        """These streams received their last frame."""
        self.ended[slots] = True

    def next_chunks(self, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Among ``candidates`` (slots), those that step now and their chunk lengths (``[N]`` each).

        A stream steps with ``first_chunk`` (first step) or ``chunk`` frames when that many wait; once ended, with
        what is left: its first chunk whatever its length, a later one if at least ``min_last_chunk`` frames.
        """
        g = self.geometry
        first = self.stepped[candidates] == 0
        need = np.where(first, g.first_chunk, g.chunk)
        backlog = self.backlog[candidates]
        full = backlog >= need
        rest = self.ended[candidates] & (backlog > 0) & (first | (backlog >= g.min_last_chunk))
        steps = full | rest
        return candidates[steps], np.minimum(backlog, need)[steps]

    def advance(self, slots: np.ndarray, lengths: np.ndarray) -> None:
        """``slots`` stepped chunks of ``lengths`` frames."""
        self.stepped[slots] += lengths

    def done(self, candidates: np.ndarray) -> np.ndarray:
        """``[N]`` bool: ended streams with nothing left to step (a remainder NeMo drops counts as nothing)."""
        backlog = self.backlog[candidates]
        started = self.stepped[candidates] > 0
        return self.ended[candidates] & ((backlog == 0) | (started & (backlog < self.geometry.min_last_chunk)))


class FeatureQueue:
    """Each slot's waiting feature frames in a device ring ``[S, capacity, F]`` (time-major: one frame is a row).

    Args:
        num_slots: ``S``.
        features: ``F`` mel features per frame.
        capacity: most frames a slot holds at once (the engine bounds each stream's backlog below it).
        device: where the frames live (the front end's and the encoder's device).
    """

    def __init__(self, num_slots: int, features: int, capacity: int, device: torch.device):
        self.capacity = capacity
        self.device = device
        self.frames = torch.zeros(num_slots, capacity, features, dtype=torch.float32, device=device)
        # the frame indices go up through pinned buffers: the host queues the scatter and gather without waiting
        self._write_index = HostStaging(device)
        self._read_index = HostStaging(device)

    def write(self, slots: np.ndarray, starts: np.ndarray, counts: np.ndarray, packed: torch.Tensor) -> None:
        """Store ``counts[i]`` frames of ``slots[i]`` as its frames ``starts[i] ...`` (absolute frame indices).

        Args:
            slots, starts, counts: ``[B]`` int64 each (slots distinct).
            packed: ``[F, sum(counts)]`` the frames, stream after stream (the front end's output layout).
        """
        total = int(counts.sum())
        if total == 0:
            return
        offsets = np.cumsum(counts) - counts
        rows = np.repeat(slots, counts)
        positions = (np.repeat(starts - offsets, counts) + np.arange(total)) % self.capacity
        index = self._write_index.upload(np.stack([rows, positions]).astype(np.int64, copy=False))
        self.frames[index[0], index[1]] = packed.T  # one scatter: frames[slot, position] = one [F] column

    def read(self, slots: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> torch.Tensor:
        """``[N, F, max(lengths)]`` the frames ``starts[i] ... starts[i] + lengths[i] - 1`` of each ``slots[i]``,
        left-aligned (what follows a row's length is stale and must be ignored, as the transcriber does)."""
        width = int(lengths.max())
        positions = (starts[:, None] + np.arange(width)[None, :]) % self.capacity  # [N, width]
        rows = np.broadcast_to(slots[:, None], positions.shape)
        index = self._read_index.upload(np.stack([rows, positions]).astype(np.int64, copy=False))
        return self.frames[index[0], index[1]].transpose(1, 2)  # one gather: [N, width, F] -> [N, F, width]
