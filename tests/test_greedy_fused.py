"""The greedy loops' fused Triton step kernels (kernels/greedy_select.py, through greedy/steps.py) are bit-identical
to their torch references (the unfused paths of greedy/steps.py).

Run in Triton's CPU interpreter without a GPU (conftest sets TRITON_INTERPRET=1). Two levels:
each step against its reference on random loop states (every buffer compared exactly), and whole
decodes with ``fused_kernels=True`` against the torch path and NeMo's baseline. The joint's hidden layer, the best
token and the masked state update are tested in tests/test_kernel_*.py.
"""

from __future__ import annotations

import pytest
import torch
from conftest import TDT_DURATIONS, VOCAB_SIZE, make_networks, random_encoder_output
from test_greedy_exactness import (
    ALGORITHMS,
    REALISTIC_BIAS,
    UNBOUNDED_SAFE,
    assert_same_hypotheses,
    baseline,
    ours,
)

from nemo_fastdecode.greedy import steps
from nemo_fastdecode.greedy.state import LoopBuffers

pytestmark = pytest.mark.usefixtures("single_thread")
BLANK = VOCAB_SIZE
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # kernels on a GPU, else interpreted


def random_buffers(batch: int, seed: int, capacity: int = 7, max_time: int = 9, score_dtype=torch.float64):
    """Loop buffers in a random but consistent state (some rows past their end, some hyps near capacity)."""
    g = torch.Generator().manual_seed(seed)
    b = LoopBuffers(batch, max_time, 5, capacity, DEVICE, torch.float32, score_dtype)

    def ints(low, high):
        return torch.randint(low, high, [batch], generator=g).to(DEVICE)

    def bools():
        return (torch.rand([batch], generator=g) < 0.5).to(DEVICE)

    b.encoder_lengths.copy_(ints(0, max_time + 1))
    b.time_indices.copy_(ints(0, max_time + 2))
    torch.clamp(b.encoder_lengths - 1, min=0, out=b.last_frame)
    steps.update_time_flags(b)
    for flags in (b.active_before, b.advance, b.blank, b.found):
        flags.copy_(bools())
    b.labels.copy_(ints(0, BLANK + 1))
    b.labels[bools()] = BLANK
    b.active_before[0], b.blank[0], b.labels[0] = True, False, 1  # row 0 emits
    b.label_time.copy_(ints(0, max_time))
    b.scores.copy_(torch.randn([batch], generator=g))
    b.durations.copy_(torch.tensor(TDT_DURATIONS, device=DEVICE)[ints(0, len(TDT_DURATIONS))])
    b.frame.fill_(3)
    b.symbols_at_frame.fill_(int(ints(0, 4)[0]))
    h = b.hyps
    h.lengths.copy_(ints(0, capacity))  # a full row (length == capacity) is retried, never read
    h.scores.copy_(torch.randn([batch], generator=g).to(score_dtype))
    h.last_label_time.copy_(torch.where(bools(), b.time_indices, ints(-1, max_time)))
    h.labels_at_last_time.copy_(ints(0, 4))
    h.last_label.copy_(ints(-1, BLANK))
    return b


def snapshot(b: LoopBuffers) -> dict[str, torch.Tensor]:
    tensors = {name: t.clone() for name, t in vars(b).items() if isinstance(t, torch.Tensor)}
    tensors.update({f"hyps.{name}": t.clone() for name, t in vars(b.hyps).items() if isinstance(t, torch.Tensor)})
    return tensors


def assert_same_state(reference: LoopBuffers, fused: LoopBuffers):
    expected, actual = snapshot(reference), snapshot(fused)
    for name, value in expected.items():
        if name in ("hyps.labels", "hyps.timestamps", "hyps.durations"):
            # only the valid prefix of each row is defined (the reference also writes the next free slot)
            for row, length in enumerate(reference.hyps.lengths.clamp(max=reference.hyps.capacity).tolist()):
                assert torch.equal(value[row, :length], actual[name][row, :length]), f"{name} row {row}"
        else:
            assert torch.equal(value, actual[name]), name


def twin_buffers(batch: int, seed: int, **kwargs):
    return random_buffers(batch, seed, **kwargs), random_buffers(batch, seed, **kwargs)


