"""GPU behaviour of fast_beam: every graph mode against NeMo's malsd_batch, both top-k paths, graph lifetime.

Marked ``gpu``: skipped on machines without CUDA (CI); run on a GPU host with ``pytest -m gpu``.
With ``fused_topk=False`` the log-probabilities and the step's selection are PyTorch's, so results must be
identical; the Triton kernels' agree to float32 rounding (measured on an H200: scores differ in the 7th digit),
so with them tokens, timestamps and n-best order must be identical and scores equal to a relative 1e-6.
"""

from __future__ import annotations

import pytest
from conftest import make_networks, random_encoder_output
from test_beam_exactness import REALISTIC_BIAS, as_tuples, fast_beam, nemo_malsd

from nemo_fastdecode.graphs import GraphMode
from nemo_fastdecode.graphs.cuda_api import while_nodes_unavailable_reason

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("exact_fp32")]
MODES = ["full_graph", "no_while_graph", "eager"]
SCORE_RTOL = 1e-6  # Triton's log-softmax rounds differently from PyTorch's


def assert_same(actual, expected, exact_scores: bool):
    """Same hypotheses (tokens, timestamps, order); scores bit-identical or equal to float32 rounding."""
    if exact_scores:
        assert actual == expected
        return
    strip = [[t[:-1] for t in row] if isinstance(row, list) else row[:-1] for row in actual]
    assert strip == [[t[:-1] for t in row] if isinstance(row, list) else row[:-1] for row in expected]
    scores = [[t[-1] for t in row] if isinstance(row, list) else [row[-1]] for row in actual]
    expected_scores = [[t[-1] for t in row] if isinstance(row, list) else [row[-1]] for row in expected]
    for got, want in zip(scores, expected_scores, strict=True):
        assert got == pytest.approx(want, rel=SCORE_RTOL, abs=SCORE_RTOL)


def cuda_networks(kind, seed):
    decoder, joint = make_networks(tdt=kind == "tdt", seed=seed, blank_bias=REALISTIC_BIAS[kind])
    return decoder.cuda(), joint.cuda()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("beam_size", [1, 4])
@pytest.mark.parametrize("fused_topk", [False, True], ids=["torch_topk", "triton_topk"])
def test_every_mode_matches_malsd_batch_on_gpu(mode, kind, beam_size, fused_topk):
    decoder, joint = cuda_networks(kind, seed=21)
    x, lengths = random_encoder_output(9, 41, seed=22, lengths=[41, 3, 1, 40, 17, 1, 41, 25, 8], device="cuda")
    expected = nemo_malsd(kind, decoder, joint, beam_size, 3, return_best_hypothesis=False)(
        encoder_output=x, encoded_lengths=lengths
    )[0]
    decode = fast_beam(kind, decoder, joint, beam_size, 3, return_best_hypothesis=False, graph_mode=mode)
    decode.computer.fused_topk = fused_topk
    for _ in range(2):  # the second call replays the captured graph
        actual = decode(encoder_output=x, encoded_lengths=lengths)[0]
        assert_same(as_tuples(actual, True), as_tuples(expected, True), exact_scores=not fused_topk)
    if mode == "full_graph" and while_nodes_unavailable_reason(x.device) is None:
        assert decode.computer.graph_mode is GraphMode.FULL_GRAPH


@pytest.mark.parametrize("mode", ["full_graph", "no_while_graph"])
def test_graphs_are_reused_for_smaller_batches_and_recaptured_when_larger(mode):
    decoder, joint = cuda_networks("rnnt", seed=23)
    decode = fast_beam("rnnt", decoder, joint, 4, 3, graph_mode=mode)
    x, lengths = random_encoder_output(6, 30, seed=24, device="cuda")
    decode(encoder_output=x, encoded_lengths=lengths)
    buffers = decode.computer._buffers
    small = (x[:2, :, :20].contiguous(), lengths[:2].clamp(max=20))
    expected = nemo_malsd("rnnt", decoder, joint, 4, 3)(encoder_output=small[0], encoded_lengths=small[1])[0]
    actual = decode(encoder_output=small[0], encoded_lengths=small[1])[0]
    assert decode.computer._buffers is buffers, "a smaller batch must replay the captured graph"
    assert_same(as_tuples(actual, False), as_tuples(expected, False), exact_scores=False)
    big, big_lengths = random_encoder_output(8, 45, seed=25, device="cuda")
    decode(encoder_output=big, encoded_lengths=big_lengths)
    assert decode.computer._buffers is not buffers and decode.computer._buffers.max_time >= 45


