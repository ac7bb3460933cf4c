"""NeMo's NVRTC helper without its write into CPython's shared one-byte ``b" "``.

NeMo 3.0's ``nemo.core.utils.cuda_python_utils.run_nvrtc`` (which compiles the conditional kernels of its CUDA-graph
decoders: greedy label looping, ``malsd_batch``, CTC) reads the compile log into ``b" " * size``. A successful
compile has a one-byte log (its terminating NUL), and for size 1 CPython returns its shared ``b" "`` object, so NVRTC
overwrites it: from then on every single-space bytes object in the process reads as NUL (``print`` separators, HTTP
request lines, anything encoding ``" "``). Importing ``nemo_fastdecode`` replaces that helper, in NeMo's module and
wherever NeMo's decoders imported it, with one that compiles the same source the same way (no options, as NeMo) into
buffers of their own (:func:`~nemo_fastdecode.graphs.cuda_api.compile_kernel`).

Patch :func:`guard_nemo_nvrtc`; idempotent (NeMo's module already holds :func:`run_nvrtc`, which is marked).
Assigning NeMo's function (``run_nvrtc.__wrapped__`` once installed) back to those modules undoes it.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["guard_nemo_nvrtc", "nvrtc_targets", "run_nvrtc"]


def run_nvrtc(kernel_string: str, kernel_name: bytes, program_name: bytes) -> Any:
    """NeMo's ``run_nvrtc``: the ``CUfunction`` ``kernel_name`` of CUDA C ``kernel_string``; failures raise NeMo's
    ``NeMoCUDAPythonException`` (NeMo's decoders fall back to other graph modes on it)."""
    from nemo.core.utils.cuda_python_utils import NeMoCUDAPythonException

    from nemo_fastdecode.graphs.cuda_api import CudaPythonError, compile_kernel, nvrtc

    if nvrtc is None:
        raise NeMoCUDAPythonException("run_nvrtc needs cuda-python (cuda-bindings), which is not installed")
    try:
        return compile_kernel(kernel_string.encode(), kernel_name, program_name, [])
    except CudaPythonError as error:
        raise NeMoCUDAPythonException(str(error)) from error


def guard_nemo_nvrtc() -> None:
    """Install :func:`run_nvrtc` in place of NeMo's (idempotent): in ``cuda_python_utils`` for modules imported later,
    and in every loaded NeMo module that imported NeMo's."""
    from nemo.core.utils import cuda_python_utils

    original = cuda_python_utils.run_nvrtc
    if original is run_nvrtc:
        return
    run_nvrtc.__wrapped__ = original
    cuda_python_utils.run_nvrtc = run_nvrtc
    for name, module in list(sys.modules.items()):
        if name.startswith("nemo.") and getattr(module, "run_nvrtc", None) is original:
            module.run_nvrtc = run_nvrtc


run_nvrtc._nemo_fastdecode = True  # installed by one of our patches (nemo_fastdecode.nemo.patches.MARK)


def nvrtc_targets() -> dict[str, object]:
    """``run_nvrtc`` as NeMo's helper module and each NeMo module that imported it see it."""
    return {
        f"{name}.run_nvrtc": module.run_nvrtc
        for name, module in list(sys.modules.items())
        if (name == "nemo" or name.startswith("nemo.")) and module is not None and hasattr(module, "run_nvrtc")
    }
