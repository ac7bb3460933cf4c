"""Candidate-selection kernel of the beam search against its torch reference (NeMo's operations).

Without CUDA the kernel runs in the Triton interpreter (TRITON_INTERPRET=1) on the CPU.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from conftest import HIDDEN, TDT_DURATIONS, make_networks  # noqa: E402
from conftest import VOCAB_SIZE as NETWORK_VOCAB  # noqa: E402

from nemo_fastdecode.beam.malsd import MALSDBeamComputer  # noqa: E402
from nemo_fastdecode.kernels.beam_select import (  # noqa: E402
    NON_EXISTENT_LABEL,
    select_extensions,
    select_extensions_reference,
)
from nemo_fastdecode.kernels.beam_topk import log_softmax_topk_reference  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
VOCAB = 33  # non-blank tokens; blank is id VOCAB
NUM_DURATIONS = 5


def search_state(batch: int, k: int, tdt: bool, max_symbols: int | None, seed: int):
    """A step's inputs as the search makes them: the beam-step kernel's output on random logits, beam scores
    with inactive (-inf) beams, finished beams, and beams at the max_symbols limit."""
    g = torch.Generator().manual_seed(seed)
    width = VOCAB + 1 + (NUM_DURATIONS if tdt else 0)
    logits = 3 * torch.randn([batch * k, width], generator=g)
    values, ids = log_softmax_topk_reference(logits[:, : VOCAB + 1], k, VOCAB)
    hyp_scores = -20 * torch.rand([batch, k], generator=g)
    hyp_scores[torch.rand([batch, k], generator=g) < 0.2] = float("-inf")
    hyp_scores[0, 1:] = float("-inf")  # a first step: one live beam
    active = torch.rand([batch, k], generator=g) < 0.8
    limit = max_symbols if max_symbols is not None else 3
    labels_at_time = torch.randint(0, limit + 1, [batch, k], generator=g)
    duration_logits = logits[:, VOCAB + 1 :] if tdt else None  # a strided column slice, as the search passes it
    args = (values, ids, hyp_scores, active, labels_at_time, VOCAB, max_symbols, duration_logits)
    return tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)


def assert_same_selection(got, want, tdt: bool) -> None:
    scores, parents, labels, durations = got
    want_scores, want_parents, want_labels, want_durations = want
    assert scores.dtype == torch.float32 and parents.dtype == labels.dtype == torch.int64
    # TDT: the duration log-softmax is summed in another order (last-bit differences); RNN-T: the same bits
    tolerance = {"rtol": 1e-6, "atol": 1e-6} if tdt else {"rtol": 0, "atol": 0}
    torch.testing.assert_close(scores.cpu(), want_scores.cpu(), **tolerance)
    # which of several -inf candidates fills a row is unspecified (they never reach a hypothesis list)
    finite = want_scores.isfinite().cpu()
    assert torch.equal(parents.cpu()[finite], want_parents.cpu()[finite])
    assert torch.equal(labels.cpu()[finite], want_labels.cpu()[finite])
    if tdt:
        assert torch.equal(durations.cpu()[finite], want_durations.cpu()[finite])
    else:
        assert durations is None and want_durations is None


@pytest.mark.parametrize("tdt", [False, True], ids=["rnnt", "tdt"])
@pytest.mark.parametrize("max_symbols", [None, 2])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 8, 16])
def test_kernel_matches_reference(k, max_symbols, tdt):
    state = search_state(batch=5, k=k, tdt=tdt, max_symbols=max_symbols, seed=k)
    got = select_extensions(*state, use_triton=True)
    want = select_extensions_reference(*state)
    assert_same_selection(got, want, tdt)
    scores, parents, labels, _ = got
    # descending, parents in range, labels a token, blank or "finished"
    assert bool((scores[:, :-1] >= scores[:, 1:]).all())
    assert bool(((parents >= 0) & (parents < k)).all())
    assert bool(((labels >= NON_EXISTENT_LABEL) & (labels <= VOCAB)).all())


@pytest.mark.parametrize("tdt", [False, True], ids=["rnnt", "tdt"])
def test_finished_and_forced_beams(tdt):
    """A finished beam is kept once with its score and no label; a beam at max_symbols may only emit blank."""
    values, ids, hyp_scores, active, labels_at_time, blank, _, durations = search_state(2, 2, tdt, 1, seed=7)
    hyp_scores = torch.tensor([[-1.0, -1e6], [-2.0, -1e6]], device=DEVICE)
    active = torch.tensor([[False, True], [True, True]], device=DEVICE)
    labels_at_time = torch.tensor([[0, 0], [1, 0]], device=DEVICE)  # row 1, beam 0: at the limit
    state = (values, ids, hyp_scores, active, labels_at_time, blank, 1, durations)
    scores, parents, labels, got_durations = select_extensions(*state, use_triton=True)
    assert (parents[0, 0].item(), labels[0, 0].item(), scores[0, 0].item()) == (0, NON_EXISTENT_LABEL, -1.0)
    assert (parents[1, 0].item(), labels[1, 0].item()) == (0, blank)
    if tdt:
        assert got_durations[1, 0].item() >= 1  # a blank never stays on its frame
    assert_same_selection((scores, parents, labels, got_durations), select_extensions_reference(*state), tdt)


def test_ties_go_to_the_lower_position():
    """Equal candidates: the lower beam first (documented order; torch.topk on CUDA leaves it open)."""
    values = torch.tensor([[-0.5, -1.5, -3.0], [-0.5, -1.5, -3.0]], device=DEVICE)
    ids = torch.tensor([[4, 7, VOCAB], [4, 7, VOCAB]], device=DEVICE)
    hyp_scores = torch.zeros([1, 2], device=DEVICE)
    active = torch.ones([1, 2], dtype=torch.bool, device=DEVICE)
    labels_at_time = torch.zeros([1, 2], dtype=torch.long, device=DEVICE)
    scores, parents, labels, _ = select_extensions(
        values, ids, hyp_scores, active, labels_at_time, VOCAB, None, use_triton=True
    )
    assert parents.tolist() == [[0, 1]] and labels.tolist() == [[4, 4]] and scores.tolist() == [[-0.5, -0.5]]


def test_nan_ranks_first():
    """A beam whose log-probabilities are NaN (a NaN logit) fills the row first, as torch.topk ranks NaN."""
    state = list(search_state(1, 2, False, None, seed=3))
    state[0] = state[0].clone()
    state[0][1] = float("nan")
    state[2] = torch.tensor([[-1.0, -2.0]], device=DEVICE)
    state[3] = torch.ones([1, 2], dtype=torch.bool, device=DEVICE)
    scores, parents, labels, _ = select_extensions(*state, use_triton=True)
    assert bool(scores.isnan().all()) and parents.tolist() == [[1, 1]]
    assert labels.tolist() == [state[1][1, :2].tolist()]
    want_scores = select_extensions_reference(*state)[0]
    assert bool(want_scores.isnan().all())


def test_low_precision_scores_use_the_reference():
    state = list(search_state(3, 4, False, 2, seed=11))
    state[2] = state[2].to(torch.bfloat16)
    got = select_extensions(*state)
    want = select_extensions_reference(*state)
    assert got[0].dtype == torch.bfloat16
    for a, b in zip(got[:3], want[:3], strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="float32"):
        select_extensions(*state, use_triton=True)


def test_shape_mismatch_is_an_error():
    values, ids, *rest = search_state(2, 4, False, None, seed=1)
    with pytest.raises(ValueError, match=r"\[B\*K, K\+1\]"):
        select_extensions(values[:, :3], ids[:, :3], *rest, use_triton=True)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_search_with_the_kernels_matches_malsd_batch(kind):
    """The whole search on the beam-step kernels (the interpreter on the CPU): NeMo's n-best lists, scores to
    float32 rounding (the kernels' log-softmax sums run in another order)."""
    from conftest import make_networks, random_encoder_output
    from test_beam_exactness import REALISTIC_BIAS, as_tuples, fast_beam, nemo_malsd
    from test_beam_gpu import assert_same

    decoder, joint = make_networks(tdt=kind == "tdt", seed=31, blank_bias=REALISTIC_BIAS[kind])
    decoder, joint = decoder.to(DEVICE), joint.to(DEVICE)
    x, lengths = random_encoder_output(4, 12, seed=32, lengths=[12, 3, 1, 9], device=DEVICE)
    expected = nemo_malsd(kind, decoder, joint, 3, 2, return_best_hypothesis=False)(
        encoder_output=x, encoded_lengths=lengths
    )[0]
    decode = fast_beam(kind, decoder, joint, 3, 2, return_best_hypothesis=False, fused_topk=True)
    actual = decode(encoder_output=x, encoded_lengths=lengths)[0]
    assert_same(as_tuples(actual, True), as_tuples(expected, True), exact_scores=False)


def loop_midway(computer, batch: int, seed: int, capacity_left: int = 3):
    """The search's buffers a few steps in: random trees, beam states, times and scores, with equal hypotheses."""
    g = torch.Generator().manual_seed(seed)
    k = computer.beam_size
    b = computer._allocate(batch, 5, HIDDEN, DEVICE, torch.float32)
    hyps = b.hyps
    shape = [batch, k]
    hyps.step.fill_(hyps.capacity - capacity_left)
    hyps.labels.copy_(torch.randint(-1, VOCAB + 1, hyps.labels.shape, generator=g))
    hyps.scores.copy_(-10 * torch.rand(shape, generator=g))
    hyps.scores[0, 1:] = float("-inf")
    hyps.lengths.copy_(torch.randint(0, 3, shape, generator=g))
    hyps.last_label.copy_(torch.randint(0, 3, shape, generator=g))  # few values: extensions often coincide
    hyps.hashes.copy_(torch.randint(0, 3, shape, generator=g))
    hyps.next_time.copy_(torch.randint(0, 4, shape, generator=g))
    hyps.labels_at_time.copy_(torch.randint(0, 3, shape, generator=g))
    last_frame = torch.randint(-1, 5, [batch, 1], generator=g).expand(shape)
    b.last_frame.copy_(last_frame)
    b.time_indices.copy_(torch.minimum(torch.randint(0, 5, shape, generator=g), last_frame + 1).clamp(min=0))
    computer._update_time_flags(b)
    return b


STATE = ["labels", "parents", "timestamps", "durations", "step", "scores", "lengths", "last_label", "hashes",
         "next_time", "labels_at_time"]  # fmt: skip
LOOP = ["time_indices", "safe_time_indices", "active", "flag"]


@pytest.mark.parametrize("tdt", [False, True], ids=["rnnt", "tdt"])
@pytest.mark.parametrize("k", [1, 2, 4, 5])
@pytest.mark.parametrize("capacity_left", [3, 1, 0])
def test_advance_beams_matches_the_torch_step(k, tdt, capacity_left):
    """advance_beams == the search's torch path: select_extensions_reference, BeamHypsBuffer.add_ and recombine_
    (NeMo's ops), the time update and the loop flags; at the last slot and past it too."""
    decoder, joint = make_networks(tdt=tdt, seed=5)
    durations = TDT_DURATIONS if tdt else None
    computers = [
        MALSDBeamComputer(decoder.to(DEVICE), joint.to(DEVICE), NETWORK_VOCAB, k, 2, durations, fused_topk=f)
        for f in (True, False)
    ]
    width = NETWORK_VOCAB + 1 + (len(TDT_DURATIONS) if tdt else 0)
    logits = 3 * torch.randn([4 * k, width], generator=torch.Generator().manual_seed(k)).to(DEVICE)
    values, ids = log_softmax_topk_reference(logits[:, : NETWORK_VOCAB + 1], k, NETWORK_VOCAB)
    ids = torch.where(ids == NETWORK_VOCAB, ids, ids % 2)  # few distinct tokens: hypotheses recombine
    got, want = (loop_midway(c, 4, seed=k, capacity_left=capacity_left) for c in computers)
    got_out = computers[0]._extend(got, logits, values, ids)
    want_out = computers[1]._extend(want, logits, values, ids)
    # which of several -inf candidates fills a row is unspecified: compare the beams alive after the step
    live = want.hyps.scores.isfinite().cpu()
    assert torch.equal(live, got.hyps.scores.isfinite().cpu()) and bool(live.any())
    assert torch.equal(got_out[0].cpu()[live], want_out[0].cpu()[live])
    assert torch.equal(got_out[1].cpu().view(live.shape)[live], want_out[1].cpu().view(live.shape)[live])
    assert torch.equal(got_out[2].cpu().view(live.shape)[live], want_out[2].cpu().view(live.shape)[live])
    slot = min(int(want.hyps.step) - 1, want.hyps.capacity - 1)
    for name in STATE + LOOP:
        source_got, source_want = (got.hyps, want.hyps) if name in STATE else (got, want)
        value, expected = getattr(source_got, name).cpu(), getattr(source_want, name).cpu()
        if name == "scores":
            torch.testing.assert_close(value, expected, rtol=1e-6, atol=1e-6)
        elif value.dim() == 3:  # trees: the written slot of live beams, every other slot untouched
            others = torch.arange(value.shape[-1]) != slot
            assert torch.equal(value[..., others], expected[..., others]), name
            assert torch.equal(value[..., slot][live], expected[..., slot][live]), name
        elif value.dim() == 2:
            assert torch.equal(value[live], expected[live]), name
        else:
            assert torch.equal(value, expected), name
