"""fast_beam returns NeMo's malsd_batch hypotheses: same tokens, timestamps (TDT: durations), scores, n-best lists.

Baseline: NeMo 3.0's ``BeamBatchedRNNTInfer`` / ``BeamBatchedTDTInfer`` (``search_type='malsd_batch'``, no CUDA
graphs) on the same tiny random networks and encoder outputs. On the CPU our top-k runs the fused kernel's torch
reference, whose log-probabilities are NeMo's ``log_softmax`` bit for bit, so scores are compared exactly.
One deliberate difference (README, Exactness): NeMo's RNN-T search decodes the padding frame of a zero-length row
when other rows are longer; ours keeps the row empty, as NeMo does when that row is decoded alone.
"""

from __future__ import annotations

import pytest
import torch
from conftest import TDT_DURATIONS, VOCAB_SIZE, make_networks, random_encoder_output
from nemo.collections.asr.parts.submodules.rnnt_beam_decoding import BeamBatchedRNNTInfer
from nemo.collections.asr.parts.submodules.tdt_beam_decoding import BeamBatchedTDTInfer

from nemo_fastdecode.beam import FastBeamBatchedInfer
from nemo_fastdecode.beam import malsd as malsd_module

pytestmark = pytest.mark.usefixtures("single_thread")

REALISTIC_BIAS = {"rnnt": 0.9, "tdt": 0.5}  # about 0.3 labels per frame
NEVER_BLANK, ALWAYS_BLANK = -6.0, 6.0
# (seed, blank shift) of networks whose every beam comes back to blank (NeMo never returns otherwise)
UNBOUNDED_SAFE = {"rnnt": (3, 2.5), "tdt": (31, 1.0)}
LENGTHS = [24, 1, 17, 5, 9, 24]  # ragged; zero-length rows are tested separately


def nemo_malsd(kind, decoder, joint, beam_size, max_symbols, **kwargs):
    common = {"beam_size": beam_size, "max_symbols_per_step": max_symbols, "allow_cuda_graphs": False, **kwargs}
    if kind == "tdt":
        return BeamBatchedTDTInfer(decoder, joint, TDT_DURATIONS, VOCAB_SIZE, **common)
    return BeamBatchedRNNTInfer(decoder, joint, VOCAB_SIZE, **common)


def fast_beam(kind, decoder, joint, beam_size, max_symbols, **kwargs):
    durations = TDT_DURATIONS if kind == "tdt" else None
    return FastBeamBatchedInfer(
        decoder, joint, VOCAB_SIZE, beam_size, max_symbols_per_step=max_symbols, durations=durations, **kwargs
    )


def as_tuple(hyp):
    """Everything a hypothesis says: tokens, timestamps, TDT durations (None for RNN-T) and the exact score."""
    durations = None if hyp.token_duration is None else tuple(map(int, hyp.token_duration))
    return tuple(map(int, hyp.y_sequence)), tuple(map(int, hyp.timestamp)), durations, float(hyp.score)


def as_tuples(hyps, nbest: bool):
    if nbest:
        return [[as_tuple(h) for h in n.n_best_hypotheses] for n in hyps]
    return [as_tuple(h) for h in hyps]


def decode_both(kind, decoder, joint, x, lengths, beam_size, max_symbols, **kwargs):
    nbest = not kwargs.get("return_best_hypothesis", True)
    expected = nemo_malsd(kind, decoder, joint, beam_size, max_symbols, **kwargs)(
        encoder_output=x, encoded_lengths=lengths
    )
    actual = fast_beam(kind, decoder, joint, beam_size, max_symbols, **kwargs)(
        encoder_output=x, encoded_lengths=lengths
    )
    return as_tuples(expected[0], nbest), as_tuples(actual[0], nbest)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("beam_size", [1, 2, 4])
