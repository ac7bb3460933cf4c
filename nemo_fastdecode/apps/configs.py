"""Configs of the user-facing apps, mirrored one to one by the YAML files in ``configs/``.

* :class:`TranscribeConfig` -- ``scripts/transcribe.py`` (``configs/transcribe.yaml``).
* :class:`ParallelTranscribeConfig` -- ``scripts/transcribe_parallel.py`` (``configs/transcribe_parallel.yaml``).
* :class:`LoadtestConfig` -- ``nemo-fastdecode loadtest`` (``configs/loadtest.yaml``).

The server's config is :class:`nemo_fastdecode.serve.config.ServeConfig`. Output folders default to ``outputs/``
(ignored by git), never the repository's own folders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nemo_fastdecode.config import FastGreedyDecodingConfig

if TYPE_CHECKING:
    pass


@dataclass
class TranscribeConfig:
    """``scripts/transcribe.py``: transcribe a folder of audio or a NeMo manifest with ``fast_greedy``.

    Attributes:
        model: a shipped trained model (``trained-tdt``, ``trained-streaming``; small models trained on
            synthesised English speech), a synthetic preset (``tiny-rnnt``, ``tiny-tdt``, ``tiny-hybrid``,
            ``rnnt-0.6b``, ``rnnt-1.1b``, ``tdt-0.6b``; random weights), a path to a ``.nemo`` checkpoint, or a
            pretrained model name for ``ASRModel.from_pretrained`` (needs network access).
        audio_dir: transcribe every ``.wav`` / ``.flac`` file in this folder (sorted by name).
        dataset_manifest: or every entry of this JSON-lines manifest (``audio_filepath``, optional
            ``text``, whose WER is then reported; relative paths are relative to the manifest's folder).
            Neither given: the embedded demo (the shipped example utterances, their references and the WER;
            4 synthetic utterances for a synthetic preset).
        output_filename: where to write the output manifest (``pred_text`` per entry). ``None``: next to
            the input (``<manifest stem>_transcribed.jsonl`` / ``<audio_dir>_transcribed.jsonl``),
            or ``outputs/transcribe_output.jsonl`` for the demo.
        batch_size: utterances per batch.
        bf16: run the model under ``torch.autocast(dtype=torch.bfloat16)`` on a GPU.
        timestamps: compute char/word/segment timestamps and write them into the manifest.
        cuda: GPU index; ``None`` picks GPU 0 when there is one, else the CPU; a negative value
            forces the CPU (NeMo's ``transcribe_speech.py`` convention).
        seed: seed of the synthetic model's random weights and of the demo audio.
        compare_strategies: after transcribing, time ``fast_greedy`` against NeMo's ``greedy_batch``
            (frame and label looping, no CUDA graphs) on the same encoder outputs and check that the
            hypotheses are identical. ``None``: only for the embedded demo.
        offline_path: transcribe through :func:`nemo_fastdecode.offline.enable_fast_transcribe` (length-sorted
            batches under a padded-audio budget, audio read ahead on threads; the same results).
        decoding: the model's decoding section, applied with ``model.change_decoding_strategy``.
    """

    model: str = "trained-tdt"
    audio_dir: str | None = None
    dataset_manifest: str | None = None
    output_filename: str | None = None
    batch_size: int = 32
    bf16: bool = False
    timestamps: bool = False
    cuda: int | None = None
    seed: int = 0
    compare_strategies: bool | None = None
    offline_path: bool = False
    decoding: FastGreedyDecodingConfig = field(default_factory=FastGreedyDecodingConfig)


@dataclass
class ParallelTranscribeConfig:
    """``scripts/transcribe_parallel.py``: a manifest or folder transcribed by several workers (Lightning DDP ranks or
    Ray actors), merged in input order.

    Attributes:
        model, audio_dir, dataset_manifest, batch_size, bf16, timestamps, seed, decoding: as
            :class:`TranscribeConfig` (one of ``audio_dir`` / ``dataset_manifest`` is required here).
        output_filename: the merged output manifest (input order).
        work_dir: one file per finished shard; a rerun with the same inputs and worker count reuses them (another job
            in the same folder is refused).
        backend: ``lightning`` (DDP processes started by Lightning, on one or more machines) or ``ray`` (Ray Data
            actors on a Ray cluster; ``pip install "ray[data]"``).
        accelerator: ``gpu``, ``cpu`` or ``auto`` (Lightning's; with Ray, one GPU per actor or one CPU per actor).
        devices: Lightning: processes per machine (GPUs per node, or CPU processes); ``-1``: every GPU.
        num_nodes: Lightning: machines (each started with the same command, as Lightning's cluster environments expect).
        strategy: Lightning's (``ddp``: one process per device).
        ray_address: Ray: the cluster to use (``auto``: a running one, ``local``: a new one on this machine,
            ``host:port`` or ``ray://host:port``); ``None``: ``RAY_ADDRESS``, else the latest local cluster, else a
            new local one.
        ray_actors: Ray: actors, each loading the model once; ``None``: one per GPU of the cluster (per CPU with
            ``accelerator=cpu``).
        shards_per_rank: shards per worker (length-balanced); more shards lose less work to a failure.
    """

    model: str = "tiny-rnnt"
    audio_dir: str | None = None
    dataset_manifest: str | None = None
    output_filename: str = "outputs/transcribe_parallel.jsonl"
    work_dir: str = "outputs/transcribe_parallel_shards"
    batch_size: int = 32
    bf16: bool = False
    timestamps: bool = False
    seed: int = 0
    backend: str = "lightning"
    accelerator: str = "auto"
    devices: int = 1
    num_nodes: int = 1
    strategy: str = "ddp"
    ray_address: str | None = None
    ray_actors: int | None = None
    shards_per_rank: int = 4
    decoding: FastGreedyDecodingConfig = field(default_factory=FastGreedyDecodingConfig)


#: hosts a load test may target: this machine's loopback interface only
LOOPBACK_HOSTS: tuple[str, ...] = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass
class LoadtestConfig:
    """``nemo-fastdecode loadtest``: concurrent clients streaming audio to a server on this machine.

    Attributes:
        url: the server's WebSocket (loopback only: ``127.0.0.1``, ``localhost`` or ``[::1]``).
        api_key: sent as ``Authorization: Bearer``.
        clients: concurrent clients (client ``i`` streams input ``i mod inputs``; the default streams each example
            utterance once).
        clients_sweep: run at each of these counts instead (latency vs clients: table, JSON and plot).
        audio_files: WAV/FLAC files to stream, or
        dataset_manifest: a JSON-lines manifest (``audio_filepath``, optional ``text``: the finals' WER against it
            is reported). Neither: the shipped example utterances and their reference texts; for a synthetic
            ``model``, synthetic speech-like audio of ``synthetic_seconds``.
        synthetic_seconds: durations of the synthetic inputs (a synthetic ``model`` with no audio given).
        max_audio_seconds: cut each input to this (``None``: whole files).
        chunk_ms: audio per message.
        input_rate: the rate clients send PCM16 at: the model's 16 kHz, or another rate the server resamples from
            (24000: OpenAI's default). The inputs are resampled to it before the run (scipy's ``resample_poly``); each
            item's reference is then NeMo's streaming of the item's audio resampled back to 16 kHz the same way.
        realtime: pace each client's audio in real time (``False``: as fast as the server reads).
        binary: raw binary PCM frames instead of base64 ``input_audio_buffer.append``.
        stagger_seconds: client starts drawn uniformly in ``[0, stagger_seconds)``.
        commit_every_seconds: each client commits after every this many seconds of its audio, so each input is
            several items, turn by turn, as a voice agent's user speaks (``None``: one item, committed at the end).
        processes: client processes (one asyncio loop each) when one cannot keep up.
        timeout_seconds: most time one client may take; the run is bounded by it plus the stagger.
        check: compare each final with NeMo's cache-aware streaming of that input alone (needs ``model``).
        model: the model the server runs (the shipped ``trained-streaming``, the default; a synthetic preset with
            ``seed``, a ``.nemo`` or a pretrained name).
        seed: synthetic model weights and audio, client start times.
        att_context_size: the server's look-ahead (``None``: the model's default).
        cuda: where the reference runs (NeMo's convention; ``None``: GPU 0 if any).
        output_dir: ``loadtest{_tag}.json`` / ``.md`` (and ``.png``/``.svg`` for a sweep).
        tag: added to the output names.
        latency_target_ms: the plot's reference line.
    """

    url: str = "ws://127.0.0.1:8000/v1/realtime"
    api_key: str | None = None
    clients: int = 6
    clients_sweep: list[int] | None = None
    audio_files: list[str] | None = None
    dataset_manifest: str | None = None
    synthetic_seconds: list[float] = field(default_factory=lambda: [3.0, 5.0, 2.0, 4.0])
    max_audio_seconds: float | None = 30.0
    chunk_ms: float = 80.0
    input_rate: int = 16000
    realtime: bool = True
    binary: bool = False
    stagger_seconds: float = 1.0
    commit_every_seconds: float | None = None
    processes: int = 1
    timeout_seconds: float = 120.0
    check: bool = True
    model: str = "trained-streaming"
    seed: int = 0
    att_context_size: list[int] | None = None
    cuda: int | None = None
    output_dir: str = "outputs/loadtest"
    tag: str | None = None
    latency_target_ms: float = 300.0

    def __post_init__(self) -> None:
        from urllib.parse import urlsplit

        host = urlsplit(self.url).hostname or ""
        if urlsplit(self.url).scheme not in ("ws", "wss") or host not in [h.strip("[]") for h in LOOPBACK_HOSTS]:
            raise ValueError(
                f"url={self.url!r}: the load test targets this machine's loopback interface only "
                f"(ws://127.0.0.1:PORT/v1/realtime)"
            )
        counts = self.clients_sweep or [self.clients]
        if any(int(n) < 1 for n in counts) or self.processes < 1:
            raise ValueError(f"clients, clients_sweep and processes must be >= 1, got {counts} and {self.processes}")
        if self.audio_files is not None and self.dataset_manifest is not None:
            raise ValueError("give audio_files or dataset_manifest, not both")
        if not 8000 <= self.input_rate <= 48000:
            raise ValueError(f"input_rate={self.input_rate} Hz; valid: 8000 to 48000 (the model's 16000 by default)")
        if not self.chunk_ms > 0 or not self.timeout_seconds > 0 or self.stagger_seconds < 0:
            raise ValueError(
                f"chunk_ms and timeout_seconds must be > 0 and stagger_seconds >= 0, got {self.chunk_ms}, "
                f"{self.timeout_seconds}, {self.stagger_seconds}"
            )
