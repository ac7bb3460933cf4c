"""NaN / inf in one utterance's encoder output: that row decodes empty with a NaN score, the others as usual."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from conftest import TDT_DURATIONS, VOCAB_SIZE, make_networks, random_encoder_output

from nemo_fastdecode.apps.comparison import as_int_list
from nemo_fastdecode.beam.infer import FastBeamBatchedInfer
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer


def decoders(tdt: bool):
    decoder, joint = make_networks(tdt=tdt, seed=3)
    durations = TDT_DURATIONS if tdt else None
    common = {"decoder_model": decoder, "joint_model": joint, "blank_index": VOCAB_SIZE, "durations": durations}
    return {
        "fast_greedy": FastGreedyBatchedInfer(max_symbols_per_step=3, graph_mode="eager", **common),
        "fast_beam": FastBeamBatchedInfer(beam_size=2, max_symbols_per_step=3, graph_mode="eager", **common),
    }


@pytest.mark.parametrize("tdt", [False, True], ids=["rnnt", "tdt"])
@pytest.mark.parametrize("strategy", ["fast_greedy", "fast_beam"])
@pytest.mark.parametrize("bad_value", [math.nan, math.inf])
def test_a_nonfinite_row_is_reported_and_the_others_decode_as_alone(tdt, strategy, bad_value, caplog):
    decode = decoders(tdt)[strategy]
    x, lengths = random_encoder_output(3, 20, seed=5, lengths=[20, 14, 17])
    clean = decode(encoder_output=x, encoded_lengths=lengths)[0]
    assert all(len(as_int_list(h.y_sequence)) > 0 for h in clean)  # something to compare
    broken = x.clone()
    broken[1, 2, 7] = bad_value  # a frame row 1 decodes
    broken[2, 0, 18] = bad_value  # row 2 has 17 frames: frame 18 is padding it never decodes
    with caplog.at_level(logging.WARNING, logger="nemo_fastdecode"):
        hyps = decode(encoder_output=broken, encoded_lengths=lengths)[0]
    assert as_int_list(hyps[1].y_sequence) == [] and math.isnan(hyps[1].score)
    for row in (0, 2):  # padding beyond a row's length does not count
        assert as_int_list(hyps[row].y_sequence) == as_int_list(clean[row].y_sequence)
        assert hyps[row].score == clean[row].score
    assert [r.getMessage() for r in caplog.records if "NaN or inf" in r.getMessage()] == [
        "nemo_fastdecode: encoder output has NaN or inf values in batch row(s) [1]; decoded as empty hypotheses "
        "with score NaN (check the audio, and the model's precision)"
    ]


def test_finite_inputs_log_nothing(caplog):
    decode = decoders(False)["fast_greedy"]
    x, lengths = random_encoder_output(2, 10, seed=1)
    with caplog.at_level(logging.WARNING, logger="nemo_fastdecode"):
        hyps = decode(encoder_output=x, encoded_lengths=lengths)[0]
    assert not caplog.records and all(not math.isnan(h.score) for h in hyps)
    assert torch.equal(hyps[0].length, lengths[0].cpu())  # NeMo reports the caller's length
