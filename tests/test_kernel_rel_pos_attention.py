"""Relative-position attention in one pass against its torch reference and against NeMo's
``RelPositionMultiHeadAttention``, in Triton's interpreter on the CPU (conftest) or on a GPU."""

from __future__ import annotations

import pytest
import torch
from nemo.collections.asr.parts.submodules.multi_head_attention import RelPositionMultiHeadAttention

from nemo_fastdecode.kernels.rel_pos_attention import rel_pos_attention, rel_pos_attention_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _padding_mask(lengths: torch.Tensor, time: int) -> torch.Tensor:
    """NeMo's full-context ``att_mask``: ``True`` unless both the query and the key are inside the row's length."""
    valid = torch.arange(time)[None, :] < lengths[:, None]
    return ~(valid[:, :, None] & valid[:, None, :])


# time on both sides of the 64-query/key tiles, one row fully padded (its output must be 0), head sizes 16-128
@pytest.mark.parametrize(
    ("batch", "time", "heads", "dim"), [(3, 70, 2, 32), (2, 64, 1, 16), (2, 65, 3, 64), (1, 1, 2, 32), (2, 40, 2, 128)]
)
@pytest.mark.parametrize("masked", [True, False])
def test_matches_reference(batch, time, heads, dim, masked):
    g = torch.Generator().manual_seed(time * heads + dim)
    q, k, v = (torch.randn(batch, time, heads, dim, generator=g).to(DEVICE) for _ in range(3))
    bias_u = torch.randn(heads, dim, generator=g).to(DEVICE)
    bd = torch.randn(batch, heads, time, 2 * time - 1, generator=g).to(DEVICE)
    lengths = torch.randint(1, time + 1, (batch,), generator=g)
    lengths[0] = time
    if batch > 1:
        lengths[-1] = 0  # a fully padded row
    mask = _padding_mask(lengths, time).to(DEVICE) if masked else None
    out = rel_pos_attention(q, k, v, bias_u, bd, mask, dim**-0.5)
    expected = rel_pos_attention_reference(q, k, v, bias_u, bd, mask, dim**-0.5)
    assert out.shape == (batch, time, heads * dim)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    if masked and batch > 1:
        assert torch.equal(out[-1], torch.zeros_like(out[-1]))


def test_limited_context_mask_is_honoured():
    """Any mask NeMo builds (here a banded, limited-context one) is read as given, not assumed to be padding."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 50, 2, 32, generator=g).to(DEVICE) for _ in range(3))
    bias_u = torch.randn(2, 32, generator=g).to(DEVICE)
    bd = torch.randn(2, 2, 50, 99, generator=g).to(DEVICE)
    i = torch.arange(50)
    band = ((i[None, :] - i[:, None]).abs() > 6).expand(2, 50, 50).to(DEVICE)
    out = rel_pos_attention(q, k, v, bias_u, bd, band, 0.2)
    torch.testing.assert_close(out, rel_pos_attention_reference(q, k, v, bias_u, bd, band, 0.2), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(out, rel_pos_attention(q, k, v, bias_u, bd, None, 0.2))


def test_reference_is_nemo_module_arithmetic():
    torch.manual_seed(0)
    heads, dim, batch, time = 2, 16, 3, 23
    attention = RelPositionMultiHeadAttention(heads, heads * dim, 0.0, None, None).eval()
    x = torch.randn(batch, time, heads * dim)
    pos = torch.randn(1, 2 * time - 1, heads * dim)
    mask = _padding_mask(torch.tensor([23, 9, 1]), time)
    with torch.no_grad():
        nemo = attention(x, x, x, mask, pos)
        q, k, v = (
            lin(x).view(batch, time, heads, dim) for lin in (attention.linear_q, attention.linear_k, attention.linear_v)
        )
        p = attention.linear_pos(pos).view(1, -1, heads, dim)
        bd = torch.matmul((q + attention.pos_bias_v).transpose(1, 2), p.permute(0, 2, 3, 1))
        ours = attention.linear_out(
            rel_pos_attention_reference(q, k, v, attention.pos_bias_u, bd, mask, 1 / attention.s_d_k)
        )
    assert nemo.abs().max() > 0.1
    torch.testing.assert_close(ours, nemo, rtol=1e-5, atol=1e-6)


def test_bad_shapes_are_named():
    q = torch.zeros(2, 5, 2, 16, device=DEVICE)
    bias_u = torch.zeros(2, 16, device=DEVICE)
    bd = torch.zeros(2, 2, 5, 9, device=DEVICE)
    with pytest.raises(ValueError, match=r"q, k, v must be \[B, T, H, d\] of one shape"):
        rel_pos_attention(q, q[:, :4], q, bias_u, bd, None, 0.25)
    with pytest.raises(ValueError, match=r"bias_u must be \[H=2, d=16\], got shape \(16,\)"):
        rel_pos_attention(q, q, q, bias_u[0], bd, None, 0.25)
    with pytest.raises(ValueError, match=r"bd must be \[B=2, H=2, T=5, 2T-1=9\], got shape \(2, 2, 5, 8\)"):
        rel_pos_attention(q, q, q, bias_u, bd[..., :8], None, 0.25)
    with pytest.raises(ValueError, match=r"mask must be \[B=2, T=5, T=5\]"):
        rel_pos_attention(q, q, q, bias_u, bd, torch.zeros(2, 5, 4, dtype=torch.bool, device=DEVICE), 0.25)