@pytest.mark.parametrize("max_symbols", [1, 3, 10])
@pytest.mark.parametrize("return_best_hypothesis", [True, False], ids=["best", "nbest"])
@pytest.mark.parametrize("score_norm", [True, False], ids=["norm", "raw"])
def test_matches_malsd_batch(kind, beam_size, max_symbols, return_best_hypothesis, score_norm):
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=REALISTIC_BIAS[kind])
    x, lengths = random_encoder_output(6, 24, seed=4, lengths=LENGTHS)
    expected, actual = decode_both(
        kind,
        decoder,
        joint,
        x,
        lengths,
        beam_size,
        max_symbols,
        return_best_hypothesis=return_best_hypothesis,
        score_norm=score_norm,
    )
    assert actual == expected
    flat = [h for row in actual for h in row] if not return_best_hypothesis else actual
    assert sum(len(h[0]) for h in flat) > 0, "setup: the networks should emit labels"
    if not return_best_hypothesis and beam_size > 1:
        assert max(len(row) for row in actual) > 1, "setup: n-best lists should hold several hypotheses"


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("regime", ["never_blank", "always_blank"])
def test_extreme_blank_regimes_match(kind, regime):
    decoder, joint = make_networks(
        tdt=kind == "tdt", seed=5, blank_bias=NEVER_BLANK if regime == "never_blank" else ALWAYS_BLANK
    )
    x, lengths = random_encoder_output(4, 13, seed=6, lengths=[13, 2, 7, 13])
    expected, actual = decode_both(kind, decoder, joint, x, lengths, 4, 2, return_best_hypothesis=False)
    assert actual == expected
    best = [row[0] for row in actual]
    if regime == "always_blank":
        assert all(len(h[0]) == 0 for h in best)
    elif kind == "rnnt":  # 2 labels on every frame (TDT durations skip frames)
        assert [len(h[0]) for h in best] == [2 * n for n in lengths.tolist()]


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_unbounded_symbols_match_and_storage_grows(kind, monkeypatch):
    """max_symbols=None: storage is a guess; a search that fills it runs again with more room."""
    monkeypatch.setattr(malsd_module, "UNBOUNDED_STEPS_START", 1)
    seed, bias = UNBOUNDED_SAFE[kind]
    decoder, joint = make_networks(tdt=kind == "tdt", seed=seed, blank_bias=bias)
    x, lengths = random_encoder_output(4, 12, seed=7, lengths=[12, 3, 8, 12])
    decode = fast_beam(kind, decoder, joint, 2, None, return_best_hypothesis=False)
    expected = nemo_malsd(kind, decoder, joint, 2, None, return_best_hypothesis=False)(
        encoder_output=x, encoded_lengths=lengths
    )[0]
    actual = decode(encoder_output=x, encoded_lengths=lengths)[0]
    assert as_tuples(actual, True) == as_tuples(expected, True)
    if kind == "rnnt":  # (TDT durations skip frames: one step per frame was enough here)
        assert decode.computer._steps_per_frame > 1, "setup: storage should have grown"


def test_unbounded_symbols_on_a_model_that_never_stops_raise():
    """NeMo's search never returns here; ours stops with an error that says what to set.

    No limit: max_symbols unset and graphs disallowed (with graphs allowed NeMo's rule sets 10)."""
    decoder, joint = make_networks(seed=3, blank_bias=NEVER_BLANK)
    x, lengths = random_encoder_output(1, 2, seed=4, lengths=[2])
    decode = fast_beam("rnnt", decoder, joint, 2, None, allow_cuda_graphs=False)
    assert decode.computer.max_symbols is None
    with pytest.raises(RuntimeError, match="beam.max_symbols"):
        decode(encoder_output=x, encoded_lengths=lengths)


