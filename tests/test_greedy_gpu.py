"""GPU behaviour of fast_greedy: every graph mode against NeMo's baseline, graph lifetime, devices, streams.

Marked ``gpu``: skipped on machines without CUDA (CI); run on a GPU host with ``pytest -m gpu``.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_networks, random_encoder_output
from test_greedy_exactness import REALISTIC_BIAS, UNBOUNDED_SAFE, assert_same_hypotheses, baseline, ours

from nemo_fastdecode.graphs import GraphMode
from nemo_fastdecode.graphs.cuda_api import while_nodes_unavailable_reason

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("exact_fp32")]
MODES = ["full_graph", "no_while_graph", "eager"]
ALGORITHMS = [("rnnt", False), ("rnnt", True), ("tdt", True)]


def cuda_networks(kind, seed, device="cuda", bias=None):
    bias = REALISTIC_BIAS[kind] if bias is None else bias
    decoder, joint = make_networks(tdt=kind == "tdt", seed=seed, blank_bias=bias)
    return decoder.to(device), joint.to(device)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "torch"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=["rnnt-frame", "rnnt-label", "tdt-label"])
@pytest.mark.parametrize("max_symbols", [1, 3, 10, None])
def test_every_mode_matches_baseline_on_gpu(mode, kind, loop_labels, max_symbols, fused):
    if max_symbols is None:  # a network that always comes back to blank (else NeMo's baseline never returns)
        seed, bias = UNBOUNDED_SAFE[kind]
        decoder, joint = cuda_networks(kind, seed=seed, bias=bias)
        x, lengths = random_encoder_output(6, 24, seed=4, lengths=[24, 1, 17, 0, 9, 24], device="cuda")
    else:
        # seed 3 emits labels on about 60 frames, more with each max_symbols (RNN-T 62 / 166 / 500, TDT 48 / 56 /
        # 78 at 1 / 3 / 10); seed 21 emitted on 7 frames only
        decoder, joint = cuda_networks(kind, seed=3)
        x, lengths = random_encoder_output(9, 41, seed=22, lengths=[41, 3, 0, 40, 17, 1, 41, 25, 8], device="cuda")
    expected = baseline(kind, decoder, joint, max_symbols)(encoder_output=x, encoded_lengths=lengths)[0]
    assert sum(len(h.y_sequence) for h in expected) > 0, "test setup should emit labels"
    decode = ours(kind, decoder, joint, max_symbols, loop_labels, graph_mode=mode)
    decode.computer.fused_kernels = fused
    for _ in range(2):  # the second call replays the captured graph
        actual = decode(encoder_output=x, encoded_lengths=lengths)[0]
        assert_same_hypotheses(expected, actual)
    if mode == "full_graph" and while_nodes_unavailable_reason(x.device) is None:
        assert decode.computer.graph_mode is GraphMode.FULL_GRAPH


def test_auto_mode_uses_while_nodes_where_the_driver_has_them():
    decoder, joint = cuda_networks("rnnt", seed=23)
    decode = ours("rnnt", decoder, joint, 10)
    x, lengths = random_encoder_output(4, 20, seed=24, device="cuda")
    decode(encoder_output=x, encoded_lengths=lengths)
    expected = GraphMode.NO_WHILE_GRAPH if while_nodes_unavailable_reason(x.device) else GraphMode.FULL_GRAPH
    assert decode.computer.graph_mode is expected


@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=["rnnt-frame", "rnnt-label", "tdt-label"])
def test_recapture_only_when_batch_or_length_grows(kind, loop_labels):
    decoder, joint = cuda_networks(kind, seed=3)  # labels in every run below (seed 25 emitted none in several)
    # NeMo's modules: this network never emits blank (bursts of max_symbols), its LSTM saturates and labels tie to
    # float32 rounding, ties that the exact predictor's reordered fp32 sums may break the other way (it is compared
    # with NeMo on networks without such ties in test_exact_predictor.py and the tests above); this test is about
    # graph capture
    decode = ours(kind, decoder, joint, 5, loop_labels, exact_predictor=False)
    computer = decode.computer

    def run(batch, time, seed):
        x, lengths = random_encoder_output(batch, time, seed=seed, device="cuda")
        expected = baseline(kind, decoder, joint, 5)(encoder_output=x, encoded_lengths=lengths)[0]
        assert sum(len(h.y_sequence) for h in expected) > 0, "test setup should emit labels"
        assert_same_hypotheses(expected, decode(encoder_output=x, encoded_lengths=lengths)[0])
        return computer._buffers

    first = run(8, 40, 1)
    assert run(4, 30, 2) is first and run(8, 40, 3) is first  # smaller or equal: same graph
    grown = run(12, 40, 4)
    assert grown is not first and grown.batch_size >= 12
    longer = run(12, 90, 5)
    assert longer is not grown and longer.max_time >= 90
    # memory stays bounded: many more calls at sizes within the captured ones allocate nothing new
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for seed in range(6, 16):
        assert run(1 + seed % 12, 10 + 7 * seed % 80, seed) is longer
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before + (1 << 20)


def test_non_default_stream():
    decoder, joint = cuda_networks("tdt", seed=26)
    x, lengths = random_encoder_output(5, 33, seed=27, device="cuda")
    expected = baseline("tdt", decoder, joint, 4)(encoder_output=x, encoded_lengths=lengths)[0]
    decode = ours("tdt", decoder, joint, 4)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(2):
            actual = decode(encoder_output=x, encoded_lengths=lengths)[0]
    stream.synchronize()
    assert_same_hypotheses(expected, actual)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=["rnnt-frame", "rnnt-label", "tdt-label"])
def test_second_gpu(kind, loop_labels):
    decoder, joint = cuda_networks(kind, seed=3, device="cuda:1")  # (seed 28 emitted no RNN-T label)
    x, lengths = random_encoder_output(6, 30, seed=29, device="cuda:1")
    expected = baseline(kind, decoder, joint, 3)(encoder_output=x, encoded_lengths=lengths)[0]
    assert sum(len(h.y_sequence) for h in expected) > 0, "test setup should emit labels"
    actual = ours(kind, decoder, joint, 3, loop_labels)(encoder_output=x, encoded_lengths=lengths)[0]
    assert_same_hypotheses(expected, actual)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=["rnnt-frame", "rnnt-label", "tdt-label"])
def test_fused_kernels_are_bit_identical_on_gpu(mode, kind, loop_labels):
    """Fused step kernels change no score bit, also under bf16 autocast (where near-ties are common)."""
    decoder, joint = cuda_networks(kind, seed=30)
    x, lengths = random_encoder_output(32, 64, seed=31, device="cuda")
    results = {}
    for fused in (False, True):
        decode = ours(kind, decoder, joint, 10, loop_labels, graph_mode=mode)
        decode.computer.fused_kernels = fused
        with torch.autocast("cuda", dtype=torch.bfloat16):
            results[fused] = decode(encoder_output=x, encoded_lengths=lengths)[0]
    for expected, actual in zip(results[False], results[True], strict=True):
        assert torch.equal(expected.y_sequence, actual.y_sequence) and torch.equal(expected.timestamp, actual.timestamp)
        assert expected.score == actual.score


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=["rnnt-frame", "rnnt-label", "tdt-label"])
def test_fast_math_in_every_mode_agrees_with_the_exact_path(mode, kind, loop_labels):
    """Opt-in fast math (3xTF32 prediction network) in graphs: same decisions as the exact path, near-fp32 scores."""
    from nemo_fastdecode.prediction import FastMathPredictor

    decoder, joint = cuda_networks(kind, seed=21)
    x, lengths = random_encoder_output(9, 41, seed=22, lengths=[41, 3, 0, 40, 17, 1, 41, 25, 8], device="cuda")
    expected = ours(kind, decoder, joint, 10, loop_labels)(encoder_output=x, encoded_lengths=lengths)[0]
    decode = ours(kind, decoder, joint, 10, loop_labels, graph_mode=mode)
    decode.computer.fast_predictor = FastMathPredictor(decoder, joint)
    for _ in range(2):  # the second call replays the captured graph
        assert_same_hypotheses(expected, decode(encoder_output=x, encoded_lengths=lengths)[0])


def test_decoders_collected_while_another_captures_do_not_abort():
    """A dropped decoder (reference cycles) freed by the cyclic GC during another capture used to abort the process."""
    import gc

    decoder, joint = cuda_networks("rnnt", seed=21)
    x, lengths = random_encoder_output(4, 20, seed=24, device="cuda")
    threshold = gc.get_threshold()
    gc.set_threshold(1)  # collect at almost every allocation
    try:
        for mode in ("full_graph", "no_while_graph", "full_graph"):
            decode = ours("rnnt", decoder, joint, 10, True, graph_mode=mode)
            assert len(decode(encoder_output=x, encoded_lengths=lengths)[0]) == 4
            del decode
    finally:
        gc.set_threshold(*threshold)


@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=["rnnt-frame", "rnnt-label", "tdt-label"])
def test_a_decoder_built_on_the_gpu_warms_up_and_decodes_the_same(monkeypatch, kind, loop_labels):
    """Built where the networks sit on a GPU, the decoder decodes two frames once (kernels loaded before the first
    transcribe), keeps no graphs from it, and then decodes as one built without the warm-up."""
    decoder, joint = cuda_networks(kind, seed=3)
    x, lengths = random_encoder_output(9, 41, seed=22, lengths=[41, 3, 0, 40, 17, 1, 41, 25, 8], device="cuda")
    warmed = ours(kind, decoder, joint, 10, loop_labels)
    assert warmed.warm_up_seconds is not None and warmed.warm_up_seconds > 0
    assert warmed.computer._buffers is None  # the first real batch captures at its own size
    monkeypatch.setenv("NEMO_FASTDECODE_DECODER_WARM_UP", "0")
    cold = ours(kind, decoder, joint, 10, loop_labels)
    assert cold.warm_up_seconds is None
    expected = cold(encoder_output=x, encoded_lengths=lengths)[0]
    assert sum(len(h.y_sequence) for h in expected) > 0, "test setup should emit labels"
    assert_same_hypotheses(expected, warmed(encoder_output=x, encoded_lengths=lengths)[0], with_durations=kind == "tdt")
