"""The batched polyphase resampler (kernels/resample.py): the Triton kernel against its torch reference (Triton's
interpreter on the CPU, conftest; the same tests on a GPU, marked ``gpu``), and both against
``scipy.signal.resample_poly`` on whole signals and in streaming runs (outputs computed as inputs arrive)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.signal import firwin, resample_poly

from nemo_fastdecode.kernels.resample import (
    RESAMPLE_FIELDS,
    FilterBank,
    Ratio,
    design_filter,
    ready_outputs,
    resample,
    resample_reference,
    total_outputs,
)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
RATES = [8000, 11025, 12000, 22050, 24000, 32000, 44100, 48000]
# float32 products and sums of at most 61 taps of |h| < 1 on inputs within [-1, 1]
ATOL = 2e-6


def _rows_for(streams, bank: FilterBank, capacity: int) -> np.ndarray:
    """``[B, 9]`` rows: ``(slot, ratio, first output, outputs, inputs, first ring column)`` per stream."""
    rows = []
    for slot, ratio, first, count, inputs, column in streams:
        offset = bank.add(ratio)
        rows.append((slot, first, count, ratio.up, ratio.down, ratio.half_len, offset, inputs, column % capacity))
    return np.array(rows, dtype=np.int64).reshape(-1, RESAMPLE_FIELDS)


def test_filter_is_resample_polys_default():
    """The designed filter is ``resample_poly``'s (firwin's Kaiser 5.0 low-pass at 1 / max(up, down), times up),
    and its ratio the rates over their gcd."""
    ratio = Ratio.of(44100, 16000)
    assert (ratio.up, ratio.down, ratio.half_len) == (160, 441, 4410)
    h = firwin(2 * 4410 + 1, 1 / 441, window=("kaiser", 5.0)).astype(np.float32) * np.float32(160)
    assert np.array_equal(design_filter(ratio), h)
    # resample_poly with that filter as its window gives the same outputs
    x = np.random.default_rng(0).uniform(-1, 1, 777).astype(np.float32)
    assert np.array_equal(resample_poly(x, 160, 441), resample_poly(x, 160, 441, window=h / np.float32(160)))


@pytest.mark.parametrize("rate", RATES)
def test_reference_is_resample_poly_on_a_whole_signal(rate):
    ratio = Ratio.of(rate, 16000)
    x = np.random.default_rng(rate).uniform(-1, 1, 2501).astype(np.float32)
    bank = FilterBank(torch.device("cpu"))
    n_out = int(total_outputs(np.int64(len(x)), ratio.up, ratio.down))
    expected = resample_poly(x, ratio.up, ratio.down)
    assert len(expected) == n_out
    input_ring = torch.zeros(2, 3000)
    input_ring[1, : len(x)] = torch.from_numpy(x)
    ring = torch.zeros(2, n_out + 7)
    rows = torch.from_numpy(_rows_for([(1, ratio, 0, n_out, len(x), 7)], bank, ring.shape[1]))
    resample_reference(input_ring, bank.bank, rows, ring, n_out, ratio.taps)
    assert np.abs(ring[1, 7:].numpy() - expected).max() < ATOL
    assert torch.equal(ring[1, :7], torch.zeros(7)) and torch.equal(ring[0], torch.zeros(n_out + 7))


@pytest.mark.parametrize("device", DEVICES)
def test_kernel_matches_reference_many_rates_in_one_launch(device):
    """Rows of every rate in one launch: runs that start mid-stream, that reach past the last input (zeros), rings
    that wrap, an empty run; the kernel equals the reference to fp32 summation order."""
    rng = np.random.default_rng(3)
    bank = FilterBank(torch.device(device))
    input_capacity, capacity = 3000, 700
    input_ring = torch.from_numpy(rng.uniform(-1, 1, (len(RATES) + 1, input_capacity)).astype(np.float32))
    streams = []
    for slot, rate in enumerate(RATES):
        ratio = Ratio.of(rate, 16000)
        inputs = int(rng.integers(1, 10_000))  # the ring holds inputs up to `inputs`, wrapped
        last = int(total_outputs(np.int64(inputs), ratio.up, ratio.down))
        first = max(0, last - int(rng.integers(1, 600)))
        streams.append((slot, ratio, first, last - first, inputs, int(rng.integers(0, capacity))))
    streams.append((len(RATES), Ratio.of(24000, 16000), 5, 0, 9, 0))  # nothing to do
    rows = _rows_for(streams, bank, capacity)
    ring = torch.from_numpy(rng.uniform(-1, 1, (len(RATES) + 1, capacity)).astype(np.float32))
    expected = ring.clone()
    taps = max(r.taps for _, r, *_ in streams)
    resample_reference(input_ring, bank.bank.cpu(), torch.from_numpy(rows), expected, int(rows[:, 2].max()), taps)
    ring = ring.to(device)
    resample(input_ring.to(device), bank.bank, torch.from_numpy(rows).to(device), ring, int(rows[:, 2].max()), taps, 16)
    torch.testing.assert_close(ring.cpu(), expected, rtol=0, atol=ATOL)
    assert not torch.equal(expected, ring.new_zeros(1).cpu().expand_as(expected))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rate", [24000, 8000, 48000, 44100])
def test_streaming_runs_equal_resample_poly(device, rate):
    """Inputs arrive in random pieces into a ring; each piece's final outputs are computed as they become ready, and
    at the end the rest with zeros past the end: the outputs are ``resample_poly`` of the whole signal."""
    rng = np.random.default_rng(rate)
    ratio = Ratio.of(rate, 16000)
    x = rng.uniform(-1, 1, rate // 5).astype(np.float32)
    bank = FilterBank(torch.device(device))
    input_capacity, capacity = 2048 + ratio.history, 4096
    input_ring = torch.zeros(1, input_capacity, device=device)
    ring = torch.zeros(1, capacity, device=device)
    got, inputs, done = [], 0, 0
    while True:
        piece = x[inputs : inputs + int(rng.integers(0, 2048))]
        end = inputs + len(piece) == len(x)
        columns = (inputs + np.arange(len(piece))) % input_capacity
        input_ring[0, torch.from_numpy(columns).to(device)] = torch.from_numpy(piece).to(device)
        inputs += len(piece)
        args = (np.int64(inputs), ratio.up, ratio.down)
        ready = int(total_outputs(*args) if end else ready_outputs(*args, ratio.half_len))
        rows = torch.from_numpy(_rows_for([(0, ratio, done, ready - done, inputs, done)], bank, capacity))
        resample(input_ring, bank.bank, rows.to(device), ring, ready - done, ratio.taps)
        got.append(ring[0, (done + torch.arange(ready - done, device=device)) % capacity].cpu().numpy())
        done = ready
        if end:
            break
    expected = resample_poly(x, ratio.up, ratio.down)
    got = np.concatenate(got)
    assert len(got) == len(expected)
    assert np.abs(got - expected).max() < ATOL


def test_bad_arguments():
    ring = torch.zeros(2, 8)
    bank = torch.zeros(5)
    rows = torch.zeros(1, RESAMPLE_FIELDS, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"rows must be a contiguous int64 \[B, 9\]"):
        resample(ring, bank, rows.int(), ring, 1, 8)
    with pytest.raises(ValueError, match="input_ring must be float32"):
        resample(ring.double(), bank, rows, ring, 1, 8)
    with pytest.raises(ValueError, match="bank must be a contiguous float32 vector"):
        resample_reference(ring, bank.view(1, 5), rows, ring, 1, 8)
