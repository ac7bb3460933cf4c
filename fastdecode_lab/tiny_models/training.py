"""Training the tiny models with NeMo's own model classes on Lightning, resumable run after run, and their export.

A model is NeMo's ``EncDecHybridRNNTCTCBPEModel`` (a TDT or RNN-T transducer with an auxiliary CTC head) built
from ``configs/tiny_models/<model>.yaml`` with the recipe's manifests and tokenizer, and ``trainer.fit`` trains
it: NeMo's data loading, SpecAugment, losses, optimiser and schedule, validation WER. Each run resumes from
``last.ckpt`` (weights, optimiser, schedule, step and elapsed time: ``max_time`` counts over all runs), writes it
every ``checkpoint_every_n_steps`` and at its end, and exports the ``.nemo`` once training reaches ``max_steps`` or
``max_time``. Without ``last.ckpt`` a model starts from random weights or, with ``init_from``, from the weights of a
``.nemo`` (the shipped model of its kind, say), so that short sessions on fresh machines still accumulate training.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from fastdecode_lab.configs import TINY_MODELS, TinyModelsConfig
from fastdecode_lab.tiny_models.layout import RecipeLayout, check_model
from fastdecode_lab.tiny_models.transducer_loss import install_torch_loss
from fastdecode_lab.tiny_models.voices import training_splits

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from nemo.collections.asr.models import ASRModel

#: the repository's model configs (``configs/tiny_models``)
DEFAULT_MODEL_CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "tiny_models"


def default_num_workers() -> int:
    """Data-loading processes: every CPU core but two (the training process and the system), at most 12."""
    return max(1, min(12, (os.cpu_count() or 1) - 2))


def model_config(model: str, cfg: TinyModelsConfig, layout: RecipeLayout) -> DictConfig:
    """The resolved NeMo ``model:`` config of ``model``: its YAML, ``cfg.model_overrides``, and the recipe's
    manifests, tokenizer, batch size, data-loading processes and warm-up."""
    folder = Path(cfg.model_configs) if cfg.model_configs else DEFAULT_MODEL_CONFIGS
    path = folder / f"{check_model(model)}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no model config {path} (model_configs={cfg.model_configs!r})")
    full = OmegaConf.load(path)
    full.model = OmegaConf.merge(full.model, OmegaConf.create(dict(cfg.model_overrides or {})))
    workers = cfg.num_workers if cfg.num_workers is not None else default_num_workers()
    with open_dict(full):
        full.model.tokenizer.dir = str(layout.tokenizer_dir)
        # eSpeak's training split and each other synthesiser's (NeMo reads a list of manifests as one)
        training = ["train", *training_splits(cfg.voices)]
        full.model.train_ds.manifest_filepath = [str(layout.manifest(split)) for split in training]
        full.model.validation_ds.manifest_filepath = str(layout.manifest("dev"))
        for section in ("train_ds", "validation_ds", "test_ds"):
            full.model[section].batch_size = cfg.batch_size
            full.model[section].num_workers = workers if section == "train_ds" else min(workers, 4)
        if cfg.warmup_steps is not None:
            full.model.optim.sched.warmup_steps = cfg.warmup_steps
    OmegaConf.resolve(full)
    return full.model


def _precision(cfg: TinyModelsConfig, on_gpu: bool) -> str:
    if cfg.precision is not None:
        return cfg.precision
    return "bf16-mixed" if on_gpu else "32"


def _uses_gpu(cfg: TinyModelsConfig) -> bool:
    return cfg.accelerator in ("gpu", "cuda") or (cfg.accelerator == "auto" and torch.cuda.is_available())


def make_trainer(model: str, cfg: TinyModelsConfig, layout: RecipeLayout) -> pl.Trainer:
    """Lightning's trainer for one model: one device, ``last.ckpt`` checkpoints, a CSV log, the step and time
    limits of ``cfg``."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    checkpoint = ModelCheckpoint(
        dirpath=str(layout.checkpoint_dir(model)),
        save_top_k=0,
        save_last=True,
        every_n_train_steps=cfg.checkpoint_every_n_steps,
    )
    return pl.Trainer(
        accelerator=cfg.accelerator,
        devices=1,
        precision=_precision(cfg, _uses_gpu(cfg)),
        max_steps=cfg.max_steps,
        max_epochs=-1,
        max_time=cfg.max_time,
        val_check_interval=cfg.val_check_interval,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        log_every_n_steps=cfg.log_every_n_steps,
        gradient_clip_val=1.0,
        callbacks=[checkpoint, LearningRateMonitor(logging_interval="step")],
        logger=CSVLogger(str(layout.model_dir(model)), name="logs"),
        enable_progress_bar=False,
        benchmark=False,
    )


