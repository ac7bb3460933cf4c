"""fast_beam on the networks of NeMo's model tests (see test_greedy_edge_cases.py): NeMo's ``malsd_batch`` hypotheses.

* Networks without parameters (a hand-written prediction network and joint) search as ``malsd_batch`` does.
* A ``blank_index`` below the joint's last token output: RNN-T ``malsd_batch`` ranks every output but the blank as a
  label (those past the blank too), and so does our beam step (its top-k leaves out the blank column wherever it
  is): same hypotheses, on the torch path and on the Triton kernels (here in the interpreter). NeMo's TDT search
  scores a forced blank by the last token output instead: fast_beam refuses that layout, naming ``malsd_batch``.

Baseline: NeMo's ``BeamBatchedRNNTInfer`` / ``BeamBatchedTDTInfer`` (``search_type='malsd_batch'``, no CUDA graphs).
"""

from __future__ import annotations

import pytest
from conftest import TDT_DURATIONS, VOCAB_SIZE, make_networks, random_encoder_output
from nemo.collections.asr.parts.submodules.rnnt_beam_decoding import BeamBatchedRNNTInfer
from nemo.collections.asr.parts.submodules.tdt_beam_decoding import BeamBatchedTDTInfer
from test_beam_exactness import as_tuples
from test_greedy_edge_cases import TINY_BLANK, ParameterlessDecoder, ParameterlessJoint, tiny_encoder_output

from nemo_fastdecode.beam import FastBeamBatchedInfer, malsd

pytestmark = pytest.mark.usefixtures("single_thread")


def nemo_malsd(decoder, joint, blank_index: int, beam_size: int, max_symbols: int, durations=None):
    common = dict(beam_size=beam_size, max_symbols_per_step=max_symbols, allow_cuda_graphs=False)
    if durations:
        return BeamBatchedTDTInfer(decoder, joint, durations, blank_index, search_type="malsd_batch", **common)
    return BeamBatchedRNNTInfer(decoder, joint, blank_index, search_type="malsd_batch", **common)


def fast_beam(decoder, joint, blank_index: int, beam_size: int, max_symbols: int, durations=None, **options):
    return FastBeamBatchedInfer(
        decoder, joint, blank_index, beam_size, max_symbols_per_step=max_symbols, durations=durations, **options
    )


@pytest.mark.parametrize("return_best_hypothesis", [True, False], ids=["best", "nbest"])
@pytest.mark.parametrize("max_symbols", [1, 5])
def test_parameterless_networks_search_like_malsd_batch(max_symbols, return_best_hypothesis):
    decoder, joint = ParameterlessDecoder(), ParameterlessJoint()
    assert next(decoder.parameters(), None) is None and next(joint.parameters(), None) is None
    x, lengths = tiny_encoder_output(lengths=(20, 3, 14, 5, 20))
    nemo = nemo_malsd(decoder, joint, TINY_BLANK, 2, max_symbols)
    nemo.return_best_hypothesis = return_best_hypothesis
    expected = as_tuples(nemo(encoder_output=x, encoded_lengths=lengths)[0], nbest=not return_best_hypothesis)
    best = expected if return_best_hypothesis else [nbest[0] for nbest in expected]
    assert sum(len(tokens) for tokens, *_ in best) > 0, "setup: the searches should emit labels"
    ours = fast_beam(decoder, joint, TINY_BLANK, 2, max_symbols, return_best_hypothesis=return_best_hypothesis)
    assert as_tuples(ours(encoder_output=x, encoded_lengths=lengths)[0], nbest=not return_best_hypothesis) == expected


@pytest.mark.parametrize("fused_topk", [False, True], ids=["torch", "triton"])
def test_blank_below_the_last_token_output_searches_like_malsd_batch(fused_topk):
    decoder, joint = make_networks(seed=3, blank_bias=0.9)
    blank = VOCAB_SIZE - 1  # the joint's output VOCAB_SIZE is then a label (and, shifted by blank_bias, a frequent one)
    x, lengths = random_encoder_output(2, 6, seed=4)  # small: the Triton interpreter is slow
    expected = as_tuples(nemo_malsd(decoder, joint, blank, 2, 3)(encoder_output=x, encoded_lengths=lengths)[0], False)
    assert any(VOCAB_SIZE in tokens for tokens, *_ in expected), "setup: NeMo emits the output past the blank"
    ours = fast_beam(decoder, joint, blank, 2, 3, fused_topk=fused_topk)
    actual = as_tuples(ours(encoder_output=x, encoded_lengths=lengths)[0], False)
    assert [hyp[:3] for hyp in actual] == [hyp[:3] for hyp in expected]
    # the Triton kernel's log-softmax agrees with torch's to float32 rounding (the torch path bit for bit)
    tolerance = {"rel": 1e-6, "abs": 1e-5} if fused_topk else {"rel": 0, "abs": 0}
    assert [hyp[3] for hyp in actual] == pytest.approx([hyp[3] for hyp in expected], **tolerance)


def test_tdt_blank_below_the_last_token_output_is_refused(monkeypatch):
    """NeMo's TDT malsd_batch scores a forced blank by the joint's last token output, not by ``blank_index``: fast_beam
    refuses the layout (naming malsd_batch) rather than return other hypotheses."""
    decoder, joint = make_networks(tdt=True, seed=3, blank_bias=0.9)
    blank = VOCAB_SIZE - 1
    x, lengths = random_encoder_output(4, 16, seed=4)
    expected = as_tuples(
        nemo_malsd(decoder, joint, blank, 2, 3, TDT_DURATIONS)(encoder_output=x, encoded_lengths=lengths)[0], False
    )
    assert any(len(tokens) > 0 for tokens, *_ in expected), "setup: the searches should emit labels"
    last = VOCAB_SIZE
    message = rf"fast_beam \(TDT\).*last token output is {last}, got blank_index={last - 1}.*malsd_batch"
    with pytest.raises(ValueError, match=message):
        fast_beam(decoder, joint, blank, 2, 3, TDT_DURATIONS)
    fast_beam(decoder, joint, VOCAB_SIZE, 2, 3, TDT_DURATIONS)  # the last token output is fine
    # why: searched with the blank where blank_index says, the hypotheses are not NeMo's
    monkeypatch.setattr(malsd, "check_blank_is_last_token", lambda *args: None)
    unchecked = fast_beam(decoder, joint, blank, 2, 3, TDT_DURATIONS)(encoder_output=x, encoded_lengths=lengths)[0]
    assert as_tuples(unchecked, False) != expected
