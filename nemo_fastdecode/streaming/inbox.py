"""Pushed audio, copied once into pinned host memory as it arrives, handed to the front end a cycle at a time.

Each push is written at once into the current *log*: one host buffer (pinned on a GPU host) in which the pushes of
all streams lie one after another, each at a 4-byte aligned offset (a batch of int16 pushes: one block), with a
record ``(slot, offset, bytes)`` per push.
:meth:`AudioInbox.take` hands the bytes of the streams a cycle feeds to the front end as :class:`StagedAudio` (records
into that log, which goes to the device in ONE copy) and switches to the other log, so that pushes arriving while
the cycle steps never write into bytes still being copied. The per-byte host work of gathering every stream's audio
into one buffer is thus done as the audio arrives (in a server, while the GPU steps), not inside the cycle.

Bytes a cycle does not take (a stream with a chunk already waiting, or more than one cycle's audio) leave the
pinned logs for the stream's *backlog*, a plain byte buffer per slot, once; a later cycle that feeds the stream writes
them back into its log ahead of the stream's newer records. A server that falls behind thus copies each byte at most
twice more, whatever its wait, instead of carrying every waiting record from log to log in every cycle. A dropped
stream's records are skipped by the log's record count at its drop, without searching the log.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from nemo_fastdecode.streaming.staging import HostStaging

__all__ = ["AudioInbox", "StagedAudio", "earlier_in_slot"]

_ALIGN = 4  # float32 payloads are viewed in place on the host (finiteness checks)


class _PinnedLog:
    """One host buffer of pushes and their records (a :class:`HostStaging`), copied to the device as a whole prefix.

    Written only while no copy out of it is in flight: the first write after :meth:`send` waits for that copy (long
    done in practice: the engine reads the cycle's results back before the log comes round again).
    """

    def __init__(self, device: torch.device):
        self._staging = HostStaging(device)
        self._refresh()
        self.cursor = 0
        # (slot, offset, bytes) of each record, flat: one list, one conversion per cycle (the cost is per element)
        self.records: list[int] = []
        self.dropped: dict[int, int] = {}  # slot: the record count when it was dropped (its records before are dead)

    def _refresh(self) -> None:
        self.host = self._staging.staging.numpy()
        self._bytes = memoryview(self.host)  # slice assignment from bytes: the cheapest copy Python has

    def reserve(self, nbytes: int) -> int:
        """Room for ``nbytes`` at the next aligned offset (the buffer grows, keeping its bytes); returns the offset."""
        start = -(-self.cursor // _ALIGN) * _ALIGN
        end = start + nbytes
        if end > self.host.size or self._staging.pending:
            self._staging.reserve(end, keep=self.cursor)
            self._refresh()
        self.cursor = end
        return start

    def write(self, slot: int, data: bytes | memoryview) -> None:
        """Copy ``data`` (bytes, or a memoryview of unsigned bytes) to the log as one record of ``slot``."""
        size = len(data)
        start = self.reserve(size)
        self._bytes[start : start + size] = data
        self.records += (slot, start, size)

    def drop(self, slot: int) -> None:
        """Forget ``slot``'s records so far (records written later are the slot's next stream's)."""
        if self.records:
            self.dropped[slot] = len(self.records) // 3

    def record_arrays(self, num_slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``[R]`` int64 slot, byte offset and bytes of each record; a dropped slot's earlier records have 0 bytes."""
        table = np.array(self.records, dtype=np.int64).reshape(-1, 3)
        slots, offsets, sizes = table[:, 0], table[:, 1], table[:, 2]
        if self.dropped:
            cut = np.zeros(num_slots, dtype=np.int64)
            cut[list(self.dropped)] = list(self.dropped.values())
            sizes = np.where(np.arange(len(slots)) < cut[slots], 0, sizes)
        return slots, offsets, sizes

    def clear(self) -> None:
        self.cursor = 0
        self.records = []
        self.dropped = {}

    def send(self, nbytes: int) -> torch.Tensor:
        """The log's first ``nbytes`` on the device: one copy (on the CPU, the host buffer itself)."""
        return self._staging.send(nbytes)


@dataclass
class StagedAudio:
    """One cycle's audio in a host log: ``[R]`` records of whole samples, in push order within each slot.

    Attributes:
        slots: ``[R]`` int64 slot of each record (a slot may have several).
        offsets: ``[R]`` int64 byte offset of each record in the log (a multiple of 4).
        sizes: ``[R]`` int64 bytes of each record.
        unique_slots: no slot has two records (the usual cycle: one push per stream).
    """

    slots: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    _log: _PinnedLog
    unique_slots: bool

    def payload(self, record: int) -> np.ndarray:
        """``[sizes[record]]`` uint8 host view of one record's bytes."""
        start = int(self.offsets[record])
        return self._log.host[start : start + int(self.sizes[record])]

    def upload(
        self, rows: np.ndarray, table: np.ndarray | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Append the int32 ``rows`` (and an int64 ``table``, 8-byte aligned) after the log's payloads and copy all of
        it to the device at once.

        Returns ``(bytes, rows, table)``: the log's bytes on the device and the rows' and the table's device views
        (``None`` without a table; valid until the log's next use: read them in the kernels queued before the next
        :meth:`AudioInbox.take`).
        """
        start = self._log.reserve(rows.nbytes)
        self._log.host[start : start + rows.nbytes] = rows.view(np.uint8).reshape(-1)
        end = start + rows.nbytes
        if table is not None:
            table = np.ascontiguousarray(table, dtype=np.int64)
            at = self._log.reserve(table.nbytes + 12)  # 4-byte aligned: 16 with the slack (one kernel variant)
            at += -at % 16
            self._log.host[at : at + table.nbytes] = table.view(np.uint8).reshape(-1)
            end = at + table.nbytes
        received = self._log.send(end)
        device_rows = received[start : start + rows.nbytes].view(torch.int32).reshape(rows.shape)
        device_table = None if table is None else received[at:end].view(torch.int64).reshape(table.shape)
        return received, device_rows, device_table


class AudioInbox:
    """Every stream's pushed bytes, waiting in pinned host memory for the cycle that feeds them.

    Args:
        num_slots: the slots of the engine (``0 .. num_slots - 1``).
        device: where the staged audio goes (pinned host logs on a CUDA device).
    """

    def __init__(self, num_slots: int, device: torch.device):
        self._logs = (_PinnedLog(device), _PinnedLog(device))
        self._log = self._logs[0]
        self.pending_bytes = np.zeros(num_slots, dtype=np.int64)
        """``[S]`` bytes waiting per slot (read by the engine's feed policy; changed only here)."""
        self._backlog = [bytearray() for _ in range(num_slots)]  # bytes older than any of the slot's records
        self._backlog_bytes = np.zeros(num_slots, dtype=np.int64)

    def write(self, slot: int, data: bytes | memoryview) -> None:
        """Copy one push of whole samples into the current log."""
        if len(data):
            self._log.write(slot, data)
            self.pending_bytes[slot] += len(data)

    def write_many(self, slots: np.ndarray, data: bytes | memoryview, starts: np.ndarray, stops: np.ndarray) -> None:
        """Copy ``data[starts[i]:stops[i]]`` as a push of ``slots[i]`` for every ``i``, in order (int16 audio: the
        records may sit at any even offset). Adjacent pieces are copied in one piece."""
        view = memoryview(data).cast("B")  # slices of it are not copies
        if len(slots) == 0 or not (starts[1:] == stops[:-1]).all():  # apart: one push at a time
            for slot, start, stop in zip(slots.tolist(), starts.tolist(), stops.tolist(), strict=True):
                self.write(slot, view[start:stop])
            return
        log, sizes, first, last = self._log, stops - starts, int(starts[0]), int(stops[-1])
        base = log.reserve(last - first)  # one block (a network batch): one copy
        log._bytes[base : base + last - first] = view[first:last]
        kept = sizes > 0
        log.records += np.stack([slots[kept], starts[kept] - first + base, sizes[kept]], axis=1).ravel().tolist()
        np.add.at(self.pending_bytes, slots, sizes)

    def drop(self, slot: int) -> None:
        """Forget every byte waiting for ``slot`` (a stream closed or a slot reopened)."""
        self.pending_bytes[slot] = 0
        self._log.drop(slot)
        self._backlog[slot] = bytearray()
        self._backlog_bytes[slot] = 0

    def take(self, slots: np.ndarray, limits: np.ndarray) -> StagedAudio | None:
        """The waiting bytes of ``slots``: at most ``limits[i]`` bytes of ``slots[i]`` (whole samples, in push order).

        Returns ``None`` when nothing is taken; else the staged records, after which new pushes go to the other log;
        the bytes left behind wait in their streams' backlogs.
        """
        log = self._log
        limit = np.zeros_like(self.pending_bytes)
        limit[slots] = limits
        owed = slots[(self._backlog_bytes[slots] > 0) & (limits > 0)]
        if not log.records and owed.size == 0:
            return None
        # 1. each fed stream's backlog first: its oldest bytes, written into the log as one record
        early = np.zeros((3, owed.size), dtype=np.int64)  # slot, offset, bytes
        for i, slot in enumerate(owed.tolist()):
            backlog = self._backlog[slot]
            size = min(int(limit[slot]), len(backlog))
            start = log.reserve(size)
            with memoryview(backlog) as view:  # released before the bytearray shrinks
                log._bytes[start : start + size] = view[:size]
            del backlog[:size]  # from the front of a bytearray: no move of the rest
            early[:, i] = slot, start, size
        limit[owed] -= early[2]
        self._backlog_bytes[owed] -= early[2]
        self.pending_bytes[owed] -= early[2]
        # 2. the log's records, each slot's in push order, behind its backlog (a backlog left has used up the limit)
        record_slot, offsets, sizes = log.record_arrays(len(limit))
        count = len(record_slot)
        # the usual cycle: one push per stream since the last one
        unique = owed.size == 0 and count <= len(limit) and (count == 0 or np.bincount(record_slot).max() == 1)
        before = 0 if unique else earlier_in_slot(record_slot, sizes)
        taken = np.clip(limit[record_slot] - before, 0, sizes)  # each slot's first bytes, in push order
        keep = taken > 0
        if unique:
            self.pending_bytes[record_slot[keep]] -= taken[keep]
        else:
            np.subtract.at(self.pending_bytes, record_slot[keep], taken[keep])
        # 3. the rest of the log's records join their streams' backlogs, in push order
        for i in np.flatnonzero(sizes > taken).tolist():
            slot, start = int(record_slot[i]), int(offsets[i] + taken[i])
            self._backlog[slot] += log._bytes[start : int(offsets[i] + sizes[i])]
            self._backlog_bytes[slot] += sizes[i] - taken[i]
        self._log = self._logs[1] if log is self._logs[0] else self._logs[0]
        self._log.clear()
        if early.shape[1] == 0 and not keep.any():
            return None
        return StagedAudio(
            np.concatenate([early[0], record_slot[keep]]),
            np.concatenate([early[1], offsets[keep]]),
            np.concatenate([early[2], taken[keep]]),
            log,
            unique,
        )


def earlier_in_slot(slots: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``[R]``: for each record, the sum of ``sizes`` over the records of its slot that come before it."""
    order = np.argsort(slots, kind="stable")
    ordered, ordered_sizes = slots[order], sizes[order]
    before = np.cumsum(ordered_sizes) - ordered_sizes  # over all earlier records, then less the other slots' ones
    starts = np.r_[True, ordered[1:] != ordered[:-1]]
    before -= before[np.maximum.accumulate(np.where(starts, np.arange(len(ordered)), 0))]
    out = np.empty_like(sizes)
    out[order] = before
    return out
