"""Offline transcription over several processes, GPUs and machines (``scripts/transcribe_parallel.py``).

* :mod:`~nemo_fastdecode.apps.parallel.shards` -- the inputs cut into length-balanced shards, each shard's output
  written once it is complete (a rerun skips finished shards), the outputs merged in input order.
* :mod:`~nemo_fastdecode.apps.parallel.job` -- what the backends share: the job's shards, one shard's transcription
  on a worker, the merge and the throughput report.
* :mod:`~nemo_fastdecode.apps.parallel.lightning_run` -- Lightning's DDP predict: every rank transcribes its shards
  with the model's decoding strategy (``fast_greedy`` by default), rank 0 merges.
* :mod:`~nemo_fastdecode.apps.parallel.ray_run` -- Ray Data: a pool of actors (one per GPU) takes the shards one at a
  time, the driver merges (``pip install "ray[data]"``).

:func:`transcribe_parallel` runs a job on the backend its config names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from nemo_fastdecode.apps.parallel.job import ParallelResult

__all__ = ["BACKENDS", "transcribe_parallel"]

#: ``backend`` values of :class:`~nemo_fastdecode.apps.configs.ParallelTranscribeConfig`
BACKENDS = ("lightning", "ray")


def transcribe_parallel(cfg: DictConfig, log: Callable[[str], None] = print) -> ParallelResult | None:
    """Run ``cfg``'s job (:class:`~nemo_fastdecode.apps.configs.ParallelTranscribeConfig`) on ``cfg.backend``; the
    process that merges (Lightning's rank 0, Ray's driver) returns the result, other Lightning ranks ``None``."""
    if cfg.backend == "lightning":
        from nemo_fastdecode.apps.parallel.lightning_run import transcribe_parallel_lightning

        return transcribe_parallel_lightning(cfg, log)
    if cfg.backend == "ray":
        from nemo_fastdecode.apps.parallel.ray_run import transcribe_parallel_ray

        return transcribe_parallel_ray(cfg, log)
    raise ValueError(f"backend={cfg.backend!r}; valid backends: {', '.join(BACKENDS)}")
