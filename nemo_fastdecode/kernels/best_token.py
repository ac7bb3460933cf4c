"""Each row's best token: the maximum of the first ``num_tokens`` logits (tokens + blank) and its label, one
program per row (``torch.max`` over a slice launches several kernels and copies the slice).

Ties go to the lower label in both the kernel and the torch path (``fused=False``, the reference), which agree bit
for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["best_token"]


@triton.jit
def _row_argmax_kernel(logits, logits_stride, num_tokens, out_scores, out_labels, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_V)
    x = tl.load(logits + row * logits_stride + cols, mask=cols < num_tokens, other=float("-inf"))
    best = tl.argmax(x, axis=0, tie_break_left=True)
    tl.store(out_scores + row, tl.max(x, axis=0))
    tl.store(out_labels + row, best.to(tl.int64))


def best_token(
    logits: torch.Tensor, num_tokens: int, out_scores: torch.Tensor, out_labels: torch.Tensor, fused: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Best of the first ``num_tokens`` columns (tokens + blank) of ``logits [B, N]``: ``(scores [B], labels [B])``.

    Written into ``out_*`` (``[B]``) when fused. Ties go to the lower label, as ``torch.max`` does; rows holding
    NaN are undefined in both paths (a broken model).
    """
    if not fused or logits.stride(1) != 1 or num_tokens > 16384:
        return logits[:, :num_tokens].max(dim=-1)
    _row_argmax_kernel[(logits.shape[0],)](
        logits, logits.stride(0), num_tokens, out_scores, out_labels,
        BLOCK_V=triton.next_power_of_2(num_tokens), num_warps=4,
    )  # fmt: skip
    return out_scores, out_labels
