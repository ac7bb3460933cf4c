"""fast_greedy returns NeMo's baseline hypotheses: same tokens and frames (and TDT durations), same scores.

Baselines: RNN-T -> NeMo ``greedy_batch`` with ``loop_labels=False`` and no graphs (the frame loop);
TDT -> NeMo ``greedy_batch`` without graphs (NeMo has only the label loop for TDT). Scores agree to
float32 rounding: on the CPU NeMo's frame loop log-softmaxes the joint output twice, so bitwise
equality of scores is not expected there (see README, Exactness).
"""

from __future__ import annotations

import pytest
import torch
from conftest import GREEDY_UNBOUNDED_SAFE, TDT_DURATIONS, VOCAB_SIZE, make_networks, random_encoder_output
from nemo.collections.asr.parts.submodules.rnnt_greedy_decoding import GreedyBatchedRNNTInfer, GreedyBatchedTDTInfer

from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer

# blank-logit shifts: about 0.3 labels per frame, never blank (max_symbols labels every frame), always blank
REALISTIC_BIAS = {"rnnt": 0.9, "tdt": 0.5}
UNBOUNDED_SAFE = GREEDY_UNBOUNDED_SAFE
NEVER_BLANK, ALWAYS_BLANK = -6.0, 6.0
SCORE_RTOL = 1e-5


def baseline(kind: str, decoder, joint, max_symbols, loop_labels: bool = False, use_cuda_graph_decoder: bool = False):
    """NeMo's greedy_batch: for RNN-T the frame loop (``loop_labels=True``: the label loop), for TDT the label loop."""
    if kind == "tdt":
        return GreedyBatchedTDTInfer(
            decoder,
            joint,
            VOCAB_SIZE,
            durations=TDT_DURATIONS,
            max_symbols_per_step=max_symbols,
            use_cuda_graph_decoder=use_cuda_graph_decoder,
            include_duration=True,
        )
    return GreedyBatchedRNNTInfer(
        decoder,
        joint,
        VOCAB_SIZE,
        max_symbols_per_step=max_symbols,
        loop_labels=loop_labels,
        use_cuda_graph_decoder=use_cuda_graph_decoder,
    )


def ours(kind: str, decoder, joint, max_symbols, loop_labels=True, graph_mode="auto", **options):
    """fast_greedy on these networks; ``options``: further FastGreedyBatchedInfer arguments (e.g. fast_math)."""
    return FastGreedyBatchedInfer(
        decoder,
        joint,
        VOCAB_SIZE,
        max_symbols_per_step=max_symbols,
        durations=TDT_DURATIONS if kind == "tdt" else None,
        loop_labels=loop_labels,
        graph_mode=graph_mode,
        include_duration=kind == "tdt",
        **options,
    )


def as_lists(hyp, with_durations: bool):
    fields = [list(map(int, hyp.y_sequence)), list(map(int, hyp.timestamp))]
    if with_durations:
        fields.append(list(map(int, hyp.token_duration)))
    return fields


def assert_same_hypotheses(expected, actual, with_durations: bool = False):
    assert len(expected) == len(actual)
    for row, (e, a) in enumerate(zip(expected, actual, strict=True)):
        assert as_lists(e, with_durations) == as_lists(a, with_durations), f"row {row} differs"
        assert a.score == pytest.approx(e.score, rel=SCORE_RTOL, abs=SCORE_RTOL), f"row {row} score"


ALGORITHMS = [("rnnt", False), ("rnnt", True), ("tdt", True)]  # (model kind, loop_labels)


@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=["rnnt-frame", "rnnt-label", "tdt-label"])
@pytest.mark.parametrize("max_symbols", [1, 3, 10, None])
@pytest.mark.parametrize("regime", ["realistic", "never_blank", "always_blank"])
def test_matches_nemo_baseline(kind, loop_labels, max_symbols, regime):
    if regime == "never_blank" and max_symbols is None:
        pytest.skip("without max_symbols a model that never emits blank never stops (NeMo's baseline hangs too)")
    seed, realistic = (3, REALISTIC_BIAS[kind]) if max_symbols is not None else UNBOUNDED_SAFE[kind]
    bias = {"realistic": realistic, "never_blank": NEVER_BLANK, "always_blank": ALWAYS_BLANK}[regime]
    decoder, joint = make_networks(tdt=kind == "tdt", seed=seed, blank_bias=bias)
    x, lengths = random_encoder_output(6, 24, seed=4, lengths=[24, 1, 17, 0, 9, 24])  # ragged, with a zero row
    expected = baseline(kind, decoder, joint, max_symbols)(encoder_output=x, encoded_lengths=lengths)[0]
    actual = ours(kind, decoder, joint, max_symbols, loop_labels)(encoder_output=x, encoded_lengths=lengths)[0]
    # NeMo's TDT loop records, for a row that found its label before others, the duration of a later inner
    # step (it overwrites `durations` for every row); per utterance the durations are compared below.
    assert_same_hypotheses(expected, actual, with_durations=False)
    if regime == "realistic":
        assert sum(len(h.y_sequence) for h in actual) > 0, "test setup should emit labels"
    if regime == "never_blank" and kind == "rnnt":  # (TDT durations skip frames)
        assert [len(h.y_sequence) for h in actual] == [n * max_symbols for n in lengths.tolist()]
    if regime == "always_blank":
        assert all(len(h.y_sequence) == 0 for h in actual)


