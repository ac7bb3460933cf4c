"""``decode_with_state``: continuing rows from batched state tensors equals ``partial_hypotheses`` continuation."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import TDT_DURATIONS, VOCAB_SIZE, make_networks, random_encoder_output

from nemo_fastdecode.greedy import FrameLoopGreedy, LabelLoopGreedy
from nemo_fastdecode.greedy.state import BatchedGreedyState

ALGORITHMS = [("rnnt", FrameLoopGreedy), ("rnnt", LabelLoopGreedy), ("tdt", LabelLoopGreedy)]
IDS = ["rnnt-frame", "rnnt-label", "tdt-label"]
# with stateless prediction networks (NeMo's StatelessTransducerDecoder, context 2): state [B, 1] of labels
WITH_STATELESS = [(*algorithm, None) for algorithm in ALGORITHMS] + [(*algorithm, 2) for algorithm in ALGORITHMS]
WITH_STATELESS_IDS = IDS + [f"{name}-stateless" for name in IDS]


def computer(kind, computer_class, max_symbols=3, context_size=None):
    # about 0.3 labels per frame (stateless networks emit fewer at the same shift)
    bias = {("rnnt", False): 0.9, ("tdt", False): 0.5, ("rnnt", True): 0.5, ("tdt", True): 0.3}[
        kind, context_size is not None
    ]
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=bias, context_size=context_size)
    durations = TDT_DURATIONS if kind == "tdt" else None
    return computer_class(decoder, joint, VOCAB_SIZE, max_symbols, durations=durations)


@pytest.mark.parametrize("kind,computer_class,context_size", WITH_STATELESS, ids=WITH_STATELESS_IDS)
def test_decode_with_state_matches_partial_hypotheses(kind, computer_class, context_size):
    """Streams in slots step in random subsets, with ragged (and zero) chunk lengths; slots are reused."""
    rng = random.Random(1)
    slots = 4
    stepper = computer(kind, computer_class, context_size=context_size)
    reference = computer(kind, computer_class, context_size=context_size)
    storage = stepper.initial_state(slots + 1, torch.device("cpu"), torch.float32)  # + 1 dummy row
    fresh = stepper.initial_state(1, torch.device("cpu"), torch.float32)
    tokens: list[list[int]] = [[] for _ in range(slots)]
    frames: list[list[int]] = [[] for _ in range(slots)]
    scores = [0.0] * slots
    hyps = [None] * slots
    emitted_any = 0
    for step in range(14):
        if step == 7:  # slot 1 restarts: a new stream in a used slot
            storage.index_copy_(torch.tensor([1]), fresh)
            tokens[1], frames[1], scores[1], hyps[1] = [], [], 0.0, None
        rows = rng.sample(range(slots), rng.randint(1, slots))
        x, lengths = random_encoder_output(len(rows) + 1, 5, seed=step)
        lengths = torch.tensor([rng.randint(0, 5) for _ in rows] + [0])  # + a padding row on the dummy slot
        slot_ids = torch.tensor([*rows, slots])
        final, emitted = stepper.decode_with_state(x.transpose(1, 2), lengths, storage.index_select(slot_ids))
        storage.index_copy_(slot_ids, final)
        previous = [hyps[r] for r in rows]
        out = reference(x[: len(rows)].transpose(1, 2), lengths[: len(rows)], [h and h.dec_state for h in previous])
        for i, row in enumerate(rows):
            n = int(emitted.lengths[i])
            tokens[row] += emitted.labels[i, :n].tolist()
            frames[row] += emitted.timestamps[i, :n].tolist()
            scores[row] += float(emitted.scores[i])
            emitted_any += n
            merged = out[i] if previous[i] is None else previous[i].merge_(out[i])
            hyps[row] = merged
            assert tokens[row] == merged.y_sequence.tolist() and frames[row] == merged.timestamp.tolist()
            assert scores[row] == pytest.approx(merged.score, rel=1e-6, abs=1e-6)
            item = merged.dec_state
            assert int(storage.labels[row]) == int(item.label)
            assert int(storage.decoded_lengths[row]) == int(item.decoded_length)
            # the state itself to float32 rounding (matrix products at another batch size)
            torch.testing.assert_close(storage.predictor_outputs[row], item.predictor_output, rtol=1e-5, atol=1e-6)
            if kind == "tdt":
                assert int(storage.time_jumps[row]) == int(item.time_jump)
            if context_size is not None:  # the state is labels: exact
                assert torch.equal(storage.predictor_states[0][row], item.predictor_state[0])
        assert int(emitted.lengths[-1]) == 0  # the padding row emits nothing
    assert emitted_any > 0


def test_state_batch_checks_and_stacking():
    c = computer("tdt", LabelLoopGreedy)
    state = c.initial_state(3, torch.device("cpu"), torch.float32)
    assert state.batch_size == 3 and state.time_jumps is not None and state.labels.tolist() == [VOCAB_SIZE] * 3
    items = state.split()
    items[1].time_jump = None  # a missing TDT time jump counts as 0
    stacked = BatchedGreedyState.stack(items)
    assert stacked.time_jumps.tolist() == [0, 0, 0]
    assert all(torch.equal(a, b) for a, b in zip(stacked.predictor_states, state.predictor_states, strict=True))
    x, lengths = random_encoder_output(2, 4)
    with pytest.raises(ValueError, match="state has 3 rows for a batch of 2"):
        c.decode_with_state(x.transpose(1, 2), lengths, state)


def test_split_items_own_their_memory():
    # the batched state may be views of loop buffers that the next decode overwrites: the items must not change
    c = computer("tdt", LabelLoopGreedy)
    state = c.initial_state(3, torch.device("cpu"), torch.float32)
    items = state.split()
    before = [(item.label.clone(), item.predictor_output.clone(), [s.clone() for s in item.predictor_state])
              for item in items]  # fmt: skip
    for tensor in [*state.predictor_states, state.predictor_outputs, state.labels, state.decoded_lengths]:
        tensor.add_(1)
    for item, (label, output, states) in zip(items, before, strict=True):
        assert torch.equal(item.label, label) and torch.equal(item.predictor_output, output)
        assert all(torch.equal(a, b) for a, b in zip(item.predictor_state, states, strict=True))
        assert item.predictor_state[0].shape == state.predictor_states[0][:, 0].shape


@pytest.mark.parametrize("kind,computer_class,context_size", WITH_STATELESS, ids=WITH_STATELESS_IDS)
def test_decode_with_state_in_parts_is_decode_with_state(kind, computer_class, context_size):
    # load_with_state / loop.run / state_after: the parts the streaming decoder captures around the loop
    whole = computer(kind, computer_class, context_size=context_size)
    parts = computer(kind, computer_class, context_size=context_size)
    state = whole.initial_state(3, torch.device("cpu"), torch.float32)
    x, lengths = random_encoder_output(3, 6, seed=5)
    for _ in range(2):  # the second chunk continues from the first one's state
        final, emitted = whole.decode_with_state(x.transpose(1, 2), lengths, state)
        buffers, loop = parts.load_with_state(x.transpose(1, 2), lengths, state)
        with torch.inference_mode():  # as SlotDecoder runs it
            loop.run()
        final_parts, emitted_parts = parts.state_after(buffers, 3, lengths, state)
        for a, b in [(emitted.labels, emitted_parts.labels), (emitted.lengths, emitted_parts.lengths),
                     (emitted.timestamps, emitted_parts.timestamps), (emitted.scores, emitted_parts.scores),
                     (final.labels, final_parts.labels), (final.decoded_lengths, final_parts.decoded_lengths),
                     (final.predictor_outputs, final_parts.predictor_outputs)]:  # fmt: skip
            assert torch.equal(a, b)
        assert int(emitted.lengths.sum()) > 0
        state = BatchedGreedyState.stack(final.split(), whole.state_batch_dim)


def test_load_with_state_needs_max_symbols():
    c = computer("rnnt", LabelLoopGreedy, max_symbols=None)
    state = c.initial_state(2, torch.device("cpu"), torch.float32)
    x, lengths = random_encoder_output(2, 4)
    with pytest.raises(ValueError, match="load_with_state needs max_symbols"):
        c.load_with_state(x.transpose(1, 2), lengths, state)
    x3, lengths3 = random_encoder_output(3, 4)
    with pytest.raises(ValueError, match="state has 2 rows for a batch of 3"):
        computer("rnnt", LabelLoopGreedy).load_with_state(x3.transpose(1, 2), lengths3, state)
