"""ncu target: the fast-math LSTM cell (layer 0 from the label table, and a layer with an input GEMM) and the
3xTF32 linear at 128 rows (beam 4 x batch 32), H = 640, V + 1 = 1025.

ncu --clock-control none -k regex:"_lstm_cell_kernel|_linear_kernel" -s 3 -c 3 --section SpeedOfLight \
    --section WarpStateStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
    --section SchedulerStats python3 benchmarks/experiments/ncu_prediction_kernels.py
"""

import torch

from nemo_fastdecode.kernels import lstm_step, matmul

torch.manual_seed(0)
B, H, V = 128, 640, 1025
dev = "cuda"
table = torch.randn(V, 4 * H, device=dev)
labels = torch.randint(0, V, [B], device=dev)
wh = torch.randn(4 * H, H, device=dev) * 0.05
wx = torch.randn(4 * H, H, device=dev) * 0.05
bias = torch.randn(4 * H, device=dev)
h, c, x = (torch.randn(B, H, device=dev) for _ in range(3))
ho, co = torch.empty_like(h), torch.empty_like(c)
wj = torch.randn(V, H, device=dev) * 0.05
bj = torch.randn(V, device=dev)
out = torch.empty(B, V, device=dev)
for _ in range(3):
    lstm_step.lstm_cell_step(table, labels, None, None, h, wh, c, ho, co)
    lstm_step.lstm_cell_step(bias, None, x, wx, h, wh, c, ho, co)
    matmul.linear(h, wj, bj, out=out, **matmul.decoder_tiling(B))
torch.cuda.synchronize()
