"""Opt-in fast math (``fast_math=True``): the 3xTF32 LSTM / linear kernels and the prediction network built on them.

The kernels run in Triton's CPU interpreter without a GPU (conftest sets TRITON_INTERPRET=1) and are compared
with their torch references and with NeMo's own prediction network; whole decodes are compared with the exact
path. Fast math is near fp32, not bit-exact, so comparisons use tolerances and decisions are compared on
networks without near-ties.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import VOCAB_SIZE, make_networks, random_encoder_output
from omegaconf import OmegaConf
from test_greedy_exactness import ALGORITHMS, REALISTIC_BIAS, assert_same_hypotheses, ours

from fastdecode_lab import synthetic
from nemo_fastdecode.config import FastGreedyConfig
from nemo_fastdecode.kernels import lstm_step, matmul
from nemo_fastdecode.kernels.tf32x3 import split_k_counters
from nemo_fastdecode.prediction import FastMathPredictor, fast_math_unsupported_reason

pytestmark = pytest.mark.usefixtures("single_thread", "exact_fp32")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # kernels on a GPU, else interpreted
TOLERANCE = 2e-5  # fp32 GEMM vs 3xTF32 on O(1) values with depth <= 70


def _randn(*shape, g):
    return torch.randn(list(shape), generator=g).to(DEVICE)


def _split_k_options(split_k: int) -> dict:
    """Kernel options for ``split_k`` programs per tile (16-deep K blocks, so that small depths really split)."""
    if split_k == 1:
        return {}
    return {"split_k": split_k, "counters": split_k_counters(DEVICE), "block_k": 16}


def _linear(x, weight, bias, out, **options):
    """The linear kernel tiled as the prediction network runs it, ``options`` on top."""
    return matmul.linear(x, weight, bias, out=out, **(matmul.decoder_tiling(x.shape[0]) | options))


@pytest.mark.parametrize("batch,hidden,depth", [(1, 16, 16), (5, 24, 40), (33, 40, 24), (70, 17, 9)])
@pytest.mark.parametrize("indexed_bias", [True, False])
@pytest.mark.parametrize("recurrent", ["h", "precomputed"])
def test_lstm_cell_kernel_matches_reference(batch, hidden, depth, indexed_bias, recurrent):
    g = torch.Generator().manual_seed(batch + hidden)
    h, c = _randn(batch, hidden, g=g), _randn(batch, hidden, g=g)
    weight_h = 0.3 * _randn(4 * hidden, hidden, g=g)
    x, weight_x = (None, None) if indexed_bias else (_randn(batch, depth, g=g), 0.3 * _randn(4 * hidden, depth, g=g))
    row_bias = _randn(7, 4 * hidden, g=g) if indexed_bias else _randn(4 * hidden, g=g)
    bias_index = torch.randint(0, 7, [batch], generator=g).to(DEVICE) if indexed_bias else None
    # h @ W_h^T inside the kernel, or computed beforehand (as the label loop does on a parallel graph branch)
    recurrent_args = (h, weight_h, {}) if recurrent == "h" else (None, None, {"recurrent_gates": h @ weight_h.T})
    outputs = {}
    for name, cell in (("kernel", lstm_step.lstm_cell_step), ("reference", lstm_step.lstm_cell_step_reference)):
        h_out, c_out = torch.full_like(h, float("nan")), torch.full_like(c, float("nan"))
        h_in, weight_h_in, kwargs = recurrent_args if name == "kernel" else (h, weight_h, {})
        cell(row_bias, bias_index, x, weight_x, h_in, weight_h_in, c, h_out, c_out, **kwargs)
        outputs[name] = h_out, c_out
    for kernel, reference in zip(outputs["kernel"], outputs["reference"], strict=True):
        torch.testing.assert_close(kernel, reference, rtol=TOLERANCE, atol=TOLERANCE)
    assert not torch.equal(outputs["kernel"][0], h)  # the step did something


@pytest.mark.parametrize("batch,n_out,depth", [(1, 16, 16), (5, 13, 40), (40, 70, 33)])
@pytest.mark.parametrize("split_k", [1, 3])
def test_linear_kernel_matches_reference(batch, n_out, depth, split_k):
    g = torch.Generator().manual_seed(batch)
    x, weight, bias = _randn(batch, depth, g=g), _randn(n_out, depth, g=g), _randn(n_out, g=g)
    options = _split_k_options(split_k)
    expected = matmul.linear_reference(x, weight, bias, out=torch.empty([batch, n_out], device=DEVICE))
    actual = _linear(x, weight, bias, torch.full([batch, n_out], float("nan"), device=DEVICE), **options)
    torch.testing.assert_close(actual, expected, rtol=TOLERANCE, atol=TOLERANCE)
    again = _linear(x, weight, bias, torch.full([batch, n_out], float("nan"), device=DEVICE), **options)
    assert torch.equal(actual, again)  # deterministic, whatever order the splits finish in
    if "counters" in options:  # every launch leaves its counters at zero for the next one
        assert not options["counters"].any()


@pytest.mark.parametrize("split_k", [1, 3])
def test_masked_in_place_step_writes_only_the_masked_rows(split_k):
    """The label loop's in-place update: cells on the state itself (c read and written, h not read: its recurrent
    gates come precomputed) and the projection into the output, rows outside the mask untouched."""
    g = torch.Generator().manual_seed(5)
    batch, hidden, n_out = 6, 16, 24
    h, c = _randn(batch, hidden, g=g), _randn(batch, hidden, g=g)
    weight_h, table = 0.3 * _randn(4 * hidden, hidden, g=g), _randn(7, 4 * hidden, g=g)
    labels = torch.randint(0, 7, [batch], generator=g).to(DEVICE)
    mask = torch.tensor([True, False, True, True, False, True], device=DEVICE)
    expected_h, expected_c = torch.empty_like(h), torch.empty_like(c)
    lstm_step.lstm_cell_step_reference(table, labels, None, None, h, weight_h, c, expected_h, expected_c)
    state_h, state_c = h.clone(), c.clone()
    lstm_step.lstm_cell_step(table, labels, None, None, None, None, state_c, state_h, state_c,
                             recurrent_gates=h @ weight_h.T, row_mask=mask)  # fmt: skip
    for state, new, old in ((state_h, expected_h, h), (state_c, expected_c, c)):
        torch.testing.assert_close(state[mask], new[mask], rtol=TOLERANCE, atol=TOLERANCE)
        assert torch.equal(state[~mask], old[~mask])
    weight, bias = _randn(n_out, hidden, g=g), _randn(n_out, g=g)
    out = _randn(batch, n_out, g=g)
    before = out.clone()
    _linear(state_h, weight, bias, out, row_mask=mask, **_split_k_options(split_k))
    expected = matmul.linear_reference(state_h, weight, bias, out=before.clone(), row_mask=mask)
    torch.testing.assert_close(out, expected, rtol=TOLERANCE, atol=TOLERANCE)
    assert torch.equal(out[~mask], before[~mask]) and not torch.equal(out[mask], before[mask])
    with pytest.raises(ValueError, match="h_out may be h only with recurrent_gates"):
        lstm_step.lstm_cell_step(table, labels, None, None, h, weight_h, c, h, c.clone())


def test_split_k_needs_int32_counters():
    x, out = torch.zeros([2, 16], device=DEVICE), torch.empty([2, 4], device=DEVICE)
    weight, bias = torch.zeros([4, 16], device=DEVICE), torch.zeros(4, device=DEVICE)
    with pytest.raises(ValueError, match="split_k=2 needs int32 tile counters"):
        _linear(x, weight, bias, out, split_k=2, counters=torch.zeros(8, device=DEVICE))
    with pytest.raises(ValueError, match="split_k must be a positive int, got 0"):
        _linear(x, weight, bias, out, split_k=0)


def test_kernels_reject_non_fp32_inputs_and_bad_shapes():
    h = torch.zeros([2, 16], device=DEVICE)
    with pytest.raises(ValueError, match="x must be float32, got torch.bfloat16"):
        _linear(h.bfloat16(), torch.zeros([4, 16], device=DEVICE), torch.zeros(4, device=DEVICE), h[:, :4])
    with pytest.raises(ValueError, match="LSTM shapes disagree"):
        lstm_step.lstm_cell_step(torch.zeros(64, device=DEVICE), None, None, None, h, torch.zeros([16, 16], device=DEVICE),
                                 h, h.clone(), h.clone())  # fmt: skip
    with pytest.raises(ValueError, match="give h and weight_h, or recurrent_gates"):  # both
        lstm_step.lstm_cell_step(torch.zeros(64, device=DEVICE), None, None, None, h, torch.zeros([64, 16], device=DEVICE),
                                 h, h.clone(), h.clone(), recurrent_gates=torch.zeros([2, 64], device=DEVICE))  # fmt: skip


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("fused", [True, False], ids=["kernels", "torch"])
def test_predictor_step_matches_nemo_prediction_network(layers, fused):
    decoder, joint = make_networks(pred_layers=layers, seed=layers)
    decoder, joint = decoder.to(DEVICE), joint.to(DEVICE)
    predictor = FastMathPredictor(decoder, joint)
    assert predictor.refresh() is True and predictor.refresh() is False  # built once, then reused
    g = torch.Generator().manual_seed(0)
    labels = torch.tensor([0, 3, VOCAB_SIZE, 7, 1], device=DEVICE)  # VOCAB_SIZE = blank (the zero embedding)
    states = [_randn(layers, 5, decoder.pred_hidden, g=g) for _ in range(2)]
    with torch.inference_mode():
        expected, expected_states, *_ = decoder.predict(labels[:, None], states, add_sos=False, batch_size=5)
        expected = joint.project_prednet(expected)
        output, new_states = predictor.step(labels, states, fused)
    torch.testing.assert_close(output, expected, rtol=TOLERANCE, atol=TOLERANCE)
    for actual, reference in zip(new_states, expected_states, strict=True):
        torch.testing.assert_close(actual, reference, rtol=TOLERANCE, atol=TOLERANCE)
    hidden = torch.relu(_randn(5, joint.joint_net[-1].in_features, g=g))
    with torch.inference_mode():
        torch.testing.assert_close(
            predictor.joint_output(hidden), joint.joint_net[-1](hidden), rtol=TOLERANCE, atol=TOLERANCE
        )


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("fused", [True, False], ids=["kernels", "torch"])
def test_predictor_advance_in_place_is_step_then_masked_copy(layers, fused):
    decoder, joint = make_networks(pred_layers=layers, seed=layers)
    predictor = FastMathPredictor(decoder.to(DEVICE), joint.to(DEVICE))
    predictor.refresh()
    g = torch.Generator().manual_seed(3)
    labels = torch.tensor([0, 3, VOCAB_SIZE, 7, 1], device=DEVICE)
    mask = torch.tensor([True, True, False, True, False], device=DEVICE)
    states = [_randn(layers, 5, decoder.pred_hidden, g=g) for _ in range(2)]
    output = _randn(5, 1, joint.pred.out_features, g=g)
    with torch.inference_mode():
        new_output, new_states = predictor.step(labels, states, fused)
        expected_output = torch.where(mask[:, None, None], new_output, output)
        expected_states = [
            torch.where(mask[None, :, None], new, old) for new, old in zip(new_states, states, strict=True)
        ]
        gates = predictor.recurrent_gates(states, torch.empty([layers, 5, 4 * decoder.pred_hidden], device=DEVICE),
                                          fused)  # fmt: skip
        predictor.advance_in_place(labels, mask, states, output, gates, fused)
    torch.testing.assert_close(output, expected_output, rtol=TOLERANCE, atol=TOLERANCE)
    for actual, expected in zip(states, expected_states, strict=True):
        torch.testing.assert_close(actual, expected, rtol=TOLERANCE, atol=TOLERANCE)
        assert torch.equal(actual[:, ~mask], expected[:, ~mask])  # untouched rows: bit for bit


def test_predictor_follows_weight_updates():
    decoder, joint = make_networks()
    predictor = FastMathPredictor(decoder, joint)
    predictor.refresh()
    labels, states = torch.tensor([2, 5]), [torch.zeros([1, 2, decoder.pred_hidden]) for _ in range(2)]
    before = predictor.step(labels, states, fused=False)[0]
    with torch.no_grad():
        decoder.prediction["embed"].weight.mul_(2.0)  # an in-place update (fine-tuning, loading a checkpoint)
    assert predictor.refresh() is False  # same shapes: rewritten in place, captured graphs stay valid
    after = predictor.step(labels, states, fused=False)[0]
    expected = joint.project_prednet(decoder.predict(labels[:, None], states, add_sos=False, batch_size=2)[0])
    torch.testing.assert_close(after, expected.detach(), rtol=TOLERANCE, atol=TOLERANCE)
    assert not torch.allclose(before, after)


def test_unsupported_prediction_networks_are_named():
    decoder, joint = make_networks()
    assert fast_math_unsupported_reason(decoder, joint) is None
    decoder.prediction["dec_rnn"] = torch.nn.GRU(4, 4)
    with pytest.raises(ValueError, match="plain LSTM prediction network.*got GRU"):
        FastMathPredictor(decoder, joint)
    decoder, joint = make_networks()
    states = [torch.zeros([1, 2, decoder.pred_hidden], dtype=torch.bfloat16) for _ in range(2)]
    predictor = FastMathPredictor(decoder, joint)
    predictor.refresh()
    with pytest.raises(ValueError, match="fast_math decodes in float32, got torch.bfloat16"):
        predictor.step(torch.tensor([1, 2]), states, fused=False)


@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=["rnnt-frame", "rnnt-label", "tdt-label"])
@pytest.mark.parametrize("fused", [True, False], ids=["kernels", "torch"])
def test_fast_math_decoding_agrees_with_exact_path(kind, loop_labels, fused):
    layers, seed = (2, 5) if kind == "tdt" else (1, 3)  # networks that emit labels at the realistic bias
    decoder, joint = make_networks(tdt=kind == "tdt", seed=seed, blank_bias=REALISTIC_BIAS[kind], pred_layers=layers)
    decoder, joint = decoder.to(DEVICE), joint.to(DEVICE)
    x, lengths = random_encoder_output(6, 24, seed=4, lengths=[24, 1, 17, 0, 9, 24], device=DEVICE)
    exact = ours(kind, decoder, joint, 3, loop_labels)(encoder_output=x, encoded_lengths=lengths)[0]
    fast = ours(kind, decoder, joint, 3, loop_labels)
    fast.computer.fused_kernels = fused
    fast.computer.fast_predictor = FastMathPredictor(decoder, joint)
    hyps = fast(encoder_output=x, encoded_lengths=lengths)[0]
    # these networks have no near-ties, so the decisions agree; scores agree to fp32 rounding
    assert_same_hypotheses(exact, hyps, with_durations=kind == "tdt")
    assert sum(len(h.y_sequence) for h in hyps) > 0


def test_fast_math_option_reaches_the_computer_from_the_config():
    assert (
        OmegaConf.load(Path(__file__).parents[1] / "configs" / "decoding" / "fast_greedy.yaml").greedy.fast_math
        is False
    )
    assert FastGreedyConfig(fast_math=True).fast_math is True
    model = synthetic.build_synthetic_model("tiny-rnnt")
    config = OmegaConf.create({"strategy": "fast_greedy", "greedy": {"max_symbols": 10, "fast_math": True}})
    model.change_decoding_strategy(config)
    computer = model.decoding.decoding.computer
    assert isinstance(computer.fast_predictor, FastMathPredictor)
    audio = synthetic.synthetic_audio([1.5, 0.7], seed=2)
    hyps = model.transcribe(audio, batch_size=2, verbose=False)
    assert len(hyps) == 2 and all(isinstance(h.text, str) for h in hyps)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("fused", [True, False], ids=["kernels", "torch"])
def test_fast_math_beam_search_agrees_with_the_exact_search(kind, fused, monkeypatch):
    from test_beam_exactness import LENGTHS, as_tuples, fast_beam

    if not fused:  # the torch references: what fast_math runs where Triton does not
        monkeypatch.setattr("nemo_fastdecode.beam.malsd.triton_runs_on", lambda device: False)
        monkeypatch.setattr("nemo_fastdecode.prediction.triton_runs_on", lambda device: False)
    layers = 2 if kind == "tdt" else 1
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=REALISTIC_BIAS[kind], pred_layers=layers)
    decoder, joint = decoder.to(DEVICE), joint.to(DEVICE)
    x, lengths = random_encoder_output(6, 24, seed=4, lengths=LENGTHS, device=DEVICE)
    exact = fast_beam(kind, decoder, joint, 4, 3, return_best_hypothesis=False)
    fast = fast_beam(kind, decoder, joint, 4, 3, return_best_hypothesis=False, fast_math=True)
    expected = as_tuples(exact(encoder_output=x, encoded_lengths=lengths)[0], nbest=True)
    actual = as_tuples(fast(encoder_output=x, encoded_lengths=lengths)[0], nbest=True)
    # same n-best lists (tokens, timestamps, durations); scores to fp32 rounding
    assert [[h[:3] for h in n] for n in actual] == [[h[:3] for h in n] for n in expected]
    for n_actual, n_expected in zip(actual, expected, strict=True):
        assert [h[3] for h in n_actual] == pytest.approx([h[3] for h in n_expected], rel=1e-5, abs=1e-5)
    assert any(len(h[0]) for n in actual for h in n)


def test_fast_beam_config_reaches_the_computer():
    assert OmegaConf.load(Path(__file__).parents[1] / "configs" / "decoding" / "fast_beam.yaml").beam.fast_math is False
    model = synthetic.build_synthetic_model("tiny-rnnt")
    model.change_decoding_strategy(
        OmegaConf.create({"strategy": "fast_beam", "beam": {"beam_size": 2, "fast_math": True}})
    )
    assert isinstance(model.decoding.decoding.computer.fast_predictor, FastMathPredictor)
    model.change_decoding_strategy(
        OmegaConf.create({"strategy": "fast_beam", "beam": {"beam_size": 2, "compiled_step": True}})
    )
    computer = model.decoding.decoding.computer
    assert computer._compiled is not None  # compiled on CUDA only: the CPU runs the parts as written
    buffers = SimpleNamespace(device=torch.device("cpu"), float_dtype=torch.float32)
    assert computer._step_parts(buffers) == (computer._extend, computer._select_parents, computer._keep_parents)


def test_non_default_joint_is_rejected_by_name():
    decoder, joint = make_networks()
    joint.joint_net[0] = torch.nn.Tanh()
    with pytest.raises(ValueError, match="fast_math needs NeMo's default joint .*got Tanh"):
        FastMathPredictor(decoder, joint)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_fast_math_under_autocast_decodes_in_float32(search):
    """Under bf16 autocast (how NeMo users run ``transcribe``) fast math runs its own float32: the same hypotheses as
    outside autocast on the same values, whether the encoder output comes in bf16 or fp32."""
    from test_beam_exactness import fast_beam

    decoder, joint = make_networks()
    x, lengths = random_encoder_output(3, 8, seed=1)
    x = x.bfloat16().float()  # values a bf16 encoder output can hold
    if search == "greedy":
        decode = ours("rnnt", decoder, joint, 3)
        decode.computer.fast_predictor = FastMathPredictor(decoder, joint)
    else:
        decode = fast_beam("rnnt", decoder, joint, 2, 3, fast_math=True)
    (want,) = decode(encoder_output=x, encoded_lengths=lengths)
    assert sum(len(h.y_sequence) for h in want) > 0  # tokens to compare
    for encoder_output in (x, x.bfloat16()):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            (got,) = decode(encoder_output=encoder_output, encoded_lengths=lengths)
        assert_same_hypotheses(got, want)
    with pytest.raises(ValueError, match="fast_math decodes in float32, got torch.bfloat16"):
        FastMathPredictor(decoder, joint).check_dtype(torch.bfloat16)
