"""fast_beam decodes streams chunk by chunk exactly as NeMo's malsd_batch does.

NeMo 3.0 continues a ``malsd_batch`` search only through its computer: ``decoding_computer(x [B, T, D], out_len,
prev_batched_state) -> (BatchedBeamHyps, BatchedBeamState)``, the chunks' hypotheses joined with
``BatchedBeamHyps.flatten_`` and ``merge_(..., is_chunk_continuation=True, boundary_prev_ptr=...)`` (NeMo's
``test_streaming_beam_decoding.py`` does it so). Baseline: NeMo's ``ModifiedALSDBatched{RNNT,TDT}Computer`` (torch
path, no CUDA graphs) on the same tiny random networks, encoder outputs and chunks. On the CPU our search runs
NeMo's floating-point operations, so tokens, timestamps, TDT durations, scores, n-best lists and every field of
the state between chunks are compared with ``==``.

Deliberate difference, as offline (README, Exactness): NeMo's RNN-T search decodes the padding frame of a row whose
chunk has no frames when other rows of the batch have some, so a stream that ended keeps gaining labels; ours keeps
such a row as it is, as NeMo does when that stream is decoded alone. Rows are therefore compared with NeMo decoding
each stream alone (scores to float32 rounding: the CPU's GEMMs round a batch of one differently in the last bit),
and whole batches, exactly, where no row has an empty chunk while another has frames.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_networks, random_encoder_output
from nemo.collections.asr.parts.submodules.transducer_decoding.label_looping_base import BatchedBeamState
from test_beam_exactness import REALISTIC_BIAS, UNBOUNDED_SAFE, as_tuple, fast_beam, nemo_malsd
from test_beam_gpu import assert_same

from nemo_fastdecode.beam import malsd as malsd_module

pytestmark = pytest.mark.usefixtures("single_thread")

MAX_TIME = 20
LENGTHS = [20, 13, 6]  # the shorter streams end early: their later chunks have no frames
# (seed, blank shift) of networks whose every beam comes back to blank with max_symbols=None and emits labels
CHUNKS_UNBOUNDED_SAFE = {"rnnt": UNBOUNDED_SAFE["rnnt"], "tdt": (20, 0.0)}
STATE_FIELDS = ["labels", "decoded_lengths", "time_jumps", "scores", "transcript_hash", "current_lengths_nb",
                "last_timestamp_lasts", "predictor_outputs", "predictor_states"]  # fmt: skip


def bounds_of(chunking: str, max_time: int = MAX_TIME) -> list[int]:
    """Chunk boundaries ``[0, ..., max_time]``: one frame each, uneven sizes, or the whole utterance."""
    sizes = {"one_frame": [1], "uneven": [3, 1, 5, 2, 7], "whole": [max_time]}[chunking]
    bounds, i = [0], 0
    while bounds[-1] < max_time:
        bounds.append(min(bounds[-1] + sizes[i % len(sizes)], max_time))
        i += 1
    return bounds


@torch.no_grad()
def decode_in_chunks(computer, x, lengths, bounds, nbest=False):
    """Decode ``x [B, D, T]`` chunk by chunk as NeMo's streaming beam tests do (outside inference mode: ``flatten_``
    and ``merge_`` update the chunks' hypotheses in place); returns (hypotheses as tuples (:func:`as_tuple`; n-best:
    lists of them), the state after each chunk)."""
    x = x.transpose(1, 2)
    joined, states, state = None, [], None
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        out_len = (lengths - start).clamp(min=0, max=stop - start)
        hyps, state = computer(x=x[:, start:stop], out_len=out_len, prev_batched_state=state)
        states.append(state)
        roots = hyps.flatten_()
        if joined is None:
            joined = hyps
        else:
            joined.merge_(hyps, is_chunk_continuation=True, boundary_prev_ptr=roots)
    if nbest:
        return [[as_tuple(h) for h in n.n_best_hypotheses] for n in joined.to_nbest_hyps_list(score_norm=True)], states
    return [as_tuple(h) for h in joined.to_hyps_list(score_norm=True)], states


def assert_same_states(actual: list[BatchedBeamState], expected: list[BatchedBeamState]) -> None:
    assert len(actual) == len(expected)
    for chunk, (ours, nemo) in enumerate(zip(actual, expected, strict=True)):
        for name in STATE_FIELDS:
            got, want = getattr(ours, name), getattr(nemo, name)
            if name == "predictor_states":
                assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
            elif want is None:
                assert got is None, f"chunk {chunk}: {name}"
            else:
                assert torch.equal(got, want), f"chunk {chunk}: {name}\n{got}\n{want}"


class Alternating:
    """The computers in turn, one chunk each."""

    def __init__(self, *computers):
        self.computers, self.calls = computers, 0

    def __call__(self, **kwargs):
        self.calls += 1
        return self.computers[(self.calls - 1) % len(self.computers)](**kwargs)


def emitted(hyps) -> int:
    rows = [row if isinstance(row, list) else [row] for row in hyps]
    return sum(len(h[0]) for row in rows for h in row)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("beam_size", [1, 2, 4])
@pytest.mark.parametrize("chunking", ["one_frame", "uneven"])
def test_chunks_match_malsd_batch(kind, beam_size, chunking):
    """Streams of different lengths, chunk by chunk: NeMo's best hypotheses, and its states after every chunk."""
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=REALISTIC_BIAS[kind])
    x, lengths = random_encoder_output(len(LENGTHS), MAX_TIME, seed=4, lengths=LENGTHS)
    bounds = bounds_of(chunking)
    ours = fast_beam(kind, decoder, joint, beam_size, 3).decoding_computer
    actual, _ = decode_in_chunks(ours, x, lengths, bounds)
    assert emitted(actual) > 0, "setup: the networks should emit labels"
    for row in range(len(LENGTHS)):
        alone = nemo_malsd(kind, decoder, joint, beam_size, 3).decoding_computer
        expected, _ = decode_in_chunks(alone, x[row : row + 1], lengths[row : row + 1], bounds)
        # the CPU's GEMMs round a batch of one stream differently in the last bit: scores to float32 rounding
        assert_same([actual[row]], expected, exact_scores=False)
    # the whole batch and its states, where NeMo's RNN-T search decodes no padding (all streams as long)
    same_lengths = torch.full_like(lengths, MAX_TIME)
    expected, expected_states = decode_in_chunks(
        nemo_malsd(kind, decoder, joint, beam_size, 3).decoding_computer, x, same_lengths, bounds
    )
    actual, actual_states = decode_in_chunks(ours, x, same_lengths, bounds)
    assert actual == expected
    assert_same_states(actual_states, expected_states)
    if kind == "tdt":  # NeMo's TDT search keeps rows without frames as they are: the ragged batch compares whole
        expected, expected_states = decode_in_chunks(
            nemo_malsd(kind, decoder, joint, beam_size, 3).decoding_computer, x, lengths, bounds
        )
        actual, actual_states = decode_in_chunks(ours, x, lengths, bounds)
        assert actual == expected
        assert_same_states(actual_states, expected_states)
        assert any(bool((s.time_jumps > 0).any()) for s in actual_states), "setup: beams should jump chunk ends"


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("score_norm", [True, False], ids=["norm", "raw"])
def test_chunks_nbest_match_malsd_batch(kind, score_norm):
    decoder, joint = make_networks(tdt=kind == "tdt", seed=8, blank_bias=REALISTIC_BIAS[kind])
    x, lengths = random_encoder_output(2, MAX_TIME, seed=9, lengths=[MAX_TIME, MAX_TIME])
    bounds = bounds_of("uneven")
    decoders = [
        build(kind, decoder, joint, 4, 2, return_best_hypothesis=False, score_norm=score_norm).decoding_computer
        for build in (nemo_malsd, fast_beam)
    ]
    expected, actual = (decode_in_chunks(d, x, lengths, bounds, nbest=True)[0] for d in decoders)
    assert actual == expected
    assert emitted(actual) > 0 and min(len(row) for row in actual) > 1, "setup: several hypotheses per stream"


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_finished_stream_gains_no_labels(kind):
    """A stream whose chunks have no frames any more keeps its hypotheses (NeMo's RNN-T search: not so)."""
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=REALISTIC_BIAS[kind])
    x, lengths = random_encoder_output(3, MAX_TIME, seed=4, lengths=LENGTHS)
    _, states = decode_in_chunks(
        fast_beam(kind, decoder, joint, 4, 3).decoding_computer, x, lengths, bounds_of("uneven")
    )
    ended = [i for i, s in enumerate(states) if int(s.decoded_lengths[2]) == LENGTHS[2]]
    assert len(ended) > 2, "setup: the short stream should end several chunks before the others"
    for name in ("scores", "current_lengths_nb", "transcript_hash", "labels"):
        first = getattr(states[ended[0]], name)[2]
        assert all(torch.equal(getattr(states[i], name)[2], first) for i in ended), name
    assert int(states[ended[0]].current_lengths_nb[2].max()) > 0, "setup: the short stream should have labels"


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("chunking", ["one_frame", "uneven"])
def test_one_beam_chunks_equal_whole_utterances(kind, chunking):
    """With one beam there is nothing for chunk ends to change: the chunked search is the whole-utterance search
    (tokens, timestamps, durations; scores to fp32 rounding: a chunk's joint GEMM has other shapes, which BLAS may
    round differently, e.g. MKL on AVX-512), for NeMo and for us."""
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=REALISTIC_BIAS[kind])
    x, lengths = random_encoder_output(len(LENGTHS), MAX_TIME, seed=4, lengths=LENGTHS)
    decode = fast_beam(kind, decoder, joint, 1, 3)
    whole = [as_tuple(h) for h in decode(encoder_output=x, encoded_lengths=lengths)[0]]
    chunked, _ = decode_in_chunks(decode.decoding_computer, x, lengths, bounds_of(chunking))
    assert emitted(whole) > 0
    assert [h[:3] for h in chunked] == [h[:3] for h in whole]
    assert [h[3] for h in chunked] == pytest.approx([h[3] for h in whole], rel=1e-6)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_several_beams_chunks_differ_from_whole_utterances_as_nemo_does(kind):
    """With several beams a chunk end holds back the beams that reach it first (they wait, inactive, while the
    others finish the chunk; in the whole utterance they would go on and compete at later frames), so chunked and
    whole-utterance searches may keep different beams. NeMo's do, on this input; ours equal NeMo's either way.
    One chunk holding the whole utterance is the whole-utterance search."""
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=REALISTIC_BIAS[kind])
    x, lengths = random_encoder_output(3, MAX_TIME, seed=4, lengths=[MAX_TIME] * 3)
    nemo, ours = nemo_malsd(kind, decoder, joint, 4, 3), fast_beam(kind, decoder, joint, 4, 3)
    whole = [as_tuple(h) for h in ours(encoder_output=x, encoded_lengths=lengths)[0]]
    assert whole == [as_tuple(h) for h in nemo(encoder_output=x, encoded_lengths=lengths)[0]]
    assert decode_in_chunks(ours.decoding_computer, x, lengths, bounds_of("whole"))[0] == whole
    chunked = decode_in_chunks(ours.decoding_computer, x, lengths, bounds_of("one_frame"))[0]
    assert chunked == decode_in_chunks(nemo.decoding_computer, x, lengths, bounds_of("one_frame"))[0]
    assert chunked != whole, "NeMo's chunked search now equals its whole-utterance search: update this test"


