"""The engine's streams: ids and slots, and each stream's lifecycle (open, ending, ended), with clear errors.

A stream id is never reused; its slot is. A stream is *ending* once its audio is over (``finish``, or the idle
timeout) until its final event is built; then its slot is freed and its id stays ended.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from nemo_fastdecode.streaming.events import (
    CapacityError,
    EndReason,
    StreamEndedError,
    StreamOptions,
    UnknownStreamError,
)

__all__ = ["StreamTable"]


class StreamTable:
    """Stream ids <-> slots and the per-slot lifecycle state, on the host (vectorised over slots in each cycle).

    Attributes:
        stream_of: ``[S]`` int64, the stream id in each slot, -1 for a free slot.
        slot_of: stream id -> slot, for the streams that hold a slot.
        ending: ``[S]`` bool, no more audio: flush, step the rest, emit the final event.
        flushed: ``[S]`` bool, the front end gave the stream's last frames.
        last_push: ``[S]`` float64, the clock (seconds) at the stream's last push.
        options: per slot, the stream's :class:`StreamOptions` (``None``: free).
        reason: per slot, why the stream ends (``None``: it does not yet).
        stepping: inside ``poll(while_stepping=...)``: only pushes may run.
    """

    def __init__(self, num_slots: int, clock: Callable[[], float]):
        self.num_slots, self.clock = num_slots, clock
        self.stream_of = np.full(num_slots, -1, dtype=np.int64)
        self.slot_of: dict[int, int] = {}
        self.next_id = 0
        self.ending = np.zeros(num_slots, dtype=bool)
        self.flushed = np.zeros(num_slots, dtype=bool)
        self.last_push = np.zeros(num_slots, dtype=np.float64)
        self.options: list[StreamOptions | None] = [None] * num_slots
        self.reason: list[EndReason | None] = [None] * num_slots
        self.stepping = False

    @property
    def live(self) -> np.ndarray:
        """``[S]`` bool: the slots that hold a stream."""
        return self.stream_of >= 0

    @property
    def open_streams(self) -> list[int]:
        return sorted(self.slot_of)

    def free_slot(self) -> int:
        """The lowest free slot (the transcriber takes the same one).

        Raises:
            CapacityError: every slot holds a stream.
        """
        free = np.flatnonzero(self.stream_of < 0)
        if free.size == 0:
            raise CapacityError(self.num_slots)
        return int(free[0])

    def add(self, slot: int, options: StreamOptions) -> int:
        """A new stream in ``slot``; returns its id."""
        stream_id, self.next_id = self.next_id, self.next_id + 1
        self.slot_of[stream_id] = slot
        self.stream_of[slot] = stream_id
        self.ending[slot] = self.flushed[slot] = False
        self.last_push[slot] = self.clock()
        self.options[slot], self.reason[slot] = options, None
        return stream_id

    def remove(self, slot: int) -> None:
        """Free ``slot``; its stream's id stays ended."""
        del self.slot_of[int(self.stream_of[slot])]
        self.stream_of[slot] = -1
        self.options[slot] = None

    def end(self, slot: int, reason: EndReason) -> None:
        """No more audio for the stream in ``slot``: a cycle steps the rest and emits its final event."""
        self.ending[slot], self.reason[slot] = True, reason

    def end_idle(self, timeout_seconds: float) -> None:
        """End the streams without a push for longer than ``timeout_seconds``."""
        idle = self.live & ~self.ending & (self.clock() - self.last_push > timeout_seconds)
        for slot in np.flatnonzero(idle).tolist():
            self.end(slot, EndReason.IDLE_TIMEOUT)

    # ---- checks --------------------------------------------------------------------------------------------
    def refuse_while_stepping(self, action: str) -> None:
        """Only ``push`` may run inside ``poll(while_stepping=...)``: the cycle still reads the streams' state."""
        if self.stepping:
            raise RuntimeError(f"cannot {action} while a cycle steps: poll(while_stepping=...) may only push audio")

    def live_slot(self, stream_id: Any, action: str, ending_ok: bool = False) -> int:
        """The slot of an open stream; a clear error for ids never opened and streams that ended."""
        if isinstance(stream_id, bool) or not isinstance(stream_id, (int, np.integer)):
            raise UnknownStreamError(stream_id, f"stream ids are ints, got {stream_id!r} ({type(stream_id).__name__})")
        slot = self.slot_of.get(int(stream_id))
        if slot is None:
            if 0 <= stream_id < self.next_id:
                raise StreamEndedError(
                    stream_id, f"cannot {action} stream {stream_id}: it has ended (closed, finished or timed out)"
                )
            raise UnknownStreamError(
                stream_id, f"cannot {action} stream {stream_id}: no such stream; open streams: {self.listing()}"
            )
        if self.ending[slot] and not ending_ok:
            why = "timed out" if self.reason[slot] is EndReason.IDLE_TIMEOUT else "was finished"
            raise StreamEndedError(
                stream_id, f"cannot {action} stream {stream_id}: it {why}; its final event comes from poll()"
            )
        return slot

    def listing(self, limit: int = 16) -> str:
        ids = self.open_streams
        shown = ", ".join(map(str, ids[:limit])) or "none"
        return shown + (f", ... ({len(ids)} in all)" if len(ids) > limit else "")
