"""What every backend of a parallel transcription job shares: the inputs and their shards, one shard's transcription
on a worker, and the end of the job (merge, output manifest, throughput).

A worker is a Lightning rank or a Ray actor. It loads the model once (:func:`load_transcriber`) and transcribes whole
shards (:func:`transcribe_shard`), each written atomically by :class:`~.shards.ShardOutputs`. The process that started
the job (rank 0, or Ray's driver) merges the shards in input order and reports the audio seconds per wall second
(:func:`finish_job`), overall and per worker (:class:`WorkerTime`), so that runs on 1 and N GPUs can be compared.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import soundfile
import torch
from omegaconf import DictConfig

from nemo_fastdecode.apps.manifests import Utterance, read_inputs, write_output_manifest
from nemo_fastdecode.apps.models import load_model
from nemo_fastdecode.apps.parallel.shards import ShardOutputs, plan_shards
from nemo_fastdecode.apps.transcribe import apply_transcribe_decoding, transcribe_utterances

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

__all__ = [
    "ParallelResult",
    "ShardJob",
    "Throughput",
    "WorkerTime",
    "durations_of",
    "finish_job",
    "load_transcriber",
    "transcribe_shard",
]


def durations_of(utterances: Sequence[Utterance]) -> list[float]:
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


@dataclass
class ShardJob:
    """The inputs of ``cfg`` (:class:`~nemo_fastdecode.apps.configs.ParallelTranscribeConfig`), cut into
    ``workers * cfg.shards_per_rank`` length-balanced shards, and the shard files of ``cfg.work_dir``.

    Every process that plans the same inputs for the same number of workers gets the same shards.
    """

    cfg: DictConfig
    utterances: list[Utterance]
    durations: list[float]
    shards: list[list[int]]
    outputs: ShardOutputs
    reused: int  # shards finished by an earlier run

    @classmethod
    def plan(cls, cfg: DictConfig, workers: int) -> ShardJob:
        utterances = read_inputs(cfg.audio_dir, cfg.dataset_manifest)
        durations = durations_of(utterances)
        shards = plan_shards(durations, max(1, workers * cfg.shards_per_rank))
        outputs = ShardOutputs(cfg.work_dir)
        outputs.check_plan([str(u.audio_path) for u in utterances], shards)
        reused = sum(outputs.done(k) for k in range(len(shards)))
        return cls(cfg, utterances, durations, shards, outputs, reused)

    def pending(self, owned: Sequence[int] | None = None) -> list[int]:
        """The shards (of ``owned``, default all) that have inputs and no output yet."""
        candidates = range(len(self.shards)) if owned is None else owned
        return [k for k in candidates if self.shards[k] and not self.outputs.done(k)]

    def audio_seconds(self, shard: int) -> float:
        return sum(self.durations[i] for i in self.shards[shard])


def load_transcriber(cfg: DictConfig, device: str | torch.device) -> ASRModel:
    """The model of ``cfg.model`` on ``device``, with ``cfg``'s decoding strategy (as ``scripts/transcribe.py``)."""
    asr = load_model(cfg.model, device=device, seed=cfg.seed)
    apply_transcribe_decoding(asr, cfg.decoding, bool(cfg.timestamps))
    return asr


def transcribe_shard(
    asr: ASRModel,
    cfg: DictConfig,
    outputs: ShardOutputs,
    shard: int,
    indices: Sequence[int],
    utterances: Sequence[Utterance],
) -> tuple[float, float]:
    """Transcribe one shard (``utterances[j]`` is input ``indices[j]``) and write its file; returns the wall-clock
    ``(start, end)`` (``time.time()``) of the work."""
    start = time.time()
    records, _ = transcribe_utterances(
        asr, utterances, batch_size=cfg.batch_size, timestamps=bool(cfg.timestamps), bf16=cfg.bf16, progress=False,
        log=lambda _: None,  # an unreadable file gets an `error` entry in the records; finish_job counts them
    )  # fmt: skip
    outputs.write(shard, indices, records)
    return start, time.time()


