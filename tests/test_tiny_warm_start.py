"""``scripts/train_tiny_models.py``'s warm start (``init_from``) and its GPU memory share (``gpu_memory_fraction``):
a model without ``last.ckpt`` starts from a ``.nemo``'s weights, checked against the recipe's tokenizer and the
model config's architecture; a resumed run ignores ``init_from``."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from omegaconf import open_dict

from fastdecode_lab.bpe_tokenizer import write_bpe_tokenizer
from fastdecode_lab.configs import TinyModelsConfig
from fastdecode_lab.tiny_models import corpus, training
from fastdecode_lab.tiny_models.layout import RecipeLayout
from fastdecode_lab.tiny_models.recipe import resolve_config
from nemo_fastdecode.apps.trained_models import ASSETS_DIR, TRAINED_MODELS, shipped_name, trained_model_path

pytestmark = pytest.mark.usefixtures("single_thread")

#: a tdt model of a few thousand parameters
TINY = {
    "encoder": {"n_layers": 1, "d_model": 16, "n_heads": 2, "subsampling_conv_channels": 8},
    "model_defaults": {"pred_hidden": 16, "joint_hidden": 16},
}


def _config(root: Path, **overrides) -> TinyModelsConfig:
    cfg = {
        "output_dir": str(root),
        "models": ["tdt"],
        "num_train": 40,
        "voices": {"engines": []},
        "vocab_size": 48,
        "batch_size": 2,
        "num_workers": 0,
        "max_steps": 2,
        "max_time": None,
        "accelerator": "cpu",
        "model_overrides": TINY,
    }
    return resolve_config({**cfg, **overrides})


def _recipe_data(cfg: TinyModelsConfig) -> RecipeLayout:
    """The files the train stage reads, without speech synthesis: the tokenizer and train / dev manifests of a few
    seconds of noise."""
    layout = RecipeLayout.at(cfg.output_dir)
    splits = corpus.make_splits(cfg.num_train, 2, 2, seed=cfg.seed)
    write_bpe_tokenizer(splits.train, layout.tokenizer_dir, cfg.vocab_size)
    rng = np.random.default_rng(0)
    for split, sentences in (("train", splits.train[:2]), ("dev", splits.dev)):
        layout.manifest(split).parent.mkdir(parents=True, exist_ok=True)
        with open(layout.manifest(split), "w", encoding="utf8") as f:
            for index, text in enumerate(sentences):
                wav = layout.manifest(split).parent / f"{split}_{index}.wav"
                soundfile.write(wav, 0.1 * rng.standard_normal(16000).astype(np.float32), 16000)
                f.write(json.dumps({"audio_filepath": wav.name, "duration": 1.0, "text": text}) + "\n")
    return layout


def _save_model(cfg: TinyModelsConfig, layout: RecipeLayout, path: Path, seed: int) -> dict[str, torch.Tensor]:
    """A ``.nemo`` of the recipe's model for ``cfg`` with random weights of ``seed``; returns its state dict."""
    model_cfg = training.model_config("tdt", cfg, layout)
    with open_dict(model_cfg):
        for section in ("train_ds", "validation_ds", "test_ds"):
            model_cfg[section].manifest_filepath = None
    torch.manual_seed(seed)
    asr_model = training.build_model(model_cfg, loss="nemo")
    asr_model.save_to(str(path))
    return {name: value.clone() for name, value in asr_model.state_dict().items()}


class _Stop(Exception):
    """Raised by the recording ``fit``: the test has what it needs before any training step."""


@pytest.fixture
def fit_records(monkeypatch):
    """``train``'s trainer records the model's weights and ``ckpt_path`` at ``fit`` and stops there."""
    records: list[tuple[dict[str, torch.Tensor], str | None]] = []
    make_trainer = training.make_trainer

    def recording_trainer(model, cfg, layout):
        trainer = make_trainer(model, cfg, layout)

        def fit(asr_model, ckpt_path=None):
            records.append(({k: v.detach().clone() for k, v in asr_model.state_dict().items()}, ckpt_path))
            raise _Stop

        trainer.fit = fit
        return trainer

    monkeypatch.setattr(training, "make_trainer", recording_trainer)
    return records


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    """A recipe folder with its tokenizer and manifests, and a ``.nemo`` of its tdt model (other random weights)."""
    root = tmp_path_factory.mktemp("warm_start")
    cfg = _config(root / "recipe")
    layout = _recipe_data(cfg)
    source = root / "source.nemo"
    weights = _save_model(cfg, layout, source, seed=cfg.seed + 1)
    return cfg, layout, source, weights


