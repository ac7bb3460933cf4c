"""The exact greedy decoders on IEEE-fp32 Triton kernels (``exact_kernels``): NeMo's baseline hypotheses.

On CUDA, fp32 decodes run the LSTM prediction network and the joint's output layer on
:class:`~nemo_fastdecode.prediction.KernelPredictor` in ``"ieee"`` precision by default. Here the kernels run in
Triton's interpreter (``TRITON_INTERPRET=1``, set by conftest; ``exact_kernels=True`` with ``fused_kernels=True``
forces them on the CPU) and are checked against NeMo's baseline: same tokens, frames and durations, scores to fp32
rounding (the contract of ``tests/test_greedy_exactness.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import make_networks, random_encoder_output
from omegaconf import OmegaConf
from test_greedy_exactness import REALISTIC_BIAS, assert_same_hypotheses, baseline, ours

from nemo_fastdecode.kernels import lstm_step, matmul
from nemo_fastdecode.prediction import KernelPredictor
from nemo_fastdecode.tools import synthetic

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
LENGTHS = [24, 1, 17, 0, 9, 24]
ALGORITHMS = [("rnnt", False), ("rnnt", True), ("tdt", True)]
IDS = ["rnnt-frame", "rnnt-label", "tdt-label"]


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts of the Triton predictor's kernel launches (LSTM cell, linear), by precision."""
    calls: dict[str, int] = {}

    def counted(function, precision_position):
        def wrapper(*args, **kwargs):
            default = args[precision_position] if len(args) > precision_position else None
            precision = kwargs.get("precision", default)
            calls[precision] = calls.get(precision, 0) + 1
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(lstm_step, "lstm_cell_step", counted(lstm_step.lstm_cell_step, 9))
    monkeypatch.setattr(matmul, "linear", counted(matmul.linear, 3))
    return calls


def exact_on_kernels(kind, decoder, joint, max_symbols, loop_labels, **options):
    """The exact decoder forced onto the kernels: on CUDA where there is one, else in Triton's interpreter."""
    return ours(kind, decoder.to(DEVICE), joint.to(DEVICE), max_symbols, loop_labels, graph_mode="eager",
                fused_kernels=True, exact_kernels=True, **options)  # fmt: skip


@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=IDS)
@pytest.mark.parametrize("layers", [1, 2])
def test_exact_kernels_return_nemo_baseline_hypotheses(kind, loop_labels, layers, kernel_calls):
    seed = {1: 3, 2: 5}[layers]  # networks that emit labels at the realistic bias
    decoder, joint = make_networks(tdt=kind == "tdt", seed=seed, blank_bias=REALISTIC_BIAS[kind], pred_layers=layers)
    decoder, joint = decoder.to(DEVICE), joint.to(DEVICE)
    x, lengths = random_encoder_output(len(LENGTHS), 24, seed=4, lengths=LENGTHS, device=DEVICE)
    expected = baseline(kind, decoder, joint, 3)(encoder_output=x, encoded_lengths=lengths)[0]
    assert sum(len(h.y_sequence) for h in expected) > 0, "setup: the baseline should emit labels"
    # one frame per look here: the look-ahead has its own test below
    options = {"lookahead_frames": 1} if loop_labels else {}
    decode = exact_on_kernels(kind, decoder, joint, 3, loop_labels, **options)
    assert decode.computer.kernel_predictor.precision == "ieee"
    actual = decode(encoder_output=x, encoded_lengths=lengths)[0]
    assert kernel_calls.get("ieee", 0) > 0 and "tf32x3" not in kernel_calls, kernel_calls
    assert_same_hypotheses(expected, actual, with_durations=False)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_exact_kernels_look_ahead_by_default_and_keep_the_hypotheses(kind):
    """The IEEE joint kernel computes each row the same way at any batch size, so the automatic look-ahead applies
    to the exact path: several frames per joint call, NeMo's baseline hypotheses."""
    decoder, joint = make_networks(tdt=kind == "tdt", seed=5, blank_bias=0.8, pred_layers=2)
    decoder, joint = decoder.to(DEVICE), joint.to(DEVICE)
    x, lengths = random_encoder_output(len(LENGTHS), 24, seed=4, lengths=LENGTHS, device=DEVICE)
    expected = baseline(kind, decoder, joint, 3)(encoder_output=x, encoded_lengths=lengths)[0]
    assert sum(len(h.y_sequence) for h in expected) > 0
    decode = exact_on_kernels(kind, decoder, joint, 3, True)
    assert decode.computer._lookahead(x.device, len(LENGTHS)) > 1
    # (NeMo's batched TDT loop may record a later step's duration for a row: durations are compared elsewhere)
    assert_same_hypotheses(expected, decode(encoder_output=x, encoded_lengths=lengths)[0], with_durations=False)


