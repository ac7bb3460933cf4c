"""fast_beam through NeMo's usual paths (change_decoding_strategy, transcribe with timestamps), its config and errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from conftest import calibrated_model, transcribe
from nemo.collections.asr.parts.submodules.rnnt_decoding import RNNTDecodingConfig
from omegaconf import OmegaConf

from fastdecode_lab import synthetic
from nemo_fastdecode import valid_strategies
from nemo_fastdecode.beam import FastBeamBatchedInfer
from nemo_fastdecode.config import FastBeamConfig, FastBeamDecodingConfig
from nemo_fastdecode.nemo import registry

pytestmark = pytest.mark.usefixtures("single_thread")
YAML = Path(__file__).resolve().parents[1] / "configs" / "decoding" / "fast_beam.yaml"


def beam_config(strategy: str, **beam):
    return OmegaConf.create({"strategy": strategy, "beam": {"beam_size": 4, "allow_cuda_graphs": False, **beam}})


@pytest.fixture(scope="module")
def audio():
    return synthetic.synthetic_audio([2.5, 1.0, 3.2], seed=1)


@pytest.fixture(scope="module")
def rnnt_model(audio):
    return calibrated_model("tiny-rnnt", audio)


def test_decoding_yaml_matches_dataclass():
    yaml = OmegaConf.load(YAML)
    schema = OmegaConf.structured(FastBeamDecodingConfig)
    assert OmegaConf.merge(schema, yaml) == schema  # type-checks every value; the YAML holds the defaults
    assert set(yaml) == set(schema) and set(yaml.beam) == set(schema.beam)
    assert OmegaConf.to_container(yaml.beam) == dataclasses.asdict(FastBeamConfig())


def test_decoding_keys_are_nemo_keys_and_accepted_by_fast_beam():
    nemo = OmegaConf.structured(RNNTDecodingConfig)
    ours = OmegaConf.structured(FastBeamDecodingConfig)
    assert set(ours) <= set(nemo), set(ours) - set(nemo)
    assert set(ours.beam) <= registry.FAST_STRATEGIES["fast_beam"].options
    # `max_symbols` is what NeMo's malsd_batch reads (not in its dataclass); the others are ours
    assert set(ours.beam) - {"max_symbols"} - registry.FAST_STRATEGIES["fast_beam"].own_options <= set(nemo.beam)
    assert set(nemo.beam) <= registry.FAST_STRATEGIES["fast_beam"].options  # merged NeMo configs pass as they are
    with pytest.raises(ValueError, match="beam_size must be in 1..16"):
        FastBeamConfig(beam_size=17)
    with pytest.raises(ValueError, match="graph_mode='fast'"):
        FastBeamConfig(graph_mode="fast")


def test_change_decoding_strategy_and_transcribe_with_timestamps_match_malsd_batch(rnnt_model, audio):
    model = rnnt_model
    model.change_decoding_strategy(beam_config("malsd_batch"))
    expected = transcribe(model, audio, timestamps=True)
    model.change_decoding_strategy(OmegaConf.load(YAML))
    assert isinstance(model.decoding.decoding, FastBeamBatchedInfer)
    assert model.cfg.decoding.strategy == "fast_beam" and model.decoding.decoding.beam_size == 4
    actual = transcribe(model, audio, timestamps=True)
    assert sum(len(h.y_sequence) for h in actual) > 0, "setup: the calibrated model should emit tokens"
    for e, a in zip(expected, actual, strict=True):
        assert a.text == e.text and a.score == e.score
        assert list(map(int, a.y_sequence)) == list(map(int, e.y_sequence))
        assert list(map(int, a.timestamp["timestep"])) == list(map(int, e.timestamp["timestep"]))
        assert a.timestamp["char"] == e.timestamp["char"] and a.timestamp["word"] == e.timestamp["word"]


def test_tdt_model_transcribes_like_malsd_batch(audio):
    model = synthetic.build_synthetic_model("tiny-tdt", seed=0)
    encoded, lengths = synthetic.encode(model, audio, batch_size=len(audio), device="cpu")
    synthetic.calibrate_blank_bias(model, encoded, lengths, 0.3)
    # char TDT models need `model_type: tdt` in NeMo 3.0 (else its char decoding puts blank after the durations);
    # NeMo 3.0 cannot make timestamps for char TDT models (IndexError in decode_ids_to_tokens, malsd_batch too):
    # TDT timestamps and durations are compared below the model, in test_beam_exactness.py
    tdt = OmegaConf.create({"model_type": "tdt"})
    model.change_decoding_strategy(OmegaConf.merge(beam_config("malsd_batch", beam_size=2), tdt))
    expected = transcribe(model, audio)
    model.change_decoding_strategy(OmegaConf.merge(beam_config("fast_beam", beam_size=2), tdt))
    assert isinstance(model.decoding.decoding, FastBeamBatchedInfer) and model.decoding.decoding.computer.is_tdt
    actual = transcribe(model, audio)
    assert sum(len(h.y_sequence) for h in actual) > 0
    for e, a in zip(expected, actual, strict=True):
        assert a.text == e.text and a.score == e.score
        assert list(map(int, a.y_sequence)) == list(map(int, e.y_sequence))


def test_nbest_through_the_model_matches(rnnt_model, audio):
    model = rnnt_model
    results = []
    for strategy in ("malsd_batch", "fast_beam"):
        model.change_decoding_strategy(beam_config(strategy, beam_size=3, return_best_hypothesis=False))
        encoded, lengths = synthetic.encode(model, audio, batch_size=len(audio), device="cpu")
        with torch.inference_mode():
            nbest = model.decoding.rnnt_decoder_predictions_tensor(encoded[0], lengths[0], return_hypotheses=True)
        results.append([[(h.text, h.score, list(map(int, h.timestamp))) for h in n] for n in nbest])
    assert results[0] == results[1] and max(len(n) for n in results[1]) > 1


def test_model_built_with_fast_beam_and_nemo_strategies_unchanged():
    from nemo.collections.asr.models import EncDecRNNTModel

    config = synthetic.make_synthetic_config("tiny-rnnt")
    config.decoding = beam_config("fast_beam", beam_size=2, graph_mode="eager")
    model = EncDecRNNTModel(cfg=config).eval()
    assert isinstance(model.decoding.decoding, FastBeamBatchedInfer) and model.decoding.decoding.beam_size == 2
    model.change_decoding_strategy(beam_config("malsd_batch"))
    assert type(model.decoding.decoding).__name__ == "BeamBatchedRNNTInfer"
    assert {"fast_beam", "fast_greedy", "malsd_batch"} <= set(valid_strategies())
    assert registry.STAND_IN_STRATEGY == {"fast_greedy": "greedy_batch", "fast_beam": "malsd_batch"}


@pytest.mark.parametrize(
    "top,beam,error,match",
    [
        ({}, {"beam_sise": 3}, ValueError, r"fast_beam option\(s\) \['beam_sise'\].*valid options: .*beam_size"),
        ({}, {"graph_mode": "turbo"}, ValueError, r"'turbo'.*full_graph.*no_while_graph.*eager"),
        ({}, {"beam_size": 32}, ValueError, r"beam_size must be (an int )?in 1\.\.16.*malsd_batch"),
        ({}, {"ngram_lm_model": "/no/such/lm.nemo"}, ValueError, r"beam.ngram_lm_model='/no/such/lm.nemo'.*no such"),
        ({"preserve_alignments": True}, {}, NotImplementedError, r"fast_beam does not support preserve_alignments"),
        ({}, {"preserve_alignments": True}, NotImplementedError, r"preserve_alignments.*malsd_batch"),
        ({"big_blank_durations": [2, 4]}, {}, NotImplementedError, r"multi-blank models.*malsd_batch"),
        (
            {"confidence_cfg": {"preserve_frame_confidence": True}},
            {},
            NotImplementedError,
            r"confidence.*malsd_batch",
        ),
    ],
)
def test_unsupported_options_fail_clearly(top, beam, error, match):
    model = synthetic.build_synthetic_model("tiny-rnnt")
    config = beam_config("fast_beam", **beam)
    config = OmegaConf.merge(config, top)
    with pytest.raises(error, match=match):
        model.change_decoding_strategy(config)


def test_max_symbols_per_step_without_effect_is_reported(caplog):
    model = synthetic.build_synthetic_model("tiny-rnnt")
    with caplog.at_level("WARNING", logger="nemo_fastdecode"):
        model.change_decoding_strategy(beam_config("fast_beam", max_symbols_per_step=3))
    assert "max_symbols_per_step=3 has no effect" in caplog.text
    assert model.decoding.decoding.computer.max_symbols == 10  # as NeMo's malsd_batch
