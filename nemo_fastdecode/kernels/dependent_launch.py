"""Programmatic dependent launch (PDL) for the decoders' chains of small kernels (Hopper and newer).

EXPERIMENT (eighth session), reverted in the next commit: no measurable gain in the decoders (see
benchmarks/results/README.md, "Eighth session").

Launched with PDL (``launch_pdl=True``), a kernel's programs start while the kernel before it still runs and
wait at ``griddepcontrol.wait`` until it has finished and its writes are visible. ``NEMO_FASTDECODE_PDL=0``
turns it off (for A/B timing).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


@triton.jit
def wait_for_inputs(USE_PDL: tl.constexpr):
    """Under PDL: wait until the kernels this one depends on have finished (their writes visible)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


def pdl_enabled(device: torch.device) -> bool:
    """CUDA compute capability 9.0 or newer, compiled (not the interpreter), not ``NEMO_FASTDECODE_PDL=0``."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if os.environ.get("NEMO_FASTDECODE_PDL", "1") == "0":
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _capable(device_index: int) -> bool:
    has_gdc = hasattr(tl.extra.cuda, "gdc_wait") and hasattr(tl.extra.cuda, "gdc_launch_dependents")
    return has_gdc and torch.cuda.get_device_capability(device_index)[0] >= 9 and triton is not None


def launch_options(device: torch.device) -> dict:
    """The keyword arguments a kernel launch on ``device`` adds: its ``USE_PDL`` constexpr and ``launch_pdl``."""
    use_pdl = pdl_enabled(device)
    return {"USE_PDL": use_pdl, "launch_pdl": use_pdl}
