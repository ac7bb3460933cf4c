"""One look of the label loop's look-ahead (``fast_math``) as ONE kernel: the joint's output layer on the window's
hidden rows, each row's best token, and the window selection.

:func:`window_look` leaves exactly the state of :func:`~nemo_fastdecode.kernels.matmul.linear` (tiled as for
the batch's rows) + :func:`~nemo_fastdecode.kernels.best_token.best_token` +
:func:`~nemo_fastdecode.kernels.greedy_select.window_select` on the same tensors, in one launch instead
of three. Each program computes a tile of logits and, for its rows, the best token among its columns; the last
program of a row tile to finish combines the tiles' answers (the lowest label among equal scores, as ``torch.max``);
the last row tile to finish runs the selection. Inside a CUDA graph a label-loop step waits on each launch for a few
microseconds, so the look-ahead's critical path loses two of them per look.

Used where the joint's logits are its scores (no log-softmax: NeMo's default on CUDA); elsewhere the label loop
runs the three steps (the reference: ``tests/test_greedy_lookahead.py`` compares the two).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from nemo_fastdecode.kernels.greedy_select import LookTensors, batch_block, window_select_rows
from nemo_fastdecode.kernels.matmul import batch_tiling
from nemo_fastdecode.kernels.tf32x3 import accumulate, check_fp32


def look_tiling(batch_size: int, window: int) -> tuple[int, int, int]:
    """``(rows per program, columns per program, warps)`` for ``batch_size * window`` joint rows.

    Rows and warps are :func:`~nemo_fastdecode.kernels.matmul.batch_tiling` of the batch (the same sums as the
    single-frame joint, row for row); wider column tiles from 256 rows, faster there with bit for bit the same
    logits (``benchmarks/bench_joint.py``).
    """
    block_b, num_warps = batch_tiling(batch_size)
    return block_b, (32 if batch_size * window >= 256 else 16), num_warps


@dataclass
class WindowLookBuffers:
    """Scratch of :func:`window_look` for a batch and window (allocated once, outside graph capture).

    logits ``[B * W, N]``; tile_scores / tile_labels ``[column tiles, B * W]`` (each tile's best token per row);
    best_scores / best_labels ``[B * W]``; counters ``[row tiles + 1]`` int32, zero between launches.
    """

    logits: torch.Tensor
    tile_scores: torch.Tensor
    tile_labels: torch.Tensor
    best_scores: torch.Tensor
    best_labels: torch.Tensor
    counters: torch.Tensor

    @classmethod
    def allocate(cls, batch_size: int, window: int, n_out: int, device: torch.device) -> WindowLookBuffers:
        block_b, block_n, _ = look_tiling(batch_size, window)
        rows = batch_size * window
        tiles = triton.cdiv(n_out, block_n)
        return cls(
            logits=torch.empty([rows, n_out], dtype=torch.float32, device=device),
            tile_scores=torch.empty([tiles, rows], dtype=torch.float32, device=device),
            tile_labels=torch.empty([tiles, rows], dtype=torch.int32, device=device),
            best_scores=torch.empty([rows], dtype=torch.float32, device=device),
            best_labels=torch.empty([rows], dtype=torch.long, device=device),
            counters=torch.zeros([triton.cdiv(rows, block_b) + 1], dtype=torch.int32, device=device),
        )


@triton.jit
def _window_look_kernel(
    hidden_ptr, hidden_stride, w_ptr, w_stride, bias_ptr, logits_ptr, logits_stride,
    tile_scores_ptr, tile_labels_ptr, best_scores_ptr, best_labels_ptr, counters_ptr, rows_total, n_out, depth,
    num_tokens, duration_values, time, safe_time, label_time, last_frame, lengths, active, active_before, advance,
    blank, labels, scores, durations, inner_flag, batch, blank_id,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_TILES: tl.constexpr, START: tl.constexpr, WINDOW: tl.constexpr, NUM_DURATIONS: tl.constexpr,
    SELECT_BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # 1. a tile of logits, computed as matmul.linear computes it (SPLIT_K = 1, no epilogue)
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < rows_total, cols < n_out
    acc = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    w_rows = tl.minimum(cols, n_out - 1)
    acc = accumulate(acc, hidden_ptr, hidden_stride, w_ptr, w_stride, w_rows, rows, row_ok, depth, BLOCK_K, PRECISION,
                     1)  # fmt: skip
    acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0)[None, :]
    tl.store(logits_ptr + rows[:, None] * logits_stride + cols[None, :], acc, mask=row_ok[:, None] & col_ok[None, :])
    # 2. the tile's best token per row (durations and padding columns excluded); ties: the lower label
    token_scores = tl.where((cols < num_tokens)[None, :], acc, float("-inf"))
    tile_best = tl.argmax(token_scores, axis=1, tie_break_left=True) + tl.program_id(1) * BLOCK_N
    tl.store(tile_scores_ptr + tl.program_id(1) * rows_total + rows, tl.max(token_scores, axis=1), mask=row_ok)
    tl.store(tile_labels_ptr + tl.program_id(1) * rows_total + rows, tile_best, mask=row_ok)
    tl.debug_barrier()  # every thread's stores are issued before the counter moves (released by the atomic)
    column_tiles = tl.num_programs(1)
    if tl.atomic_add(counters_ptr + tl.program_id(0), 1, sem="acq_rel") == column_tiles - 1:
        # 3. the row tile's last program: the best of the tiles' answers (from L2: other SMs wrote them)
        tiles = tl.arange(0, BLOCK_TILES)
        both = (tiles < column_tiles)[:, None] & row_ok[None, :]
        offsets = tiles[:, None] * rows_total + rows[None, :]
        s = tl.load(tile_scores_ptr + offsets, mask=both, other=float("-inf"), cache_modifier=".cg")
        lab = tl.load(tile_labels_ptr + offsets, mask=both, other=0, cache_modifier=".cg")
        best_tile = tl.argmax(s, axis=0, tie_break_left=True)
        best_label = tl.sum(tl.where(tiles[:, None] == best_tile[None, :], lab, 0), axis=0)
        tl.store(best_scores_ptr + rows, tl.max(s, axis=0), mask=row_ok)
        tl.store(best_labels_ptr + rows, best_label.to(tl.int64), mask=row_ok)
        tl.atomic_xchg(counters_ptr + tl.program_id(0), 0)  # zero for the next launch
        tl.debug_barrier()
        row_tiles = tl.num_programs(0)
        if tl.atomic_add(counters_ptr + row_tiles, 1, sem="acq_rel") == row_tiles - 1:
            # 4. the last row tile: the window selection over the whole batch
            tl.atomic_xchg(counters_ptr + row_tiles, 0)
            window_select_rows(
                best_scores_ptr, best_labels_ptr, logits_ptr + num_tokens, logits_stride, duration_values, time,
                safe_time, label_time, last_frame, lengths, active, active_before, advance, blank, labels, scores,
                durations, inner_flag, batch, blank_id, START, WINDOW, NUM_DURATIONS, SELECT_BLOCK_B, BLOCK_D, ".cg",
            )  # fmt: skip


def window_look(
    look: LookTensors,
    scratch: WindowLookBuffers,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    num_tokens: int,
    duration_values: torch.Tensor | None,
    blank_id: int,
    window: int,
    start: bool,
    precision: str = "tf32x3",
) -> None:
    """Up to ``window`` looks of the label loop from the joint's hidden rows, in one kernel (see module doc).

    Shapes: hidden ``[B * W, H]`` (:func:`~nemo_fastdecode.kernels.joint_hidden.joint_hidden_window`), weight
    ``[N, H]`` and bias ``[N]`` (the joint's last Linear; N = V + 1 (+ durations)), duration_values
    ``[num_durations]`` (TDT) or ``None``; float32; ``look``: the label loop's per-row state (``B`` rows).
    Leaves ``scratch.logits`` / ``best_scores`` / ``best_labels`` as ``linear`` / ``best_token`` would, and ``look``
    as :func:`~nemo_fastdecode.kernels.greedy_select.window_select` would.
    """
    check_fp32(hidden=hidden, weight=weight, bias=bias)
    batch = look.labels.shape[0]
    rows_total, depth = hidden.shape
    n_out = weight.shape[0]
    if rows_total != batch * window or scratch.logits.shape != (rows_total, n_out) or weight.shape[1] != depth:
        raise ValueError(f"window look shapes disagree: hidden {tuple(hidden.shape)}, batch {batch}, window "
                         f"{window}, weight {tuple(weight.shape)}, logits {tuple(scratch.logits.shape)}")  # fmt: skip
    block_b, block_n, num_warps = look_tiling(batch, window)
    grid = (triton.cdiv(rows_total, block_b), triton.cdiv(n_out, block_n))
    num_durations = n_out - num_tokens if duration_values is not None else 0
    select_block, _ = batch_block(batch)
    _window_look_kernel[grid](
        hidden, hidden.stride(0), weight, weight.stride(0), bias, scratch.logits, scratch.logits.stride(0),
        scratch.tile_scores, scratch.tile_labels, scratch.best_scores, scratch.best_labels, scratch.counters,
        rows_total, n_out, depth, num_tokens, duration_values if num_durations else scratch.best_labels,
        *look, batch, blank_id,
        BLOCK_B=block_b, BLOCK_N=block_n, BLOCK_K=64, PRECISION=precision,
        BLOCK_TILES=triton.next_power_of_2(grid[1]), START=start, WINDOW=window, NUM_DURATIONS=num_durations,
        SELECT_BLOCK_B=select_block, BLOCK_D=triton.next_power_of_2(max(num_durations, 2)), num_warps=num_warps,
        num_stages=4,
    )  # fmt: skip
