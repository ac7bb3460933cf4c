"""EXPERIMENT (eighth session, reverted with the split-K cell): the layer-1 cell (x @ W_ih, recurrent gates
precomputed, H = 640, B = 32) by tiling and split-K. python benchmarks/experiments/cell_split_sweep.py OUT.md"""

import itertools
import sys

import torch
import triton.testing

from nemo_fastdecode.kernels import lstm_step

torch.manual_seed(0)
B, H = 32, 640
x = torch.randn(B, H, device="cuda")
c = torch.randn(B, H, device="cuda")
wx = 0.05 * torch.randn(4 * H, H, device="cuda")
bias = torch.randn(4 * H, device="cuda")
gates = torch.randn(B, 4 * H, device="cuda")
h_out, c_out = torch.empty_like(c), torch.empty_like(c)
counters = lstm_step.split_k_counters(c.device)
rows = []
for block_h, block_k, warps, split in itertools.product((4, 8, 16), (32, 64, 128), (1, 2, 4), (1, 2, 4, 8)):

    def cell(block_h=block_h, block_k=block_k, warps=warps, split=split):
        lstm_step.lstm_cell_step(bias, None, x, wx, None, None, c, h_out, c_out, recurrent_gates=gates,
                                 block_h=block_h, block_k=block_k, num_warps=warps, split_k=split,
                                 counters=counters)  # fmt: skip

    rows.append((triton.testing.do_bench_cudagraph(cell, rep=20) * 1e3, block_h, block_k, warps, split))
rows.sort()
with open(sys.argv[1], "w") as out:
    out.write("# cell1 with recurrent gates precomputed (x @ W_ih, H=640, B=32), 3xTF32, do_bench_cudagraph us\n\n")
    out.write("| us | block_h | block_k | warps | split_k |\n|---|---|---|---|---|\n")
    out.writelines(f"| {t:.2f} | {bh} | {bk} | {w} | {s} |\n" for t, bh, bk, w, s in rows)
