"""The offline path's opt-in fast encoder: NeMo's convolution modules fused, the same encoder to rounding, the same
transcripts on a trained model; in Triton's interpreter on the CPU (conftest) or on a GPU."""

from __future__ import annotations

import contextlib

import pytest
import torch
from nemo.collections.asr.models import ASRModel
from nemo.collections.asr.parts.submodules.conformer_modules import ConformerConvolution

from fastdecode_lab import synthetic
from nemo_fastdecode.apps.models import apply_decoding
from nemo_fastdecode.apps.trained_models import example_entries, trained_model_path
from nemo_fastdecode.offline import FastTranscribeOptions, fast_transcribe
from nemo_fastdecode.offline.fast_encoder import fast_encoder, fusable_conv_module

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _features(model, audio):
    signal = torch.zeros(len(audio), max(len(a) for a in audio))
    for row, a in enumerate(audio):
        signal[row, : len(a)] = torch.from_numpy(a)
    lengths = torch.tensor([len(a) for a in audio])
    with torch.inference_mode():
        return model.preprocessor(input_signal=signal.to(DEVICE), length=lengths.to(DEVICE))


def _encode(model, audio):
    features, feature_lengths = _features(model, audio)
    with torch.inference_mode():
        return model.encoder(audio_signal=features, length=feature_lengths)


@pytest.mark.parametrize("preset", ["tiny-tdt", "tiny-rnnt"])
def test_fused_encoder_equals_nemo_to_rounding_and_is_undone(preset):
    model = synthetic.build_synthetic_model(preset, device=DEVICE).eval()
    audio = synthetic.synthetic_audio([1.3, 2.9, 0.7], seed=3)  # ragged rows: the pad mask matters
    expected, expected_lengths = _encode(model, audio)
    layers = len(model.encoder.layers)
    with fast_encoder(model) as fused:
        assert fused == 2 * layers  # each layer's convolution module and attention
        assert all("forward" in layer.conv.__dict__ for layer in model.encoder.layers)
        assert all("forward" in layer.self_attn.__dict__ for layer in model.encoder.layers)
        out, lengths = _encode(model, audio)
    assert not any(m.__dict__.get("forward") for layer in model.encoder.layers for m in (layer.conv, layer.self_attn))
    assert torch.equal(lengths, expected_lengths)
    assert expected.abs().max() > 0.1
    # on CUDA both sides take TF32 products in the convolution modules (cuDNN's default, the GEMMs' here)
    tolerance = 2e-3 if DEVICE.type == "cuda" else 1e-4
    for row, n in enumerate(expected_lengths.tolist()):
        torch.testing.assert_close(out[row, :, :n], expected[row, :, :n], rtol=tolerance, atol=tolerance)
    again, _ = _encode(model, audio)
    assert torch.equal(again, expected)


def test_modules_it_cannot_fuse_stay_nemo_and_say_why():
    plain = ConformerConvolution(d_model=16, kernel_size=9, norm_type="layer_norm")
    assert "norm LayerNorm" in fusable_conv_module(plain)
    silu = ConformerConvolution(d_model=16, kernel_size=9, pointwise_activation="relu")
    assert "pointwise activation" in fusable_conv_module(silu)
    assert fusable_conv_module(ConformerConvolution(d_model=16, kernel_size=9)) is None
    model = synthetic.build_synthetic_model("tiny-tdt", device=DEVICE).eval()
    model.encoder.layers[0].conv = plain.to(DEVICE).eval()
    with fast_encoder(model) as fused:
        assert fused == 2 * len(model.encoder.layers) - 1
        assert "forward" not in model.encoder.layers[0].conv.__dict__


def test_training_mode_runs_nemo_modules():
    model = synthetic.build_synthetic_model("tiny-tdt", device=DEVICE)
    module = model.encoder.layers[0].conv
    x = torch.randn(2, 7, module.d_model, device=DEVICE)
    with fast_encoder(model):
        model.train()
        torch.manual_seed(0)
        trained = module(x)
        nemo = type(module).forward(module, x)  # batch statistics in both: the same modules' arithmetic
    torch.testing.assert_close(trained, nemo, rtol=0, atol=0)


def test_trained_model_transcripts_equal_nemo_with_the_fast_encoder():
    model = ASRModel.restore_from(str(trained_model_path("trained-tdt")), map_location=DEVICE).eval()
    files = [e["audio_filepath"] for e in example_entries()]
    assert len(files) == 6
    apply_decoding(model, {"strategy": "fast_greedy"})
    with torch.inference_mode():
        nemo = fast_transcribe(model, files, batch_size=4, return_hypotheses=True)
        fast = fast_transcribe(
            model, files, batch_size=4, return_hypotheses=True, options=FastTranscribeOptions(fast_encoder=True)
        )
    assert all(len(h.y_sequence) > 3 for h in nemo)
    assert [h.y_sequence.tolist() for h in fast] == [h.y_sequence.tolist() for h in nemo]
    assert [h.text for h in fast] == [h.text for h in nemo]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["bf16_autocast", "bf16_weights", "fp32"])
def test_encoder_stays_close_to_nemo_on_the_gpu(precision):
    """On CUDA: both modules fused in bf16 (autocast or weights); in fp32 the convolution modules (TF32 GEMMs, as
    cuDNN's) and NeMo's attention."""
    model = synthetic.build_synthetic_model("tiny-tdt", device=DEVICE).eval()
    if precision == "bf16_weights":
        model.to(torch.bfloat16)
        model.preprocessor.float()
    audio = synthetic.synthetic_audio([1.3, 2.9, 0.7], seed=4)

    def encode():
        features = _features(model, audio)
        if precision == "bf16_weights":
            features = (features[0].to(torch.bfloat16), features[1])
        context = (
            torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bf16_autocast" else contextlib.nullcontext()
        )
        with torch.inference_mode(), context:
            return model.encoder(audio_signal=features[0], length=features[1])

    expected, lengths = encode()
    with fast_encoder(model):
        out, _ = encode()
    assert out.dtype == expected.dtype and expected.abs().max() > 0.1
    tolerance = 1e-3 if precision == "fp32" else 0.05
    for row, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(
            out[row, :, :n].float(), expected[row, :, :n].float(), rtol=tolerance, atol=tolerance
        )
