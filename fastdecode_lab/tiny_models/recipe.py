"""``scripts/train_tiny_models.py``: the stages of the tiny-model recipe, each resumable.

* ``data`` -- the corpus splits (:mod:`.corpus`), their speech (:mod:`.speech`; other synthesisers, augmented
  multi-utterance training examples and the evaluation splits of :mod:`.voices`), NeMo manifests, and the BPE
  tokenizer trained on the training sentences;
* ``train`` -- each model from its last checkpoint (:mod:`.training`), exported when training ends;
* ``export`` -- a ``.nemo`` of the last checkpoint where there is none yet;
* ``evaluate`` -- held-out WER, NeMo's decoding and ours side by side (:mod:`.evaluation`);
* ``ship`` -- the models, their evaluations and a few test utterances copied to the package's assets, where the
  demos find them (:mod:`nemo_fastdecode.apps.trained_models`), and the shipped models' emission statistics on the
  test split (:mod:`fastdecode_lab.emissions`), which the benchmarks' ``trained`` calibration aims at.

Every stage skips what is already done, so the same command run again after an interruption carries on.
"""

from __future__ import annotations

import itertools
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from fastdecode_lab.bpe_tokenizer import write_bpe_tokenizer
from fastdecode_lab.configs import TinyModelsConfig
from fastdecode_lab.emissions import (
    EMISSION_STATISTICS_PATH,
    TRAINED_REFERENCE_MODELS,
    write_trained_emission_stats,
)
from fastdecode_lab.tiny_models import corpus, speech, voices
from fastdecode_lab.tiny_models.evaluation import evaluate
from fastdecode_lab.tiny_models.layout import RecipeLayout
from fastdecode_lab.tiny_models.training import export, train
from nemo_fastdecode.apps.trained_models import ASSETS_DIR, shipped_name


def resolve_config(cfg: TinyModelsConfig | DictConfig | dict[str, Any] | None = None) -> TinyModelsConfig:
    """``cfg`` checked against :class:`TinyModelsConfig` (unknown keys and bad values raise), defaults filled in."""
    schema = OmegaConf.structured(TinyModelsConfig)
    if cfg is None:
        return OmegaConf.to_object(schema)
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg) if isinstance(cfg, dict) else OmegaConf.structured(cfg)
    return OmegaConf.to_object(OmegaConf.merge(schema, cfg))


def _tokenizer_is_current(layout: RecipeLayout, sentences: list[str], vocab_size: int) -> bool:
    folder = layout.tokenizer_dir
    if not (folder / "tokenizer.model").is_file() or not (folder / "corpus.txt").is_file():
        return False
    with open(folder / "tokenizer.vocab", encoding="utf8") as f:
        pieces = sum(1 for _ in f)
    return pieces == vocab_size and (folder / "corpus.txt").read_text(encoding="utf8") == "".join(
        s + "\n" for s in sentences
    )


def prepare_data(cfg: TinyModelsConfig, layout: RecipeLayout, log: Callable[[str], None] = print) -> None:
    """The ``data`` stage: corpus text files, WAV files, manifests and tokenizer under ``layout.root``."""
    start = time.perf_counter()
    splits = corpus.make_splits(cfg.num_train, cfg.num_dev, cfg.num_test, seed=cfg.seed)
    speech.check_voices(speech.TRAIN_VARIANTS + speech.HELD_OUT_VARIANTS)
    requests = {
        split: speech.draw_requests(sentences, split, layout.root, seed=cfg.seed) for split, sentences in splits.items()
    }
    for split, sentences in splits.items():
        layout.corpus(split).parent.mkdir(parents=True, exist_ok=True)
        layout.corpus(split).write_text("".join(s + "\n" for s in sentences), encoding="utf8")
    every = [r for split_requests in requests.values() for r in split_requests]
    durations = iter(speech.synthesize(every, workers=cfg.synthesis_workers, log=log))
    for split, split_requests in requests.items():
        split_durations = [next(durations) for _ in split_requests]
        speech.write_manifest(split_requests, split_durations, layout.manifest(split))
        log(
            f"{split}: {len(split_requests)} utterances, {sum(split_durations) / 3600:.2f} h "
            f"(mean {sum(split_durations) / len(split_durations):.2f} s) -> {layout.manifest(split)}"
        )
    if voices.training_splits(cfg.voices) or voices.evaluation_splits(cfg.voices):
        plan = voices.plan_splits(cfg.voices, splits.train, splits.test, layout.root, seed=cfg.seed)
        voices.synthesize_splits(plan, cfg.voices, layout.manifest, workers=cfg.synthesis_workers, log=log)
    if _tokenizer_is_current(layout, splits.train, cfg.vocab_size):
        log(f"tokenizer: {layout.tokenizer_dir} is up to date")
    else:
        write_bpe_tokenizer(splits.train, layout.tokenizer_dir, cfg.vocab_size)
        log(f"tokenizer: {cfg.vocab_size} BPE pieces -> {layout.tokenizer_dir}")
    log(f"data stage: {time.perf_counter() - start:.0f} s")


