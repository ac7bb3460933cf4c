"""ReLU + time mask + zero padding in one pass (the subsampling's elementwise work) against its torch reference,
and the fused subsampling convolutions against NeMo's ``MaskedConvSequential``, in Triton's interpreter on the CPU
(conftest) or on a GPU."""

from __future__ import annotations

import pytest
import torch
from nemo.collections.asr.parts.submodules.subsampling import ConvSubsampling

from nemo_fastdecode.kernels.masked_relu import masked_relu_pad, masked_relu_pad_reference
from nemo_fastdecode.streaming.subsampling import CausalSubsampling

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize(
    ("shape", "time_pad", "freq_pad"),
    [((3, 4, 7, 5), (2, 1), (2, 1)), ((2, 1, 1, 3), (0, 0), (0, 0)), ((4, 3, 13, 40), (2, 1), (2, 1)), ((1, 2, 5, 9), (0, 3), (1, 0))],
)  # fmt: skip
def test_matches_reference(shape, time_pad, freq_pad):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=g).to(DEVICE)
    lengths = torch.randint(0, shape[2] + 1, (shape[0],), generator=g)
    lengths[0] = shape[2]  # a full row and (for B > 1) some shorter or empty ones
    lengths = lengths.to(DEVICE)
    out = masked_relu_pad(x, lengths, time_pad, freq_pad)
    expected = masked_relu_pad_reference(x, lengths, time_pad, freq_pad)
    assert out.shape == (shape[0], shape[1], shape[2] + sum(time_pad), shape[3] + sum(freq_pad))
    assert torch.equal(out, expected)  # max(x, 0) and zeros: no rounding anywhere
    # NeMo's order: mask, ReLU, mask, then F.pad
    mask = (torch.arange(shape[2], device=DEVICE)[None, :] < lengths[:, None]).float()[:, None, :, None]
    nemo = torch.nn.functional.pad(torch.relu(x * mask) * mask, (*freq_pad, *time_pad))
    assert torch.equal(out, nemo)


def test_non_contiguous_input_and_bad_inputs():
    x = torch.randn(2, 3, 6, 4, device=DEVICE).transpose(2, 3).contiguous().transpose(2, 3)  # [2, 3, 6, 4] strided
    lengths = torch.tensor([6, 2], device=DEVICE)
    assert torch.equal(masked_relu_pad(x, lengths, (2, 1)), masked_relu_pad_reference(x, lengths, (2, 1)))
    with pytest.raises(ValueError, match=r"x must be \[B, C, T, F\], got shape \(3, 6, 4\)"):
        masked_relu_pad(x[0], lengths)
    with pytest.raises(TypeError, match="x dtype torch.float16 is not supported; valid: torch.float32"):
        masked_relu_pad(x.half(), lengths)
    with pytest.raises(ValueError, match=r"lengths must be an integer \[B\] = \(2,\) tensor"):
        masked_relu_pad(x, lengths.float())
    with pytest.raises(ValueError, match="paddings must be >= 0"):
        masked_relu_pad(x, lengths, (-1, 0))


@pytest.mark.parametrize("use_triton", [False, True])
@pytest.mark.parametrize("factor", [4, 8])
@pytest.mark.parametrize("max_frames", [None, 25, 40], ids=["float-lengths", "length-table", "larger-table"])
def test_causal_subsampling_equals_nemo_masked_conv_sequential(use_triton, factor, max_frames):
    torch.manual_seed(factor)
    pre_encode = ConvSubsampling(
        "dw_striding", factor, feat_in=20, feat_out=24, conv_channels=8, activation=torch.nn.ReLU(), is_causal=True
    )
    pre_encode = pre_encode.to(DEVICE).eval()
    subsampling = CausalSubsampling.from_module(pre_encode, use_triton=use_triton, max_frames=max_frames)
    assert subsampling is not None
    x = torch.randn(4, 25, 20, device=DEVICE)
    lengths = torch.tensor([25, 17, 1, 0], device=DEVICE)
    masked = x * (torch.arange(25, device=DEVICE)[None, :] < lengths[:, None])[:, :, None]
    with torch.no_grad():
        out, out_lengths = subsampling(x, lengths)
        out_masked, _ = subsampling(masked, lengths, input_masked=True)  # the caller zeroed past the lengths
        expected, expected_lengths = pre_encode.conv(x, lengths)
    assert torch.equal(out_lengths, expected_lengths)
    assert torch.equal(out, expected)  # NeMo's own convolution calls on the same values: bit for bit
    assert torch.equal(out_masked, expected)


def test_other_subsamplings_keep_nemo_module():
    not_causal = ConvSubsampling("dw_striding", 8, feat_in=20, feat_out=24, conv_channels=8, is_causal=False)
    striding = ConvSubsampling("striding", 8, feat_in=20, feat_out=24, conv_channels=8, is_causal=True)
    gelu = ConvSubsampling(
        "dw_striding", 8, feat_in=20, feat_out=24, conv_channels=8, activation=torch.nn.GELU(), is_causal=True
    )
    for module in (not_causal, striding, gelu):
        assert CausalSubsampling.from_module(module, use_triton=False) is None
    with pytest.raises(ValueError, match="not a causal dw_striding ConvSubsampling"):
        CausalSubsampling(not_causal, use_triton=False)
