"""The subsampling's fused (first convolution,) masked ReLU and depthwise convolution against its float64 torch
reference and NeMo's ``MaskedConvSequential``, in Triton's interpreter on the CPU (conftest) or on a GPU."""

from __future__ import annotations

import pytest
import torch
from nemo.collections.asr.parts.submodules.subsampling import ConvSubsampling

from nemo_fastdecode.kernels.masked_depthwise import FirstConv, masked_depthwise_conv, masked_depthwise_conv_reference
from nemo_fastdecode.streaming.subsampling import CausalSubsampling

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _double(first: FirstConv | None) -> FirstConv | None:
    if first is None:
        return None
    return FirstConv(first.weight.double(), first.bias.double(), first.stride, first.lengths)


@pytest.mark.parametrize(
    ("batch", "channels", "time", "freq", "kernel", "stride", "with_first"),
    [(3, 5, 25, 20, 3, 2, True), (2, 70, 9, 11, 3, 2, True), (3, 4, 7, 10, 3, 2, False), (2, 3, 6, 5, 5, 3, False),
     (1, 2, 1, 1, 3, 2, True)],
)  # fmt: skip
def test_matches_float64_reference(batch, channels, time, freq, kernel, stride, with_first):
    g = torch.Generator().manual_seed(channels * time + freq)
    lengths_in = torch.randint(0, time + 1, (batch,), generator=g)
    lengths_in[0] = time  # a full row and (for B > 1) shorter or empty ones
    first = None
    if with_first:  # features [B, T0, F0], strided like the encoder's transposed window
        x = torch.randn(batch, freq, time, generator=g).transpose(1, 2)
        w1, b1 = torch.randn(channels, 1, 3, 3, generator=g), torch.randn(channels, generator=g)
        first = FirstConv(w1.to(DEVICE), b1.to(DEVICE), 2, lengths_in.to(DEVICE))
        lengths = lengths_in // 2 + (lengths_in > 0).long()  # valid frames of the first convolution's output
    else:
        x = torch.randn(batch, channels, time, freq, generator=g)
        lengths = lengths_in
    w, b = torch.randn(channels, 1, kernel, kernel, generator=g), torch.randn(channels, generator=g)
    x, lengths, w, b = x.to(DEVICE), lengths.to(DEVICE), w.to(DEVICE), b.to(DEVICE)
    out = masked_depthwise_conv(x, lengths, w, b, stride, first)
    expected = masked_depthwise_conv_reference(x.double(), lengths, w.double(), b.double(), stride, _double(first))
    assert out.shape == expected.shape
    # fp32 sums of at most 81 + 9 products against float64: a few ulps of the sum of |products|
    scale = masked_depthwise_conv_reference(
        x.double().abs(), lengths, w.double().abs(), b.double().abs(), stride,
        None if first is None else FirstConv(first.weight.double().abs(), first.bias.double().abs(), 2, first.lengths),
    )  # fmt: skip
    assert ((out.double() - expected).abs() <= 1e-6 * scale + 1e-12).all()


def test_masks_are_applied():
    # the same input with garbage past each row's length gives the same output: the masks hide it
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 8, 6, generator=g).to(DEVICE)
    lengths = torch.tensor([8, 3], device=DEVICE)
    w, b = torch.randn(4, 1, 3, 3, generator=g).to(DEVICE), torch.randn(4, generator=g).to(DEVICE)
    garbage = x.clone()
    garbage[1, :, 3:] = 1e3
    assert torch.equal(masked_depthwise_conv(x, lengths, w, b, 2), masked_depthwise_conv(garbage, lengths, w, b, 2))
    features = torch.randn(2, 9, 7, generator=g).to(DEVICE)
    noisy = features.clone()
    noisy[1, 4:] = -1e3
    first = FirstConv(torch.randn(4, 1, 3, 3, generator=g).to(DEVICE), torch.randn(4, generator=g).to(DEVICE), 2,
                      torch.tensor([9, 4], device=DEVICE))  # fmt: skip
    act_lengths = torch.tensor([5, 3], device=DEVICE)
    out = masked_depthwise_conv(features, act_lengths, w, b, 2, first)
    assert torch.equal(out, masked_depthwise_conv(noisy, act_lengths, w, b, 2, first))
    # and a shorter activation length changes the output (the mask is not a no-op)
    assert not torch.equal(out, masked_depthwise_conv(features, act_lengths - 1, w, b, 2, first))


