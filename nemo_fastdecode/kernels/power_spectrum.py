"""The power spectrum of many FFT frames, in the frequency-major layout NeMo's mel product reads, in one pass.

NeMo's ``FilterbankFeatures`` turns the STFT ``[B, n_freq, T]`` (complex) into ``sqrt(re**2 + im**2) ** 2``
through ``view_as_real``, ``pow(2)``, ``sum(-1)``, ``sqrt`` and ``pow(2)``: five passes over the spectrum, the sum a
reduction kernel of its own. :func:`power_spectrum` reads the ``[R, n_freq]`` one-sided FFT of ``R`` frames once and
writes ``[n_freq, R]`` (contiguous, the layout of NeMo's ``x`` before ``fb @ x``). Each step is rounded as IEEE
fp32 rounds it: two products, their sum, a correctly rounded square root, its square (compiled without fused
multiply-adds). On a GPU, torch's operations round the same way, so the result equals them bit for bit (tested on an
H100). PyTorch's CPU square root is not always correctly rounded (about 0.6% of values one ulp off with torch 2.13's
AVX-512 path), so on the CPU NeMo's features come from :func:`power_spectrum_reference`, those torch operations.
"""

from __future__ import annotations

import contextlib

import torch

try:  # Triton is optional: without it only the torch reference runs.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

__all__ = ["power_spectrum", "power_spectrum_reference"]

if triton is not None:

    @triton.jit
    def _power_spectrum_kernel(
        spectrum_ptr, out_ptr, frames, bins, guard, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr
    ):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]  # frames
        cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)[None, :]  # frequency bins
        ok = (rows < frames) & (cols < bins)
        at = spectrum_ptr + (rows.to(tl.int64) * bins + cols) * 2  # interleaved (re, im) pairs
        re = tl.load(at, mask=ok, other=0.0)
        im = tl.load(at + 1, mask=ok, other=0.0)
        magnitude = tl.sqrt_rn(re * re + im * im + guard)
        tl.store(out_ptr + cols.to(tl.int64) * frames + rows, magnitude * magnitude, mask=ok)


def power_spectrum(spectrum: torch.Tensor, guard: float = 0.0, mag_power: float = 2.0) -> torch.Tensor:
    """``[n_freq, R]`` contiguous float32 ``sqrt(|spectrum|**2 + guard) ** 2`` of a ``[R, n_freq]`` complex64 spectrum.

    ``guard`` is NeMo's term under the square root (0 unless ``use_grads``); ``mag_power`` must be 2 (NeMo's default
    and its streaming models'; the reference takes any).
    """
    if mag_power != 2.0:
        raise ValueError(f"power_spectrum computes mag_power=2.0; got {mag_power} (use power_spectrum_reference)")
    if spectrum.dim() != 2 or spectrum.dtype != torch.complex64 or not spectrum.is_contiguous():
        raise ValueError(
            f"spectrum must be a contiguous complex64 [R, n_freq], got {spectrum.dtype} {tuple(spectrum.shape)}"
        )
    frames, bins = spectrum.shape
    out = torch.empty(bins, frames, dtype=torch.float32, device=spectrum.device)
    if out.numel() == 0:
        return out
    block_r, block_f = 64, 32
    with torch.cuda.device(spectrum.device) if spectrum.is_cuda else contextlib.nullcontext():
        _power_spectrum_kernel[(triton.cdiv(frames, block_r), triton.cdiv(bins, block_f))](
            torch.view_as_real(spectrum), out, frames, bins, guard, BLOCK_R=block_r, BLOCK_F=block_f,
            enable_fp_fusion=False,  # re*re + im*im as torch rounds it: two products, then their sum
        )  # fmt: skip
    return out


def power_spectrum_reference(spectrum: torch.Tensor, guard: float = 0.0, mag_power: float = 2.0) -> torch.Tensor:
    """NeMo's operations (``FilterbankFeatures.forward``) on ``[R, n_freq]`` frames, for any ``mag_power``: the result
    of :func:`power_spectrum`."""
    magnitude = torch.sqrt(torch.view_as_real(spectrum).pow(2).sum(-1) + guard)
    if mag_power != 1.0:
        magnitude = magnitude.pow(mag_power)
    return magnitude.t().contiguous()
