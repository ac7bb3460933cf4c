"""Tiling sweep of ``indexed_attention`` at the streaming encoder's shapes (GPU): how its block sizes were chosen.

python benchmarks/sweep_indexed_attention.py

The caches are laid out as the encoder keeps them (``[S, T, H, D]`` ring buffers viewed ``[S, H, T, D]``, random
ring starts, relative-position term with both biases), fp32, every stream at full length (``W`` left context +
``Tq`` new frames). For each shape it times the kernel (``do_bench_cudagraph``, median) at each
``(USE_DOT, BLOCK_N, num_warps)``: the CUDA-core path (``USE_DOT=False``, chunks of at most ``SMALL_TQ`` queries)
and two ``tl.dot`` tilings, and prints the largest difference from the torch reference.
"""

from __future__ import annotations

import functools
import math

import torch

import nemo_fastdecode.kernels.indexed_attention as ia

HEADS, HEAD_DIM, SLOTS = 8, 64, 1025
SHAPES = ((256, 2, 70), (1024, 2, 70), (256, 14, 70), (16, 2, 70))  # (streams N, queries Tq, left context W)
CUDA_CORE_TILINGS = [(block_n, warps) for block_n in (16, 32, 64) for warps in (1, 2, 4, 8)]
DOT_TILINGS = [(64, 4), (32, 2)]


def main() -> None:
    from triton.testing import do_bench_cudagraph

    torch.manual_seed(0)
    h, d, s, dev = HEADS, HEAD_DIM, SLOTS, "cuda"
    default_pick_blocks = ia.pick_blocks
    try:
        for n, tq, w in SHAPES:
            t = w + tq
            keys = torch.randn(s, t, h, d, device=dev).permute(0, 2, 1, 3)
            values = torch.randn(s, t, h, d, device=dev).permute(0, 2, 1, 3)
            q = torch.randn(n, tq, h, d, device=dev).transpose(1, 2)
            extra = {
                "pos_bias_u": torch.randn(h, d, device=dev),
                "pos_bias_v": torch.randn(h, d, device=dev),
                "pos_emb": torch.randn(h, 2 * t - 1, d, device=dev),
                "key_starts": torch.randint(0, t, (n,), device=dev),
            }
            slot_ids = torch.randperm(s - 1, device=dev)[:n]
            lengths = torch.full((n,), t, device=dev)
            scale = 1 / math.sqrt(d)
            reference = ia.indexed_attention_reference(q, keys, values, slot_ids, lengths, scale, **extra)
            configs = [(True, *tiling) for tiling in DOT_TILINGS]
            if tq <= ia.SMALL_TQ:
                configs = [(False, *tiling) for tiling in CUDA_CORE_TILINGS] + configs
            for use_dot, block_n, warps in configs:
                block_m = max(16, triton_pow2(tq)) if use_dot else triton_pow2(tq)
                block_d = max(16, triton_pow2(d))
                ia.pick_blocks = lambda *_, c=(use_dot, block_m, block_n, block_d, warps): c

                run = functools.partial(
                    ia.indexed_attention, q, keys, values, slot_ids, lengths, scale, check_values=False, **extra
                )
                error = (run() - reference).abs().max().item()
                ms = do_bench_cudagraph(run, rep=50)
                print(
                    f"N={n:5d} Tq={tq:3d} T={t} dot={use_dot:d} block_n={block_n:3d} warps={warps}: "
                    f"{ms * 1e3:8.1f} us  max|err|={error:.1e}",
                    flush=True,
                )
    finally:
        ia.pick_blocks = default_pick_blocks


def triton_pow2(value: int) -> int:
    return 1 << max(0, (value - 1).bit_length())


if __name__ == "__main__":
    main()
