"""Simulated real-time arrival of many concurrent streams: the logic behind ``scripts/streaming.py``.

Mirrors NeMo's ``examples/asr/asr_cache_aware_streaming/speech_to_text_cache_aware_streaming_infer.py``
(features of each file computed whole, cut into NeMo's chunks) but serves ``num_streams`` concurrent
streams that start at staggered times. A chunk *arrives* when its last audio sample would have been
recorded (its last 10 ms feature frame, counted from the stream's start). A virtual clock plays a server
that, whenever it is free, steps every stream whose next chunk has arrived, and advances by the measured
wall time of that step (encoder + decoding; synchronised on a GPU). Reported per path: per-chunk latency
(completion - arrival) percentiles, step times, batch sizes, throughput (audio seconds per compute
second) and the busy share of the simulated time (< 1: the streams are served in real time).

The same schedule runs through ours (:class:`~nemo_fastdecode.streaming.transcriber.StreamingTranscriber`)
and, for comparison, NeMo's path (:class:`~nemo_fastdecode.streaming.nemo_path.NemoSlotStreamer`); the
transcripts are compared stream by stream.
"""

from __future__ import annotations

import contextlib
import json
import platform
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from nemo_fastdecode import synthetic
from nemo_fastdecode import transcribe as offline
from nemo_fastdecode.comparison import as_int_list
from nemo_fastdecode.config import StreamingConfig
from nemo_fastdecode.streaming.geometry import StreamingGeometry, split_features
from nemo_fastdecode.streaming.nemo_path import NemoSlotStreamer
from nemo_fastdecode.streaming.transcriber import StreamingTranscriber, set_att_context_size

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

__all__ = [
    "PathStats",
    "StreamPlan",
    "StreamingRunResult",
    "format_markdown",
    "plan_streams",
    "resolve_config",
    "run",
    "simulate",
]

FRAME_SECONDS = 0.01  # NeMo's mel-feature hop


# ----------------------------------------------------------------------------------------------
# configuration


def resolve_config(cfg: StreamingConfig | DictConfig | dict[str, Any] | None = None) -> DictConfig:
    """Validate ``cfg`` against :class:`~nemo_fastdecode.config.StreamingConfig` and fill in its defaults."""
    schema = OmegaConf.structured(StreamingConfig)
    if cfg is None:
        return schema
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.structured(cfg) if not isinstance(cfg, dict) else OmegaConf.create(cfg)
    merged = OmegaConf.merge(schema, cfg)
    StreamingConfig(**OmegaConf.to_container(merged))  # value checks (__post_init__)
    if merged.num_streams < 1:
        raise ValueError(f"num_streams must be >= 1, got {merged.num_streams}")
    if merged.num_slots is not None and merged.num_slots < 1:
        raise ValueError(f"num_slots must be >= 1 or null, got {merged.num_slots}")
    if merged.stagger_seconds < 0:
        raise ValueError(f"stagger_seconds must be >= 0, got {merged.stagger_seconds}")
    if merged.audio_dir is not None and merged.dataset_manifest is not None:
        raise ValueError(
            f"give audio_dir ({merged.audio_dir!r}) or dataset_manifest ({merged.dataset_manifest!r}), not both"
        )
    return merged


# ----------------------------------------------------------------------------------------------
# the schedule


@dataclass
class StreamPlan:
    """One simulated stream: its input, start time, chunks and each chunk's arrival time (seconds)."""

    name: str
    start: float
    chunks: list[torch.Tensor]
    arrivals: list[float]

    @property
    def audio_seconds(self) -> float:
        return sum(c.shape[1] for c in self.chunks) * FRAME_SECONDS


def plan_streams(
    features: Sequence[torch.Tensor],
    names: Sequence[str],
    geometry: StreamingGeometry,
    num_streams: int,
    stagger_seconds: float,
    seed: int = 0,
    max_stream_seconds: float | None = None,
) -> list[StreamPlan]:
    """Stream ``i`` plays ``features[i % len(features)]`` (``[feat_in, T]``), starting at a uniform random time."""
    rng = random.Random(seed)
    plans = []
    for i in range(num_streams):
        feats = features[i % len(features)]
        if max_stream_seconds is not None:
            feats = feats[:, : max(1, round(max_stream_seconds / FRAME_SECONDS))]
        start = rng.uniform(0.0, stagger_seconds) if stagger_seconds > 0 else 0.0
        chunks = split_features(feats, geometry)
        ends = np.cumsum([c.shape[1] for c in chunks])
        plans.append(StreamPlan(names[i % len(names)], start, chunks, [start + e * FRAME_SECONDS for e in ends]))
    return plans