@pytest.mark.parametrize("batch", [1, 5, 17])
@pytest.mark.parametrize("start", [True, False])
@pytest.mark.parametrize("tdt", [False, True])
def test_label_select_kernel_matches_reference(batch, start, tdt):
    reference, fused = twin_buffers(batch, seed=batch * 7 + start)
    g = torch.Generator().manual_seed(batch)
    best_scores = torch.randn([batch], generator=g).to(DEVICE)
    best_labels = torch.randint(0, BLANK + 1, [batch], generator=g).to(DEVICE)
    best_labels[::3] = BLANK
    logits = torch.randn([batch, 3 + len(TDT_DURATIONS)], generator=g).to(DEVICE)
    logits[0, 3:] = 1.0  # a tie: the lower duration index wins in both
    duration_logits = logits[:, 3:] if tdt else None  # a strided view, as sliced from the joint output
    values = torch.tensor(TDT_DURATIONS, device=DEVICE)
    steps.label_select(reference, best_scores, best_labels, duration_logits, values, BLANK, start, fused=False)
    steps.label_select(fused, best_scores, best_labels, duration_logits, values, BLANK, start, fused=True)
    assert_same_state(reference, fused)


@pytest.mark.parametrize("batch", [1, 6, 33])
@pytest.mark.parametrize("max_symbols", [1, 2, None])
@pytest.mark.parametrize("tdt", [False, True])
def test_label_emit_kernel_matches_reference(batch, max_symbols, tdt):
    score_dtype = torch.float32 if tdt else torch.float64
    reference, fused = twin_buffers(batch, seed=batch + 100, score_dtype=score_dtype)
    steps.label_emit(reference, max_symbols, tdt, fused=False)
    steps.label_emit(fused, max_symbols, tdt, fused=True)
    assert_same_state(reference, fused)
    assert reference.found.any(), "setup: some rows should emit"


@pytest.mark.parametrize("batch", [1, 9])
@pytest.mark.parametrize("max_symbols", [2, None])
def test_frame_kernels_match_reference(batch, max_symbols):
    reference, fused = twin_buffers(batch, seed=batch + 200)
    steps.frame_emit(reference, fused=False)
    steps.frame_emit(fused, fused=True)
    assert_same_state(reference, fused)
    g = torch.Generator().manual_seed(batch)
    best_scores = torch.randn([batch], generator=g).to(DEVICE)
    best_labels = torch.randint(0, BLANK + 1, [batch], generator=g).to(DEVICE)
    steps.frame_select(reference, best_scores, best_labels, BLANK, max_symbols, fused=False)
    steps.frame_select(fused, best_scores, best_labels, BLANK, max_symbols, fused=True)
    assert_same_state(reference, fused)


@pytest.mark.skipif(DEVICE.type != "cpu", reason="GPU hosts run this in test_greedy_gpu.py")
@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=["rnnt-frame", "rnnt-label", "tdt-label"])
@pytest.mark.parametrize("max_symbols", [3, None])
def test_fused_decoding_matches_torch_path_and_nemo(kind, loop_labels, max_symbols):
    seed, bias = (3, REALISTIC_BIAS[kind]) if max_symbols is not None else UNBOUNDED_SAFE[kind]
    layers = 1
    if kind == "tdt" and max_symbols is not None:
        layers, seed = 2, 5  # TDT 0.6B has a 2-layer LSTM (seed 5 emits labels at the realistic bias)
    decoder, joint = make_networks(tdt=kind == "tdt", seed=seed, blank_bias=bias, pred_layers=layers)
    x, lengths = random_encoder_output(6, 24, seed=4, lengths=[24, 1, 17, 0, 9, 24])
    torch_path = ours(kind, decoder, joint, max_symbols, loop_labels)
    fused = ours(kind, decoder, joint, max_symbols, loop_labels)
    fused.computer.fused_kernels = True
    expected = torch_path(encoder_output=x, encoded_lengths=lengths)[0]
    actual = fused(encoder_output=x, encoded_lengths=lengths)[0]
    for e, a in zip(expected, actual, strict=True):  # bit-identical to the torch path, durations included
        assert torch.equal(e.y_sequence, a.y_sequence) and torch.equal(e.timestamp, a.timestamp)
        assert torch.equal(e.token_duration, a.token_duration) and e.score == a.score
    assert_same_hypotheses(
        baseline(kind, decoder, joint, max_symbols)(encoder_output=x, encoded_lengths=lengths)[0], actual
    )
    assert sum(len(h.y_sequence) for h in actual) > 0


@pytest.mark.skipif(DEVICE.type != "cpu", reason="on a GPU host CPU decoding is not what runs")
def test_fused_kernels_forced_without_triton_backend_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    decoder, joint = make_networks()
    decode = ours("rnnt", decoder, joint, 3)
    decode.computer.fused_kernels = True
    x, lengths = random_encoder_output(2, 4, seed=1)
    with pytest.raises(ValueError, match="fused_kernels=True needs a CUDA device or TRITON_INTERPRET=1, got cpu"):
        decode(encoder_output=x, encoded_lengths=lengths)
