"""The fused middle of a Conformer convolution module (GLU, pad mask, depthwise convolution, batch norm, Swish)
against its torch reference and against NeMo's ``ConformerConvolution``, in Triton's interpreter on the CPU (conftest)
or on a GPU."""

from __future__ import annotations

import pytest
import torch

from nemo_fastdecode.kernels.conv_module import glu_depthwise_norm_swish, glu_depthwise_norm_swish_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _inputs(batch: int, time: int, channels: int, kernel: int, seed: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(batch, time, 2 * channels, generator=g).to(DEVICE, dtype)
    weight = torch.randn(channels, kernel, generator=g).to(DEVICE)
    bias = torch.randn(channels, generator=g).to(DEVICE)
    scale = (torch.rand(channels, generator=g) + 0.5).to(DEVICE)
    shift = torch.randn(channels, generator=g).to(DEVICE)
    lengths = torch.randint(0, time + 1, (batch,), generator=g)
    lengths[0] = time  # one full row; the others shorter or empty
    pad_mask = (torch.arange(time)[None, :] >= lengths[:, None]).to(DEVICE)
    return h, pad_mask, weight, bias, scale, shift


# time and channels on both sides of the kernel's 32-frame and 128-channel tiles; odd kernels and paddings
@pytest.mark.parametrize(
    ("batch", "time", "channels", "kernel", "left"),
    [(3, 37, 20, 9, 4), (2, 31, 128, 9, 4), (2, 33, 129, 9, 8), (1, 1, 5, 3, 0), (4, 64, 96, 5, 2), (2, 70, 8, 31, 15)],
)  # fmt: skip
@pytest.mark.parametrize("masked", [True, False])
def test_matches_reference(batch, time, channels, kernel, left, masked):
    h, pad_mask, weight, bias, scale, shift = _inputs(batch, time, channels, kernel, seed=time + channels)
    pad_mask = pad_mask if masked else None
    out = glu_depthwise_norm_swish(h, pad_mask, weight, bias, scale, shift, left)
    expected = glu_depthwise_norm_swish_reference(h, pad_mask, weight, bias, scale, shift, left)
    assert out.shape == (batch, time, channels) and out.dtype == h.dtype
    assert expected.abs().max() > 0.1  # something to compare
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_bf16_input_is_summed_in_fp32_and_stored_in_bf16():
    h, pad_mask, weight, bias, scale, shift = _inputs(2, 40, 130, 9, seed=1, dtype=torch.bfloat16)
    out = glu_depthwise_norm_swish(h, pad_mask, weight, bias, scale, shift, 4)
    exact = glu_depthwise_norm_swish_reference(h.float(), pad_mask, weight, bias, scale, shift, 4)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), exact, rtol=1e-2, atol=1e-2)  # one bf16 rounding of the output


def test_strided_input_and_bad_inputs():
    h, pad_mask, weight, bias, scale, shift = _inputs(2, 12, 16, 9, seed=2)
    wide = torch.zeros(2, 12, 40, device=DEVICE)
    wide[:, :, :32] = h
    out = glu_depthwise_norm_swish(wide[:, :, :32], pad_mask, weight, None, scale, shift, 4)
    torch.testing.assert_close(out, glu_depthwise_norm_swish_reference(h, pad_mask, weight, None, scale, shift, 4))
    with pytest.raises(ValueError, match=r"h must be \[B, T, 2D\], got shape \(2, 12, 31\)"):
        glu_depthwise_norm_swish(h[:, :, :31], pad_mask, weight, bias, scale, shift, 4)
    with pytest.raises(ValueError, match=r"weight must be \[D=16, K\], got shape \(15, 9\)"):
        glu_depthwise_norm_swish(h, pad_mask, weight[:15], bias, scale, shift, 4)
    with pytest.raises(ValueError, match=r"left padding must be in \[0, 8\], got 9"):
        glu_depthwise_norm_swish(h, pad_mask, weight, bias, scale, shift, 9)
    with pytest.raises(ValueError, match=r"pad_mask must be \[B=2, T=12\], got shape \(2, 11\)"):
        glu_depthwise_norm_swish(h, pad_mask[:, :11], weight, bias, scale, shift, 4)
