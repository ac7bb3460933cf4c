"""The exact label loop's prediction-network step (:class:`~nemo_fastdecode.prediction.ExactPredictor`).

On CUDA the exact label loop runs it by default for float32 decodes; here its IEEE-fp32 Triton kernels run in Triton's
CPU interpreter (conftest sets TRITON_INTERPRET=1, ``exact_predictor=True`` with ``fused_kernels=True``). Whole decodes
are compared with NeMo's baseline (tokens and frames identical, scores to float32 rounding) and one step with NeMo's
own prediction network; the rules that choose it (float32, no autocast, eval mode, NeMo's LSTM) get their own tests.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_networks, random_encoder_output
from test_greedy_exactness import assert_same_hypotheses, baseline, ours

from nemo_fastdecode.prediction import ExactPredictor

pytestmark = pytest.mark.usefixtures("single_thread", "exact_fp32")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # kernels on a GPU, else interpreted


@pytest.fixture
def predictor_steps(monkeypatch) -> list[int]:
    """Counts :meth:`ExactPredictor.advance_in_place` calls (one per label-loop iteration that emits)."""
    calls = [0]
    original = ExactPredictor.advance_in_place

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ExactPredictor, "advance_in_place", counted)
    return calls


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("layers,blank_bias", [(1, 0.0), (2, -0.5)])
def test_decode_matches_nemo_baseline(kind, layers, blank_bias, predictor_steps):
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=blank_bias, pred_layers=layers)
    decoder, joint = decoder.to(DEVICE), joint.to(DEVICE)
    x, lengths = random_encoder_output(5, 12, seed=4, lengths=[12, 1, 9, 0, 12], device=DEVICE)
    with torch.inference_mode():
        expected = baseline(kind, decoder, joint, 3)(encoder_output=x, encoded_lengths=lengths)[0]
        ours_decoder = ours(kind, decoder, joint, 3, graph_mode="eager", fused_kernels=True, exact_predictor=True)
        actual = ours_decoder(encoder_output=x, encoded_lengths=lengths)[0]
    assert sum(len(h.y_sequence) for h in expected) > 10  # something to compare
    assert predictor_steps[0] > 0  # the exact predictor ran, not NeMo's modules
    assert_same_hypotheses(expected, actual)


@pytest.mark.parametrize("layers", [1, 2])
def test_step_matches_nemo_prediction_network(layers):
    """Masked rows advance as ``decoder.predict`` + ``joint.project_prednet`` would; the others keep their values."""
    decoder, joint = make_networks(seed=5, pred_layers=layers)
    decoder, joint = decoder.to(DEVICE), joint.to(DEVICE)
    predictor = ExactPredictor(decoder, joint)
    predictor.prepare(torch.float32)
    batch = 7
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, joint.num_classes_with_blank - 1, [batch], generator=g).to(DEVICE)
    mask = torch.tensor([True, False, True, True, False, True, True], device=DEVICE)
    hidden = decoder.pred_hidden
    states = [0.5 * torch.randn([layers, batch, hidden], generator=g).to(DEVICE) for _ in range(2)]
    output = torch.randn([batch, 1, joint.pred.out_features], generator=g).to(DEVICE)
    before = [s.clone() for s in states], output.clone()
    with torch.inference_mode():
        nemo_output, nemo_states, *_ = decoder.predict(labels.unsqueeze(1), states, add_sos=False, batch_size=batch)
        nemo_output = joint.project_prednet(nemo_output)
        gates = torch.empty([layers, batch, 4 * hidden], device=DEVICE)
        predictor.recurrent_gates(states, gates, fused=True)
        predictor.advance_in_place(labels, mask, states, output, gates, fused=True)
    for new, nemo, old in zip([*states, output], [*nemo_states, nemo_output], [*before[0], before[1]], strict=True):
        rows = mask if new.shape[0] == batch else mask.unsqueeze(0).expand(new.shape[0], -1)
        assert not torch.equal(new[rows], old[rows])  # the masked rows moved
        # the same fp32 operations in another order; on CUDA cuDNN and the kernels each use the GPU's approximate
        # exp (H200: up to 7e-6 apart on values of 0.4 after two layers)
        torch.testing.assert_close(new[rows], nemo[rows], rtol=2e-5, atol=1e-5)
        assert torch.equal(new[~rows], old[~rows])


def _computer(kind="rnnt", **options):
    decoder, joint = make_networks(tdt=kind == "tdt", seed=1)
    return ours(kind, decoder.to(DEVICE), joint.to(DEVICE), 3, **options).computer


def test_chosen_only_for_float32_eval_decodes_without_autocast():
    computer = _computer(fused_kernels=True, exact_predictor=True)
    assert computer._predictor_for(DEVICE, torch.float32) is computer.exact_predictor is not None
    assert computer._predictor_for(DEVICE, torch.bfloat16) is None  # NeMo's modules in the caller's precision
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        assert computer._predictor_for(DEVICE, torch.float32) is None
    computer.decoder.train()
    assert computer._predictor_for(DEVICE, torch.float32) is None  # training-mode dropout: NeMo's modules
    computer.decoder.eval()
    # opt-in: by default NeMo's modules, on CUDA too
    default = _computer(fused_kernels=True)
    assert default.exact_predictor is None and default._predictor_for(DEVICE, torch.float32) is None
    assert _computer(fused_kernels=True, exact_predictor=False).exact_predictor is None
    assert _computer(fast_math=True).exact_predictor is None  # fast math has its own predictor


def test_refusals_name_the_option_and_the_reason():
    with pytest.raises(ValueError, match="exact_predictor=True needs the fused Triton kernels"):
        _computer(fused_kernels=False, exact_predictor=True)._predictor_for(DEVICE, torch.float32)
    with pytest.raises(ValueError, match="exact_predictor needs the label-looping algorithm"):
        _computer(loop_labels=False, exact_predictor=True)
    decoder, joint = make_networks(context_size=2)
    with pytest.raises(ValueError, match="exact_predictor=True: the exact predictor needs NeMo's plain LSTM"):
        ours("rnnt", decoder, joint, 3, exact_predictor=True)
    # by default a stateless prediction network runs NeMo's modules, as every other one does
    assert ours("rnnt", decoder, joint, 3).computer.exact_predictor is None


def test_streaming_slots_decode_on_nemo_modules():
    """The streaming engine holds each stream to NeMo's decoding of it alone: NeMo's modules, op for op."""
    from fastdecode_lab import synthetic
    from nemo_fastdecode.streaming.decoding import SlotDecoder

    model = synthetic.build_synthetic_model("tiny-rnnt", device=DEVICE)
    slots = SlotDecoder(model, num_slots=2)
    assert slots.computers and all(c.exact_predictor is None for c in slots.computers.values())
