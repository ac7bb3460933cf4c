"""The label loop as one loop (``looks_per_iteration=K``): K looks per iteration and no inner WHILE loop give the
same hypotheses as the two-level loop and as NeMo's baseline, in every graph mode.

Without CUDA the fast-math cases run the Triton kernels in the interpreter (TRITON_INTERPRET=1, set by conftest).
"""

from __future__ import annotations

import pytest
import torch
from conftest import GREEDY_UNBOUNDED_SAFE, VOCAB_SIZE, make_networks, random_encoder_output
from test_greedy_exactness import REALISTIC_BIAS, assert_same_hypotheses, baseline, ours
from test_greedy_lookahead import everything

from nemo_fastdecode.graphs import GraphMode, LoopPhases
from nemo_fastdecode.greedy import label_loop
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
LENGTHS = [24, 1, 17, 0, 9, 24]  # ragged, with a zero row


def networks(kind: str, max_symbols: int | None, blank_bias: float | None = None, device=DEVICE):
    seed, bias = (3, REALISTIC_BIAS[kind]) if max_symbols is not None else GREEDY_UNBOUNDED_SAFE[kind]
    decoder, joint = make_networks(tdt=kind == "tdt", seed=seed, blank_bias=bias if blank_bias is None else blank_bias)
    return decoder.to(device), joint.to(device)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("max_symbols", [1, 3, None])
@pytest.mark.parametrize("looks", [1, 2, 3])
def test_one_loop_matches_nemo_and_the_two_level_loop(kind, max_symbols, looks):
    decoder, joint = networks(kind, max_symbols, device="cpu")
    x, lengths = random_encoder_output(len(LENGTHS), 24, seed=4, lengths=LENGTHS)
    expected = baseline(kind, decoder, joint, max_symbols)(encoder_output=x, encoded_lengths=lengths)[0]
    two_level = ours(kind, decoder, joint, max_symbols, looks_per_iteration=0)
    one_loop = ours(kind, decoder, joint, max_symbols, looks_per_iteration=looks)
    got = one_loop(encoder_output=x, encoded_lengths=lengths)[0]
    assert_same_hypotheses(expected, got)
    assert everything(got) == everything(two_level(encoder_output=x, encoded_lengths=lengths)[0])
    assert sum(len(h.y_sequence) for h in got) > 0, "test setup should emit labels"


@pytest.mark.parametrize("kind,blank_bias", [("rnnt", 1.2), ("tdt", 0.8)])
def test_one_loop_with_windowed_looks_matches_the_two_level_loop(kind, blank_bias):
    # fast_math with look-ahead windows (the Triton window kernels): labels, and blank runs longer than a window
    # and than K looks, so rows carry their blank skipping over into later iterations
    decoder, joint = networks(kind, 3, blank_bias)
    x, lengths = random_encoder_output(len(LENGTHS), 24, seed=4, lengths=LENGTHS, device=DEVICE)

    def decode(looks: int):
        return ours(kind, decoder, joint, 3, graph_mode="eager", fused_kernels=True, fast_math=True,
                    lookahead_frames=3, looks_per_iteration=looks)(encoder_output=x, encoded_lengths=lengths)[0]  # fmt: skip

    expected = decode(0)
    for looks in (1, 2):
        assert everything(decode(looks)) == everything(expected), looks
    assert 0 < sum(len(h.y_sequence) for h in expected) < sum(LENGTHS) / 2, "labels and long blank runs"


def test_one_loop_has_no_inner_loop_and_the_default_is_named(monkeypatch):
    decoder, joint = networks("tdt", 3, device="cpu")
    seen = []
    real = LoopPhases.one_level
    monkeypatch.setattr(LoopPhases, "one_level", classmethod(lambda cls, *a: seen.append(a) or real(*a)))
    x, lengths = random_encoder_output(2, 9, seed=4)
    ours("tdt", decoder, joint, 3, looks_per_iteration=2)(encoder_output=x, encoded_lengths=lengths)
    assert len(seen) == 1
    seen.clear()
    ours("tdt", decoder, joint, 3, looks_per_iteration=0)(encoder_output=x, encoded_lengths=lengths)
    assert not seen
    # automatic: one loop with CUDA graphs, the two-level loop eagerly (here, on the CPU)
    ours("tdt", decoder, joint, 3)(encoder_output=x, encoded_lengths=lengths)
    assert not seen
    automatic = ours("tdt", decoder, joint, 3).computer
    assert automatic._looks(GraphMode.EAGER) == 0 == label_loop.auto_looks_per_iteration(GraphMode.EAGER, tdt=True)
    for mode in (GraphMode.FULL_GRAPH, GraphMode.NO_WHILE_GRAPH):
        assert automatic._looks(mode) == 1 == label_loop.auto_looks_per_iteration(mode, tdt=True)
    assert ours("tdt", decoder, joint, 3, looks_per_iteration=2).computer._looks(GraphMode.EAGER) == 2


@pytest.mark.parametrize("bad", [-1, True])
def test_bad_looks_per_iteration_is_named(bad):
    decoder, joint = make_networks()
    with pytest.raises(ValueError, match=f"looks_per_iteration must be 0 .*got {bad!r}"):
        FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, max_symbols_per_step=3, looks_per_iteration=bad)
    with pytest.raises(ValueError, match="looks_per_iteration=2 applies to the label loop only"):
        FastGreedyBatchedInfer(
            decoder, joint, VOCAB_SIZE, max_symbols_per_step=3, loop_labels=False, looks_per_iteration=2
        )


@pytest.mark.parametrize("kind,blank_bias", [("rnnt", 1.2), ("tdt", 0.8)])
def test_one_loop_in_graphs_on_the_gpu(kind, blank_bias):
    if not torch.cuda.is_available():
        pytest.skip("CUDA graphs need a GPU")
    decoder, joint = networks(kind, 3, blank_bias)
    x, lengths = random_encoder_output(len(LENGTHS), 24, seed=4, lengths=LENGTHS, device="cuda")
    for fast_math in (False, True):
        expected = everything(ours(kind, decoder, joint, 3, graph_mode="eager", fast_math=fast_math,
                                   looks_per_iteration=0)(encoder_output=x, encoded_lengths=lengths)[0])  # fmt: skip
        assert sum(len(labels) for labels, *_ in expected) > 0, "test setup should emit labels"
        for mode in ("full_graph", "no_while_graph"):
            for looks in (1, 2):
                decode = ours(kind, decoder, joint, 3, graph_mode=mode, fast_math=fast_math, looks_per_iteration=looks)
                assert everything(decode(encoder_output=x, encoded_lengths=lengths)[0]) == expected, (mode, looks)
