"""Batch-size buckets for the streaming step: static inputs per bucket, one CUDA graph replay per step.

The number of streams with audio changes every step. A CUDA graph is specialised to its shapes, so a
step of ``N`` streams runs in the smallest bucket ``B >= N`` (powers of two up to the slot count, and
the slot count itself), its rows ``N..B`` padded with the dummy slot and zero-length chunks. Each
bucket's graph is captured the first time it is needed and replayed afterwards: no re-capture for a
new ``N``, and at most ``log2(S) + 2`` graphs, sharing one memory pool. On the CPU (or with graphs off)
the same static inputs feed the step eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from nemo_fastdecode.graphs.capture import capture_graph

logger = logging.getLogger("nemo_fastdecode")

__all__ = ["BucketedStep", "bucket_sizes"]

StepFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def bucket_sizes(num_slots: int) -> list[int]:
    """Powers of two below ``num_slots``, then ``num_slots``: e.g. 1, 2, 4, 8, 10 for 10 slots."""
    sizes, size = [], 1
    while size < num_slots:
        sizes.append(size)
        size *= 2
    return [*sizes, num_slots]


class _Bucket:
    """Static inputs (and, once captured, the graph and its outputs) of one batch size."""

    def __init__(self, size: int, dummy_slot: int, feat_in: int, frames: int, device: torch.device):
        self.size = size
        self.slot_ids = torch.full([size], dummy_slot, dtype=torch.long, device=device)
        self.features = torch.zeros([size, feat_in, frames], device=device)
        self.lengths = torch.zeros([size], dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: tuple[torch.Tensor, torch.Tensor] | None = None


class BucketedStep:
    """Runs ``step(slot_ids, features, lengths)`` for any ``N`` streams in a bucket of static inputs.

    Args:
        step: the encoder step; it must only read its inputs and update state in place.
        num_slots: ``S``; buckets are :func:`bucket_sizes` of it.
        dummy_slot: the slot id of padding rows.
        feat_in, frames: feature size and the most feature frames of a chunk.
        device: where the inputs live.
        use_cuda_graphs: capture and replay per bucket on CUDA (ignored on the CPU).
        pad_to_bucket: run eager steps padded to their bucket too (tests of the padding rows); by
            default eager steps run at their exact size.
    """

    def __init__(
        self,
        step: StepFn,
        num_slots: int,
        dummy_slot: int,
        feat_in: int,
        frames: int,
        device: torch.device,
        use_cuda_graphs: bool = True,
        pad_to_bucket: bool = False,
    ):
        self.step, self.device, self.dummy_slot = step, device, dummy_slot
        self.use_graphs = use_cuda_graphs and device.type == "cuda"
        self.pad_to_bucket = pad_to_bucket or self.use_graphs
        self.sizes = bucket_sizes(num_slots)
        self._make = lambda size: _Bucket(size, dummy_slot, feat_in, frames, device)
        self._buckets: dict[int, _Bucket] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        logger.info(
            "nemo_fastdecode: streaming encoder step %s (buckets %s)",
            "as one CUDA graph per batch-size bucket" if self.use_graphs else f"eager ({device.type})",
            self.sizes,
        )

    def bucket(self, n: int) -> int:
        """The batch size a step of ``n`` streams runs at."""
        for size in self.sizes:
            if size >= n:
                return size
        raise ValueError(f"{n} streams in one step, but there are only {self.sizes[-1]} slots")

    @property
    def captured(self) -> list[int]:
        """Bucket sizes whose graph has been captured."""
        return sorted(size for size, b in self._buckets.items() if b.graph is not None)

    def __call__(
        self, slot_ids: torch.Tensor, features: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the step for ``N`` streams.

        Args:
            slot_ids: ``[N]`` int64 slots (any device).
            features: ``[N, F, G]`` chunks, left-aligned, ``G`` at most the bucket's frame count.
            lengths: ``[N]`` valid frames per chunk.

        Returns:
            The step's outputs for the ``N`` streams (views of the bucket's static outputs on CUDA: valid
            until the next step).
        """
        n = slot_ids.shape[0]
        _, encoded, encoded_lengths = self.run_padded(slot_ids, features, lengths)
        return encoded[:n], encoded_lengths[:n]

    def run_padded(
        self, slot_ids: torch.Tensor, features: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As :meth:`__call__`, but the whole bucket of ``B >= N`` rows: ``(slot_ids [B], outputs...)``.

        Rows past ``N`` are padding: the dummy slot, zero-length. Without padding (eager, exact size) ``B = N``.
        """
        n = slot_ids.shape[0]
        if not self.pad_to_bucket:
            slot_ids, features, lengths = (t.to(self.device, non_blocking=True) for t in (slot_ids, features, lengths))
            return (slot_ids, *self.step(slot_ids, features, lengths))
        b = self.prepare(self.bucket(n))
        # rows past N: the dummy slot and zero lengths (stale features there are never read)
        b.slot_ids[:n].copy_(slot_ids, non_blocking=True)
        b.slot_ids[n:].fill_(self.dummy_slot)
        b.features[:n, :, : features.shape[2]].copy_(features, non_blocking=True)
        b.features[:n, :, features.shape[2] :].zero_()
        b.lengths[:n].copy_(lengths, non_blocking=True)
        b.lengths[n:].zero_()
        return (b.slot_ids, *self._run(b))

    def _run(self, b: _Bucket) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.use_graphs:
            return self.step(b.slot_ids, b.features, b.lengths)
        b.graph.replay()
        return b.outputs

    def warm_up(self) -> None:
        """Allocate every bucket (capturing its graph) and run it once, on padding rows only."""
        for size in self.sizes:
            b = self.prepare(size)
            b.slot_ids.fill_(self.dummy_slot)
            b.lengths.zero_()
            self._run(b)

    def prepare(self, size: int) -> _Bucket:
        """The bucket of ``size`` rows, allocated (and its graph captured) on first use."""
        b = self._buckets.get(size)
        if b is None:
            b = self._buckets[size] = self._make(size)
            if self.use_graphs:
                # warm-up and capture see only padding rows (dummy slot, no frames): no open stream is touched
                b.graph, b.outputs = capture_graph(
                    lambda: self.step(b.slot_ids, b.features, b.lengths), self.device, pool=self._pool
                )
        return b