def test_auto_mode_uses_while_nodes_where_the_driver_has_them():
    decoder, joint = cuda_networks("tdt", seed=26)
    decode = fast_beam("tdt", decoder, joint, 2, 3)
    x, lengths = random_encoder_output(3, 20, seed=27, device="cuda")
    decode(encoder_output=x, encoded_lengths=lengths)
    expected = GraphMode.NO_WHILE_GRAPH if while_nodes_unavailable_reason(x.device) else GraphMode.FULL_GRAPH
    assert decode.computer.graph_mode is expected


@pytest.mark.parametrize("mode", ["full_graph", "eager"])
@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_compiled_step_matches_the_exact_search(mode, kind):
    """Experimental compiled_step (torch.compile of the step's torch parts): the same n-best lists."""
    decoder, joint = cuda_networks(kind, seed=21)
    x, lengths = random_encoder_output(9, 41, seed=22, lengths=[41, 3, 1, 40, 17, 1, 41, 25, 8], device="cuda")
    expected = fast_beam(kind, decoder, joint, 4, 3, return_best_hypothesis=False, graph_mode=mode, fused_topk=False)
    compiled = fast_beam(
        kind, decoder, joint, 4, 3, return_best_hypothesis=False, graph_mode=mode, fused_topk=False, compiled_step=True
    )
    for _ in range(2):  # the second call replays the captured graph
        actual = as_tuples(compiled(encoder_output=x, encoded_lengths=lengths)[0], nbest=True)
        assert_same(actual, as_tuples(expected(encoder_output=x, encoded_lengths=lengths)[0], nbest=True), False)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("fused_topk", [False, True], ids=["torch_topk", "triton_topk"])
def test_chunks_in_every_mode_match_malsd_batch_on_gpu(mode, kind, fused_topk):
    """Chunk by chunk (tests/test_beam_chunks.py) in every graph mode: NeMo's computer's n-best lists, every chunk
    replaying the graphs captured for a longer batch; a whole-utterance search after the chunks begins afresh."""
    from test_beam_chunks import bounds_of, decode_in_chunks

    decoder, joint = cuda_networks(kind, seed=21)
    # streams of one length: NeMo's RNN-T search decodes the padding of rows whose chunk has no frames
    x, lengths = random_encoder_output(4, 30, seed=22, lengths=[30, 30, 30, 30], device="cuda")
    bounds = bounds_of("uneven", 30)
    nemo = nemo_malsd(kind, decoder, joint, 4, 3, return_best_hypothesis=False)
    expected, _ = decode_in_chunks(nemo.decoding_computer, x, lengths, bounds, nbest=True)
    decode = fast_beam(kind, decoder, joint, 4, 3, return_best_hypothesis=False, graph_mode=mode, fused_topk=fused_topk)
    whole = as_tuples(decode(encoder_output=x, encoded_lengths=lengths)[0], True)
    buffers = decode.computer._buffers
    actual, _ = decode_in_chunks(decode.decoding_computer, x, lengths, bounds, nbest=True)
    assert sum(len(h[0]) for row in actual for h in row) > 0
    assert_same(actual, expected, exact_scores=not fused_topk)
    if mode != "eager":
        assert decode.computer._buffers is buffers, "every chunk must replay the graphs captured for 30 frames"
    assert as_tuples(decode(encoder_output=x, encoded_lengths=lengths)[0], True) == whole