def test_chunk_without_frames_changes_nothing():
    """A chunk of T = 0 frames (NeMo's computer refuses one) leaves every stream as it is."""
    decoder, joint = make_networks(tdt=True, seed=3, blank_bias=REALISTIC_BIAS["tdt"])
    x, lengths = random_encoder_output(len(LENGTHS), MAX_TIME, seed=4, lengths=LENGTHS)
    computer = fast_beam("tdt", decoder, joint, 4, 3).decoding_computer
    bounds = bounds_of("uneven")
    expected, expected_states = decode_in_chunks(computer, x, lengths, bounds)
    with_empty = bounds[:3] + bounds[2:]  # a chunk [t, t) after the second
    actual, actual_states = decode_in_chunks(computer, x, lengths, with_empty)
    assert actual == expected and emitted(actual) > 0
    assert_same_states(actual_states[:2] + actual_states[3:], expected_states)
    assert_same_states([actual_states[2]], [actual_states[1]])


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_a_stream_moves_between_nemo_and_fast_beam(kind):
    """The state is NeMo's BatchedBeamState: NeMo's computer continues ours and ours continues NeMo's."""
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=REALISTIC_BIAS[kind])
    x, lengths = random_encoder_output(2, MAX_TIME, seed=4, lengths=[MAX_TIME, MAX_TIME])
    nemo = nemo_malsd(kind, decoder, joint, 4, 3).decoding_computer
    ours = fast_beam(kind, decoder, joint, 4, 3).decoding_computer
    bounds = bounds_of("uneven")
    expected, _ = decode_in_chunks(nemo, x, lengths, bounds)

    for first, second in ((nemo, ours), (ours, nemo)):
        actual, _ = decode_in_chunks(Alternating(first, second), x, lengths, bounds)
        assert actual == expected
    assert emitted(expected) > 0


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_unbounded_symbols_chunks_match_and_storage_grows(kind, monkeypatch):
    """max_symbols=None: a chunk that fills the storage runs again, from the same start, with more room."""
    monkeypatch.setattr(malsd_module, "UNBOUNDED_STEPS_START", 1)
    seed, bias = CHUNKS_UNBOUNDED_SAFE[kind]
    decoder, joint = make_networks(tdt=kind == "tdt", seed=seed, blank_bias=bias)
    x, lengths = random_encoder_output(2, 12, seed=7, lengths=[12, 12])
    bounds = bounds_of("one_frame", 12)  # room for one step per chunk at first
    # no limit: max_symbols unset and graphs disallowed (with graphs allowed NeMo's rule sets 10)
    ours = fast_beam(kind, decoder, joint, 2, None, return_best_hypothesis=False, allow_cuda_graphs=False)
    expected, expected_states = decode_in_chunks(
        nemo_malsd(kind, decoder, joint, 2, None).decoding_computer, x, lengths, bounds, nbest=True
    )
    actual, actual_states = decode_in_chunks(ours.decoding_computer, x, lengths, bounds, nbest=True)
    assert actual == expected and emitted(actual) > 0
    assert_same_states(actual_states, expected_states)
    assert ours.computer.max_symbols is None and ours.computer._steps_per_frame > 1, "setup: storage should grow"


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_chunks_on_the_kernels_match_malsd_batch(kind):
    """The beam-step kernels (the Triton interpreter on the CPU) chunk by chunk: NeMo's hypotheses, scores to
    float32 rounding (the kernels sum log-softmax normalisers in another order)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter runs on the CPU only without CUDA
    decoder, joint = make_networks(tdt=kind == "tdt", seed=31, blank_bias=REALISTIC_BIAS[kind])
    decoder, joint = decoder.to(device), joint.to(device)
    x, lengths = random_encoder_output(2, 9, seed=32, lengths=[9, 9], device=device)
    bounds = [0, 1, 4, 9]
    expected, _ = decode_in_chunks(nemo_malsd(kind, decoder, joint, 3, 2).decoding_computer, x, lengths, bounds, True)
    ours = fast_beam(kind, decoder, joint, 3, 2, return_best_hypothesis=False, fused_topk=True).decoding_computer
    actual, _ = decode_in_chunks(ours, x, lengths, bounds, nbest=True)
    assert emitted(actual) > 0
    assert_same(actual, expected, exact_scores=False)


def test_whole_utterances_after_chunks_start_afresh():
    """The search's buffers begin afresh after a chunk continued a stream (graphs keep one set of buffers)."""
    decoder, joint = make_networks(seed=3, blank_bias=REALISTIC_BIAS["rnnt"])
    computer = fast_beam("rnnt", decoder, joint, 4, 3).computer
    b = computer._allocate(3, 5, joint.pred_hidden, torch.device("cpu"), torch.float32)
    fresh = {name: t.clone() for name, t in b.hyps.start.items()}
    x, lengths = random_encoder_output(3, 5, seed=4, lengths=[5, 5, 5])
    _, three_streams = computer.search_chunk(x.transpose(1, 2), lengths)
    _, two_streams = computer.search_chunk(x[1:].transpose(1, 2), lengths[1:])
    b.start_from(three_streams, 3, computer.state_batch_dim, tdt=False)
    assert not torch.equal(b.hyps.start["scores"][2], fresh["scores"][2])
    b.start_from(two_streams, 2, computer.state_batch_dim, tdt=False)
    assert torch.equal(b.hyps.start["scores"][:2], two_streams.scores)
    assert torch.equal(b.start_decoder_output[:8], two_streams.predictor_outputs)
    assert all(torch.equal(b.hyps.start[name][2], fresh[name][2]) for name in fresh), "padding rows begin afresh"
    assert torch.equal(b.start_decoder_output[8:], b.sos_decoder_output[8:])
    b.start_empty()
    assert all(torch.equal(b.hyps.start[name], fresh[name]) for name in fresh)
    assert torch.equal(b.start_decoder_output, b.sos_decoder_output)
    assert all(torch.equal(a, s) for a, s in zip(b.start_decoder_state, b.sos_decoder_state, strict=True))


