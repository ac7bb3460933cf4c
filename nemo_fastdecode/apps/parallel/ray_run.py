"""Transcription on a Ray cluster with Ray Data: a fixed pool of actors, one per GPU (or per CPU), each loading the
model once.

The driver (the process that runs this) reads the inputs and plans the shards as the Lightning backend does
(:class:`~.job.ShardJob`); the unfinished shards become a :mod:`ray.data` dataset of one row per shard (the shard's
inputs: index, audio path and manifest entry), and ``map_batches`` hands them one at a time to the actors
(:class:`ShardTranscriber`; ``num_gpus=1`` each on GPUs). An actor transcribes a shard with the configured decoding
strategy and writes the shard's file as a Lightning rank does, so the work folder, its resume and its merge are the
same for both backends; the driver merges the files in input order. On a cluster of several machines the audio, the
work folder and the output must be on a file system that every node sees, and every node needs this package.

Ray is imported when a job runs: the package works without it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from nemo_fastdecode.apps.manifests import Utterance
from nemo_fastdecode.apps.models import family_modules, import_model_families
from nemo_fastdecode.apps.parallel.job import (
    ParallelResult,
    ShardJob,
    WorkerTime,
    finish_job,
    load_transcriber,
    transcribe_shard,
)
from nemo_fastdecode.apps.parallel.shards import ShardOutputs

__all__ = ["ShardTranscriber", "import_ray", "transcribe_parallel_ray"]

#: accelerator values the Ray backend takes
RAY_ACCELERATORS = ("auto", "gpu", "cpu")

#: how long the driver waits for every actor to have loaded its model before the first shard is handed out (so that
#: the actors start together), and the error instead of a wait without end where the cluster lacks the resources
ACTOR_START_TIMEOUT_S = 1800


def import_ray() -> ModuleType:
    """``ray``, with Ray Data imported; a clear error where it is not installed."""
    try:
        import ray
        import ray.data  # noqa: F401  (the backend's API)
    except ImportError as error:
        raise ImportError(
            f'backend=ray needs Ray Data, which could not be imported ({error}): pip install "ray[data]" '
            '(or this package\'s extra: pip install "nemo-fastdecode[ray]")'
        ) from None
    return ray


class ShardTranscriber:
    """A Ray Data actor: loads the model once, then transcribes each row of its batches (one shard) and writes the
    shard's file.

    A batch is ``{"shard": [k], "inputs": [json of [[index, audio path, entry], ...]]}``; the actor answers one row per
    shard with its worker name, model load seconds and the ``time.time()`` start and end of the shard's work.
    """

    def __init__(self, cfg: dict[str, Any], use_gpu: bool, family_modules: Sequence[str] = ()):
        start = time.time()
        import_model_families(family_modules)  # names the driver knows (a registered family) known here too
        self.cfg = OmegaConf.create(cfg)
        self.asr = load_transcriber(self.cfg, torch.device("cuda" if use_gpu else "cpu"))
        self.outputs = ShardOutputs(self.cfg.work_dir)
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "") if use_gpu else ""
        self.worker = f"{socket.gethostname()} pid {os.getpid()}" + (f" GPU {gpus}" if gpus else "")
        self.load_seconds = time.time() - start

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        starts, ends = [], []
        for shard, inputs in zip(batch["shard"], batch["inputs"], strict=True):
            items = json.loads(inputs)
            utterances = [Utterance(audio_path=Path(path), entry=entry) for _, path, entry in items]
            start, end = transcribe_shard(
                self.asr, self.cfg, self.outputs, int(shard), [index for index, _, _ in items], utterances
            )
            starts.append(start)
            ends.append(end)
        count = len(starts)
        return {
            "shard": np.asarray(batch["shard"], dtype=np.int64),
            "worker": np.asarray([self.worker] * count, dtype=object),
            "load_seconds": np.full(count, self.load_seconds),
            "start": np.asarray(starts, dtype=np.float64),
            "end": np.asarray(ends, dtype=np.float64),
        }


def _use_gpu(accelerator: str, resources: dict[str, float]) -> bool:
    """Whether the actors take a GPU each: ``gpu``, ``cpu``, or ``auto`` (GPUs where the cluster has any)."""
    if accelerator not in RAY_ACCELERATORS:
        raise ValueError(f"accelerator={accelerator!r} with backend=ray; valid: {', '.join(RAY_ACCELERATORS)}")
    if accelerator == "gpu" and resources.get("GPU", 0) < 1:
        raise ValueError("accelerator=gpu but the Ray cluster has no GPU; use accelerator=cpu or auto")
    return accelerator == "gpu" or (accelerator == "auto" and resources.get("GPU", 0) >= 1)


def _actor_count(requested: int | None, use_gpu: bool, resources: dict[str, float]) -> int:
    """``requested`` actors, checked against what the cluster has; ``None``: one per GPU (or CPU) of the cluster."""
    kind = "GPU" if use_gpu else "CPU"
    available = int(resources.get(kind, 0))
    if requested is None:
        return max(1, available)
    if requested < 1 or requested > available:
        raise ValueError(f"ray_actors={requested}, but the Ray cluster has {available} {kind}(s) (one per actor)")
    return requested


def _shard_rows(job: ShardJob, pending: list[int]) -> list[dict[str, Any]]:
    """One dataset row per shard: its id and its inputs as JSON (index, resolved audio path, manifest entry)."""
    return [
        {
            "shard": k,
            "inputs": json.dumps(
                [[i, str(job.utterances[i].audio_path), job.utterances[i].entry] for i in job.shards[k]],
                ensure_ascii=False,
            ),
        }
        for k in pending
    ]


def _transcribe_on_actors(
    ray: ModuleType, job: ShardJob, pending: list[int], actors: int, use_gpu: bool
) -> list[WorkerTime]:
    """The ``pending`` shards through a pool of ``actors`` :class:`ShardTranscriber` actors; each actor's times."""
    context = ray.data.DataContext.get_current()  # copied into the dataset when it is made
    wait_before = context.wait_for_min_actors_s
    context.wait_for_min_actors_s = ACTOR_START_TIMEOUT_S
    try:
        dataset = ray.data.from_items(_shard_rows(job, pending), override_num_blocks=len(pending))
        # one shard per call, each handed to an idle actor (no queue per actor): the actors finish together
        results = dataset.map_batches(
            ShardTranscriber,
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=1),
            fn_constructor_kwargs={
                "cfg": OmegaConf.to_container(job.cfg, resolve=True),
                "use_gpu": use_gpu,
                "family_modules": family_modules(),
            },
            num_gpus=1 if use_gpu else 0,
            num_cpus=1,
        )
    finally:
        context.wait_for_min_actors_s = wait_before
    workers: dict[str, WorkerTime] = {}
    for row in results.iter_rows():
        name = str(row["worker"])
        worker = workers.setdefault(name, WorkerTime(name, load_seconds=float(row["load_seconds"])))
        worker.add(float(row["start"]), float(row["end"]), job.audio_seconds(int(row["shard"])))
    return sorted(workers.values(), key=lambda w: w.worker)


