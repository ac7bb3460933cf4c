"""Label-loop look-ahead (``lookahead_frames``): looks at the joint (and blank skipping) from one call over each
row's next W frames end in exactly the state of single-frame looks (same tokens, frames, durations, scores).

Without CUDA the Triton kernels run in the interpreter (TRITON_INTERPRET=1, set by conftest).
"""

from __future__ import annotations

import pytest
import torch
from conftest import GREEDY_UNBOUNDED_SAFE, VOCAB_SIZE, make_networks, random_encoder_output
from test_greedy_exactness import ours

from nemo_fastdecode.greedy import label_loop
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer
from nemo_fastdecode.greedy.label_loop import auto_lookahead_frames
from nemo_fastdecode.greedy.steps import window_look

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
LENGTHS = [24, 1, 17, 0, 9, 24, 3]


def decoder_for(kind, decoder, joint, max_symbols, lookahead_frames, mode="eager"):
    return ours(kind, decoder, joint, max_symbols, graph_mode=mode, fused_kernels=True, fast_math=True,
                lookahead_frames=lookahead_frames)  # fmt: skip


def everything(hyps):
    return [(h.y_sequence.tolist(), h.timestamp.tolist(), h.token_duration.tolist(), float(h.score)) for h in hyps]


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize(
    "window,max_symbols,blank_bias",
    [(2, 1, 0.7), (8, 3, 0.7), (3, 3, 0.8), (8, 1, 0.8), (3, None, None)],
    ids=["2-1", "8-3", "3-3-more-blanks", "8-1-more-blanks", "3-unbounded"],
)
def test_lookahead_matches_single_frame_steps(kind, window, max_symbols, blank_bias):
    # these networks skip up to 20 frames at a time (blank runs longer than every window here)
    seed, layers = 5, 2
    if max_symbols is None:
        (seed, blank_bias), layers = GREEDY_UNBOUNDED_SAFE[kind], 1
    decoder, joint = make_networks(tdt=kind == "tdt", seed=seed, blank_bias=blank_bias, pred_layers=layers)
    decoder, joint = decoder.to(DEVICE), joint.to(DEVICE)
    x, lengths = random_encoder_output(len(LENGTHS), 24, seed=4, lengths=LENGTHS, device=DEVICE)
    single = decoder_for(kind, decoder, joint, max_symbols, 1)(encoder_output=x, encoded_lengths=lengths)[0]
    ahead = decoder_for(kind, decoder, joint, max_symbols, window)
    assert ahead.computer._lookahead(x.device, len(LENGTHS)) == window
    windowed = ahead(encoder_output=x, encoded_lengths=lengths)[0]
    assert everything(windowed) == everything(single)
    assert sum(len(h.y_sequence) for h in single) > 0


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_one_kernel_look_on_raw_logits_matches_single_frame_steps(kind, monkeypatch):
    # a joint without log-softmax (NeMo's default on CUDA): each look is one kernel (window_look)
    decoder, joint = make_networks(tdt=kind == "tdt", seed=5, blank_bias=0.8, pred_layers=2)
    joint.log_softmax = False
    decoder, joint = decoder.to(DEVICE), joint.to(DEVICE)
    x, lengths = random_encoder_output(len(LENGTHS), 24, seed=4, lengths=LENGTHS, device=DEVICE)
    single = decoder_for(kind, decoder, joint, 3, 1)(encoder_output=x, encoded_lengths=lengths)[0]
    looks = []
    monkeypatch.setattr(label_loop, "window_look", lambda *args: looks.append(window_look(*args)))
    windowed = decoder_for(kind, decoder, joint, 3, 3)(encoder_output=x, encoded_lengths=lengths)[0]
    assert looks, "the one-kernel look was not used"
    assert everything(windowed) == everything(single)
    assert sum(len(h.y_sequence) for h in single) > 0


def test_lookahead_in_graphs_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("CUDA graphs need a GPU")
    # blank bias 0.8: labels, and blank runs that jump past a window (3.0 emitted no label on these networks)
    decoder, joint = make_networks(tdt=True, seed=5, blank_bias=0.8, pred_layers=2)
    decoder, joint = decoder.cuda(), joint.cuda()
    x, lengths = random_encoder_output(len(LENGTHS), 24, seed=4, lengths=LENGTHS, device="cuda")
    single = decoder_for("tdt", decoder, joint, 3, 1)(encoder_output=x, encoded_lengths=lengths)[0]
    assert sum(len(h.y_sequence) for h in single) > 0, "test setup should emit labels"
    for mode in ("full_graph", "no_while_graph"):
        windowed = decoder_for("tdt", decoder, joint, 3, None, mode)
        assert windowed.computer._lookahead(x.device, len(LENGTHS)) == 16  # TDT: 128 rows // 7 > 16
        assert everything(windowed(encoder_output=x, encoded_lengths=lengths)[0]) == everything(single)