def test_bad_states_and_inputs_are_rejected():
    decoder, joint = make_networks(seed=3)
    computer = fast_beam("rnnt", decoder, joint, 4, 3).decoding_computer
    x, lengths = random_encoder_output(2, 5, seed=4, lengths=[5, 5])
    x = x.transpose(1, 2)
    _, state = computer(x=x, out_len=lengths)
    with pytest.raises(ValueError, match=r"2 rows x 4 beams; this search needs at least 2 rows x 2 beams"):
        fast_beam("rnnt", decoder, joint, 2, 3).decoding_computer(x=x, out_len=lengths, prev_batched_state=state)
    with pytest.raises(ValueError, match=r"2 rows x 4 beams; this search needs at least 3 rows"):
        computer(x=torch.cat([x, x[:1]]), out_len=torch.cat([lengths, lengths[:1]]), prev_batched_state=state)
    state.fusion_states_list = [torch.zeros(8, dtype=torch.long)]
    with pytest.raises(ValueError, match="fusion states, and this search fuses no models"):
        computer(x=x, out_len=lengths, prev_batched_state=state)
    with pytest.raises(ValueError, match="must be the BatchedBeamState a beam search returned"):
        computer(x=x, out_len=lengths, prev_batched_state=BatchedBeamState(None, None, None, None))
    with pytest.raises(ValueError, match=r"out_len must be in \[0, T=5\]"):
        computer(x=x, out_len=lengths + 1)
    with pytest.raises(ValueError, match=r"x must be a float tensor \[B, T, D\]"):
        computer(x=x[0], out_len=lengths)