def test_bad_inputs():
    x = torch.randn(2, 3, 6, 4, device=DEVICE)
    w, b = torch.randn(3, 1, 3, 3, device=DEVICE), torch.randn(3, device=DEVICE)
    lengths = torch.tensor([6, 2], device=DEVICE)
    with pytest.raises(TypeError, match="x dtype torch.float16 is not supported; valid: torch.float32"):
        masked_depthwise_conv(x.half(), lengths, w, b, 2)
    with pytest.raises(ValueError, match=r"x must be \[B, 3, T, F\] activations, got shape \(2, 4, 6, 4\)"):
        masked_depthwise_conv(torch.randn(2, 4, 6, 4, device=DEVICE), lengths, w, b, 2)
    with pytest.raises(ValueError, match=r"weight must be \[3, 1, K, K\], got shape \(3, 1, 3, 2\)"):
        masked_depthwise_conv(x, lengths, w[..., :2], b, 2)
    with pytest.raises(ValueError, match=r"lengths must be an integer \[B\] = \(2,\) tensor"):
        masked_depthwise_conv(x, lengths.float(), w, b, 2)
    first = FirstConv(w, b, 2, lengths)
    with pytest.raises(ValueError, match=r"x must be \[B, T, F\] features before the first convolution"):
        masked_depthwise_conv(x, lengths, w, b, 2, first)


@pytest.mark.parametrize("factor", [4, 8, 16])
def test_fused_subsampling_equals_nemo_masked_conv_sequential(factor):
    torch.manual_seed(factor)
    pre_encode = ConvSubsampling(
        "dw_striding", factor, feat_in=20, feat_out=24, conv_channels=8, activation=torch.nn.ReLU(), is_causal=True
    )
    pre_encode = pre_encode.to(DEVICE).eval()
    fused = CausalSubsampling.from_module(pre_encode, use_triton=True, max_frames=40, fuse_convolutions=True)
    assert fused.fuse_convolutions
    x = torch.randn(4, 40, 20, device=DEVICE)
    lengths = torch.tensor([40, 17, 1, 0], device=DEVICE)
    masked = x * (torch.arange(40, device=DEVICE)[None, :] < lengths[:, None])[:, :, None]
    with torch.no_grad():
        out, out_lengths = fused(x, lengths)
        out_masked, _ = fused(masked, lengths, input_masked=True)
        expected, expected_lengths = pre_encode.conv(x, lengths)
    assert torch.equal(out_lengths, expected_lengths)
    # another order of fp32 sums than cuDNN's: equal to rounding (NeMo's reference runs without TF32)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(out_masked, out)  # the kernel masks its input itself: the caller's mask changes nothing
    for row, length in enumerate(out_lengths.tolist()):
        assert (out[row, :, length:] == 0).all()  # past each row's length: zero, as NeMo's


def test_fusion_needs_triton_and_nemo_layout():
    pre_encode = ConvSubsampling("dw_striding", 8, feat_in=20, feat_out=24, conv_channels=8, is_causal=True)
    with pytest.raises(ValueError, match="fuse_convolutions=True runs Triton kernels: it needs use_triton=True"):
        CausalSubsampling(pre_encode, use_triton=False, fuse_convolutions=True)
    pre_encode.conv[2].bias = None  # a layout the kernel does not compute: the per-layer path stays
    assert not CausalSubsampling(pre_encode, use_triton=True, fuse_convolutions=True).fuse_convolutions


def test_tiles_change_no_value():
    # each output's sums run in tap order whatever the tile, so another tile (bench_subsampling's sweep) is bit-equal
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 25, 20, generator=g).to(DEVICE)
    w1, b1 = torch.randn(6, 1, 3, 3, generator=g).to(DEVICE), torch.randn(6, generator=g).to(DEVICE)
    w, b = torch.randn(6, 1, 3, 3, generator=g).to(DEVICE), torch.randn(6, generator=g).to(DEVICE)
    first = FirstConv(w1, b1, 2, torch.tensor([25, 14], device=DEVICE))
    lengths = torch.tensor([13, 8], device=DEVICE)
    default = masked_depthwise_conv(x, lengths, w, b, 2, first)
    for tile in ({"block_c": 2, "block_p": 16, "num_warps": 1}, {"block_c": 8, "block_p": 128, "num_warps": 8}):
        assert torch.equal(masked_depthwise_conv(x, lengths, w, b, 2, first, **tile), default)
