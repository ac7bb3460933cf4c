"""NeMo's NVRTC helper is replaced by one that leaves CPython's shared one-byte ``b" "`` alone.

NeMo's own ``run_nvrtc`` reads a successful compile's one-byte log into ``b" " * 1``, the interpreter's shared object,
and NVRTC's NUL then turns every single-space bytes object of the process into ``b"\\x00"`` (seen as broken HTTP
request lines and print separators in later tests on a GPU host).
"""

from __future__ import annotations

import pytest
import torch

import nemo_fastdecode  # noqa: F401  (installs the replacement)
from nemo_fastdecode.graphs import cuda_api
from nemo_fastdecode.nemo.nvrtc import guard_nemo_nvrtc, run_nvrtc

SPACE = 32


def space_is_intact() -> bool:
    return bytes([SPACE])[0] == SPACE and chr(SPACE).encode("latin-1")[0] == SPACE


def test_nemo_decoders_compile_with_the_replacement():
    from nemo.collections.asr.parts.submodules import ctc_greedy_decoding, tdt_malsd_batched_computer
    from nemo.collections.asr.parts.submodules.transducer_decoding import rnnt_label_looping, tdt_label_looping
    from nemo.core.utils import cuda_python_utils

    modules = (
        cuda_python_utils,
        rnnt_label_looping,
        tdt_label_looping,
        tdt_malsd_batched_computer,
        ctc_greedy_decoding,
    )
    assert all(module.run_nvrtc is run_nvrtc for module in modules)
    guard_nemo_nvrtc()  # idempotent
    assert cuda_python_utils.run_nvrtc is run_nvrtc


@pytest.mark.parametrize("size", [0, 1, 2, 7])
def test_nvrtc_output_buffers_are_never_shared(size):
    """Sizes 0 and 1 would be CPython's shared ``b""`` / ``b" "``: the buffer is a fresh object of at least 2 bytes."""
    buffer = cuda_api._output_buffer(size)
    assert len(buffer) >= max(size, 2)
    shared = (bytes([SPACE]), bytes(0))  # CPython's one-byte and empty bytes objects
    assert all(buffer is not obj for obj in shared)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
def test_nemo_conditional_kernel_compiles_without_touching_shared_bytes():
    """NeMo's TDT label-looping conditional kernel (its one-byte compile log) through the helper NeMo calls."""
    from nemo.collections.asr.parts.submodules.transducer_decoding import tdt_label_looping

    assert space_is_intact(), "setup: an earlier call already overwrote b' '"
    torch.zeros(1, device="cuda")  # the module loads into the current CUDA context
    computer = tdt_label_looping.GreedyBatchedTDTLabelLoopingComputer
    kernel = computer._create_outer_while_loop_kernel()
    assert kernel is not None
    assert space_is_intact()
    with pytest.raises(Exception, match="NVRTC failed"):
        run_nvrtc("this is not CUDA C", b"missing", b"broken.cu")
    assert space_is_intact()