def test_exact_kernels_leave_lower_precision_decodes_to_nemo_modules():
    """Outside fp32 (a bf16 or fp16 encoder projection, e.g. under autocast) the exact decoders run NeMo's modules in
    the caller's precision, as NeMo's decoders do (decoded on the GPU by ``tests/test_greedy_gpu.py``)."""
    decoder, joint = make_networks()
    computer = exact_on_kernels("rnnt", decoder, joint, 3, True).computer
    assert computer._predictor_for(DEVICE, torch.float32) is computer.kernel_predictor
    assert computer._predictor_for(DEVICE, torch.bfloat16) is None
    assert computer._predictor_for(DEVICE, torch.float16) is None
    assert computer._lookahead(DEVICE, 6, torch.bfloat16) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU defaults (the GPU's: tests/test_greedy_gpu.py)")
def test_exact_kernels_are_off_on_the_cpu_by_default_and_when_disabled(kernel_calls):
    decoder, joint = make_networks(seed=3, blank_bias=REALISTIC_BIAS["rnnt"])
    x, lengths = random_encoder_output(len(LENGTHS), 24, seed=4, lengths=LENGTHS)
    default = ours("rnnt", decoder, joint, 3, fused_kernels=True)  # default: CUDA only
    assert isinstance(default.computer.kernel_predictor, KernelPredictor)
    assert default.computer._predictor_for(x.device, torch.float32) is None
    default(encoder_output=x, encoded_lengths=lengths)
    disabled = ours("rnnt", decoder, joint, 3, fused_kernels=True, exact_kernels=False)
    assert disabled.computer.kernel_predictor is None
    disabled(encoder_output=x, encoded_lengths=lengths)
    assert kernel_calls == {}


def test_exact_kernels_name_what_they_need():
    decoder, joint = make_networks(context_size=2)  # a stateless prediction network: no LSTM step to replace
    with pytest.raises(ValueError, match="exact_kernels needs NeMo's plain LSTM prediction network.*Stateless"):
        ours("rnnt", decoder, joint, 3, exact_kernels=True)
    assert ours("rnnt", decoder, joint, 3).computer.kernel_predictor is None  # automatic: NeMo's modules
    decoder, joint = make_networks()
    x, lengths = random_encoder_output(2, 5, seed=1)
    decode = ours("rnnt", decoder, joint, 3, fused_kernels=False, exact_kernels=True)
    with pytest.raises(ValueError, match="exact_kernels=True needs the fused Triton kernels .*fused_kernels=False"):
        decode(encoder_output=x, encoded_lengths=lengths)


def test_exact_kernels_option_reaches_the_computer_from_the_config():
    yaml = OmegaConf.load(Path(__file__).parents[1] / "configs" / "decoding" / "fast_greedy.yaml")
    assert "exact_kernels" in yaml.greedy and yaml.greedy.exact_kernels is None
    model = synthetic.build_synthetic_model("tiny-rnnt")
    for value, expected in ((None, "ieee"), (False, None)):
        config = OmegaConf.create({"strategy": "fast_greedy", "greedy": {"max_symbols": 10, "exact_kernels": value}})
        model.change_decoding_strategy(config)
        predictor = model.decoding.decoding.computer.kernel_predictor
        assert (predictor.precision if predictor is not None else None) == expected
