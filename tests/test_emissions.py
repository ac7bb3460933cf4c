"""Emission statistics (tokens per frame, bursts, blank runs, TDT durations) and the shipped trained statistics."""

from types import SimpleNamespace

import pytest
import torch

from fastdecode_lab.emissions import (
    EMISSION_STATISTICS_PATH,
    EmissionStats,
    emission_stats,
    trained_emission_stats,
)


def hyp(timestamp, length=0, token_duration=None):
    return SimpleNamespace(timestamp=timestamp, length=length, token_duration=token_duration)


def test_bursts_blank_runs_and_shares_over_frames():
    # frames 0..9: tokens at frames 2, 2, 5; blank runs 0-1 (2), 3-4 (2), 6-9 (4)
    stats = emission_stats([hyp([2, 2, 5], 10)])
    assert stats.tokens_per_frame == pytest.approx(0.3)
    assert stats.tokens_per_emitting_frame == pytest.approx(1.5)
    assert stats.mean_blank_run == pytest.approx(8 / 3)
    assert stats.emitting_frame_share == pytest.approx(0.2)
    assert (stats.frames, stats.tokens) == (10, 3)
    assert stats.burst_histogram == {"1": 1, "2": 1}
    assert stats.blank_run_histogram == {"2": 2, "4": 1}
    assert stats.duration_histogram is None


def test_hypotheses_together_lengths_given_tensors_and_long_runs():
    # NeMo's greedy infer modules leave length at 0: the lengths come separately; a run of 70 frames is "64+"
    first = hyp(torch.tensor([0, 0, 0]), token_duration=torch.tensor([0, 0, 1]))
    second = hyp({"timestep": [70]}, token_duration=torch.tensor([2]))
    stats = emission_stats([first, second], lengths=[4, 72])
    assert (stats.frames, stats.tokens) == (76, 4)
    assert stats.burst_histogram == {"1": 1, "3": 1}
    assert stats.blank_run_histogram == {"1": 1, "3": 1, "64+": 1}
    assert stats.mean_blank_run == pytest.approx((3 + 70 + 1) / 3)
    assert stats.duration_histogram == {"0": 2, "1": 1, "2": 1}  # TDT: the duration of each token
    with pytest.raises(ValueError, match="2 hypotheses but 1 lengths"):
        emission_stats([first, second], lengths=[4])


def test_no_tokens_means_one_blank_run_per_utterance():
    stats = emission_stats([hyp([], 5), hyp([], 3)])
    assert (stats.tokens_per_frame, stats.tokens_per_emitting_frame, stats.emitting_frame_share) == (0.0, 0.0, 0.0)
    assert stats.blank_run_histogram == {"3": 1, "5": 1} and stats.mean_blank_run == 4.0


def test_shipped_trained_statistics():
    assert EMISSION_STATISTICS_PATH.is_file()
    rnnt, tdt = trained_emission_stats("rnnt"), trained_emission_stats("tdt")
    for stats in (rnnt, tdt):
        assert stats.tokens > 0 and 0 < stats.tokens_per_frame < 1 and stats.tokens_per_emitting_frame >= 1
        assert sum(int(k) * v for k, v in stats.burst_histogram.items()) == stats.tokens
    assert tdt.duration_histogram and sum(tdt.duration_histogram.values()) == tdt.tokens
    assert rnnt.duration_histogram is None
    assert EmissionStats.from_dict(rnnt.__dict__) == rnnt
    with pytest.raises(ValueError, match="valid kinds: rnnt, tdt"):
        trained_emission_stats("ctc")