def _train(cfg: TinyModelsConfig, layout: RecipeLayout, lines: list[str]) -> None:
    with pytest.raises(_Stop):
        training.train("tdt", cfg, layout, log=lines.append)


@pytest.mark.slow
def test_init_from_a_nemo_starts_from_its_weights(recipe, fit_records):
    cfg, layout, source, weights = recipe
    lines: list[str] = []
    _train(cfg, layout, lines)  # from scratch: the seed's random weights, not the file's
    _train(replace(cfg, init_from={"tdt": str(source)}), layout, lines)
    (scratch, scratch_ckpt), (warm, warm_ckpt) = fit_records
    assert scratch_ckpt is None and warm_ckpt is None
    assert scratch.keys() == warm.keys() == weights.keys()
    assert not all(torch.equal(scratch[k], weights[k]) for k in weights)
    assert all(torch.equal(warm[k], weights[k]) for k in weights)
    assert lines[0].startswith("tdt: ") and lines[0].endswith("; from scratch")
    assert re.fullmatch(rf"tdt: [0-9.]+M parameters; from {re.escape(str(source))}", lines[1])


@pytest.mark.slow
def test_a_resumed_run_ignores_init_from(recipe, fit_records):
    cfg, layout, _, _ = recipe
    last = layout.last_checkpoint("tdt")
    last.parent.mkdir(parents=True, exist_ok=True)
    last.write_bytes(b"")  # never read: fit is the recording one
    try:
        lines: list[str] = []
        missing = str(layout.root / "missing.nemo")  # would raise if init_from were looked at
        _train(replace(cfg, init_from={"tdt": missing}), layout, lines)
    finally:
        last.unlink()
    assert fit_records[0][1] == str(last)
    assert lines[0].endswith(f"; resuming from {last}")


@pytest.mark.slow
def test_init_from_rejects_another_tokenizer(recipe, tmp_path):
    cfg, layout, source, _ = recipe
    other_cfg = _config(tmp_path / "other", vocab_size=40)  # another corpus: another tokenizer
    other_layout = RecipeLayout.at(other_cfg.output_dir)
    write_bpe_tokenizer(corpus.make_splits(other_cfg.num_train, 2, 2).train, other_layout.tokenizer_dir, 40)
    other = tmp_path / "other.nemo"
    _save_model(other_cfg, other_layout, other, seed=0)
    cfg = replace(cfg, init_from={"tdt": str(other)})
    with pytest.raises(ValueError, match="tokenizer") as error:
        training.train("tdt", cfg, layout, log=lambda line: None)
    message = str(error.value)
    assert str(other) in message and str(layout.tokenizer_dir) in message
    assert "num_train, seed, vocab_size" in message


@pytest.mark.slow
@pytest.mark.parametrize(
    "change",
    [
        {"encoder": {"d_model": 24}},  # same parameters, other shapes
        {"encoder": {"n_layers": 2}},  # parameters the built model lacks
    ],
)
def test_init_from_rejects_another_architecture(recipe, tmp_path, change):
    cfg, layout, _, _ = recipe
    overrides = {**TINY, "encoder": {**TINY["encoder"], **change["encoder"]}}
    other = tmp_path / "other.nemo"
    theirs = _save_model(_config(layout.root, model_overrides=overrides), layout, other, seed=0)
    ours = _save_model(cfg, layout, tmp_path / "ours.nemo", seed=0)
    differing = [k for k in [*ours, *theirs] if k not in ours or k not in theirs or ours[k].shape != theirs[k].shape]
    cfg = replace(cfg, init_from={"tdt": str(other)})
    with pytest.raises(ValueError, match="does not match the model config") as error:
        training.train("tdt", cfg, layout, log=lambda line: None)
    assert str(other) in str(error.value)
    assert f" {differing[0]} " in str(error.value)  # the first differing parameter is named


