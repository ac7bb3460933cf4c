"""The joint's hidden layer kernel (kernels/joint_hidden.py) against its torch path: one frame per row (greedy),
beams sharing an encoder row (beam search), and each row's next ``window`` frames (the greedy look-ahead), in Triton's
interpreter on the CPU (conftest) or on a GPU."""

from __future__ import annotations

import pytest
import torch

from nemo_fastdecode.kernels.joint_hidden import joint_hidden, joint_hidden_window

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("hidden", [5, 1030])  # below and above one 1024-wide block
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("frame_loop", [False, True])
def test_joint_hidden_kernel_matches_reference(hidden, dtype, frame_loop):
    g = torch.Generator().manual_seed(hidden)
    encoder = torch.randn([3, 4, hidden], generator=g).to(DEVICE, dtype)
    predictor = torch.randn([3, 1, hidden], generator=g).to(DEVICE, dtype)
    frame = torch.tensor(2, device=DEVICE)
    times = frame.expand(3) if frame_loop else torch.tensor([3, 0, 2], device=DEVICE)
    out = torch.empty([3, hidden], dtype=dtype, device=DEVICE)
    expected = joint_hidden(encoder, times, predictor, out, fused=False).clone()
    actual = joint_hidden(encoder, times, predictor, out.fill_(7.0), fused=True)
    if dtype == torch.bfloat16 and DEVICE.type == "cpu":
        # Triton's CPU interpreter rounds fp32 -> bf16 toward zero (the GPU rounds to nearest): one ulp apart
        torch.testing.assert_close(actual, expected, rtol=2**-7, atol=0)
    else:
        assert torch.equal(expected, actual)
    assert (actual == 0).any() and (actual > 0).any(), "setup: relu should clip some entries"


def test_joint_hidden_kernel_with_beams_sharing_an_encoder_row():
    """Beam search: R decoder rows per utterance read that utterance's encoder row, each at its own frame."""
    g = torch.Generator().manual_seed(3)
    beams = 3
    encoder = torch.randn([2, 5, 40], generator=g).to(DEVICE)
    predictor = torch.randn([2 * beams, 1, 40], generator=g).to(DEVICE)
    times = torch.tensor([0, 4, 2, 1, 1, 3], device=DEVICE)
    out = torch.empty([2 * beams, 40], device=DEVICE)
    expected = torch.relu(encoder.repeat_interleave(beams, 0)[torch.arange(2 * beams), times] + predictor[:, 0])
    for fused in (False, True):
        actual = joint_hidden(encoder, times, predictor, out.fill_(7.0), fused, rows_per_frame_row=beams)
        assert torch.equal(actual, expected), fused


@pytest.mark.parametrize("fused", [True, False], ids=["kernel", "torch"])
def test_window_rows_are_the_single_frame_hidden_rows(fused):
    g = torch.Generator().manual_seed(0)
    encoder = torch.randn([3, 6, 5], generator=g).to(DEVICE)
    predictor = torch.randn([3, 1, 5], generator=g).to(DEVICE)
    time = torch.tensor([0, 4, 2], device=DEVICE)
    last_frame = torch.tensor([5, 5, 0], device=DEVICE)  # row 2: a zero-length row (always frame 0)
    window = 4
    got = joint_hidden_window(encoder, time, last_frame, predictor, torch.empty([12, 5], device=DEVICE),
                                    window, fused)  # fmt: skip
    for b in range(3):
        for w in range(window):
            frame = max(min(int(time[b]) + w, int(last_frame[b])), 0)
            expected = torch.relu(encoder[b, frame] + predictor[b, 0])
            assert torch.equal(got[b * window + w], expected), (b, w)
    with pytest.raises(ValueError, match="B \\* window = 12 rows"):
        joint_hidden_window(encoder, time, last_frame, predictor, torch.empty([9, 5]), window, fused)
