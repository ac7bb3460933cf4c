"""Transcription on every GPU (or CPU process) of one or more machines with Lightning's DDP predict.

As NeMo's ``transcribe_speech_parallel.py`` does, Lightning starts one process per device (``strategy=ddp``; on the
CPU the processes talk over gloo). Here each prediction step is one whole shard (:class:`~.job.ShardJob`): rank ``r``
of ``W`` takes shards ``r, r + W, ...`` that have no output yet, transcribes each with NeMo's ``transcribe`` and the
configured decoding strategy, and writes its records once the shard is done. After a barrier, the ranks' times are
gathered and rank 0 merges the shard files in input order into one manifest. A job that died is rerun with the same
command and work folder: finished shards are read, not redone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig

from nemo_fastdecode.apps.parallel.job import (
    ParallelResult,
    ShardJob,
    WorkerTime,
    finish_job,
    load_transcriber,
    transcribe_shard,
)

__all__ = ["transcribe_parallel_lightning"]

_NO_SHARD = -1  # the step of a rank whose shards are all finished


class _ShardPredictor(pl.LightningModule):
    """Loads the model on its rank's device; one predict step transcribes one shard and writes its output."""

    def __init__(self, job: ShardJob):
        super().__init__()
        self.job = job
        self.asr: Any = None
        self.time: WorkerTime | None = None
        self.times: list[WorkerTime] = []  # every rank's, after predict

    def on_predict_start(self) -> None:
        start = time.time()
        self.asr = load_transcriber(self.job.cfg, self.device)
        # NeMo's Conformer encoder all-reduces each batch's length across ranks when a process group exists (for
        # training); ranks that transcribe different shards would wait on each other forever
        if hasattr(self.asr.encoder, "sync_max_audio_length"):
            self.asr.encoder.sync_max_audio_length = False
        self.time = WorkerTime(f"rank {self.trainer.global_rank}", load_seconds=time.time() - start)
        self.trainer.strategy.barrier("models loaded")  # the ranks start together, as the Ray actors do

    def predict_step(self, batch: list[int]) -> None:
        job = self.job
        for shard in batch:
            if shard == _NO_SHARD:
                continue
            indices = job.shards[shard]
            start, end = transcribe_shard(
                self.asr, job.cfg, job.outputs, shard, indices, [job.utterances[i] for i in indices]
            )
            self.time.add(start, end, job.audio_seconds(shard))

    def on_predict_end(self) -> None:
        """Every rank's shards are written: gather the ranks' times (inside predict, while the process group is up)."""
        self.trainer.strategy.barrier("shards written")
        mine = torch.tensor(self.time.as_list(), dtype=torch.float64, device=self.device)
        gathered = self.trainer.strategy.all_gather(mine).reshape(-1, len(WorkerTime.NUMBERS)).tolist()
        self.times = [WorkerTime.from_list(f"rank {rank}", values) for rank, values in enumerate(gathered)]


class _ShardData(pl.LightningDataModule):
    """Per rank, the unfinished shards it owns (built after the process group exists, so the rank is known)."""

    def __init__(self, job: ShardJob):
        super().__init__()
        self.job = job

    def predict_dataloader(self) -> torch.utils.data.DataLoader:
        rank, world = self.trainer.global_rank, self.trainer.world_size
        mine = self.job.pending(range(rank, len(self.job.shards), world))
        # Lightning wants a batch on every rank: one with nothing to do gets an empty step
        return torch.utils.data.DataLoader(mine or [_NO_SHARD], batch_size=1, collate_fn=list)


def transcribe_parallel_lightning(cfg: DictConfig, log: Callable[[str], None] = print) -> ParallelResult | None:
    """Run the job of ``cfg`` (:class:`~nemo_fastdecode.apps.configs.ParallelTranscribeConfig`) on this process's
    share of the devices; rank 0 returns the merged result, other ranks ``None``."""
    wall_start = time.time()
    trainer = pl.Trainer(
        accelerator=cfg.accelerator, devices=cfg.devices, num_nodes=cfg.num_nodes, strategy=cfg.strategy,
        use_distributed_sampler=False, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False,
    )  # fmt: skip
    job = ShardJob.plan(cfg, trainer.world_size)
    predictor = _ShardPredictor(job)
    trainer.predict(predictor, datamodule=_ShardData(job), return_predictions=False)
    if trainer.global_rank != 0:
        return None
    return finish_job(job, predictor.times, trainer.world_size, wall_start, log)
