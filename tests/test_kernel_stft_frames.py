"""Windowed STFT frames from slot sample rings (kernels/stft_frames.py) against its torch reference and against the
frames ``torch.stft`` transforms in NeMo's ``FilterbankFeatures``, in Triton's interpreter on the CPU or on a GPU."""

from __future__ import annotations

import pytest
import torch

from nemo_fastdecode.kernels.stft_frames import FrameIndex, stft_frames, stft_frames_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _streams(hop: int, capacity: int) -> list[tuple[int, int, int, int]]:
    """(slot, first frame, frames, samples) per stream: frames in the left padding, in the middle, in the right
    padding (a flushed stream), and the last frames of a stream that has wrapped around its ring twice."""
    wrapped = 2 * capacity
    return [(2, 0, 3, 5 * hop), (0, 4, 2, 7 * hop + 3), (4, 9, 1, 9 * hop + 1), (1, wrapped // hop - 5, 4, wrapped)]


@pytest.mark.parametrize(("n_fft", "win", "hop", "preemph"), [(512, 400, 160, 0.97), (400, 399, 129, None)])
def test_matches_reference_and_torch_stft(n_fft, win, hop, preemph):
    g = torch.Generator().manual_seed(n_fft)
    pad, capacity = n_fft // 2, n_fft + 12 * hop
    ring = torch.randn(5, capacity, generator=g)
    window = torch.zeros(n_fft)
    window[(n_fft - win) // 2 : (n_fft - win) // 2 + win] = torch.hann_window(win, periodic=False)
    streams = _streams(hop, capacity)
    counts = torch.tensor([s[2] for s in streams])
    offset = torch.cumsum(counts, 0) - counts
    index = FrameIndex(
        torch.repeat_interleave(torch.arange(len(streams)), counts),
        torch.tensor([s[0] for s in streams]),
        torch.tensor([s[1] for s in streams]),
        offset,
        torch.tensor([pad + s[3] for s in streams]),
    )
    args = dict(hop=hop, pad=pad, preemph=preemph)
    expected = stft_frames_reference(ring, window, index, **args)
    on_device = FrameIndex(*(t.to(DEVICE) for t in vars(index).values()))
    got = stft_frames(ring.to(DEVICE), window.to(DEVICE), on_device, **args)
    assert torch.equal(got.cpu(), expected)
    rows = int(counts.sum()) + 5  # a larger FFT batch: the same frames, then zero rows
    padded = stft_frames(ring.to(DEVICE), window.to(DEVICE), on_device, **args, rows=rows).cpu()
    assert padded.shape == (rows, n_fft) and torch.equal(padded[: len(expected)], expected)
    assert not padded[len(expected) :].any()
    assert torch.equal(stft_frames_reference(ring, window, index, **args, rows=rows), padded)
    # the frame count read from device memory (a CUDA graph's launch): stream_of longer, its tail never read
    frames = len(expected)
    longer = torch.cat([on_device.stream_of, torch.full((7,), 10**6, device=DEVICE)])  # out of range if read
    counted = FrameIndex(longer, on_device.slot, on_device.start, on_device.offset, on_device.end)
    count = torch.tensor([frames], device=DEVICE)
    from_memory = stft_frames(ring.to(DEVICE), window.to(DEVICE), counted, **args, frame_count=count).cpu()
    assert from_memory.shape == (frames + 7, n_fft) and torch.equal(from_memory[:frames], expected)
    assert not from_memory[frames:].any()
    host_index = FrameIndex(longer.cpu(), *list(vars(index).values())[1:])
    assert torch.equal(stft_frames_reference(ring, window, host_index, **args, frame_count=count.cpu()), from_memory)
    # the frames of the streams that fit their rings are the ones torch.stft transforms in NeMo's FilterbankFeatures
    for (slot, first, count, samples), row in zip(streams[:3], offset.tolist()[:3], strict=True):
        x = ring[slot, pad : pad + samples]
        x = x if preemph is None else torch.cat((x[:1], x[1:] - preemph * x[:-1]))
        frames = torch.nn.functional.pad(x, (pad, pad)).unfold(0, n_fft, hop)[first : first + count] * window
        assert torch.equal(expected[row : row + count], frames)


def test_bad_arguments():
    ring, window = torch.zeros(2, 8), torch.zeros(4)
    ids = torch.zeros(1, dtype=torch.long)
    index = FrameIndex(ids, ids, ids, ids, ids)
    with pytest.raises(ValueError, match="ring must be float32"):
        stft_frames(ring.double(), window, index, hop=2, pad=2, preemph=None)
    with pytest.raises(ValueError, match="window must be a contiguous float32"):
        stft_frames(ring, window[::2], index, hop=2, pad=2, preemph=None)
    with pytest.raises(ValueError, match="must be contiguous int64 vectors"):
        stft_frames(ring, window, FrameIndex(ids.int(), ids, ids, ids, ids), hop=2, pad=2, preemph=None)
    with pytest.raises(ValueError, match="one entry per stream"):
        stft_frames(ring, window, FrameIndex(ids, ids, ids.repeat(2), ids, ids), hop=2, pad=2, preemph=None)
