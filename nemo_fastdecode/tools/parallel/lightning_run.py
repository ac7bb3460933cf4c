"""Transcription on every GPU (or CPU process) of one or more machines with Lightning's DDP predict.

As NeMo's ``transcribe_speech_parallel.py`` does, Lightning starts one process per device (``strategy=ddp``; on the
CPU the processes talk over gloo). Here each prediction step is one whole shard
(:mod:`~nemo_fastdecode.tools.parallel.shards`): rank ``r`` of ``W`` takes shards ``r, r + W, ...`` that have no
output yet, transcribes each with NeMo's ``transcribe`` and the configured decoding strategy, and writes its records
once the shard is done. After a barrier, rank 0 merges the shard files in input order into one manifest. A job that
died is rerun with the same command and work folder: finished shards are read, not redone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import soundfile
import torch
from omegaconf import DictConfig

from nemo_fastdecode.tools.manifests import Utterance, read_inputs, write_output_manifest
from nemo_fastdecode.tools.models import load_model
from nemo_fastdecode.tools.parallel.shards import ShardOutputs, plan_shards
from nemo_fastdecode.tools.transcribe_app import apply_transcribe_decoding, transcribe_utterances

__all__ = ["ParallelResult", "durations_of", "transcribe_parallel"]

_NO_SHARD = -1  # the step of a rank whose shards are all finished


def durations_of(utterances: list[Utterance]) -> list[float]:
    """Seconds of each input: the manifest's ``duration`` where given, else the file's header (0 if unreadable)."""
    out = []
    for u in utterances:
        duration = u.entry.get("duration")
        if duration is None:
            try:
                duration = soundfile.info(str(u.audio_path)).duration
            except (RuntimeError, OSError):  # soundfile's LibsndfileError is a RuntimeError
                duration = 0.0  # transcribe_utterances names the problem in the output
        out.append(float(duration))
    return out


class _ShardPredictor(pl.LightningModule):
    """Loads the model on its rank's device; one predict step transcribes one shard and writes its output."""

    def __init__(self, cfg: DictConfig, utterances: list[Utterance], shards: list[list[int]], outputs: ShardOutputs):
        super().__init__()
        self.cfg, self.utterances, self.shards, self.outputs = cfg, utterances, shards, outputs
        self.asr: Any = None
        self.merged: list[dict[str, Any]] | None = None  # rank 0, after predict

    def on_predict_start(self) -> None:
        self.asr = load_model(self.cfg.model, device=self.device, seed=self.cfg.seed)
        apply_transcribe_decoding(self.asr, self.cfg.decoding, bool(self.cfg.timestamps))
        # NeMo's Conformer encoder all-reduces each batch's length across ranks when a process group exists (for
        # training); ranks that transcribe different shards would wait on each other forever
        if hasattr(self.asr.encoder, "sync_max_audio_length"):
            self.asr.encoder.sync_max_audio_length = False

    def predict_step(self, batch: list[int]) -> None:
        for shard in batch:
            if shard == _NO_SHARD:
                continue
            indices = self.shards[shard]
            records, _ = transcribe_utterances(
                self.asr, [self.utterances[i] for i in indices], batch_size=self.cfg.batch_size,
                timestamps=bool(self.cfg.timestamps), bf16=self.cfg.bf16, progress=False, log=lambda _: None,
            )  # fmt: skip
            self.outputs.write(shard, indices, records)

    def on_predict_end(self) -> None:
        """Every rank's shards are written: rank 0 merges them (inside predict, while the process group is up)."""
        self.trainer.strategy.barrier("shards written")
        if self.trainer.global_rank == 0:
            self.merged = self.outputs.merge(self.shards)


class _ShardData(pl.LightningDataModule):
    """Per rank, the unfinished shards it owns (built after the process group exists, so the rank is known)."""

    def __init__(self, shards: list[list[int]], outputs: ShardOutputs):
        super().__init__()
        self.shards, self.outputs = shards, outputs

    def predict_dataloader(self) -> torch.utils.data.DataLoader:
        rank, world = self.trainer.global_rank, self.trainer.world_size
        mine = [k for k in range(rank, len(self.shards), world) if not self.outputs.done(k) and self.shards[k]]
        # Lightning wants a batch on every rank: one with nothing to do gets an empty step
        return torch.utils.data.DataLoader(mine or [_NO_SHARD], batch_size=1, collate_fn=list)


@dataclass
class ParallelResult:
    """What :func:`transcribe_parallel` did (on rank 0; other ranks get ``None``)."""

    output_path: Path
    records: list[dict[str, Any]]
    shards: int
    shards_reused: int


def transcribe_parallel(cfg: DictConfig, log: Callable[[str], None] = print) -> ParallelResult | None:
    """Run the job of ``cfg`` (:class:`~nemo_fastdecode.tools.configs.ParallelTranscribeConfig`) on this process's
    share of the devices; rank 0 returns the merged result."""
    utterances = read_inputs(cfg.audio_dir, cfg.dataset_manifest)
    trainer = pl.Trainer(
        accelerator=cfg.accelerator, devices=cfg.devices, num_nodes=cfg.num_nodes, strategy=cfg.strategy,
        use_distributed_sampler=False, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False,
    )  # fmt: skip
    world = trainer.world_size
    shards = plan_shards(durations_of(utterances), max(1, world * cfg.shards_per_rank))
    outputs = ShardOutputs(cfg.work_dir)
    reused = sum(outputs.done(k) for k in range(len(shards)))
    predictor = _ShardPredictor(cfg, utterances, shards, outputs)
    trainer.predict(predictor, datamodule=_ShardData(shards, outputs), return_predictions=False)
    if trainer.global_rank != 0:
        return None
    records = predictor.merged
    output_path = write_output_manifest(records, cfg.output_filename)
    log(
        f"{len(records)} input(s) in {len(shards)} shard(s) over {world} process(es) ({reused} shard(s) from an "
        f"earlier run); wrote {output_path}"
    )
    return ParallelResult(output_path, records, len(shards), reused)