@pytest.mark.parametrize("max_symbols", [2, 10])
def test_tdt_durations_match_baseline_per_utterance(max_symbols):
    decoder, joint = make_networks(tdt=True, seed=5, blank_bias=REALISTIC_BIAS["tdt"])
    x, lengths = random_encoder_output(4, 29, seed=6)
    batched = ours("tdt", decoder, joint, max_symbols)(encoder_output=x, encoded_lengths=lengths)[0]
    for row in range(4):
        single = (x[row : row + 1], lengths[row : row + 1])
        expected = baseline("tdt", decoder, joint, max_symbols)(encoder_output=single[0], encoded_lengths=single[1])[0]
        assert_same_hypotheses(expected, [batched[row]], with_durations=True)
        assert all(d in TDT_DURATIONS for d in batched[row].token_duration.tolist())


@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=["rnnt-frame", "rnnt-label", "tdt-label"])
def test_batch_size_one_and_all_zero_lengths(kind, loop_labels):
    decoder, joint = make_networks(tdt=kind == "tdt", seed=7, blank_bias=REALISTIC_BIAS[kind])
    decode = ours(kind, decoder, joint, 5, loop_labels)
    x, lengths = random_encoder_output(1, 11, seed=8, lengths=[11])
    expected = baseline(kind, decoder, joint, 5)(encoder_output=x, encoded_lengths=lengths)[0]
    assert_same_hypotheses(expected, decode(encoder_output=x, encoded_lengths=lengths)[0])
    x, lengths = random_encoder_output(3, 5, seed=8, lengths=[0, 0, 0])
    hyps = decode(encoder_output=x, encoded_lengths=lengths)[0]
    assert [len(h.y_sequence) for h in hyps] == [0, 0, 0] and [h.score for h in hyps] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=["rnnt-frame", "rnnt-label", "tdt-label"])
def test_hypothesis_does_not_depend_on_the_rest_of_the_batch(kind, loop_labels):
    decoder, joint = make_networks(tdt=kind == "tdt", seed=9, blank_bias=REALISTIC_BIAS[kind])
    decode = ours(kind, decoder, joint, 4, loop_labels)
    x, lengths = random_encoder_output(5, 19, seed=10)
    together = decode(encoder_output=x, encoded_lengths=lengths)[0]
    # change every other row (values and lengths) and decode again: row 2 must not change
    x2, lengths2 = random_encoder_output(5, 19, seed=11)
    x2[2], lengths2[2] = x[2], lengths[2]
    changed = decode(encoder_output=x2, encoded_lengths=lengths2)[0]
    alone = decode(encoder_output=x[2:3, :, : int(lengths[2])], encoded_lengths=lengths[2:3])[0]
    for other in (changed[2], alone[0]):
        assert as_lists(other, kind == "tdt") == as_lists(together[2], kind == "tdt")
        assert other.score == pytest.approx(together[2].score, rel=SCORE_RTOL)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("max_symbols", [2, None])
def test_partial_hypotheses_continue_like_nemo(kind, max_symbols):
    """Chunk-by-chunk decoding (as cache-aware streaming does) equals NeMo's label loop fed the same chunks."""
    seed, bias = UNBOUNDED_SAFE[kind] if max_symbols is None else (3, REALISTIC_BIAS[kind])
    decoder, joint = make_networks(tdt=kind == "tdt", seed=seed, blank_bias=bias)
    x, lengths = random_encoder_output(3, 24, seed=4, lengths=[24, 24, 24])
    if kind == "tdt":
        nemo = baseline(kind, decoder, joint, max_symbols)
    else:
        nemo = GreedyBatchedRNNTInfer(
            decoder,
            joint,
            VOCAB_SIZE,
            max_symbols_per_step=max_symbols,
            loop_labels=True,
            use_cuda_graph_decoder=False,
        )
    fast = ours(kind, decoder, joint, max_symbols)
    nemo_hyps = fast_hyps = None
    for start in range(0, 24, 8):
        chunk = x[:, :, start : start + 8].contiguous()
        chunk_lengths = torch.full([3], 8, dtype=torch.long)
        nemo_hyps = nemo(encoder_output=chunk, encoded_lengths=chunk_lengths, partial_hypotheses=nemo_hyps)[0]
        fast_hyps = fast(encoder_output=chunk, encoded_lengths=chunk_lengths, partial_hypotheses=fast_hyps)[0]
    assert_same_hypotheses(nemo_hyps, fast_hyps)
    assert sum(len(h.y_sequence) for h in fast_hyps) > 0


