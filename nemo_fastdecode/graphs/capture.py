"""Capture a function of pre-allocated tensors as one CUDA graph (warm-up on a side stream first)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["capture_graph", "capturing", "garbage_collection_paused", "keep_if_capturing", "release_kept"]


@contextlib.contextmanager
def garbage_collection_paused() -> Iterator[None]:
    """No garbage collection until the block ends: wrap every stream capture in it.

    Decoders hold reference cycles (their loops keep bound methods of their owner), so a dropped decoder's graphs
    and memory pools are freed by the cyclic collector at an arbitrary allocation. If that happens while another
    graph is being captured, the freed pool's ``cudaFree`` is illegal during capture and the process aborts.
    Pausing the collector is enough; collecting first (as ``torch.cuda.graph`` does) walks every object of a
    process holding a NeMo model at each capture, a cost the first ``transcribe`` call paid.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# graphs (and memory pools) whose owner was collected while a stream was capturing, kept until no capture runs
_kept_during_capture: list[Any] = []


def keep_if_capturing(*graphs_and_pools: Any) -> None:
    """From an owner's finalizer: keep its graphs and pools alive if this thread is capturing now.

    The cyclic collector frees dropped decoders at any allocation, also inside a capture that is not ours and does
    not pause it (NeMo's decoders capture with ``torch.cuda.graph``, which no longer collects garbage first in recent
    PyTorch). Destroying a graph or releasing its pool there is illegal and fails that capture ("operation not
    permitted when stream is capturing"). Kept here, they are released by :func:`release_kept` outside captures.
    """
    try:
        capturing_now = torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()
    except Exception:  # a finalizer at interpreter exit, with torch half torn down: nothing captures then
        return
    if capturing_now:
        _kept_during_capture.extend(g for g in graphs_and_pools if g is not None)


def release_kept() -> None:
    """Release what :func:`keep_if_capturing` kept, unless this thread is capturing now."""
    if _kept_during_capture and not (torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()):
        _kept_during_capture.clear()


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream, pool: Any = None) -> Iterator[None]:
    """Capture the block into ``graph`` on ``stream`` (thread-local capture mode), like ``torch.cuda.graph``
    without what that does first: synchronise the device and empty PyTorch's device and pinned-host caches.

    Emptying the caches at every capture hands the memory of the caller's other work (an encoder's activations,
    pinned audio buffers) back to the driver, and the next batch allocates it again with ``cudaMalloc`` /
    ``cudaHostAlloc``; the first call of a pipeline that captures its decoder paid for that on every batch that
    followed a capture. Callers order ``stream`` after the work the capture depends on (``wait_stream``).
    """
    with torch.cuda.stream(stream):
        if pool is None:
            graph.capture_begin(capture_error_mode="thread_local")
        else:
            graph.capture_begin(pool, capture_error_mode="thread_local")
        try:
            yield
        finally:
            graph.capture_end()


def capture_graph(
    fn: Callable[[], Any], device: torch.device, *, warmup: int = 3, pool: Any = None
) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Warm ``fn`` up ``warmup`` times, then capture one call; returns ``(graph, what the captured call returned)``.

    ``fn`` must read and write only tensors that outlive the graph (update them in place) and must not
    synchronise with the host. Its return value is the graph's static output: replaying the graph
    rewrites those tensors. Graphs that never run concurrently may share a memory ``pool``
    (``torch.cuda.graph_pool_handle()``).
    """
    # capture on a side stream: the legacy default stream cannot be captured; lazily created
    # cuBLAS/cuDNN handles, workspaces and Triton compilations must exist before the capture
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with (
        garbage_collection_paused(),
        capturing(graph, stream, pool),
    ):
        output = fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    return graph, output
