"""The label loop's one-kernel look (kernels/window_look.py) against its reference: the joint's output layer
(``matmul.linear``, tiled as for the batch's rows), each row's best token and the window selection, three launches on
the same loop state, in Triton's interpreter on the CPU (conftest) or on a GPU."""

from __future__ import annotations

import pytest
import torch
from conftest import TDT_DURATIONS
from test_greedy_fused import assert_same_state, twin_buffers

from nemo_fastdecode.greedy import steps
from nemo_fastdecode.kernels import matmul
from nemo_fastdecode.kernels.best_token import best_token
from nemo_fastdecode.kernels.window_look import WindowLookBuffers, look_tiling, window_look

pytestmark = pytest.mark.usefixtures("single_thread")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("batch,window", [(5, 3), (3, 2)])
@pytest.mark.parametrize("start", [True, False])
@pytest.mark.parametrize("tdt", [False, True])
def test_window_look_kernel_is_linear_best_token_and_window_select(batch, window, start, tdt):
    reference, fused = twin_buffers(batch, seed=batch * 11 + start, max_time=9)
    g = torch.Generator().manual_seed(batch + window)
    # 40 tokens (blank = 39): three column tiles of 16, so the kernel combines tiles; the loop state's other labels
    # are random in both paths
    hidden_size, num_tokens, blank = 8, 40, 39
    n_out = num_tokens + (len(TDT_DURATIONS) if tdt else 0)
    hidden = torch.randn([batch * window, hidden_size], generator=g).to(DEVICE)
    weight = torch.randn([n_out, hidden_size], generator=g).to(DEVICE)
    bias = torch.randn([n_out], generator=g).to(DEVICE)
    weight[1] = weight[blank] = 4 * hidden[0]  # row 0: labels 1 and blank tie (different tiles): 1 wins
    bias[1] = bias[blank] = 0.0
    hidden[2] = 0.0  # a row whose logits are the bias
    values = torch.tensor(TDT_DURATIONS, device=DEVICE) if tdt else None
    logits = matmul.linear(hidden, weight, bias, **matmul.decoder_tiling(batch))  # tiled as for the batch's rows
    scores, labels = best_token(logits, num_tokens, torch.empty([batch * window], device=DEVICE),
                                      torch.empty([batch * window], dtype=torch.long, device=DEVICE), True)  # fmt: skip
    assert labels[0] == 1 and logits[0, blank] == scores[0], "setup: row 0's best is the tie"
    durations = logits[:, num_tokens:] if tdt else None
    steps.window_select(reference, scores, labels, durations, values, blank, window, start)
    scratch = WindowLookBuffers.allocate(batch, window, n_out, DEVICE)
    for repeat in range(2):  # the second launch finds its counters reset
        twin = fused if repeat == 0 else twin_buffers(batch, seed=batch * 11 + start, max_time=9)[1]
        window_look(steps.look_tensors(twin), scratch, hidden, weight, bias, num_tokens, values, blank, window, start)
        assert torch.equal(scratch.logits, logits)
        assert torch.equal(scratch.best_scores, scores) and torch.equal(scratch.best_labels, labels)
        assert_same_state(reference, twin)
        assert not scratch.counters.any()
    assert look_tiling(32, 16)[1] == 32 and look_tiling(32, 4)[1] == 16