def pick_examples(
    layout: RecipeLayout, splits: list[str], count: int, log: Callable[[str], None] = print
) -> list[tuple[str, dict[str, Any]]]:
    """Up to ``count`` ``(split, manifest entry)`` pairs taken in turn from the first entries of each of ``splits``
    whose manifest exists, so that the demos' examples show each kind of held-out speech.

    Raises:
        FileNotFoundError: none of ``splits`` has a manifest.
    """
    present = [split for split in splits if layout.manifest(split).is_file()]
    if not present:
        raise FileNotFoundError(f"example_splits: none of {splits} has a manifest in {layout.root}; run the data stage")
    if len(present) < len(splits):
        log(f"examples: no manifest for {[s for s in splits if s not in present]}; taking them from {present}")
    queues = []
    for split in present:
        with open(layout.manifest(split), encoding="utf8") as f:
            queues.append([(split, json.loads(line)) for line in f if line.strip()][:count])
    picked = [pair for row in itertools.zip_longest(*queues) for pair in row if pair is not None]
    return picked[:count]


def ship(cfg: TinyModelsConfig, layout: RecipeLayout, log: Callable[[str], None] = print) -> Path:
    """The ``ship`` stage: each model's ``.nemo`` and evaluation as ``{ship_dir}/{shipped name}[_eval].{nemo,json}``,
    ``num_examples`` held-out utterances (:func:`pick_examples` from ``example_splits``) as ``{ship_dir}/examples/``
    (WAV files and a manifest whose entries name their ``split``), and, once both
    shipped models are there, their emission statistics on the test split as ``{ship_dir}/emission_statistics.json``."""
    target = Path(cfg.ship_dir) if cfg.ship_dir is not None else ASSETS_DIR
    target.mkdir(parents=True, exist_ok=True)
    for model in cfg.models:
        if not layout.nemo(model).is_file():
            raise FileNotFoundError(f"{model}: {layout.nemo(model)} does not exist; run the train stage first")
        name = shipped_name(model)
        shutil.copyfile(layout.nemo(model), target / f"{name}.nemo")
        if layout.evaluation(model).is_file():
            shutil.copyfile(layout.evaluation(model), target / f"{name}_eval.json")
        log(f"{model}: shipped as {target / f'{name}.nemo'}")
    examples = target / "examples"
    if examples.exists():
        shutil.rmtree(examples)
    examples.mkdir()
    picked = pick_examples(layout, cfg.example_splits, cfg.num_examples, log)
    with open(examples / "manifest.jsonl", "w", encoding="utf8") as out:
        for index, (split, entry) in enumerate(picked):
            wav = f"example_{index:02d}.wav"
            shutil.copyfile(layout.manifest(split).parent / entry["audio_filepath"], examples / wav)
            out.write(json.dumps({**entry, "audio_filepath": wav, "split": split}) + "\n")
    splits = ", ".join(dict.fromkeys(split for split, _ in picked))
    log(f"examples: {len(picked)} test utterances ({splits}) -> {examples}")
    if all((target / f"{name}.nemo").is_file() for name in TRAINED_REFERENCE_MODELS.values()):
        statistics = target / EMISSION_STATISTICS_PATH.name
        write_trained_emission_stats(
            layout.manifest("test"), statistics, assets_dir=target, batch_size=cfg.eval_batch_size
        )
        log(f"emission statistics of {', '.join(TRAINED_REFERENCE_MODELS.values())} -> {statistics}")
    return target


def run(
    cfg: TinyModelsConfig | DictConfig | dict[str, Any] | None = None, log: Callable[[str], None] = print
) -> RecipeLayout:
    """Run the configured stages (see the module docstring) in order; returns the output layout."""
    cfg = resolve_config(cfg)
    layout = RecipeLayout.at(cfg.output_dir)
    trained: dict[str, bool] = {}
    if "data" in cfg.stages:
        prepare_data(cfg, layout, log)
    if "train" in cfg.stages:
        for model in cfg.models:
            trained[model] = train(model, cfg, layout, log)
    if "export" in cfg.stages:
        for model in cfg.models:
            if layout.nemo(model).is_file() and layout.trained_marker(model).exists():
                log(f"{model}: {layout.nemo(model)} is there")
            else:
                export(model, cfg, layout, log=log)
    if "evaluate" in cfg.stages:
        for model in cfg.models:
            if not trained.get(model, True):
                log(f"{model}: training has not reached its end; run the train stage again before evaluating")
                continue
            evaluate(
                model,
                layout,
                batch_size=cfg.eval_batch_size,
                beam_size=cfg.eval_beam_size,
                streaming=cfg.eval_streaming,
                streaming_utterances=cfg.eval_streaming_utterances,
                extra_splits=voices.evaluation_splits(cfg.voices),
                sessions=cfg.eval_sessions,
                session_utterances=cfg.eval_session_utterances,
                session_pause_seconds=cfg.eval_session_pause_seconds,
                log=log,
            )
    if "ship" in cfg.stages:
        ship(cfg, layout, log)
    return layout
