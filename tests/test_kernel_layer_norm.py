"""The layer norm that keeps its output's row statistics (kernels/layer_norm.py) against torch, and the chain it
serves: ``norm_out`` then a GEMM over ``norm_feed_forward1`` of its output; interpreted on the CPU."""

from __future__ import annotations

import pytest
import torch

from nemo_fastdecode.kernels import matmul
from nemo_fastdecode.kernels.layer_norm import layer_norm_with_stats, layer_norm_with_stats_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _norm(features: int, seed: int) -> torch.nn.LayerNorm:
    g = torch.Generator().manual_seed(seed)
    norm = torch.nn.LayerNorm(features, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(features, generator=g))
        norm.bias.copy_(torch.randn(features, generator=g) + 3.0)  # outputs far from zero mean
    return norm.to(DEVICE)


@pytest.mark.parametrize(("shape", "features"), [((5,), 40), ((3, 7), 24), ((2, 9), 512), ((1,), 1)])
def test_matches_torch_and_keeps_output_stats(shape, features):
    x = (torch.randn(*shape, features, generator=torch.Generator().manual_seed(features)) * 4 - 2).to(DEVICE)
    norm = _norm(features, seed=len(shape))
    with torch.no_grad():
        y, stats = layer_norm_with_stats(x, norm)
        expected, expected_stats = layer_norm_with_stats_reference(x, norm)
    torch.testing.assert_close(y, norm(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    mean, var = stats.mean_var(features)
    want_mean, want_var = expected_stats.mean_var(features)
    torch.testing.assert_close(mean, want_mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(var, want_var, rtol=1e-4, atol=1e-5)


def test_next_gemm_normalises_with_the_kept_stats():
    """``norm_out`` then ``linear(norm_feed_forward1(.))``: the second norm applied by the GEMM while loading."""
    x = torch.randn(37, 48, generator=torch.Generator().manual_seed(3)).to(DEVICE) * 2 + 1
    norm_out, norm_ff1 = _norm(48, seed=4), _norm(48, seed=5)
    weight = torch.randn(20, 48, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    with torch.no_grad():
        y, stats = layer_norm_with_stats(x, norm_out)
        fused = matmul.linear(
            y, weight, layer_norm=matmul.LayerNormInput(stats, norm_ff1.weight, norm_ff1.bias, norm_ff1.eps)
        )
        expected = matmul.linear_reference(norm_out(x), weight, layer_norm=norm_ff1)
    torch.testing.assert_close(fused, expected, rtol=1e-4, atol=1e-4)


def test_bad_inputs():
    norm = _norm(8, seed=0)
    with pytest.raises(ValueError, match=r"need float32 x \[..., D\] and LayerNorm\(D\)"):
        layer_norm_with_stats(torch.zeros(2, 9, device=DEVICE), norm)
    with pytest.raises(ValueError, match="need an affine LayerNorm"):
        layer_norm_with_stats(torch.zeros(2, 8, device=DEVICE), torch.nn.LayerNorm(8, elementwise_affine=False))
