"""Tests for fastdecode_lab.synthetic: random-weight Parakeet-architecture models and synthetic data (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from omegaconf import OmegaConf

from fastdecode_lab import synthetic as S
from fastdecode_lab.configs import SyntheticManifestConfig

ROOT = Path(__file__).resolve().parents[1]

TINY = ["tiny-rnnt", "tiny-tdt", "tiny-hybrid"]


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def tiny_models():
    return {preset: S.build_synthetic_model(preset, seed=0) for preset in TINY}


@pytest.fixture(scope="module")
def short_audio():
    return S.synthetic_audio([1.7, 1.2], seed=3)


def _random_encoder_output(model, batch=4, frames=96, seed=0):
    generator = torch.Generator().manual_seed(seed)
    enc = torch.randn(batch, model.encoder.d_model, frames, generator=generator)
    lengths = torch.tensor([frames, frames - 16, frames // 2, 20])[:batch]
    return enc, lengths


# ---------------------------------------------------------------- presets and configs


def test_unknown_preset_lists_valid_presets():
    with pytest.raises(ValueError) as info:
        S.build_synthetic_model("parakeet-9b")
    message = str(info.value)
    assert "'parakeet-9b'" in message
    for preset in S.PRESETS:
        assert preset in message
    with pytest.raises(ValueError, match="tiny-rnnt"):
        S.make_synthetic_config("nope")


def test_unknown_vocab_is_rejected():
    with pytest.raises(ValueError, match="'wordpiece'.*char, bpe"):
        S.make_synthetic_config("tiny-rnnt", vocab="wordpiece")


@pytest.mark.parametrize(
    ("preset", "layers", "pred_layers", "durations"),
    [
        ("rnnt-0.6b", 24, 1, None),
        ("rnnt-1.1b", 42, 1, None),
        ("tdt-0.6b", 24, 2, [0, 1, 2, 3, 4]),
    ],
)
def test_big_preset_config_sizes(preset, layers, pred_layers, durations):
    cfg = S.make_synthetic_config(preset)
    enc = cfg.encoder
    assert (enc.n_layers, enc.d_model, enc.n_heads) == (layers, 1024, 8)
    assert (enc.subsampling, enc.subsampling_factor, enc.conv_kernel_size, enc.ff_expansion_factor) == (
        "dw_striding",
        8,
        9,
        4,
    )
    assert cfg.model_defaults.pred_hidden == 640 and cfg.decoder.prednet.pred_hidden == 640
    assert cfg.decoder.prednet.pred_rnn_layers == pred_layers
    assert cfg.model_defaults.joint_hidden == 640 and cfg.joint.jointnet.joint_hidden == 640
    assert cfg.decoder.vocab_size == 1024
    assert len(cfg.labels) == 1024 and len(set(cfg.labels)) == 1024
    assert cfg.preprocessor.features == 80 and cfg.preprocessor.dither == 0.0 and cfg.preprocessor.sample_rate == 16000
    # no datasets (validation_ds only carries the keys NeMo's transcribe() reads)
    assert cfg.spec_augment is None and cfg.train_ds is None and cfg.validation_ds.manifest_filepath is None
    if durations is None:
        assert "tdt_durations" not in cfg.model_defaults
        assert cfg.joint.num_extra_outputs == 0
        assert cfg.loss.loss_name == "default"
    else:
        assert list(cfg.model_defaults.tdt_durations) == durations
        assert cfg.joint.num_extra_outputs == len(durations)
        assert list(cfg.decoding.durations) == durations and cfg.decoding.model_type == "tdt"
        assert cfg.loss.loss_name == "tdt" and list(cfg.loss.tdt_kwargs.durations) == durations


def test_bpe_config_has_tokenizer_section():
    cfg = S.make_synthetic_config("rnnt-0.6b", vocab="bpe", tokenizer_dir="/tmp/tok")
    assert cfg.tokenizer.type == "bpe" and cfg.tokenizer.dir == "/tmp/tok"
    assert "labels" not in cfg and cfg.decoder.vocab_size == 1024


def test_char_vocabulary_is_distinct_and_starts_with_characters():
    labels = S.char_vocabulary(1024)
    assert len(set(labels)) == 1024
    assert labels[:28] == [" ", *"abcdefghijklmnopqrstuvwxyz", "'"]
    with pytest.raises(ValueError, match="0"):
        S.char_vocabulary(0)


# ---------------------------------------------------------------- tiny models


@pytest.mark.parametrize("preset", TINY)
def test_tiny_model_builds_and_transcribes(preset, tiny_models, short_audio, tmp_path):
    from nemo.collections.asr.models import EncDecHybridRNNTCTCModel, EncDecRNNTModel

    model = tiny_models[preset]
    assert isinstance(model, EncDecRNNTModel)
    assert isinstance(model, EncDecHybridRNNTCTCModel) == (preset == "tiny-hybrid")
    assert not model.training
    assert model.encoder.d_model == 64 and len(model.encoder.layers) == 2
    spec = S.transducer_spec(model)
    assert (spec.vocab_size, spec.blank_id) == (28, 28)
    assert model.joint.joint_net[-1].out_features == spec.num_outputs

    from_arrays = model.transcribe(short_audio, batch_size=2, verbose=False)
    paths = S.write_wavs(short_audio, tmp_path, 16000)
    from_files = model.transcribe([str(p) for p in paths], batch_size=2, verbose=False)
    model.eval()  # NeMo's transcribe() leaves encoder/decoder/joint in train mode
    assert len(from_arrays) == len(from_files) == 2
    for a, b in zip(from_arrays, from_files, strict=True):
        assert isinstance(a.text, str)
        assert a.y_sequence.tolist() == b.y_sequence.tolist()


def test_tdt_model_has_tdt_decoding(tiny_models):
    from nemo.collections.asr.parts.submodules.rnnt_greedy_decoding import GreedyBatchedTDTInfer

    model = tiny_models["tiny-tdt"]
    assert isinstance(model.decoding.decoding, GreedyBatchedTDTInfer)
    assert list(model.decoding.durations) == [0, 1, 2, 3, 4]
    assert model.joint.num_extra_outputs == 5
    spec = S.transducer_spec(model)
    assert spec.is_tdt and spec.durations == [0, 1, 2, 3, 4]
    assert spec.num_outputs == 28 + 1 + 5
    assert isinstance(S.nemo_baseline_greedy(model), GreedyBatchedTDTInfer)


def test_rnnt_baseline_is_frame_looping(tiny_models):
    from nemo.collections.asr.parts.submodules.rnnt_greedy_decoding import GreedyBatchedRNNTInfer

    decoder = S.nemo_baseline_greedy(tiny_models["tiny-rnnt"])
    assert isinstance(decoder, GreedyBatchedRNNTInfer)
    assert not S.transducer_spec(tiny_models["tiny-rnnt"]).is_tdt
    assert decoder._greedy_decode == decoder._greedy_decode_blank_as_pad_loop_frames


@pytest.mark.parametrize("name", ["tiny-rnnt", "tiny-tdt"])
def test_calibration_decoder_returns_the_baseline_hypotheses(tiny_models, name):
    """The calibrations decode with NeMo's label loop (CUDA graphs on a GPU): the baseline's tokens and frames."""
    model = tiny_models[name]
    calibration = S.nemo_calibration_greedy(model, include_duration=True)
    assert calibration._greedy_decode.__name__.endswith("loop_labels")  # NeMo's only batched TDT algorithm too
    g = torch.Generator().manual_seed(5)
    enc, lengths = torch.randn([4, model.joint.enc.in_features, 12], generator=g), torch.tensor([12, 7, 0, 12])
    with torch.inference_mode():
        expected = S.nemo_baseline_greedy(model, include_duration=True)(encoder_output=enc, encoded_lengths=lengths)[0]
        actual = calibration(encoder_output=enc, encoded_lengths=lengths)[0]
    assert sum(len(h.y_sequence) for h in expected) > 0
    for e, a in zip(expected, actual, strict=True):
        assert a.y_sequence.tolist() == e.y_sequence.tolist()
        assert list(map(int, a.timestamp)) == list(map(int, e.timestamp))


def test_hybrid_ctc_head_transcribes(short_audio):
    model = S.build_synthetic_model("tiny-hybrid", seed=1)
    assert model.ctc_decoder.num_classes_with_blank == 29
    model.change_decoding_strategy(decoder_type="ctc", verbose=False)
    out = model.transcribe(short_audio, batch_size=2, verbose=False)
    assert len(out) == 2 and all(isinstance(h.text, str) for h in out)


@pytest.mark.parametrize("preset", ["tiny-tdt", "tiny-hybrid"])
def test_bpe_vocab(preset, short_audio):
    from nemo.collections.asr.models import EncDecHybridRNNTCTCBPEModel, EncDecRNNTBPEModel

    model = S.build_synthetic_model(preset, vocab="bpe")
    expected = EncDecHybridRNNTCTCBPEModel if preset == "tiny-hybrid" else EncDecRNNTBPEModel
    assert isinstance(model, expected)
    assert model.tokenizer.vocab_size == 128 and S.transducer_spec(model).blank_id == 128
    out = model.transcribe(short_audio, batch_size=2, verbose=False)
    assert len(out) == 2 and all(isinstance(h.text, str) for h in out)


def test_seed_gives_same_weights_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = S.build_synthetic_model("tiny-rnnt", seed=7)
    assert torch.equal(torch.rand(1), expected_next)
    b = S.build_synthetic_model("tiny-rnnt", seed=7)
    c = S.build_synthetic_model("tiny-rnnt", seed=8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


# ---------------------------------------------------------------- encode and calibration


def test_encode_matches_model_forward_and_ignores_train_mode(tiny_models, short_audio):
    model = tiny_models["tiny-rnnt"]
    encoded, lengths = S.encode(model, short_audio, batch_size=1, device="cpu")
    assert len(encoded) == len(lengths) == 2
    for enc, length, audio in zip(encoded, lengths, short_audio, strict=True):
        assert enc.shape[:2] == (1, 64) and enc.dtype == torch.float32
        assert 0 < int(length[0]) <= enc.shape[2] and length.dtype == torch.int64
        with torch.inference_mode():
            ref, ref_len = model.forward(
                input_signal=torch.from_numpy(audio)[None], input_signal_length=torch.tensor([len(audio)])
            )
        assert torch.equal(enc, ref) and torch.equal(length, ref_len)
    batched, batched_lengths = S.encode(model, short_audio, batch_size=2, device="cpu")
    assert len(batched) == 1 and batched[0].shape[0] == 2
    assert batched_lengths[0].tolist() == [int(length[0]) for length in lengths]

    model.encoder.train()  # as NeMo's transcribe() leaves it
    try:
        again, _ = S.encode(model, short_audio, batch_size=1, device="cpu")
        assert model.encoder.training  # restored
    finally:
        model.eval()
    assert all(torch.equal(x, y) for x, y in zip(encoded, again, strict=True))

    bf16, _ = S.encode(model, short_audio, batch_size=2, device="cpu", dtype=torch.bfloat16)
    assert bf16[0].shape == batched[0].shape
    with pytest.raises(ValueError, match="batch_size"):
        S.encode(model, short_audio, batch_size=0, device="cpu")


@pytest.mark.parametrize("preset", ["tiny-rnnt", "tiny-tdt"])
def test_calibration_reaches_target_rate(preset):
    model = S.build_synthetic_model(preset, seed=0)
    enc, lengths = _random_encoder_output(model)
    decoder = S.nemo_baseline_greedy(model)
    before, _, frames = S.tokens_per_frame(decoder, enc, lengths)
    assert frames == int(lengths.sum())

    achieved = S.calibrate_blank_bias(model, enc, lengths, target_tokens_per_frame=0.3)
    assert abs(achieved - 0.3) <= 0.1
    rate, tokens, _ = S.tokens_per_frame(decoder, enc, lengths)
    assert rate == pytest.approx(achieved) and tokens > 0
    # the emitted tokens are not all the same symbol
    hyps = decoder(encoder_output=enc, encoded_lengths=lengths)[0]
    assert len({t for h in hyps for t in h.y_sequence.tolist()}) > 1
    # the model's own decoding object sees the new bias
    hyps = model.decoding.rnnt_decoder_predictions_tensor(encoder_output=enc, encoded_lengths=lengths)
    assert sum(len(h.y_sequence) for h in hyps) == tokens


@pytest.mark.parametrize("seed", [0, 2])
def test_calibration_on_encoded_audio_batches(seed):
    model = S.build_synthetic_model("tiny-rnnt", seed=seed)
    audio = S.synthetic_audio([3.0, 2.5, 2.0, 1.5], seed=3)
    encoded, lengths = S.encode(model, audio, batch_size=2, device="cpu")
    assert len(encoded) == 2
    achieved = S.calibrate_blank_bias(model, encoded, lengths, target_tokens_per_frame=0.3)
    assert abs(achieved - 0.3) <= 0.1
    assert S.tokens_per_frame(S.nemo_baseline_greedy(model), encoded, lengths)[0] == pytest.approx(achieved)
    with pytest.raises(ValueError, match="target_tokens_per_frame"):
        S.calibrate_blank_bias(model, encoded, lengths, target_tokens_per_frame=0.0)
    with pytest.raises(ValueError, match="same number of batches"):
        S.calibrate_blank_bias(model, encoded, lengths[:1])


# ---------------------------------------------------------------- synthetic data


def test_librispeech_like_durations_statistics():
    durations = S.librispeech_like_durations(total_seconds=3600, seed=0)
    assert durations == sorted(durations, reverse=True)
    assert min(durations) >= 1.3 and max(durations) <= 35.0
    assert abs(np.mean(durations) - 6.3) <= 0.1 * 6.3
    assert abs(sum(durations) - 3600) <= 1.3
    assert S.librispeech_like_durations(3600, seed=0) == durations
    assert S.librispeech_like_durations(3600, seed=1) != durations
    short = S.librispeech_like_durations(total_seconds=30, seed=5)
    assert all(1.3 <= d <= 35.0 for d in short) and abs(sum(short) - 30) <= 1.3
    with pytest.raises(ValueError, match="min_s"):
        S.librispeech_like_durations(100, mean=1.0)


def test_synthetic_audio_wavs_and_manifest(tmp_path):
    durations = [2.5, 1.3]
    audios = S.synthetic_audio(durations, sample_rate=16000, seed=0)
    assert [len(a) for a in audios] == [40000, 20800]
    assert all(a.dtype == np.float32 for a in audios)
    assert all(0.1 < np.abs(a).max() <= 0.5 for a in audios)
    assert np.array_equal(audios[1], S.synthetic_audio([9.0, 1.3], seed=0)[1])  # utterance i depends on i only
    paths = S.write_wavs(audios, tmp_path / "wav", 16000)
    for path, audio in zip(paths, audios, strict=True):
        data, rate = sf.read(str(path), dtype="float32")
        assert rate == 16000 and np.array_equal(data, audio)  # on the int16 grid: lossless
    manifest = S.write_manifest(paths, durations, tmp_path / "manifest.json")
    entries = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert [e["duration"] for e in entries] == durations
    assert all(e["text"] == "" and e["audio_filepath"].endswith(".wav") for e in entries)
    with pytest.raises(ValueError, match="same length"):
        S.write_manifest(paths, durations[:1], tmp_path / "bad.json")


def test_synthetic_data_set_and_its_script_config(tmp_path):
    manifest = S.write_synthetic_dataset(tmp_path / "set", total_seconds=12.0, seed=1)
    entries = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert manifest == tmp_path / "set" / "manifest.jsonl" and len(entries) >= 2
    assert [e["duration"] for e in entries] == S.librispeech_like_durations(12.0, seed=1)
    for entry in entries:  # each file holds its entry's duration
        assert sf.info(entry["audio_filepath"]).frames == round(entry["duration"] * 16000)
    assert abs(sum(e["duration"] for e in entries) - 12.0) <= 1.3
    yaml = OmegaConf.load(ROOT / "configs" / "synthetic_manifest.yaml")
    schema = OmegaConf.structured(SyntheticManifestConfig)
    assert OmegaConf.merge(schema, yaml) == schema and set(yaml) == set(schema)  # the YAML mirrors the dataclass
    with pytest.raises(ValueError, match="total_seconds must be > 0, got 0"):
        SyntheticManifestConfig(total_seconds=0)


def test_a_bpe_model_transcribes_files(tmp_path):
    # NeMo's transcribe() of a BPE model reads its validation_ds section
    model = S.build_synthetic_model("tiny-rnnt", vocab="bpe")
    paths = S.write_wavs(S.synthetic_audio([1.5, 1.0]), tmp_path)
    hyps = model.transcribe([str(p) for p in paths], batch_size=2, verbose=False)
    assert len(hyps) == 2 and all(isinstance(h.text, str) for h in hyps)
    assert any(len(h.y_sequence) > 0 for h in hyps)


# ---------------------------------------------------------------- cache-aware presets that emit throughout a stream


def test_residual_scale_scales_exactly_the_encoder_layers_residual_branches():
    plain = S.build_synthetic_model("tiny-streaming", seed=0, balance_joint=False).state_dict()
    scaled = S.build_synthetic_model("tiny-streaming", seed=0, balance_joint=False, residual_scale=0.1).state_dict()
    branches = ("feed_forward1.linear2.", "feed_forward2.linear2.", "self_attn.linear_out.", "conv.pointwise_conv2.")
    changed = [name for name in plain if not torch.equal(plain[name], scaled[name])]
    assert changed and all(name.startswith("encoder.layers.") and any(b in name for b in branches) for name in changed)
    for name in changed:
        torch.testing.assert_close(scaled[name], 0.1 * plain[name], rtol=1e-6, atol=0)
    assert len(changed) == 2 * 4 * len(S.build_synthetic_model("tiny-streaming", seed=0).encoder.layers)  # w, b


def test_trained_like_streaming_preset_emits_one_token_per_frame_throughout_streams(monkeypatch):
    """A preset marked ``trained_like`` (as the benchmark-size cache-aware ones are; a tiny one here) loads calibrated
    to a trained model's rate and bursts: tokens in every third of long streams, mostly one per emitting frame."""
    import dataclasses

    from fastdecode_lab.synthetic import presets
    from nemo_fastdecode.apps import models

    preset = dataclasses.replace(presets.get_preset("tiny-streaming"), residual_scale=0.1, trained_like=True)
    monkeypatch.setitem(presets._PRESETS, "tiny-streaming", preset)
    model = models.load_model("tiny-streaming", vocab="bpe")
    assert 0.3 < model._fastdecode_tokens_per_frame < 0.7  # the trained models' 0.46
    encoded, lengths = S.encode(model, S.synthetic_audio([12.0, 10.0], seed=5), batch_size=2, device="cpu")
    hyps = model.decoding.rnnt_decoder_predictions_tensor(
        encoder_output=encoded[0], encoded_lengths=lengths[0], return_hypotheses=True
    )
    for hyp, frames in zip(hyps, lengths[0].tolist(), strict=True):
        times = np.asarray(hyp.timestamp, dtype=np.int64)  # encoder frames
        thirds = np.bincount(3 * times // frames, minlength=3)
        assert (thirds > 5).all(), thirds
        assert len(times) <= 1.5 * len(np.unique(times))  # tokens per emitting frame