def test_frame_and_label_loop_agree_with_each_other():
    decoder, joint = make_networks(seed=14, blank_bias=REALISTIC_BIAS["rnnt"])
    x, lengths = random_encoder_output(7, 31, seed=15)
    frame = ours("rnnt", decoder, joint, 3, loop_labels=False)(encoder_output=x, encoded_lengths=lengths)[0]
    label = ours("rnnt", decoder, joint, 3, loop_labels=True)(encoder_output=x, encoded_lengths=lengths)[0]
    assert_same_hypotheses(frame, label)


@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=["rnnt-frame", "rnnt-label", "tdt-label"])
def test_unbounded_symbols_grow_storage_instead_of_dropping_labels(kind, loop_labels, monkeypatch):
    """With max_symbols=None storage is a guess; a row that fills it makes the batch run again with more room."""
    from nemo_fastdecode.greedy.base import GreedyComputerBase

    # start from storage far too small for the test inputs (1 slot per 8 frames) to exercise the regrowth
    monkeypatch.setattr(GreedyComputerBase, "_capacity", lambda self, t: max(t, 1) * self._symbols_per_frame // 16 + 1)
    seed, bias = UNBOUNDED_SAFE[kind]
    decoder, joint = make_networks(tdt=kind == "tdt", seed=seed, blank_bias=bias)
    x, lengths = random_encoder_output(6, 24, seed=4, lengths=[24, 1, 17, 0, 9, 24])
    expected = baseline(kind, decoder, joint, None)(encoder_output=x, encoded_lengths=lengths)[0]
    decode = ours(kind, decoder, joint, None, loop_labels)
    actual = decode(encoder_output=x, encoded_lengths=lengths)[0]
    assert decode.computer._symbols_per_frame > 2, "setup: storage should have grown"
    assert max(len(h.y_sequence) for h in actual) > 24 * 2 // 16 + 1, "setup: a row longer than the first storage"
    assert_same_hypotheses(expected, actual)


@pytest.mark.parametrize("loop_labels", [False, True])
def test_unbounded_symbols_on_a_model_that_never_stops_raise(loop_labels):
    """NeMo's baseline loops forever here; we stop with an error that says what to set.

    No limit: max_symbols unset and graphs disallowed (with graphs allowed NeMo's rule sets 10)."""
    decoder, joint = make_networks(seed=3, blank_bias=NEVER_BLANK)
    x, lengths = random_encoder_output(2, 2, seed=4)
    decode = ours("rnnt", decoder, joint, None, loop_labels, use_cuda_graph_decoder=False)
    assert decode.computer.max_symbols is None
    with pytest.raises(RuntimeError, match="max_symbols"):
        decode(encoder_output=x, encoded_lengths=lengths)


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_training_modules_decode_in_eval_and_are_restored(strategy):
    from nemo_fastdecode.beam import FastBeamBatchedInfer

    decoder, joint = make_networks(seed=1)
    decoder.train()  # e.g. decoding for validation inside a training loop; the joint stays in eval
    if strategy == "greedy":
        infer = FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, max_symbols_per_step=3, graph_mode="eager")
    else:
        infer = FastBeamBatchedInfer(decoder, joint, VOCAB_SIZE, beam_size=2, graph_mode="eager")
    seen = []
    inner = infer.computer.__class__.__call__

    class Recording(infer.computer.__class__):
        def __call__(self, *args, **kwargs):
            seen.append((decoder.training, decoder.prediction.training, joint.training))
            return inner(self, *args, **kwargs)

    infer.computer.__class__ = Recording
    x, lengths = random_encoder_output(2, 5)
    infer(encoder_output=x, encoded_lengths=lengths)
    assert seen == [(False, False, False)]
    assert decoder.training and decoder.prediction.training and not joint.training


def test_a_decoder_built_on_the_cpu_does_not_warm_up():
    decoder, joint = make_networks(seed=3)
    assert ours("rnnt", decoder, joint, 10).warm_up_seconds is None