def build_model(model_cfg: DictConfig, loss: str, trainer: pl.Trainer | None = None) -> ASRModel:
    """NeMo's hybrid transducer/CTC model from ``model_cfg`` (TDT or RNN-T by its ``loss``; datasets set up where the
    config names manifests), with the PyTorch transducer loss installed when ``loss == "torch"``."""
    from nemo.collections.asr.models import EncDecHybridRNNTCTCBPEModel

    from nemo_fastdecode.nemo.context import quiet_nemo

    with quiet_nemo():
        asr_model = EncDecHybridRNNTCTCBPEModel(cfg=model_cfg, trainer=trainer)
    if loss == "torch":
        install_torch_loss(asr_model.loss, OmegaConf.to_container(model_cfg.loss))
    return asr_model


def init_source(model: str, cfg: TinyModelsConfig) -> Path | None:
    """The ``.nemo`` whose weights ``model`` starts from when it has no ``last.ckpt`` (``cfg.init_from``), or
    ``None``: random weights.

    Raises:
        FileNotFoundError: the file does not exist (for ``shipped``: a source tree without the package's assets).
    """
    if cfg.init_from is None:
        return None
    if cfg.init_from == "shipped":
        from nemo_fastdecode.apps.trained_models import shipped_name, trained_model_path

        return trained_model_path(shipped_name(model))
    if model not in cfg.init_from:
        return None
    path = Path(cfg.init_from[model])
    if not path.is_file():
        raise FileNotFoundError(
            f"init_from: {path} ({model}) does not exist; init_from takes null (from scratch), shipped (the "
            f"package's .nemo of each model) or a mapping {{model: path to a .nemo}} of models "
            f"{', '.join(TINY_MODELS)}"
        )
    return path


def init_from_nemo(asr_model: ASRModel, path: str | os.PathLike, tokenizer_dir: str | os.PathLike) -> None:
    """Give ``asr_model`` (built with the tokenizer at ``tokenizer_dir``) the weights of the ``.nemo`` at ``path``.

    Every parameter and buffer must match by name and shape (``load_state_dict(strict=True)``): NeMo's
    ``init_from_nemo_model`` loads with ``strict=False`` and would silently leave unmatched weights random.

    Raises:
        ValueError: the ``.nemo``'s tokenizer pieces differ from ``asr_model``'s, or its weights' names or shapes
            differ (the first such parameter named).
    """
    restored = restore(path)
    ours, theirs = list(asr_model.tokenizer.vocab), list(restored.tokenizer.vocab)
    if ours != theirs:
        first = next(
            (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs))
        )
        raise ValueError(
            f"init_from: the tokenizer of {path} ({len(theirs)} pieces) differs from the recipe's tokenizer "
            f"{tokenizer_dir} ({len(ours)} pieces; first difference at piece {first}); the corpus (num_train, seed, "
            f"vocab_size) must match the one the .nemo was trained with"
        )
    source, target = restored.state_dict(), asr_model.state_dict()
    del restored
    for name in [*target, *(name for name in source if name not in target)]:
        if name not in source or name not in target:
            where = "the model built from the config" if name in target else path
            raise ValueError(
                f"init_from: {path} does not match the model config: {name} exists only in {where} (did "
                f"model_overrides change the architecture?)"
            )
        if source[name].shape != target[name].shape:
            raise ValueError(
                f"init_from: {path} does not match the model config: {name} has shape {tuple(source[name].shape)} "
                f"there and {tuple(target[name].shape)} in the model built from the config (did model_overrides "
                f"change the architecture?)"
            )
    asr_model.load_state_dict(source, strict=True)


def _training_finished(trainer: pl.Trainer, cfg: TinyModelsConfig) -> bool:
    """True when the fit stopped at ``max_steps`` or ``max_time`` (not at an interruption)."""
    from lightning.pytorch.callbacks import Timer

    if trainer.global_step >= cfg.max_steps:
        return True
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    remaining = timer.time_remaining() if timer is not None else None
    return remaining is not None and remaining <= 0