# ----------------------------------------------------------------------------------------------
# one path through the schedule


@dataclass
class PathStats:
    """Measurements of one path over the whole schedule (times in milliseconds unless named seconds)."""

    name: str
    steps: int
    chunks: int
    audio_seconds: float
    compute_seconds: float
    simulated_seconds: float
    latency_p50_ms: float
    latency_p95_ms: float
    latency_p99_ms: float
    latency_max_ms: float
    step_mean_ms: float
    step_p50_ms: float
    step_p95_ms: float
    batch_mean: float
    batch_max: int
    throughput: float  # audio seconds per compute second (RTFx)
    busy_share: float  # compute / simulated time: below 1 the server keeps up with real time
    step_ms_by_batch: dict[str, float] = field(default_factory=dict)  # median step time per batch-size range


class _Path:
    """What :func:`simulate` needs from a streaming implementation."""

    def __init__(
        self,
        name: str,
        open_: Callable[[], int],
        step: Callable[[list[int], list[torch.Tensor]], Any],
        finish: Callable[[int], list[int]],
    ):
        self.name, self.open, self.step, self.finish = name, open_, step, finish


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def _by_batch(batches: Sequence[int], times: Sequence[float]) -> dict[str, float]:
    """Median step time (ms) per batch-size range 1, 2-3, 4-7, 8-15, ..."""
    groups: dict[int, list[float]] = {}
    for n, t in zip(batches, times, strict=True):
        groups.setdefault(n.bit_length() - 1, []).append(t)
    return {
        (f"{1 << k}" if k == 0 else f"{1 << k}-{(2 << k) - 1}"): round(1000 * float(np.median(v)), 3)
        for k, v in sorted(groups.items())
    }


