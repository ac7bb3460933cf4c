"""Beam hypotheses out of the prefix tree: the backtrack kernel against its torch walk, and
``BeamHypsBuffer.to_hypotheses`` against NeMo's own export (``BatchedBeamHyps.to_hyps_list`` / ``to_nbest_hyps_list``).

Without CUDA the kernel runs in the Triton interpreter (TRITON_INTERPRET=1, set by conftest) on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TDT_DURATIONS, VOCAB_SIZE, make_networks, random_encoder_output

from nemo_fastdecode.beam.malsd import MALSDBeamComputer
from nemo_fastdecode.kernels.beam_backtrack import backtrack, backtrack_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def random_tree(batch: int, beams: int, capacity: int, tdt: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    shape = [batch, beams, capacity]
    labels = torch.randint(-1, 9, shape, generator=g)
    parents = torch.randint(0, beams, shape, generator=g)
    times = torch.randint(0, 50, shape, generator=g)
    durations = torch.randint(0, 5, shape, generator=g) if tdt else None
    return [t.to(DEVICE) if t is not None else None for t in (labels, parents, times, durations)]


@pytest.mark.parametrize("tdt", [False, True], ids=["rnnt", "tdt"])
@pytest.mark.parametrize("beams,chosen", [(1, 1), (4, 1), (4, 4), (3, 2), (5, 5)])
@pytest.mark.parametrize("steps", [0, 1, 7, 12])
def test_kernel_matches_torch_walk(tdt, beams, chosen, steps):
    labels, parents, times, durations = random_tree(3, beams, 12, tdt, seed=beams * 100 + steps)
    g = torch.Generator().manual_seed(steps)
    start = torch.stack([torch.randperm(beams, generator=g)[:chosen] for _ in range(3)]).to(DEVICE)
    got = backtrack(labels, parents, times, durations, start, steps, use_triton=True)
    want = backtrack_reference(labels, parents, times, durations, start, steps)
    for g_part, w_part in zip(got, want, strict=True):
        if w_part is None:
            assert g_part is None
        else:
            assert g_part.shape == (3, chosen, steps)
            assert torch.equal(g_part, w_part)


def test_torch_walk_follows_parents():
    # one row, two beams, three steps: beam 0's path is (step 0: beam 1) -> (step 1: beam 0) -> (step 2: beam 0)
    labels = torch.tensor([[[10, 20, 30], [11, 21, 31]]])
    parents = torch.tensor([[[0, 1, 0], [0, 0, 1]]])
    times = labels + 100
    out_labels, out_times, out_durations = backtrack_reference(labels, parents, times, None, torch.tensor([[0]]), 3)
    assert out_labels.tolist() == [[[11, 20, 30]]]
    assert out_times.tolist() == [[[111, 120, 130]]]
    assert out_durations is None


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(start=torch.zeros([2, 1], dtype=torch.long)), "start must be"),
        (dict(steps=13), "steps must be in"),
        (dict(parents=torch.zeros([3, 4, 11], dtype=torch.long)), "must be \\[B, K, C\\] alike"),
    ],
)
def test_bad_shapes_are_named(change, message):
    labels, parents, times, durations = random_tree(3, 4, 12, False, seed=0)
    args = dict(labels=labels, parents=parents, times=times, durations=durations,
                start=torch.zeros([3, 1], dtype=torch.long, device=DEVICE), steps=5)  # fmt: skip
    args.update({k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in change.items()})
    with pytest.raises(ValueError, match=message):
        backtrack(**args)


def searched_buffer(tdt: bool, beam_size: int, lengths):
    decoder, joint = make_networks(tdt=tdt, seed=3, blank_bias=0.5 if tdt else 0.9)
    computer = MALSDBeamComputer(
        decoder.to(DEVICE), joint.to(DEVICE), VOCAB_SIZE, beam_size, 3, TDT_DURATIONS if tdt else None
    )
    x, lengths = random_encoder_output(len(lengths), max(max(lengths), 1), seed=4, lengths=lengths, device=DEVICE)
    return computer(x.transpose(1, 2), lengths)


def assert_same_hypothesis(got, want):
    for field in ("y_sequence", "timestamp", "token_duration"):
        g, w = getattr(got, field), getattr(want, field)
        if w is None:
            assert g is None, field
            continue
        assert isinstance(g, np.ndarray) and isinstance(w, np.ndarray), field
        assert g.dtype == w.dtype and np.array_equal(g, w), field
    assert type(got.score) is type(want.score) and got.score == want.score
    assert got.alignments is None and got.dec_state is None


@pytest.mark.parametrize("tdt", [False, True], ids=["rnnt", "tdt"])
@pytest.mark.parametrize("use_triton", [False, True], ids=["torch", "kernel"])
@pytest.mark.parametrize("nbest", [False, True], ids=["best", "nbest"])
@pytest.mark.parametrize("score_norm", [True, False], ids=["norm", "raw"])
def test_matches_nemo_export(tdt, use_triton, nbest, score_norm):
    lengths = [14, 0, 9, 1, 14]
    hyps = searched_buffer(tdt, 4, lengths)
    got = hyps.to_hypotheses(len(lengths) - 1, score_norm, nbest, use_triton)
    # NeMo's export sorts its copy in place; ours leaves the buffer as it was, so it can run second
    want_nemo = hyps.to_nemo(len(lengths) - 1)
    want = want_nemo.to_nbest_hyps_list(score_norm) if nbest else want_nemo.to_hyps_list(score_norm)
    assert len(got) == len(want) == len(lengths) - 1
    for g, w in zip(got, want, strict=True):
        if nbest:
            assert len(g.n_best_hypotheses) == len(w.n_best_hypotheses)
            for gh, wh in zip(g.n_best_hypotheses, w.n_best_hypotheses, strict=True):
                assert_same_hypothesis(gh, wh)
        else:
            assert_same_hypothesis(g, w)
    assert any(len(h.y_sequence) for h in (want if not nbest else [n.n_best_hypotheses[0] for n in want]))


@pytest.mark.parametrize("tdt", [False, True], ids=["rnnt", "tdt"])
def test_all_rows_empty(tdt):
    hyps = searched_buffer(tdt, 2, [0, 0])
    for nbest in (False, True):
        got = hyps.to_hypotheses(2, nbest=nbest, use_triton=True)
        want_nemo = hyps.to_nemo(2)
        want = want_nemo.to_nbest_hyps_list() if nbest else want_nemo.to_hyps_list()
        for g, w in zip(got, want, strict=True):
            pairs = zip(g.n_best_hypotheses, w.n_best_hypotheses, strict=True) if nbest else [(g, w)]
            for gh, wh in pairs:
                assert len(gh.y_sequence) == 0
                assert_same_hypothesis(gh, wh)
