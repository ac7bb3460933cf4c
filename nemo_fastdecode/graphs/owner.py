"""What every decoding computer that owns a captured loop shares: its graph mode and the loop's lifetime."""

from __future__ import annotations

from typing import Any

import torch

from nemo_fastdecode.graphs.modes import GraphMode
from nemo_fastdecode.graphs.two_level_loop import TwoLevelLoop


def grown_shape(old: CapturedBuffers | None, batch_size: int, max_time: int) -> tuple[int, int]:
    """``(batch size, frames)`` to allocate and capture for a batch that does not fit ``old``.

    Both grow geometrically (at least doubling the dimension that is too small), so that a slowly growing batch
    or length -- length-sorted batches that get larger as utterances get shorter, a stream of longer and longer
    inputs -- re-captures a logarithmic number of times, not once per batch. A graph replays over all of its
    rows; the extra rows are inactive and cost little in a loop whose steps are small kernels.
    """
    if old is None:
        return batch_size, max_time
    grown_batch = max(batch_size, 2 * old.batch_size) if batch_size > old.batch_size else old.batch_size
    grown_time = max(max_time, 2 * old.max_time) if max_time > old.max_time else old.max_time
    return grown_batch, grown_time


class CapturedBuffers:
    """Pre-allocated loop buffers that a captured graph is specialised to; larger inputs need new ones.

    Subclasses set ``batch_size``, ``max_time``, ``device``, ``float_dtype`` and ``hyps`` (with ``capacity``).
    """

    batch_size: int
    max_time: int
    device: torch.device
    float_dtype: torch.dtype
    hyps: Any

    def fits(self, batch_size: int, max_time: int, capacity: int, device: torch.device, dtype: torch.dtype) -> bool:
        """Whether a batch of this size, length, label capacity, device and dtype runs in these buffers."""
        return (
            batch_size <= self.batch_size
            and max_time <= self.max_time
            and capacity <= self.hyps.capacity
            and device == self.device
            and dtype == self.float_dtype
        )


class CapturedLoopOwner:
    """Mixin for computers that keep pre-allocated buffers and a :class:`TwoLevelLoop` between calls.

    Subclasses set ``forced_mode``, ``_buffers`` and ``_loop`` in ``__init__``; dropping the buffers drops the
    captured graphs with them (the next call re-captures).
    """

    forced_mode: GraphMode | None
    use_cuda_graphs: bool
    _buffers: Any
    _loop: TwoLevelLoop | None
    _reserved: tuple[int, int] = (0, 0)

    def reserve(self, batch_size: int, max_time: int) -> None:
        """Size the buffers (and so the captured graphs) for at least ``batch_size`` rows of ``max_time`` frames
        when they are next allocated: a caller that knows its largest batch and longest input ahead (the offline
        path's plan) gets one capture instead of one per growth step. Drops buffers that are smaller."""
        if batch_size < 0 or max_time < 0:
            raise ValueError(f"batch_size and max_time must be >= 0, got {batch_size} and {max_time}")
        self._reserved = (max(batch_size, self._reserved[0]), max(max_time, self._reserved[1]))
        if self._buffers is not None and (
            self._buffers.batch_size < self._reserved[0] or self._buffers.max_time < self._reserved[1]
        ):
            self.reset_graphs()

    def prepare_reserved(self, device: torch.device, dtype: torch.dtype) -> None:
        """Allocate the buffers and capture the graphs at the size :meth:`reserve` asked for now, rather than in the
        next decode (computers that can; a no-op for the others). ``dtype``: the encoder output's."""

    def _next_shape(self, old: CapturedBuffers | None, batch_size: int, max_time: int) -> tuple[int, int]:
        """``(batch size, frames)`` to allocate for a batch that does not fit ``old``: :func:`grown_shape`, at least
        what :meth:`reserve` asked for."""
        grown_batch, grown_time = grown_shape(old, batch_size, max_time)
        return max(grown_batch, self._reserved[0]), max(grown_time, self._reserved[1])

    def force_mode(self, mode: GraphMode | str | None) -> None:
        """Force a graph mode (``None``/"auto" to choose automatically); drops captured graphs."""
        self.forced_mode = GraphMode.parse(mode)
        self.reset_graphs()

    def reset_graphs(self) -> None:
        self._buffers, self._loop = None, None

    @property
    def graph_mode(self) -> GraphMode | None:
        """The mode of the last run (a failed WHILE capture shows here as ``NO_WHILE_GRAPH``)."""
        return None if self._loop is None else self._loop.mode


class ComputerGraphsSwitch:
    """NeMo's ``WithOptionalCudaGraphs`` hooks for a decoding module whose ``computer`` owns the graphs."""

    computer: CapturedLoopOwner

    def disable_cuda_graphs(self) -> bool:
        """NeMo calls this around training/validation; returns whether anything changed."""
        changed = self.computer.use_cuda_graphs
        self.computer.use_cuda_graphs = False
        self.computer.reset_graphs()
        return changed

    def maybe_enable_cuda_graphs(self) -> bool:
        changed = not self.computer.use_cuda_graphs
        self.computer.use_cuda_graphs = True
        return changed