def _seconds(max_time: str | None) -> float:
    """Lightning's ``DD:HH:MM:SS`` in seconds; ``None`` (no limit) is infinite."""
    if max_time is None:
        return math.inf
    days, hours, minutes, seconds = (int(part) for part in max_time.split(":"))
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def _trained_within(layout: RecipeLayout, model: str, cfg: TinyModelsConfig) -> bool:
    """True when ``model`` reached the end of a training whose limits were at least ``cfg``'s."""
    marker = layout.trained_marker(model)
    if not marker.is_file():
        return False
    done = json.loads(marker.read_text())
    return cfg.max_steps <= done["max_steps"] and _seconds(cfg.max_time) <= _seconds(done["max_time"])


def train(model: str, cfg: TinyModelsConfig, layout: RecipeLayout, log: Callable[[str], None] = print) -> bool:
    """Train ``model`` from ``last.ckpt`` if there is one, else from ``cfg.init_from`` (:func:`init_source`) or from
    scratch; returns whether training has reached its end.

    A model that reached the end of a training with these ``max_steps`` and ``max_time`` (``{model}/TRAINED``) is
    not trained again; larger limits train it on from its last checkpoint.
    """
    if _trained_within(layout, model, cfg):
        log(f"{model}: already trained ({layout.trained_marker(model)}); skipping")
        return True
    for split in ("train", "dev", *training_splits(cfg.voices)):
        if not layout.manifest(split).is_file():
            raise FileNotFoundError(f"no manifest {layout.manifest(split)}: run the data stage first")
    if cfg.gpu_memory_fraction is not None and _uses_gpu(cfg):
        # a hard cap on this process's caching allocator, so that several trainings share one GPU
        torch.cuda.set_per_process_memory_fraction(cfg.gpu_memory_fraction)
    torch.manual_seed(cfg.seed)
    model_cfg = model_config(model, cfg, layout)
    layout.model_dir(model).mkdir(parents=True, exist_ok=True)
    OmegaConf.save(model_cfg, layout.model_config(model))
    trainer = make_trainer(model, cfg, layout)
    asr_model = build_model(model_cfg, cfg.loss, trainer)
    last = layout.last_checkpoint(model)
    resume = str(last) if last.is_file() else None
    source = None if resume else init_source(model, cfg)
    if source is not None:
        init_from_nemo(asr_model, source, layout.tokenizer_dir)
    parameters = sum(p.numel() for p in asr_model.parameters())
    start_from = f"resuming from {last}" if resume else f"from {source}" if source is not None else "from scratch"
    log(f"{model}: {parameters / 1e6:.2f}M parameters; {start_from}")
    start = time.perf_counter()
    trainer.fit(asr_model, ckpt_path=resume)
    trainer.save_checkpoint(str(last))
    log(f"{model}: step {trainer.global_step} after {time.perf_counter() - start:.0f} s in this run")
    finished = _training_finished(trainer, cfg)
    if finished:
        export(model, cfg, layout, asr_model=asr_model, log=log)
        record = {"global_step": trainer.global_step, "max_steps": cfg.max_steps, "max_time": cfg.max_time}
        layout.trained_marker(model).write_text(json.dumps(record) + "\n")
    return finished


def export(
    model: str,
    cfg: TinyModelsConfig,
    layout: RecipeLayout,
    asr_model: ASRModel | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """Save ``model`` as ``models/{model}.nemo``: the given model, or the weights of ``last.ckpt`` in the config it
    was trained with. The saved config names no manifests (they exist only here)."""
    if asr_model is None:
        if not layout.last_checkpoint(model).is_file():
            raise FileNotFoundError(f"no checkpoint {layout.last_checkpoint(model)}: train {model} first")
        model_cfg = OmegaConf.load(layout.model_config(model))
        with open_dict(model_cfg):
            for section in ("train_ds", "validation_ds", "test_ds"):
                model_cfg[section].manifest_filepath = None
        asr_model = build_model(model_cfg, loss="nemo")
        state = torch.load(layout.last_checkpoint(model), map_location="cpu", weights_only=False)
        asr_model.load_state_dict(state["state_dict"])
    with open_dict(asr_model.cfg):
        for section in ("train_ds", "validation_ds", "test_ds"):
            asr_model.cfg[section].manifest_filepath = None
    path = layout.nemo(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    asr_model.save_to(str(path))
    log(f"{model}: saved {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return path


def restore(path: str | os.PathLike, device: str | torch.device = "cpu") -> ASRModel:
    """A saved tiny model, in eval mode on ``device``."""
    from nemo.collections.asr.models import ASRModel

    from nemo_fastdecode.nemo.context import quiet_nemo

    with quiet_nemo():
        asr_model = ASRModel.restore_from(str(path), map_location=torch.device(device))
    return asr_model.eval()