def test_tdt_durations_and_start_timestamps_match():
    """TDT hypotheses carry start frames and durations (NeMo's export), n-best included."""
    decoder, joint = make_networks(tdt=True, seed=8, blank_bias=REALISTIC_BIAS["tdt"])
    x, lengths = random_encoder_output(5, 31, seed=9)
    expected, actual = decode_both("tdt", decoder, joint, x, lengths, 3, 4, return_best_hypothesis=False)
    assert actual == expected
    durations = [d for row in actual for h in row for d in h[2]]
    assert durations and set(durations) <= set(range(len(TDT_DURATIONS))) and len(set(durations)) > 1


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_zero_length_rows(kind):
    """Rows of length 0 give the empty hypothesis (score 0); the other rows are NeMo's."""
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=REALISTIC_BIAS[kind])
    lengths = [24, 0, 17, 0, 9]
    x, lengths = random_encoder_output(5, 24, seed=4, lengths=lengths)
    expected, actual = decode_both(kind, decoder, joint, x, lengths, 4, 3)
    for row in (0, 2, 4):
        assert actual[row] == expected[row]
    for row in (1, 3):
        alone = nemo_malsd(kind, decoder, joint, 4, 3)(
            encoder_output=x[row : row + 1], encoded_lengths=lengths[row : row + 1]
        )
        assert actual[row] == as_tuple(alone[0][0])
        assert actual[row][0] == () and actual[row][3] == 0.0
    if kind == "rnnt":  # the documented difference: NeMo decodes the padding frame of a zero row in a batch
        assert expected[1] != actual[1], "NeMo fixed zero-length rows: update README Exactness and this test"
    else:
        assert actual == expected


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_batch_size_one_all_zero_and_empty_batch(kind):
    decoder, joint = make_networks(tdt=kind == "tdt", seed=10, blank_bias=REALISTIC_BIAS[kind])
    x, lengths = random_encoder_output(1, 11, seed=11, lengths=[11])
    expected, actual = decode_both(kind, decoder, joint, x, lengths, 4, 3, return_best_hypothesis=False)
    assert actual == expected
    decode = fast_beam(kind, decoder, joint, 4, 3)
    x, lengths = random_encoder_output(3, 5, seed=11, lengths=[0, 0, 0])
    hyps = decode(encoder_output=x, encoded_lengths=lengths)[0]
    assert [as_tuple(h)[0] for h in hyps] == [(), (), ()] and [h.score for h in hyps] == [0.0, 0.0, 0.0]
    empty = decode(encoder_output=torch.zeros(0, 16, 5), encoded_lengths=torch.zeros(0, dtype=torch.long))[0]
    assert empty == []


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_hypothesis_does_not_depend_on_the_rest_of_the_batch(kind):
    decoder, joint = make_networks(tdt=kind == "tdt", seed=12, blank_bias=REALISTIC_BIAS[kind])
    decode = fast_beam(kind, decoder, joint, 4, 3, return_best_hypothesis=False)
    x, lengths = random_encoder_output(5, 19, seed=13)
    together = as_tuples(decode(encoder_output=x, encoded_lengths=lengths)[0], True)
    # change every other row (values and lengths, one to 0) and decode again: row 2 must not change
    x2, lengths2 = random_encoder_output(5, 19, seed=14)
    x2[2], lengths2[2], lengths2[4] = x[2], lengths[2], 0
    changed = as_tuples(decode(encoder_output=x2, encoded_lengths=lengths2)[0], True)
    alone = as_tuples(decode(encoder_output=x[2:3, :, : int(lengths[2])], encoded_lengths=lengths[2:3])[0], True)
    assert changed[2] == together[2] and alone[0] == together[2]
    assert len(together[2]) > 1


def test_bad_beam_sizes_and_partial_hypotheses_are_rejected():
    decoder, joint = make_networks()
    for beam_size in (0, 17, VOCAB_SIZE + 1):
        with pytest.raises(ValueError, match=rf"beam_size must be an int in 1\.\.{VOCAB_SIZE}.*got {beam_size}"):
            fast_beam("rnnt", decoder, joint, beam_size, 3)
    decode = fast_beam("rnnt", decoder, joint, 2, 3)
    x, lengths = random_encoder_output(1, 5, lengths=[5])
    with pytest.raises(NotImplementedError, match="does not continue partial_hypotheses.*decoding_computer"):
        decode(encoder_output=x, encoded_lengths=lengths, partial_hypotheses=[None])
    with pytest.raises(ValueError, match=r"in \[0, T=5\]"):
        decode(encoder_output=x, encoded_lengths=lengths + 1)


def test_forcing_a_graph_mode_on_cpu_is_an_error():
    decoder, joint = make_networks()
    decode = fast_beam("rnnt", decoder, joint, 2, 3, graph_mode="no_while_graph")
    x, lengths = random_encoder_output(2, 5)
    with pytest.raises(ValueError, match="no_while_graph.*needs a CUDA device"):
        decode(encoder_output=x, encoded_lengths=lengths)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bf16_weights_search_as_malsd_batch(kind, seed):
    """With bf16 weights NeMo normalises, ranks and adds in bf16, where ties are common: the same tokens, timestamps,
    durations and scores, bit for bit (each beam's candidates by NeMo's own log-softmax and ``torch.topk``)."""
    decoder, joint = make_networks(tdt=kind == "tdt", seed=seed, blank_bias=REALISTIC_BIAS[kind] - 0.3, pred_layers=2)
    decoder, joint = decoder.to(torch.bfloat16), joint.to(torch.bfloat16)
    x, lengths = random_encoder_output(8, 40, seed=seed + 1, lengths=[40, 3, 2, 33, 20, 1, 40, 25])
    expected, actual = decode_both(kind, decoder, joint, x.to(torch.bfloat16), lengths, 4, 10)
    assert sum(len(tokens) for tokens, *_ in expected) > 0, "setup: the networks should emit tokens"
    assert actual == expected
