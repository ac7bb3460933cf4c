"""The power spectrum in NeMo's layout (kernels/power_spectrum.py) against IEEE fp32 steps, and on a GPU against NeMo's
torch operations, bit for bit, in Triton's interpreter on the CPU or on a GPU."""

from __future__ import annotations

import pytest
import torch

from nemo_fastdecode.kernels.power_spectrum import power_spectrum, power_spectrum_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


# frames on both sides of the 64-frame tile, bins on both sides of the 32-bin tile (257: NeMo's 512-point FFT)
@pytest.mark.parametrize(("frames", "n_fft"), [(1, 512), (63, 64), (65, 62), (130, 66)])
@pytest.mark.parametrize("guard", [0.0, 1e-5])
def test_matches_nemo_operations(frames, n_fft, guard):
    g = torch.Generator().manual_seed(frames)
    x = torch.randn(frames, n_fft, generator=g) * torch.logspace(-4, 2, frames)[:, None]
    x[0, :] = 0  # a silent frame: zeros through the square root
    spectrum = torch.fft.rfft(x)
    got = power_spectrum(spectrum.to(DEVICE), guard)
    assert got.is_contiguous() and got.shape == (n_fft // 2 + 1, frames)
    # IEEE fp32 steps: a square root in fp64 rounded to fp32 is the correctly rounded fp32 one (53 >= 2 * 24 + 2)
    parts = torch.view_as_real(spectrum)
    magnitude = torch.sqrt((parts[..., 0] * parts[..., 0] + parts[..., 1] * parts[..., 1] + guard).double()).float()
    assert torch.equal(got.cpu(), (magnitude * magnitude).t())
    if DEVICE.type == "cuda":  # torch's CUDA square root is IEEE's: NeMo's operations, bit for bit
        assert torch.equal(got, power_spectrum_reference(spectrum.to(DEVICE), guard))


def test_reference_is_nemo_featurizer_chain():
    """The reference is FilterbankFeatures' |X| ** mag_power, transposed (any mag_power)."""
    spectrum = torch.fft.rfft(torch.randn(5, 32, generator=torch.Generator().manual_seed(0)))
    for mag_power in (1.0, 2.0, 1.5):
        nemo = torch.sqrt(torch.view_as_real(spectrum).pow(2).sum(-1))
        nemo = nemo if mag_power == 1.0 else nemo.pow(mag_power)
        assert torch.equal(power_spectrum_reference(spectrum, 0.0, mag_power), nemo.t())


def test_bad_arguments():
    with pytest.raises(ValueError, match="contiguous complex64"):
        power_spectrum(torch.zeros(3, 4, device=DEVICE))
    with pytest.raises(ValueError, match="mag_power=2.0; got 1.0"):
        power_spectrum(torch.zeros(3, 4, dtype=torch.complex64, device=DEVICE), mag_power=1.0)
