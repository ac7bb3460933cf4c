"""Capture a function of pre-allocated tensors as one CUDA graph (warm-up on a side stream first)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["capture_graph"]


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
        torch.cuda.stream(stream),
        torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"),
    ):
        output = fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    return graph, output