def simulate(
    path: _Path, plans: Sequence[StreamPlan], num_slots: int, device: torch.device
) -> tuple[PathStats, list[list[int]]]:
    """Serve the schedule on a virtual clock (see the module docstring); returns stats and each stream's tokens."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    position = [0] * len(plans)
    slot: dict[int, int] = {}
    tokens: list[list[int]] = [[] for _ in plans]
    remaining = set(range(len(plans)))
    latencies, step_times, batches = [], [], []
    now = 0.0
    while remaining:
        ready = [i for i in sorted(remaining) if plans[i].arrivals[position[i]] <= now]
        free = num_slots - len(slot)
        waiting = [i for i in ready if i not in slot]
        ready = [i for i in ready if i in slot] + waiting[:free]  # a stream without a slot waits for one
        if not ready:
            now = max(now, min(plans[i].arrivals[position[i]] for i in remaining if i in slot or free > 0))
            continue
        for i in ready:
            if i not in slot:
                slot[i] = path.open()
        sync()
        started = time.perf_counter()
        path.step([slot[i] for i in ready], [plans[i].chunks[position[i]] for i in ready])
        sync()
        elapsed = time.perf_counter() - started
        now += elapsed
        step_times.append(elapsed)
        batches.append(len(ready))
        for i in ready:
            latencies.append(now - plans[i].arrivals[position[i]])
            position[i] += 1
            if position[i] == len(plans[i].chunks):
                tokens[i] = path.finish(slot.pop(i))
                remaining.discard(i)

    audio = sum(p.audio_seconds for p in plans)
    compute = sum(step_times)
    span = max(now - min((p.start for p in plans), default=0.0), 1e-9)
    stats = PathStats(
        name=path.name,
        steps=len(step_times),
        chunks=len(latencies),
        audio_seconds=round(audio, 3),
        compute_seconds=round(compute, 4),
        simulated_seconds=round(span, 4),
        latency_p50_ms=round(1000 * _percentile(latencies, 50), 3),
        latency_p95_ms=round(1000 * _percentile(latencies, 95), 3),
        latency_p99_ms=round(1000 * _percentile(latencies, 99), 3),
        latency_max_ms=round(1000 * max(latencies, default=0.0), 3),
        step_mean_ms=round(1000 * compute / max(len(step_times), 1), 3),
        step_p50_ms=round(1000 * _percentile(step_times, 50), 3),
        step_p95_ms=round(1000 * _percentile(step_times, 95), 3),
        batch_mean=round(float(np.mean(batches)) if batches else 0.0, 2),
        batch_max=max(batches, default=0),
        throughput=round(audio / compute, 2) if compute > 0 else 0.0,
        busy_share=round(compute / span, 4),
        step_ms_by_batch=_by_batch(batches, step_times),
    )
    return stats, tokens


def fast_path(model: ASRModel, num_slots: int, dtype: torch.dtype, use_cuda_graphs: bool) -> _Path:
    """Ours: slot caches read in place, one graph replay per step (GPU), per-slot ``fast_greedy`` state."""
    streamer = StreamingTranscriber(model, num_slots, dtype=dtype, use_cuda_graphs=use_cuda_graphs)
    streamer.warm_up()  # capture every bucket's graph before the clock starts

    def finish(slot: int) -> list[int]:
        hyp = streamer.flush(slot).hypothesis
        return as_int_list(hyp.y_sequence) if hyp is not None else []

    mode = "CUDA graph per bucket" if streamer.runner.use_graphs else "eager"
    return _Path(f"nemo_fastdecode ({mode})", streamer.open, streamer.step, finish)


def nemo_path(model: ASRModel, num_slots: int, dtype: torch.dtype) -> _Path:
    """NeMo: gather the slots' caches, ``conformer_stream_step`` (model's decoding strategy), scatter back."""
    streamer = NemoSlotStreamer(model, num_slots)
    device = streamer.device
    autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype != torch.float32 else contextlib.nullcontext

    def step(slots: list[int], chunks: list[torch.Tensor]) -> None:
        with autocast():
            streamer.step(slots, chunks)

    def finish(slot: int) -> list[int]:
        hyp = streamer.flush(slot)
        return as_int_list(hyp.y_sequence) if hyp is not None else []

    strategy = model.cfg.decoding.get("strategy", "?")
    return _Path(f"NeMo gather/scatter + conformer_stream_step ({strategy})", streamer.open, step, finish)


# ----------------------------------------------------------------------------------------------
# the script


@dataclass
class StreamingRunResult:
    """What :func:`run` measured and wrote."""

    config: dict[str, Any]
    environment: dict[str, Any]
    geometry: dict[str, Any]
    paths: list[PathStats]
    transcripts: list[dict[str, Any]]
    identical_streams: float | None  # share of streams whose tokens equal NeMo's path (None: not compared)
    files: dict[str, str] = field(default_factory=dict)


def _features(model: ASRModel, audios: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """Each utterance's whole mel features ``[feat_in, T]`` (as NeMo's streaming buffer computes them)."""
    out = []
    with torch.inference_mode():
        for audio in audios:
            signal = torch.as_tensor(audio, dtype=torch.float32, device=device)[None]
            feats, length = model.preprocessor(
                input_signal=signal, length=torch.tensor([signal.shape[1]], device=device)
            )
            out.append(feats[0, :, : int(length)].clone())
    return out


def run(
    cfg: StreamingConfig | DictConfig | dict[str, Any] | None = None, *, log: Callable[[str], None] = print
) -> StreamingRunResult:
    """Run ``scripts/streaming.py`` (see :class:`~nemo_fastdecode.config.StreamingConfig`)."""
    cfg = resolve_config(cfg)
    device = offline.inference_device(cfg.cuda)
    dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
    num_slots = cfg.num_slots or cfg.num_streams
    demo = cfg.audio_dir is None and cfg.dataset_manifest is None

    model = offline.load_model(cfg.model, device=device, seed=cfg.seed)
    if offline.is_synthetic(cfg.model):
        log(offline.synthetic_banner(cfg.model, getattr(model, "_fastdecode_tokens_per_frame", None)))
    if cfg.att_context_size is not None:
        set_att_context_size(model.encoder, list(cfg.att_context_size))
    geometry = StreamingGeometry.from_encoder(model.encoder)
    sample_rate = int(model.cfg.get("sample_rate", synthetic.SAMPLE_RATE))
    if demo:
        names = [f"demo_{i}" for i in range(len(offline.DEMO_DURATIONS))]
        audios = offline.demo_audio(cfg.seed)
        log(f"No audio_dir or dataset_manifest: {len(audios)} synthetic utterances ({offline.DEMO_DURATIONS} s).")
    else:
        utterances = offline.read_inputs(cfg.audio_dir, cfg.dataset_manifest)
        names = [str(u.entry["audio_filepath"]) for u in utterances]
        audios = offline.load_audio([u.audio_path for u in utterances], sample_rate)
    plans = plan_streams(
        _features(model, audios, device),
        names,
        geometry,
        cfg.num_streams,
        cfg.stagger_seconds,
        cfg.seed,
        cfg.max_stream_seconds,
    )
    log(
        f"Model {cfg.model!r} on {device}, att_context_size {list(geometry.att_context_size)} "
        f"({geometry.chunk_seconds * 1000:.0f} ms chunks), {cfg.num_streams} streams in {num_slots} slots, "
        f"starts staggered over {cfg.stagger_seconds} s, {cfg.dtype}."
    )

    paths = [fast_path(model, num_slots, dtype, cfg.use_cuda_graphs)]
    if cfg.compare_nemo:
        paths.append(nemo_path(model, num_slots, dtype))
    stats, tokens = [], []
    for path in paths:
        result, path_tokens = simulate(path, plans, num_slots, device)
        stats.append(result)
        tokens.append(path_tokens)

    to_text = model.decoding.decode_ids_to_str
    transcripts = []
    for i, plan in enumerate(plans):
        record = {"stream": i, "audio": plan.name, "start": round(plan.start, 4), "pred_text": to_text(tokens[0][i])}
        if cfg.compare_nemo:
            record["nemo_pred_text"] = to_text(tokens[1][i])
            record["identical"] = tokens[0][i] == tokens[1][i]
        transcripts.append(record)
    identical = None
    if cfg.compare_nemo:
        identical = sum(r["identical"] for r in transcripts) / len(transcripts)

    result = StreamingRunResult(
        config=OmegaConf.to_container(cfg),
        environment=_environment(device),
        geometry=asdict(geometry),
        paths=stats,
        transcripts=transcripts,
        identical_streams=identical,
    )
    _write(result, Path(cfg.output_dir), cfg.tag)
    for record in transcripts[: 4 if not demo else len(transcripts)]:
        log(f"stream {record['stream']} ({Path(record['audio']).name}): {record['pred_text']!r}")
    log(format_markdown(result))
    log("Wrote " + ", ".join(result.files.values()))
    return result


def _environment(device: torch.device) -> dict[str, Any]:
    env = {"device": str(device), "torch": torch.__version__, "python": platform.python_version()}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    else:
        env["cpu_threads"] = torch.get_num_threads()
    return env


def format_markdown(result: StreamingRunResult) -> str:
    """The results as a Markdown report: setup, one table row per path, ratios, agreement."""
    c, g = result.config, result.geometry
    lines = [
        f"# Cache-aware streaming: {c['model']}, {c['num_streams']} streams",
        "",
        f"- device: {result.environment.get('gpu', result.environment['device'])}, torch {result.environment['torch']}",
        f"- att_context_size {list(g['att_context_size'])}: {g['chunk'] * 10} ms chunks, {g['out_frames']} encoder "
        f"frame(s) per chunk, {g['att_cache']} frames of left context",
        f"- {c['num_streams']} streams, {c['num_slots'] or c['num_streams']} slots, starts uniform in "
        f"[0, {c['stagger_seconds']}) s, dtype {c['dtype']}",
        "",
        "| path | steps | mean batch | step p50 / p95 (ms) | chunk latency p50 / p95 / p99 (ms) | RTFx | busy |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in result.paths:
        lines.append(
            f"| {p.name} | {p.steps} | {p.batch_mean} | {p.step_p50_ms} / {p.step_p95_ms} | "
            f"{p.latency_p50_ms} / {p.latency_p95_ms} / {p.latency_p99_ms} | {p.throughput} | {p.busy_share:.2f} |"
        )
    if len(result.paths) > 1:
        ours, nemo = result.paths[0], result.paths[1]
        ratio = nemo.compute_seconds / ours.compute_seconds if ours.compute_seconds else float("nan")
        lines += ["", f"Compute time: NeMo / ours = {ratio:.2f}x over the same chunks."]
        lines.append(f"Streams with identical tokens (ours vs NeMo's path): {100 * result.identical_streams:.1f}%")
    lines += ["", "Median step time by batch size (ms):", ""]
    lines += [f"- {p.name}: {p.step_ms_by_batch}" for p in result.paths]
    lines += [
        "",
        "Busy = compute time / simulated time; below 1 the server keeps up with real-time arrival.",
    ]
    return "\n".join(lines)


def _write(result: StreamingRunResult, out_dir: Path, tag: str | None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = f"_{tag}" if tag else ""
    json_path = out_dir / f"streaming_results{suffix}.json"
    md_path = out_dir / f"streaming_results{suffix}.md"
    jsonl_path = out_dir / f"streaming_transcripts{suffix}.jsonl"
    result.files = {"json": str(json_path), "markdown": str(md_path), "transcripts": str(jsonl_path)}
    payload = asdict(result)
    payload.pop("transcripts")
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    md_path.write_text(format_markdown(result) + "\n")
    with open(jsonl_path, "w", encoding="utf8") as f:
        for record in result.transcripts:
            f.write(json.dumps(record) + "\n")
