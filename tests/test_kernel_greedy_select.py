"""The greedy loops' select / emit kernels (kernels/greedy_select.py), launched on the loop's tensors, against their
torch references (the unfused paths of greedy/steps.py on the same loop state), in Triton's interpreter on the CPU
(conftest) or on a GPU. Every buffer is compared exactly; tests/test_greedy_fused.py runs the same kernels through
greedy/steps.py and in whole decodes."""

from __future__ import annotations

import pytest
import torch
from conftest import TDT_DURATIONS
from test_greedy_fused import BLANK, assert_same_state, snapshot, twin_buffers

from nemo_fastdecode.greedy import steps
from nemo_fastdecode.kernels import greedy_select
from nemo_fastdecode.kernels.greedy_select import batch_block

pytestmark = pytest.mark.usefixtures("single_thread")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def best_tokens(batch: int, seed: int, tdt: bool):
    """The joint's answers of a look: best scores and labels ``[B]`` (a third blank), TDT duration logits or None."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn([batch], generator=g).to(DEVICE)
    labels = torch.randint(0, BLANK + 1, [batch], generator=g).to(DEVICE)
    labels[::3] = BLANK
    logits = torch.randn([batch, 3 + len(TDT_DURATIONS)], generator=g).to(DEVICE)
    return scores, labels, logits[:, 3:] if tdt else None  # a strided view, as sliced from the joint output


def assert_changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> None:
    """Setup check: the step changed the loop state, so that comparing the two paths compares something."""
    assert any(not torch.equal(value, after[name]) for name, value in before.items()), "setup: nothing changed"


@pytest.mark.parametrize("batch", [1, 5, 17])
@pytest.mark.parametrize("start", [True, False])
@pytest.mark.parametrize("tdt", [False, True])
def test_label_select_matches_reference(batch, start, tdt):
    reference, fused = twin_buffers(batch, seed=batch * 13 + start)
    scores, labels, duration_logits = best_tokens(batch, batch, tdt)
    values = torch.tensor(TDT_DURATIONS, device=DEVICE)
    before = snapshot(reference)
    steps.label_select(reference, scores, labels, duration_logits, values, BLANK, start, fused=False)
    assert_changed(before, snapshot(reference))
    greedy_select.label_select(steps.look_tensors(fused), scores, labels, duration_logits, values, BLANK, start)
    assert_same_state(reference, fused)


@pytest.mark.parametrize("batch", [6, 17])
@pytest.mark.parametrize("start", [True, False])
@pytest.mark.parametrize("tdt", [False, True])
def test_window_select_of_one_frame_is_label_select(batch, start, tdt):
    """A window of one frame is one look: the rows that look (active ones at the start, else those holding a blank)
    end as :func:`label_select` leaves them; rows that do not decode may keep other junk (nothing reads it)."""
    reference, fused = twin_buffers(batch, seed=batch * 17 + start)
    scores, labels, duration_logits = best_tokens(batch, batch + 1, tdt)
    values = torch.tensor(TDT_DURATIONS, device=DEVICE)
    looking = (reference.active if start else reference.advance).clone()
    assert looking.any(), "setup: some rows should look"
    steps.label_select(reference, scores, labels, duration_logits, values, BLANK, start, fused=False)
    greedy_select.window_select(steps.look_tensors(fused), scores, labels, duration_logits, values, BLANK, 1, start)
    expected, actual = steps.look_tensors(reference), steps.look_tensors(fused)
    for name, value in expected._asdict().items():
        rows = ... if name == "inner_flag" else looking
        assert torch.equal(value[rows], getattr(actual, name)[rows]), name


@pytest.mark.parametrize("batch", [1, 6, 33])
@pytest.mark.parametrize("max_symbols", [1, 2, None])
@pytest.mark.parametrize("tdt", [False, True])
def test_label_emit_matches_reference(batch, max_symbols, tdt):
    score_dtype = torch.float32 if tdt else torch.float64
    reference, fused = twin_buffers(batch, seed=batch + 300, score_dtype=score_dtype)
    steps.label_emit(reference, max_symbols, tdt, fused=False)
    assert reference.found.any(), "setup: some rows should emit"
    hyps = steps.hyps_tensors(fused.hyps)
    greedy_select.label_emit(steps.look_tensors(fused), fused.found, fused.outer_flag, hyps, max_symbols, tdt)
    assert_same_state(reference, fused)


@pytest.mark.parametrize("batch", [1, 9])
@pytest.mark.parametrize("max_symbols", [2, None])
def test_frame_select_and_emit_match_reference(batch, max_symbols):
    reference, fused = twin_buffers(batch, seed=batch + 400)
    steps.frame_emit(reference, fused=False)
    assert reference.found.any(), "setup: some rows should emit"
    hyps = steps.hyps_tensors(fused.hyps)
    greedy_select.frame_emit(fused.blank, fused.labels, fused.scores, fused.frame, fused.symbols_at_frame,
                             fused.found, hyps)  # fmt: skip
    assert_same_state(reference, fused)
    scores, labels, _ = best_tokens(batch, batch + 2, tdt=False)
    before = snapshot(reference)
    steps.frame_select(reference, scores, labels, BLANK, max_symbols, fused=False)
    assert_changed(before, snapshot(reference))
    greedy_select.frame_select(scores, labels, fused.scores, fused.labels, fused.blank, hyps, fused.symbols_at_frame,
                               fused.inner_flag, BLANK, max_symbols)  # fmt: skip
    assert_same_state(reference, fused)


def test_one_block_holds_the_batch():
    assert batch_block(1) == (16, 4) and batch_block(17) == (32, 4) and batch_block(513) == (1024, 8)