@dataclass
class WorkerTime:
    """One worker's (rank's or actor's) share of a run; times from ``time.time()``, in seconds."""

    worker: str
    load_seconds: float = 0.0  # model load and set-up
    shards: int = 0
    audio_seconds: float = 0.0
    busy_seconds: float = 0.0  # transcribing its shards
    first_start: float = math.inf
    last_end: float = -math.inf

    #: the numeric fields, in the order of :meth:`as_list` (a row of a gathered tensor)
    NUMBERS = ("load_seconds", "shards", "audio_seconds", "busy_seconds", "first_start", "last_end")

    def add(self, start: float, end: float, audio_seconds: float) -> None:
        """Count a shard transcribed from ``start`` to ``end``."""
        self.shards += 1
        self.audio_seconds += audio_seconds
        self.busy_seconds += end - start
        self.first_start, self.last_end = min(self.first_start, start), max(self.last_end, end)

    def as_list(self) -> list[float]:
        return [float(getattr(self, name)) for name in self.NUMBERS]

    @classmethod
    def from_list(cls, worker: str, values: Sequence[float]) -> WorkerTime:
        numbers = dict(zip(cls.NUMBERS, (float(v) for v in values), strict=True))
        return cls(worker, **{**numbers, "shards": int(numbers["shards"])})


def _rtfx(audio_seconds: float, seconds: float) -> str:
    return f"RTFx {audio_seconds / seconds:.1f}" if seconds > 0 else "RTFx -"


@dataclass
class Throughput:
    """Speed of a run: audio seconds transcribed (this run's shards) per second, overall and per worker.

    Attributes:
        audio_seconds: audio of the shards transcribed in this run (not those reused from an earlier one).
        transcribe_seconds: from the first shard's start to the last shard's end, over all workers (model loads and
            process start-up excluded): ``audio_seconds / transcribe_seconds`` is the RTFx to compare across GPU counts.
        wall_seconds: the whole job on the starting process, start-up, model loads and merge included.
        workers: per worker.
    """

    audio_seconds: float
    transcribe_seconds: float
    wall_seconds: float
    workers: list[WorkerTime] = field(default_factory=list)

    @classmethod
    def of(cls, workers: Sequence[WorkerTime], wall_seconds: float) -> Throughput:
        active = [w for w in workers if w.shards]
        span = max(w.last_end for w in active) - min(w.first_start for w in active) if active else 0.0
        return cls(sum(w.audio_seconds for w in active), span, wall_seconds, list(workers))

    @property
    def rtfx(self) -> float:
        return self.audio_seconds / self.transcribe_seconds if self.transcribe_seconds > 0 else math.nan

    def lines(self) -> list[str]:
        out = [
            f"Throughput: {self.audio_seconds:.1f} s of audio in {self.transcribe_seconds:.2f} s of transcription "
            f"(first shard start to last shard end): {_rtfx(self.audio_seconds, self.transcribe_seconds)}; "
            f"{self.wall_seconds:.2f} s wall in all ({_rtfx(self.audio_seconds, self.wall_seconds)})"
        ]
        for w in self.workers:
            out.append(
                f"  {w.worker}: model {w.load_seconds:.2f} s, {w.shards} shard(s), {w.audio_seconds:.1f} s of audio "
                f"in {w.busy_seconds:.2f} s ({_rtfx(w.audio_seconds, w.busy_seconds)})"
            )
        return out


@dataclass
class ParallelResult:
    """What a parallel job did (on the process that started it)."""

    output_path: Path
    records: list[dict[str, Any]]
    shards: int
    shards_reused: int
    throughput: Throughput


def finish_job(
    job: ShardJob,
    workers: Sequence[WorkerTime],
    worker_count: int,
    wall_start: float,
    log: Callable[[str], None] = print,
) -> ParallelResult:
    """Merge the shard files in input order into ``cfg.output_filename`` and report what the run did and how fast
    (``workers``: the times of the ``worker_count`` workers that took part, or of those that transcribed shards)."""
    records = job.outputs.merge(job.shards)
    output_path = write_output_manifest(records, job.cfg.output_filename)
    throughput = Throughput.of(workers, time.time() - wall_start)
    log(
        f"{len(records)} input(s) in {len(job.shards)} shard(s) over {worker_count} {job.cfg.backend} worker(s) "
        f"({job.reused} shard(s) from an earlier run); wrote {output_path}"
    )
    failed = [r for r in records if r.get("pred_text") is None and "error" in r]
    if failed:
        log(f"{len(failed)} file(s) could not be transcribed (each has an 'error' entry there)")
    for line in throughput.lines():
        log(line)
    return ParallelResult(output_path, records, len(job.shards), job.reused, throughput)
