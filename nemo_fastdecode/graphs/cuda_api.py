"""cuda-python access in one place: imports for both cuda-bindings layouts, error checks, NVRTC.

cuda-bindings 12.x (>= 12.3) and 13.x expose the same modules under ``cuda.bindings``; older 12.x
releases only have ``from cuda import cuda, cudart, nvrtc``. A few graph calls gained an
``edgeData`` argument in 13.x; :data:`CUDA_BINDINGS_13` lets callers pick the right signature.
Nothing here is imported eagerly by the package: a machine without cuda-python (or without a
driver) must still be able to decode eagerly.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

import torch

try:  # modern layout (cuda-bindings >= 12.6 and 13.x)
    from cuda.bindings import driver as cuda_driver
    from cuda.bindings import nvrtc
    from cuda.bindings import runtime as cudart

    try:
        from cuda.bindings import __version__ as _bindings_version
    except ImportError:  # pragma: no cover - very old 12.x
        _bindings_version = "12.0.0"
except ImportError:  # pragma: no cover - legacy layout (cuda-python < 12.6) or not installed
    try:
        from cuda import cuda as cuda_driver  # type: ignore[no-redef]
        from cuda import cudart, nvrtc  # type: ignore[no-redef]

        _bindings_version = "12.0.0"
    except ImportError:
        cuda_driver = cudart = nvrtc = None  # type: ignore[assignment]
        _bindings_version = None

CUDA_PYTHON_VERSION: tuple[int, ...] | None = (
    tuple(int(p) for p in _bindings_version.split(".")[:2] if p.isdigit()) if _bindings_version else None
)
CUDA_BINDINGS_13 = CUDA_PYTHON_VERSION is not None and CUDA_PYTHON_VERSION >= (13, 0)
# Conditional WHILE nodes need CUDA 12.3 (runtime API) and a driver that supports them; bodies that hold
# cuDNN's persistent LSTM kernels need 12.6 (see DESIGN.md), so 12.6 is the floor we ask for.
MIN_DRIVER_FOR_WHILE_NODES = (12, 6)


class CudaPythonError(RuntimeError):
    """A cuda-python call returned an error code."""


def check(result: Any) -> tuple:
    """Unpack a cuda-python ``(status, *values)`` tuple, raising :class:`CudaPythonError` on failure."""
    status, *values = result if isinstance(result, tuple) else (result,)
    ok = (
        (cudart is not None and status == cudart.cudaError_t.cudaSuccess)
        or (cuda_driver is not None and status == cuda_driver.CUresult.CUDA_SUCCESS)
        or (nvrtc is not None and status == nvrtc.nvrtcResult.NVRTC_SUCCESS)
    )
    if not ok:
        raise CudaPythonError(f"cuda-python call failed with {status!r}")
    return tuple(values)


def while_nodes_unavailable_reason(device: torch.device) -> str | None:
    """Why conditional WHILE nodes cannot be used on ``device``; ``None`` when they can."""
    if device.type != "cuda":
        return f"device is {device.type}, not cuda"
    if not torch.cuda.is_available():
        return "torch.cuda is not available"
    if getattr(torch.version, "hip", None):
        return "ROCm/HIP has no CUDA graph conditional nodes"
    if cudart is None:
        return "cuda-python (cuda-bindings) is not installed"
    try:
        (driver_version,) = check(cuda_driver.cuDriverGetVersion())
    except Exception as error:  # libcuda missing or unusable: fall back, never crash
        return f"cannot query the CUDA driver ({error})"
    major, minor = driver_version // 1000, (driver_version % 1000) // 10
    if (major, minor) < MIN_DRIVER_FOR_WHILE_NODES:
        want = ".".join(map(str, MIN_DRIVER_FOR_WHILE_NODES))
        return f"driver supports CUDA {major}.{minor}, conditional nodes need >= {want}"
    return None


_SET_CONDITION_SOURCE = r"""
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle,
                                                                      unsigned int value);
// Copies a boolean flag computed on the GPU into a conditional node's handle.
extern "C" __global__ void set_condition_from_flag(cudaGraphConditionalHandle handle, const bool *flag) {
    cudaGraphSetConditional(handle, *flag);
}
"""


def _output_buffer(size: int) -> bytes:
    """A fresh ``size``-byte buffer for NVRTC to write into. Never ``b" " * size`` alone: CPython returns its shared
    one-byte ``b" "`` (and empty ``b""``) objects for sizes 1 and 0, and NVRTC's terminating NUL would then overwrite
    ``b" "`` for the whole process (every later single-space bytes object reads as NUL)."""
    return b" " * max(size, 2)


def compile_kernel(source: bytes, kernel_name: bytes, program_name: bytes, options: list[bytes]) -> Any:
    """Compile CUDA C ``source`` with NVRTC and load ``kernel_name`` from it: a ``CUfunction``. A failed compile
    raises :class:`CudaPythonError` with NVRTC's log."""
    return compile_kernels(source, [kernel_name], program_name, options)[0]


def compile_kernels(source: bytes, kernel_names: list[bytes], program_name: bytes, options: list[bytes]) -> list[Any]:
    """Compile CUDA C ``source`` once with NVRTC and load each of ``kernel_names`` (``extern "C"``): ``CUfunction``
    handles in that order. A failed compile raises :class:`CudaPythonError` with NVRTC's log."""
    (program,) = check(nvrtc.nvrtcCreateProgram(source, program_name, 0, [], []))
    try:
        check(nvrtc.nvrtcCompileProgram(program, len(options), options))
    except CudaPythonError as error:
        (log_size,) = check(nvrtc.nvrtcGetProgramLogSize(program))
        log = _output_buffer(log_size)
        check(nvrtc.nvrtcGetProgramLog(program, log))
        raise CudaPythonError(f"NVRTC failed: {log[: max(log_size - 1, 0)].decode(errors='replace')}") from error
    (ptx_size,) = check(nvrtc.nvrtcGetPTXSize(program))
    ptx = _output_buffer(ptx_size)
    check(nvrtc.nvrtcGetPTX(program, ptx))
    ptx_buffer = ctypes.create_string_buffer(ptx)
    (module,) = check(cuda_driver.cuModuleLoadData(ctypes.addressof(ptx_buffer)))
    return [check(cuda_driver.cuModuleGetFunction(module, name))[0] for name in kernel_names]


@cache
def set_condition_kernel(device_index: int) -> Any:
    """The compiled ``set_condition_from_flag`` kernel (CUfunction), built once per device with NVRTC.

    Call it before a graph capture starts: loading a module inside a capture invalidates the capture.
    """
    with torch.cuda.device(device_index):
        major, minor = torch.cuda.get_device_capability(device_index)
        options = [f"--gpu-architecture=compute_{major}{minor}".encode()]
        return compile_kernel(_SET_CONDITION_SOURCE.encode(), b"set_condition_from_flag", b"set_condition.cu", options)
