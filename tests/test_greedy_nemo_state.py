"""fast_greedy and NeMo's label-looping ``greedy_batch`` share their decoder state (NeMo's ``LabelLoopingStateItem``):
a stream decoded chunk by chunk may switch between them and ends where NeMo's label loop alone ends."""

from __future__ import annotations

import pytest
import torch
from conftest import make_networks, random_encoder_output
from nemo.collections.asr.parts.submodules.transducer_decoding.label_looping_base import LabelLoopingStateItem
from test_greedy_exactness import REALISTIC_BIAS, assert_same_hypotheses, baseline, ours

# per chunk, each row's valid frames (ragged, zeros); a new stream starts in row 2 at chunk 2
CHUNK_LENGTHS = [[8, 8, 8], [8, 3, 0], [8, 8, 8], [8, 8, 5]]
NEW_STREAM = (2, 2)  # (chunk, row)


def assert_same_state(expected: LabelLoopingStateItem, actual: LabelLoopingStateItem, bitwise: bool = True) -> None:
    """The same item; ``bitwise=False``: the prediction network's state and output to fp32 rounding."""
    assert isinstance(actual, LabelLoopingStateItem)
    assert int(actual.label) == int(expected.label) and int(actual.decoded_length) == int(expected.decoded_length)
    assert (actual.time_jump is None) == (expected.time_jump is None)
    if expected.time_jump is not None:
        assert int(actual.time_jump) == int(expected.time_jump)
    assert len(actual.predictor_state) == len(expected.predictor_state)
    pairs = [*zip(actual.predictor_state, expected.predictor_state, strict=True)]
    for a, e in [*pairs, (actual.predictor_output, expected.predictor_output)]:
        assert a.shape == e.shape
        if bitwise:  # the same ops on the same batch: bit for bit
            assert torch.equal(a, e)
        else:
            torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("max_symbols", [2, 10])
@pytest.mark.parametrize("first", ["nemo", "fast"])
@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_a_stream_switches_between_nemo_and_fast_greedy(kind, first, max_symbols):
    # two LSTM layers; about 0.4 labels per frame in every row
    decoder, joint = make_networks(tdt=kind == "tdt", seed=5, blank_bias=REALISTIC_BIAS[kind] - 0.3, pred_layers=2)
    x, _ = random_encoder_output(3, 32, seed=4, lengths=[32, 32, 32])
    nemo, fast = baseline(kind, decoder, joint, max_symbols, loop_labels=True), ours(kind, decoder, joint, max_symbols)
    turns = [nemo, fast] if first == "nemo" else [fast, nemo]
    reference = mixed = None
    for index, lengths in enumerate(CHUNK_LENGTHS):
        chunk = x[:, :, 8 * index : 8 * index + 8].contiguous()
        lengths = torch.tensor(lengths)
        if index == NEW_STREAM[0]:  # a new stream in this row: no previous hypothesis
            reference[NEW_STREAM[1]] = mixed[NEW_STREAM[1]] = None
        reference = nemo(encoder_output=chunk, encoded_lengths=lengths, partial_hypotheses=reference)[0]
        decode = turns[index % 2]
        mixed = decode(encoder_output=chunk, encoded_lengths=lengths, partial_hypotheses=mixed)[0]
        # NeMo's TDT loop may record another row's duration (see test_greedy_exactness): tokens, frames, scores
        assert_same_hypotheses(reference, mixed)
        for expected, actual in zip(reference, mixed, strict=True):
            assert_same_state(expected.dec_state, actual.dec_state)
    assert all(len(h.y_sequence) > 0 for h in mixed), "setup: every stream should emit labels"


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_items_with_fusion_states_are_refused_without_fusion(kind):
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=REALISTIC_BIAS[kind])
    x, lengths = random_encoder_output(2, 6, seed=4)
    hyps = ours(kind, decoder, joint, 3)(encoder_output=x, encoded_lengths=lengths)[0]
    hyps[1].dec_state.fusion_state_list = [torch.tensor(0)]  # e.g. NeMo's n-gram LM fusion state
    with pytest.raises(ValueError, match="different numbers of fusion model states"):
        ours(kind, decoder, joint, 3)(encoder_output=x, encoded_lengths=lengths, partial_hypotheses=hyps)
    hyps[0].dec_state.fusion_state_list = [torch.tensor(0)]
    with pytest.raises(ValueError, match="fusion states, and this decoder fuses no models"):
        ours(kind, decoder, joint, 3)(encoder_output=x, encoded_lengths=lengths, partial_hypotheses=hyps)
