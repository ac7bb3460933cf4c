"""Triton kernels, one file each: the @triton.jit kernel, its checked launcher and a torch reference.

``tf32x3.py`` is no kernel of its own: the 3xTF32 tile products, split-K and checks that the GEMM kernels share.
``few_row_gemm.py`` is the one CUDA C kernel (compiled with NVRTC): the exact decoders' IEEE-fp32 per-step products,
where Triton's ``tl.dot`` runs at half its speed.
"""

from __future__ import annotations

import os

import torch


def triton_runs_on(device: torch.device) -> bool:
    """Triton runs kernels on CUDA, or on the CPU in its interpreter (``TRITON_INTERPRET=1``, the CI tests)."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
