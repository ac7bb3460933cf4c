"""Fused transducer joint for greedy decoding: hidden layer, output layer and per-tile argmax in one kernel.

For each row ``b`` at frame ``t[b]``: ``h = relu(encoder_projected[b, t[b]] + predictor_output[b])``,
``logits = h @ weight.T + bias``; instead of writing the ``[B, V + 1]`` logits and reducing them in a
second kernel, every program keeps its ``[BLOCK_M, BLOCK_N]`` tile in registers and writes only the tile's
best token (score, label). The greedy loop's select kernel reduces the tiles (greedy/steps.py). Columns
past the tokens (TDT duration logits) are written out as they are.

This is an opt-in approximation (``fused_joint=True``): the GEMM sums in Triton's order instead of
cuBLAS's, so logits differ from NeMo's by float32 rounding and a near-tie between two tokens can
resolve differently. The benchmark reports its agreement with the baseline. Computed in float32
(``input_precision="ieee"``: no TF32), whatever the dtype of the inputs.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

__all__ = ["BLOCK_N", "joint_argmax", "joint_argmax_reference", "num_tiles"]

BLOCK_N = 16  # output columns per program (tl.dot needs >= 16): 65 column tiles for Parakeet's 1025 tokens
BLOCK_M = 16  # rows per program


def num_tiles(num_tokens: int) -> int:
    """Candidates per row: the column tiles that hold at least one token."""
    return triton.cdiv(num_tokens, BLOCK_N)


@triton.jit
def _joint_argmax_kernel(
    enc,
    enc_stride_b,
    enc_stride_t,
    time,
    time_stride,
    pred,
    pred_stride_b,
    weight,
    weight_stride_n,
    bias,
    tile_scores,
    tile_labels,
    extra,
    extra_stride_b,
    batch,
    hidden,
    num_tokens,
    num_outputs,
    num_tiles,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # small tiles on purpose: B ~ 32 rows and ~1000 columns make a few hundred KFLOP per step, so the
    # kernel is latency-bound; many small programs (2 x 65 for Parakeet) keep every SM loading at once
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    in_rows, in_cols = rows < batch, cols < num_outputs
    t = tl.load(time + rows * time_stride, mask=in_rows, other=0)
    enc_rows = enc + rows[:, None] * enc_stride_b + t[:, None] * enc_stride_t
    pred_rows = pred + rows[:, None] * pred_stride_b
    weight_rows = weight + cols[:, None] * weight_stride_n  # [BLOCK_N, BLOCK_K] tiles, contiguous along K
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        in_k = ks < hidden
        x_mask = in_rows[:, None] & in_k[None, :]
        x = tl.load(enc_rows + ks[None, :], mask=x_mask, other=0.0).to(tl.float32)
        x += tl.load(pred_rows + ks[None, :], mask=x_mask, other=0.0).to(tl.float32)
        x = tl.where(x < 0, 0.0, x)  # relu
        w = tl.load(weight_rows + ks[None, :], mask=in_cols[:, None] & in_k[None, :], other=0.0).to(tl.float32)
        acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    acc += tl.load(bias + cols, mask=in_cols, other=0.0).to(tl.float32)[None, :]
    if pid_n < num_tiles:  # this tile holds tokens: keep its best one
        token_scores = tl.where((cols < num_tokens)[None, :], acc, float("-inf"))
        best = tl.argmax(token_scores, axis=1, tie_break_left=True)
        tl.store(tile_scores + rows * num_tiles + pid_n, tl.max(token_scores, axis=1), mask=in_rows)
        tl.store(tile_labels + rows * num_tiles + pid_n, (pid_n * BLOCK_N + best).to(tl.int64), mask=in_rows)
    extra_cols = cols - num_tokens
    is_extra = (cols >= num_tokens) & in_cols
    tl.store(
        extra + rows[:, None] * extra_stride_b + extra_cols[None, :], acc, mask=in_rows[:, None] & is_extra[None, :]
    )


def _check(encoder_projected, time_indices, predictor_output, weight, bias, num_tokens) -> None:
    batch, _, hidden = encoder_projected.shape
    if predictor_output.shape != (batch, 1, hidden):
        raise ValueError(f"predictor_output must be [{batch}, 1, {hidden}], got {list(predictor_output.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden or bias.shape != (weight.shape[0],):
        raise ValueError(f"weight must be [N, {hidden}] and bias [N], got {list(weight.shape)} and {list(bias.shape)}")
    if not 0 < num_tokens <= weight.shape[0]:
        raise ValueError(f"num_tokens must be in [1, {weight.shape[0]}], got {num_tokens}")
    if time_indices.shape != (batch,) or time_indices.dtype != torch.long:
        raise ValueError(f"time_indices must be int64 [{batch}], got {time_indices.dtype} {list(time_indices.shape)}")
    devices = {t.device for t in (encoder_projected, time_indices, predictor_output, weight, bias)}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")


def joint_argmax(
    encoder_projected: torch.Tensor,
    time_indices: torch.Tensor,
    predictor_output: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    num_tokens: int,
    tile_scores: torch.Tensor,
    tile_labels: torch.Tensor,
    extra_logits: torch.Tensor,
) -> None:
    """Best token per column tile of the joint's output, and the columns past the tokens.

    Args:
        encoder_projected: ``[B, T, H]`` (joint-projected encoder output; last dim contiguous).
        time_indices: ``[B]`` int64 frame of each row, in ``[0, T)`` (an expanded 0-d tensor works).
        predictor_output: ``[B, 1, H]`` joint-projected prediction network output.
        weight, bias: the joint's output layer, ``[N, H]`` and ``[N]``.
        num_tokens: ``V + 1`` (tokens and blank); columns ``num_tokens..N-1`` are extra (TDT durations).
        tile_scores, tile_labels: out, ``[B, num_tiles(num_tokens)]`` float32 / int64.
        extra_logits: out, ``[B, N - num_tokens]`` float32 (may have zero columns).
    """
    _check(encoder_projected, time_indices, predictor_output, weight, bias, num_tokens)
    batch, _, hidden = encoder_projected.shape
    outputs = weight.shape[0]
    tiles = num_tiles(num_tokens)
    grid = (triton.cdiv(batch, BLOCK_M), triton.cdiv(outputs, BLOCK_N))
    with torch.cuda.device(encoder_projected.device) if encoder_projected.is_cuda else contextlib.nullcontext():
        _joint_argmax_kernel[grid](
            encoder_projected, encoder_projected.stride(0), encoder_projected.stride(1),
            time_indices, time_indices.stride(0), predictor_output, predictor_output.stride(0),
            weight, weight.stride(0), bias, tile_scores, tile_labels, extra_logits, extra_logits.stride(0),
            batch, hidden, num_tokens, outputs, tiles,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=64, num_warps=2,
        )  # fmt: skip


def joint_argmax_reference(
    encoder_projected: torch.Tensor,
    time_indices: torch.Tensor,
    predictor_output: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    num_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch reference (float32): ``(tile_scores, tile_labels, extra_logits)`` as :func:`joint_argmax` writes them."""
    rows = torch.arange(encoder_projected.shape[0], device=encoder_projected.device)
    hidden = torch.relu(encoder_projected[rows, time_indices].float() + predictor_output[:, 0].float())
    logits = hidden @ weight.float().T + bias.float()
    tiles = num_tiles(num_tokens)
    tokens = torch.full([logits.shape[0], tiles * BLOCK_N], float("-inf"), device=logits.device)
    tokens[:, :num_tokens] = logits[:, :num_tokens]
    scores, index = tokens.view(-1, tiles, BLOCK_N).max(dim=-1)
    labels = index + torch.arange(tiles, device=logits.device) * BLOCK_N
    return scores, labels, logits[:, num_tokens:]
