"""Conditional WHILE nodes inside a PyTorch CUDA graph capture.

Usage, inside a capture (``with capturing(g, s):`` of :mod:`nemo_fastdecode.graphs.capture`, or ``torch.cuda.graph``)::

    with captured_while_loop(flag):   # flag: 0-d bool CUDA tensor
        body()                         # must update ``flag`` in place

The loop condition never leaves the GPU: a one-thread kernel copies ``flag`` into the node's
condition handle once before the node (enter or skip) and once at the end of every iteration.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from nemo_fastdecode.graphs.cuda_api import CUDA_BINDINGS_13, check, cuda_driver, cudart, set_condition_kernel


def _launch_set_condition(kernel, stream: torch.cuda.Stream, kernel_params: np.ndarray) -> None:
    # grid (1,1,1), block (1,1,1), no shared memory; kernel_params holds the addresses of both arguments
    check(cuda_driver.cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, stream.cuda_stream, kernel_params.ctypes.data, 0))


@contextlib.contextmanager
def captured_while_loop(flag: torch.Tensor) -> Iterator[None]:
    """Capture the body of the ``with`` block as a WHILE node that repeats while ``flag`` is true.

    Args:
        flag: 0-d ``torch.bool`` tensor on the capturing device; the body updates it in place.
    """
    if flag.dim() != 0 or flag.dtype != torch.bool or flag.device.type != "cuda":
        raise ValueError(
            f"flag must be a 0-d bool CUDA tensor, got shape {tuple(flag.shape)} {flag.dtype} {flag.device}"
        )
    device = flag.device
    outer_stream = torch.cuda.current_stream(device)
    kernel = set_condition_kernel(device.index)

    status, _capture_id, graph, *_ = check(cudart.cudaStreamGetCaptureInfo(outer_stream.cuda_stream))
    if status != cudart.cudaStreamCaptureStatus.cudaStreamCaptureStatusActive:
        raise RuntimeError("captured_while_loop must be used inside an active CUDA graph capture")
    (handle,) = check(cudart.cudaGraphConditionalHandleCreate(graph, 0, 0))
    # kernel arguments: (handle, flag pointer); cuLaunchKernel wants the address of each argument
    flag_pointer = np.array([flag.data_ptr()], dtype=np.uint64)
    kernel_params = np.array([handle.getPtr(), flag_pointer.ctypes.data], dtype=np.uint64)

    _launch_set_condition(kernel, outer_stream, kernel_params)  # decides whether to enter the loop at all

    status, _capture_id, graph, dependencies, *_ = check(cudart.cudaStreamGetCaptureInfo(outer_stream.cuda_stream))
    node_params = cuda_driver.CUgraphNodeParams()
    node_params.type = cuda_driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    node_params.conditional.handle = handle
    node_params.conditional.type = cuda_driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE
    node_params.conditional.size = 1
    (node_params.conditional.ctx,) = check(cuda_driver.cuCtxGetCurrent())
    if CUDA_BINDINGS_13:  # 13.x added per-edge data arguments
        (node,) = check(cuda_driver.cuGraphAddNode(graph, dependencies, None, len(dependencies), node_params))
        check(
            cudart.cudaStreamUpdateCaptureDependencies(
                outer_stream.cuda_stream,
                [node],
                None,
                1,
                cudart.cudaStreamUpdateCaptureDependenciesFlags.cudaStreamSetCaptureDependencies,
            )
        )
    else:
        (node,) = check(cuda_driver.cuGraphAddNode(graph, dependencies, len(dependencies), node_params))
        check(
            cudart.cudaStreamUpdateCaptureDependencies(
                outer_stream.cuda_stream,
                [node],
                1,
                cudart.cudaStreamUpdateCaptureDependenciesFlags.cudaStreamSetCaptureDependencies,
            )
        )
    body_graph = node_params.conditional.phGraph_out[0]

    # the body is captured on its own stream straight into the node's body graph
    body_stream = torch.cuda.Stream(device)
    check(
        cudart.cudaStreamBeginCaptureToGraph(
            body_stream.cuda_stream,
            body_graph,
            None,
            None,
            0,
            cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal,
        )
    )
    torch.cuda.set_stream(body_stream)
    try:
        yield
        _launch_set_condition(kernel, body_stream, kernel_params)  # decides whether to run another iteration
    finally:
        check(cudart.cudaStreamEndCapture(body_stream.cuda_stream))
        torch.cuda.set_stream(outer_stream)
