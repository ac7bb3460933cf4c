"""Each row's best token (kernels/best_token.py) against ``torch.max`` over the token columns, in Triton's
interpreter on the CPU (conftest) or on a GPU."""

from __future__ import annotations

import pytest
import torch

from nemo_fastdecode.kernels.best_token import best_token

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("num_tokens", [1, 13, 1025])
def test_best_token_kernel_matches_torch_max(num_tokens):
    g = torch.Generator().manual_seed(num_tokens)
    logits = torch.randn([5, num_tokens + 4], generator=g).to(DEVICE)  # 4 extra (duration) columns ignored
    logits[1, : min(3, num_tokens)] = 9.0  # ties: the lowest label wins
    expected = best_token(logits, num_tokens, None, None, fused=False)
    out = torch.zeros([5], device=DEVICE), torch.zeros([5], dtype=torch.long, device=DEVICE)
    actual = best_token(logits, num_tokens, *out, fused=True)
    assert torch.equal(expected[0], actual[0]) and torch.equal(expected[1], actual[1])
