"""The subsampling input window and pre-encode cache update (kernels/pre_encode_window.py) against its torch
reference, in Triton's interpreter on the CPU (conftest) or on a GPU."""

from __future__ import annotations

import pytest
import torch

from nemo_fastdecode.kernels.pre_encode_window import pre_encode_window, pre_encode_window_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize(("channels", "cache_frames", "chunk", "given"), [(80, 9, 16, 16), (5, 3, 8, 5), (33, 1, 4, 4)])
def test_matches_reference(channels, cache_frames, chunk, given):
    g = torch.Generator().manual_seed(channels)
    slots = 6  # the last one plays the dummy slot of padding rows
    cache = torch.randn(slots, channels, cache_frames, generator=g).to(DEVICE)
    features = torch.randn(5, channels, given, generator=g).to(DEVICE)
    # started and first chunks, full and short chunks, two padding rows on the dummy slot
    lengths = torch.tensor([given, max(given - 2, 1), 1, 0, 0]).to(DEVICE)
    started = torch.tensor([True, False, True, False, False]).to(DEVICE)
    slot_ids = torch.tensor([2, 0, 4, 5, 5]).to(DEVICE)
    width = cache_frames + chunk
    cache_ref = cache.clone()
    window = pre_encode_window(features, lengths, started, cache, slot_ids, width)
    expected = pre_encode_window_reference(features, lengths, started, cache_ref, slot_ids, width)
    assert torch.equal(window, expected)  # copies and zeros only
    real = slot_ids[:3]
    assert torch.equal(cache[real], cache_ref[real])
    untouched = torch.tensor([1, 3]).to(DEVICE)
    assert torch.equal(cache[untouched], cache_ref[untouched])


def test_bad_inputs():
    cache = torch.zeros(2, 4, 3, device=DEVICE)
    ids = torch.zeros(1, dtype=torch.long, device=DEVICE)
    lengths, started = torch.ones(1, dtype=torch.long, device=DEVICE), torch.ones(1, dtype=torch.bool, device=DEVICE)
    with pytest.raises(TypeError, match="features and cache must be float32"):
        pre_encode_window(torch.zeros(1, 4, 5, device=DEVICE).half(), lengths, started, cache, ids, 8)
    with pytest.raises(ValueError, match=r"features \(1, 4, 6\) \[B, F, G <= W - P\]"):
        pre_encode_window(torch.zeros(1, 4, 6, device=DEVICE), lengths, started, cache, ids, 8)