@pytest.mark.usefixtures("exact_fp32")  # on CUDA, NeMo's cuDNN LSTM in true fp32 as the exact path is decided
@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("window", [2, 8])
def test_exact_path_windows_return_nemo_baseline_hypotheses(kind, window):
    """On the exact path (NeMo's Linear for the joint's output layer) a window's logits come from one GEMM of B * W
    rows: equal to the single-frame look's to fp32 rounding, so the hypotheses are NeMo's baseline's, as the
    single-frame exact path's are (same tokens and frames, scores to fp32 rounding)."""
    from test_greedy_exactness import assert_same_hypotheses, baseline

    decoder, joint = make_networks(tdt=kind == "tdt", seed=5, blank_bias=0.8, pred_layers=2)
    decoder, joint = decoder.to(DEVICE), joint.to(DEVICE)
    x, lengths = random_encoder_output(len(LENGTHS), 24, seed=4, lengths=LENGTHS, device=DEVICE)
    expected = baseline(kind, decoder, joint, 3)(encoder_output=x, encoded_lengths=lengths)[0]
    assert sum(len(h.y_sequence) for h in expected) > 0
    single = ours(kind, decoder, joint, 3, fused_kernels=True, lookahead_frames=1)
    ahead = ours(kind, decoder, joint, 3, fused_kernels=True, lookahead_frames=window)
    assert ahead.computer.fast_predictor is None and ahead.computer._lookahead(x.device, len(LENGTHS)) == window
    windowed = ahead(encoder_output=x, encoded_lengths=lengths)[0]
    # NeMo's batched TDT loop may record a later step's duration for a row: durations against our single-frame loop
    assert_same_hypotheses(expected, windowed, with_durations=False)
    assert_same_hypotheses(single(encoder_output=x, encoded_lengths=lengths)[0], windowed, with_durations=kind == "tdt")


def test_automatic_choice_and_bad_values_are_named():
    decoder, joint = make_networks()
    assert [auto_lookahead_frames(b) for b in (1, 32, 64, 128, 512, 513)] == [16, 16, 8, 4, 1, 1]
    assert [auto_lookahead_frames(b, tdt=True) for b in (1, 8, 32, 64, 128, 129)] == [16, 16, 4, 2, 1, 1]
    assert [auto_lookahead_frames(b, exact=True) for b in (1, 16, 32, 64, 128, 129)] == [16, 8, 4, 2, 1, 1]
    assert [auto_lookahead_frames(b, tdt=True, exact=True) for b in (4, 32, 64, 65)] == [16, 2, 1, 1]
    rows = 32
    forced_kernels = decoder_for("rnnt", decoder, joint, 3, None)  # fused_kernels=True: CUDA or the interpreter
    assert forced_kernels.computer._lookahead(DEVICE, rows) == 16
    plain = FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, max_symbols_per_step=3, fast_math=True)
    # fused kernels by default on CUDA only; the CPU runs the torch references, one frame per look
    assert plain.computer._lookahead(DEVICE, rows) == (16 if DEVICE.type == "cuda" else 1)
    default = FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, max_symbols_per_step=3, fused_kernels=True)
    assert default.computer._lookahead(DEVICE, rows) == 1  # NeMo's modules: each look NeMo's shape of joint call
    exact = FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, max_symbols_per_step=3, fused_kernels=True,
                                   exact_predictor=True)  # fmt: skip
    assert exact.computer._lookahead(DEVICE, rows) == 4  # the exact predictor's automatic window
    unfused_exact = FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, max_symbols_per_step=3, fused_kernels=False)
    assert unfused_exact.computer._lookahead(DEVICE, rows) == 1  # windows need the Triton step kernels
    exact_window = FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, max_symbols_per_step=3, fused_kernels=True,
                                          lookahead_frames=8)  # fmt: skip
    assert exact_window.computer._lookahead(DEVICE, rows) == 8
    with pytest.raises(ValueError, match="lookahead_frames must be a positive int or None.*got 0"):
        decoder_for("rnnt", decoder, joint, 3, 0)
    unfused = FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, max_symbols_per_step=3, fused_kernels=False,
                                     lookahead_frames=4)  # fmt: skip
    with pytest.raises(ValueError, match="lookahead_frames=4 needs the Triton kernels"):
        unfused.computer._lookahead(DEVICE, rows)
    with pytest.raises(ValueError, match="applies to the label loop only"):
        FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, 3, loop_labels=False, fast_math=True, lookahead_frames=4)
    forced = FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, max_symbols_per_step=3, fast_math=True,
                                    fused_kernels=False, lookahead_frames=4)  # fmt: skip
    with pytest.raises(ValueError, match="lookahead_frames=4 needs the Triton kernels"):
        forced.computer._lookahead(DEVICE, rows)