def transcribe_parallel_ray(cfg: DictConfig, log: Callable[[str], None] = print) -> ParallelResult:
    """Run the job of ``cfg`` (:class:`~nemo_fastdecode.apps.configs.ParallelTranscribeConfig`) on a Ray cluster.

    Uses the Ray of this process if it is already initialised; otherwise ``ray.init(address=cfg.ray_address)``
    (``None``: Ray's default, ``RAY_ADDRESS`` or a local cluster; ``auto``: an existing cluster; ``local``: a new
    local one), shut down at the end.
    """
    wall_start = time.time()
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=cfg.ray_address)
    try:
        resources = ray.cluster_resources()
        use_gpu = _use_gpu(cfg.accelerator, resources)
        planned = _actor_count(cfg.ray_actors, use_gpu, resources)
        job = ShardJob.plan(cfg, planned)
        pending = job.pending()
        actors = min(planned, len(pending))  # no more actors than shards to do
        workers = []
        if pending:
            device = "GPU" if use_gpu else "CPU"
            log(f"{len(pending)} shard(s) to transcribe on {actors} Ray actor(s), one {device} each")
            workers = _transcribe_on_actors(ray, job, pending, actors, use_gpu)
        return finish_job(job, workers, actors, wall_start, log)
    finally:
        if started:
            ray.shutdown()
