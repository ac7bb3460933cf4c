"""The fused streaming convolution step (GLU + causal depthwise conv over slot caches + batch norm + Swish) against
its torch reference and a float64 evaluation, in Triton's interpreter on the CPU (conftest) or on a GPU."""

from __future__ import annotations

import pytest
import torch

from nemo_fastdecode.kernels.streaming_conv import glu_depthwise_conv_step, glu_depthwise_conv_step_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sources(pads: list[int], kernel: int, frames: int) -> torch.Tensor:
    """The encoder's alignment of [cache, new frames] for rows with ``pad`` leading padding frames."""
    positions = torch.arange(kernel - 1 + frames)[None, :]
    pad = torch.tensor(pads)[:, None]
    return torch.where(positions >= pad + kernel - 1, positions, (positions - pad).clamp(min=0)).to(DEVICE)


def _case(batch, frames, channels, kernel, slots, seed):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(list(shape), generator=g).to(DEVICE)

    slot_ids = torch.randperm(slots, generator=g)[:batch].to(DEVICE)
    pads = torch.randint(0, frames + 1, [batch], generator=g).tolist()
    return dict(
        hidden=randn(batch, frames, 2 * channels),
        cache=randn(slots, channels, kernel - 1),
        slot_ids=slot_ids,
        sources=_sources(pads, kernel, frames),
        weight=randn(channels, kernel),
        bias=randn(channels),
        scale=randn(channels).abs() + 0.5,
        shift=randn(channels),
    )


@pytest.mark.parametrize("batch,frames,channels,kernel", [(1, 1, 8, 2), (3, 2, 24, 9), (5, 4, 130, 5), (2, 3, 17, 31)])
@pytest.mark.parametrize("norm", ["layer_norm", "batch_norm"])
def test_fused_conv_step_matches_reference_and_float64(batch, frames, channels, kernel, norm):
    case = _case(batch, frames, channels, kernel, slots=7, seed=batch + kernel)
    case["layer_norm_eps"] = 1e-5 if norm == "layer_norm" else None  # NeMo's streaming models: layer norm
    cache_before = case["cache"].clone()
    kernel_case = {**case, "cache": case["cache"].clone()}
    out = glu_depthwise_conv_step(**kernel_case)
    expected = glu_depthwise_conv_step_reference(**case)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # the new cache holds cached values and GLU outputs (sigmoid rounding may differ in the last bit)
    torch.testing.assert_close(kernel_case["cache"], case["cache"], rtol=1e-6, atol=1e-6)
    # float64 evaluation of the same semantics
    double = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in case.items()}
    double["cache"] = cache_before.double()
    torch.testing.assert_close(out.double(), glu_depthwise_conv_step_reference(**double), rtol=1e-5, atol=1e-5)
    untouched = torch.ones(7, dtype=torch.bool, device=DEVICE)
    untouched[case["slot_ids"]] = False
    assert torch.equal(kernel_case["cache"][untouched], cache_before[untouched])  # other slots keep their caches
    assert not torch.equal(kernel_case["cache"][case["slot_ids"]], cache_before[case["slot_ids"]])


def test_fused_conv_step_rejects_bad_inputs():
    case = _case(2, 2, 8, 4, slots=3, seed=0)
    with pytest.raises(ValueError, match=r"cache must be \[S, C=8, K-1=3\]"):
        glu_depthwise_conv_step(**{**case, "cache": case["cache"][:, :, :2]})
    with pytest.raises(ValueError, match="sources"):
        glu_depthwise_conv_step(**{**case, "sources": case["sources"][:, :-1]})
    with pytest.raises(ValueError, match="computes in torch.float32; hidden is torch.bfloat16"):
        glu_depthwise_conv_step(**{**case, "hidden": case["hidden"].bfloat16()})
    with pytest.raises(ValueError, match=r"hidden must be \[B, T, 2C\]"):
        glu_depthwise_conv_step(**{**case, "hidden": case["hidden"][:, :, :-1]})