@pytest.mark.parametrize("model", list(TRAINED_MODELS.values()))
def test_init_from_shipped_is_the_assets_model_of_its_kind(model):
    path = training.init_source(model, TinyModelsConfig(init_from="shipped"))
    assert path == trained_model_path(shipped_name(model)) and path.parent == ASSETS_DIR and path.is_file()
    assert training.init_source(model, TinyModelsConfig()) is None
    others = [m for m in TRAINED_MODELS.values() if m != model]
    assert training.init_source(model, TinyModelsConfig(init_from={others[0]: str(path)})) is None


@pytest.mark.slow
@pytest.mark.parametrize("model", list(TRAINED_MODELS.values()))
def test_shipped_models_fit_the_recipe_defaults(model, tmp_path):
    """The shipped ``.nemo`` loads into the recipe's default model config with the default corpus's tokenizer:
    ``init_from=shipped`` works with the defaults."""
    path = trained_model_path(shipped_name(model))
    defaults = TinyModelsConfig()
    layout = RecipeLayout.at(tmp_path)
    sentences = corpus.make_splits(defaults.num_train, defaults.num_dev, defaults.num_test, seed=defaults.seed).train
    write_bpe_tokenizer(sentences, layout.tokenizer_dir, defaults.vocab_size)
    model_cfg = training.model_config(model, defaults, layout)
    with open_dict(model_cfg):
        for section in ("train_ds", "validation_ds", "test_ds"):
            model_cfg[section].manifest_filepath = None
    asr_model = training.build_model(model_cfg, loss="torch")
    training.init_from_nemo(asr_model, path, layout.tokenizer_dir)
    restored = training.restore(path).state_dict()
    assert all(torch.equal(value, restored[name]) for name, value in asr_model.state_dict().items())


def test_init_from_missing_file_names_the_choices(tmp_path):
    cfg = TinyModelsConfig(init_from={"tdt": str(tmp_path / "missing.nemo")})
    with pytest.raises(FileNotFoundError, match="missing.nemo .tdt. does not exist; init_from takes null.*shipped"):
        training.init_source("tdt", cfg)


def test_config_validates_init_from_and_gpu_memory_fraction():
    with pytest.raises(ValueError, match="init_from='latest' is not valid; valid values: null .*, shipped .*mapping"):
        TinyModelsConfig(init_from="latest")
    with pytest.raises(ValueError, match=r"unknown models \['rnnt'\]; valid models: tdt, streaming_hybrid"):
        TinyModelsConfig(init_from={"rnnt": "a.nemo"})
    with pytest.raises(ValueError, match="each model maps to the path of a .nemo file"):
        TinyModelsConfig(init_from={"tdt": 3})
    assert resolve_config({"init_from": {"tdt": "a.nemo"}}).init_from == {"tdt": "a.nemo"}  # a plain dict
    assert resolve_config({"init_from": "shipped"}).init_from == "shipped"
    for fraction in (0, -0.5, 1.5):
        with pytest.raises(ValueError, match=rf"gpu_memory_fraction must be in \(0, 1\] .*got {fraction}"):
            TinyModelsConfig(gpu_memory_fraction=fraction)
    assert TinyModelsConfig(gpu_memory_fraction=1.0).gpu_memory_fraction == 1.0
    assert TinyModelsConfig(gpu_memory_fraction=0.45).gpu_memory_fraction == 0.45


def test_gpu_memory_fraction_is_applied_only_on_a_gpu(tmp_path, monkeypatch):
    cfg = _config(tmp_path)
    layout = RecipeLayout.at(tmp_path)
    for split in ("train", "dev"):
        layout.manifest(split).parent.mkdir(parents=True, exist_ok=True)
        layout.manifest(split).write_text("")
    fractions: list[float] = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, device=None: fractions.append(f))

    def stop(*args, **kwargs):
        raise _Stop

    monkeypatch.setattr(training, "model_config", stop)  # nothing past the memory limit is needed
    for accelerator, expected in (("cpu", []), ("gpu", [0.45])):
        cfg = replace(cfg, gpu_memory_fraction=0.45, accelerator=accelerator)
        with pytest.raises(_Stop):
            training.train("tdt", cfg, layout, log=lambda line: None)
        assert fractions == expected
