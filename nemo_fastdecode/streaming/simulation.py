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
    warmup_seconds: float = 0.0  # before the clock started (graph captures, lazy library set-up)


class _Path:
    """What :func:`simulate` needs from a streaming implementation (and how long its warm-up took)."""

    def __init__(
        self,
        name: str,
        open_: Callable[[], int],
        step: Callable[[list[int], list[torch.Tensor]], Any],
        finish: Callable[[int], list[int]],
        warmup_seconds: float = 0.0,
    ):
        self.name, self.open, self.step, self.finish = name, open_, step, finish
        self.warmup_seconds = warmup_seconds


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
        _synchronize(device)

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
        warmup_seconds=round(path.warmup_seconds, 3),
    )
    return stats, tokens


@contextlib.contextmanager
def _matmul_tf32(enabled: bool):
    """``torch.backends.cuda.matmul.allow_tf32 = enabled`` inside, the previous value restored after."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled or previous
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class FixedStepTiming:
    """What :func:`time_fixed_steps` measured: the median step (ms) and the tokens its streams decoded."""

    ms: float
    tokens: int  # over the streams' first chunk and the timed steps: equal work is visible across paths


def time_fixed_steps(
    path: _Path,
    plans: Sequence[StreamPlan],
    num_streams: int,
    repeats: int,
    device: torch.device,
    around_steps: contextlib.AbstractContextManager | None = None,
) -> FixedStepTiming:
    """Median time (ms) of a step in which ``num_streams`` streams step together, past their first chunk.

    The first ``num_streams`` plans open, step their first chunk, then ``repeats`` later chunks all together
    (stagger 0 at a fixed batch: the issue's "256 active streams out of 1024 slots" step), then close; the
    tokens their final hypotheses hold are counted. ``around_steps`` (e.g. a profiler) is entered around the
    ``repeats`` steps only.
    """
    streams = list(plans[:num_streams])
    slots = [path.open() for _ in streams]
    path.step(slots, [p.chunks[0] for p in streams])
    times = []
    with around_steps if around_steps is not None else contextlib.nullcontext():
        for r in range(repeats):
            chunks = fixed_step_chunks(streams, r)
            _synchronize(device)
            started = time.perf_counter()
            path.step(slots, chunks)
            _synchronize(device)
            times.append(time.perf_counter() - started)
    tokens = sum(len(path.finish(slot)) for slot in slots)
    return FixedStepTiming(round(1000 * float(np.median(times)), 3) if times else 0.0, tokens)


def fixed_step_chunks(plans: Sequence[StreamPlan], repeat: int) -> list[torch.Tensor]:
    """The chunks of :func:`time_fixed_steps`' ``repeat``-th timed step: a later chunk of each stream, cycling (a
    one-chunk stream repeats its first: never longer than a later one)."""
    return [p.chunks[1 + repeat % (len(p.chunks) - 1)] if len(p.chunks) > 1 else p.chunks[0] for p in plans]


def fast_path(
    model: ASRModel,
    num_slots: int,
    dtype: torch.dtype,
    use_cuda_graphs: bool,
    fast_math: bool = False,
    encoder_matmul: str = "fp32",
    capture_decoder_step: bool = True,
) -> _Path:
    """Ours: slot caches read in place, one graph replay per step (GPU), per-slot state of ``fast_greedy``.

    Warmed up before the clock starts: every encoder bucket's graph and the decoder's graph per bucket are
    captured (:meth:`StreamingTranscriber.warm_up`), so no step of the timed run captures.
    """
    streamer = StreamingTranscriber(
        model, num_slots, dtype=dtype, use_cuda_graphs=use_cuda_graphs, fast_math=fast_math,
        encoder_matmul=encoder_matmul, capture_decoder_step=capture_decoder_step,
    )  # fmt: skip
    warmup = streamer.warm_up().total_seconds

    def finish(slot: int) -> list[int]:
        tokens = streamer.token_ids(slot)  # no Hypothesis needed
        streamer.close(slot)
        return tokens

    mode = "CUDA graph per bucket" if streamer.runner.use_graphs else "eager"
    mode += (", fast_math" if fast_math else "") + (f", {encoder_matmul} encoder" if encoder_matmul != "fp32" else "")
    # what warm-up captured, not what was asked: no captures on the CPU, and a refused one falls back to eager
    captured = streamer.decoder is not None and streamer.decoder.captured_batch_sizes
    mode += ", decoder step captured" if captured else ""
    return _Path(f"nemo_fastdecode ({mode})", streamer.open, streamer.step, finish, warmup)


def nemo_path(
    model: ASRModel, num_slots: int, dtype: torch.dtype, warm_streams: int = 1, tf32_matmuls: bool = False
) -> _Path:
    """NeMo: gather the slots' caches, ``conformer_stream_step`` (model's decoding strategy), scatter back.

    Warmed up before the clock starts with ``warm_streams`` streams of silence (a first and a later chunk
    together: lazy library set-up, and NeMo's decoder graphs, if its strategy uses them, at the largest batch).
    ``tf32_matmuls``: NeMo's steps run with TF32 matmuls (``torch.backends.cuda.matmul.allow_tf32``, what
    NeMo's scripts set with ``matmul_precision=high``), the setting compared with ``encoder_matmul=tf32``.
    """
    streamer = NemoSlotStreamer(model, num_slots)
    device = streamer.device
    autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype != torch.float32 else contextlib.nullcontext

    def step(slots: list[int], chunks: list[torch.Tensor]) -> None:
        with autocast(), _matmul_tf32(tf32_matmuls):
            streamer.step(slots, chunks)

    def finish(slot: int) -> list[int]:
        hyp = streamer.flush(slot)
        return as_int_list(hyp.y_sequence) if hyp is not None else []

    g = streamer.geometry
    _synchronize(device)
    started = time.perf_counter()
    slots = [streamer.open() for _ in range(min(warm_streams, num_slots))]
    for frames in (g.first_chunk, g.chunk):
        step(slots, [torch.zeros(g.feat_in, frames, device=device)] * len(slots))
    for slot in slots:
        streamer.flush(slot)
    _synchronize(device)
    warmup = time.perf_counter() - started
    strategy = model.cfg.decoding.get("strategy", "?")
    name = f"NeMo gather/scatter + conformer_stream_step ({strategy}{', TF32 matmuls' if tf32_matmuls else ''})"
    return _Path(name, streamer.open, step, finish, warmup)


# ----------------------------------------------------------------------------------------------
# the script


@dataclass
class FixedStep:
    """Step time with ``streams`` streams stepping together (stagger 0) in ``slots`` slots, per path (ms), and the
    tokens each path decoded for those streams (their first chunk and the timed steps)."""

    streams: int
    slots: int
    repeats: int
    step_ms: dict[str, float]
    tokens: dict[str, int] = field(default_factory=dict)

    @property
    def ours_over_nemo(self) -> float | None:
        """Our step time / NeMo's (the issue's target: at most 0.1 at 256 of 1024 slots)."""
        ours, nemo = (list(self.step_ms.values()) + [None, None])[:2]
        return round(ours / nemo, 4) if ours is not None and nemo else None


@dataclass
class StreamingRunResult:
    """What :func:`run` measured and wrote."""

    config: dict[str, Any]
    environment: dict[str, Any]
    geometry: dict[str, Any]
    paths: list[PathStats]
    transcripts: list[dict[str, Any]]
    identical_streams: float | None  # share of streams whose tokens equal NeMo's path (None: not compared)
    fixed_step: FixedStep | None = None
    files: dict[str, str] = field(default_factory=dict)


@dataclass
class SweepPoint:
    """One stream count of a sweep: each path's stats and its fixed-batch step time, token agreement."""

    num_streams: int
    paths: list[PathStats]
    fixed_step: FixedStep | None
    identical_streams: float | None


@dataclass
class SweepResult:
    """What :func:`run_sweep` measured and wrote; ``max_realtime_streams`` per path name."""

    config: dict[str, Any]
    environment: dict[str, Any]
    geometry: dict[str, Any]
    num_slots: int
    points: list[SweepPoint]
    max_realtime_streams: dict[str, int | None]
    files: dict[str, str] = field(default_factory=dict)


@dataclass
class _Setup:
    """The model and the input features shared by every run of one invocation."""

    model: Any
    device: torch.device
    dtype: torch.dtype
    geometry: StreamingGeometry
    features: list[torch.Tensor]
    names: list[str]
    demo: bool


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


def _setup(cfg: DictConfig, log: Callable[[str], None]) -> _Setup:
    device = offline.inference_device(cfg.cuda)
    dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
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
    return _Setup(model, device, dtype, geometry, _features(model, audios, device), names, demo)


def compose_streams(
    config_dir: str | Path, defaults: dict[str, Any], argv: Sequence[str]
) -> tuple[DictConfig, DictConfig, _Setup, list[StreamPlan]]:
    """The start of the diagnostic scripts that time parts of a streaming step.

    ``argv``: ``key=value`` arguments; keys of ``defaults`` are the script's own options (``config``: the config
    name, ``streams``: how many streams, ...), the rest override that streaming config (later ones win).
    Returns ``(options, config, model set-up, the first options.streams stream plans)``, built as
    ``scripts/streaming.py --config-name <config> <overrides>`` builds them.
    """
    from hydra import compose, initialize_config_dir

    own = [arg for arg in argv if arg.split("=", 1)[0] in defaults]
    overrides = [arg for arg in argv if arg.split("=", 1)[0] not in defaults]
    options = OmegaConf.merge(OmegaConf.create(defaults), OmegaConf.from_dotlist(own))
    with initialize_config_dir(str(Path(config_dir).resolve()), version_base=None):
        cfg = resolve_config(compose(options.config, overrides=overrides))
    setup = _setup(cfg, print)
    return options, cfg, setup, _plans(cfg, setup, options.streams)


def _plans(cfg: DictConfig, setup: _Setup, num_streams: int) -> list[StreamPlan]:
    return plan_streams(
        setup.features,
        setup.names,
        setup.geometry,
        num_streams,
        cfg.stagger_seconds,
        cfg.seed,
        cfg.max_stream_seconds,
    )


def _make_paths(cfg: DictConfig, setup: _Setup, num_slots: int, max_batch: int) -> list[_Path]:
    """Ours, then (``compare_nemo``) NeMo's, both warmed up for batches up to ``max_batch`` streams."""
    paths = [
        fast_path(
            setup.model, num_slots, setup.dtype, cfg.use_cuda_graphs, cfg.fast_math, cfg.encoder_matmul,
            cfg.capture_decoder_step,
        )
    ]  # fmt: skip
    if cfg.compare_nemo:
        tf32 = cfg.encoder_matmul == "tf32"  # like for like: NeMo at matmul_precision=high
        paths.append(nemo_path(setup.model, num_slots, setup.dtype, warm_streams=max_batch, tf32_matmuls=tf32))
    return paths


def _measure(
    cfg: DictConfig, setup: _Setup, paths: list[_Path], plans: list[StreamPlan], num_slots: int
) -> tuple[list[PathStats], list[list[list[int]]], FixedStep | None]:
    """Every path through the schedule, then (``fixed_step_repeats > 0``) the fixed-batch step."""
    stats, tokens = _simulate_paths(setup, paths, plans, num_slots)
    return stats, tokens, _fixed_step(cfg, setup, paths, plans, num_slots)


def _simulate_paths(
    setup: _Setup, paths: list[_Path], plans: list[StreamPlan], num_slots: int
) -> tuple[list[PathStats], list[list[list[int]]]]:
    """Every path through the simulated real-time schedule: stats and each stream's tokens, per path."""
    stats, tokens = [], []
    for path in paths:
        result, path_tokens = simulate(path, plans, num_slots, setup.device)
        stats.append(result)
        tokens.append(path_tokens)
    return stats, tokens


def _fixed_step(
    cfg: DictConfig, setup: _Setup, paths: list[_Path], plans: list[StreamPlan], num_slots: int
) -> FixedStep | None:
    """The fixed-batch step time per path (``None`` with ``fixed_step_repeats == 0``)."""
    if cfg.fixed_step_repeats <= 0:
        return None
    n = min(len(plans), num_slots)
    timings = {p.name: time_fixed_steps(p, plans, n, cfg.fixed_step_repeats, setup.device) for p in paths}
    return FixedStep(
        streams=n,
        slots=num_slots,
        repeats=cfg.fixed_step_repeats,
        step_ms={name: t.ms for name, t in timings.items()},
        tokens={name: t.tokens for name, t in timings.items()},
    )


def _agreement(tokens: list[list[list[int]]]) -> float | None:
    if len(tokens) < 2 or not tokens[0]:
        return None
    return sum(a == b for a, b in zip(tokens[0], tokens[1], strict=True)) / len(tokens[0])


def _describe(cfg: DictConfig, setup: _Setup, num_slots: int, streams: str) -> str:
    g = setup.geometry
    return (
        f"Model {cfg.model!r} on {setup.device}, att_context_size {list(g.att_context_size)} "
        f"({g.chunk_seconds * 1000:.0f} ms chunks), {streams} streams in {num_slots} slots, "
        f"starts staggered over {cfg.stagger_seconds} s, {cfg.dtype}."
    )


def run(
    cfg: StreamingConfig | DictConfig | dict[str, Any] | None = None, *, log: Callable[[str], None] = print
) -> StreamingRunResult | SweepResult:
    """Run ``scripts/streaming.py`` (see :class:`~nemo_fastdecode.config.StreamingConfig`).

    With ``num_streams_sweep`` set, runs :func:`run_sweep` instead and returns its :class:`SweepResult`.
    """
    cfg = resolve_config(cfg)
    setup = _setup(cfg, log)
    if cfg.num_streams_sweep:
        return run_sweep(cfg, setup, log)
    num_slots = cfg.num_slots or cfg.num_streams
    plans = _plans(cfg, setup, cfg.num_streams)
    log(_describe(cfg, setup, num_slots, str(cfg.num_streams)))
    paths = _make_paths(cfg, setup, num_slots, min(cfg.num_streams, num_slots))
    stats, tokens = _simulate_paths(setup, paths, plans, num_slots)

    to_text = setup.model.decoding.decode_ids_to_str
    transcripts = []
    for i, plan in enumerate(plans):
        record = {"stream": i, "audio": plan.name, "start": round(plan.start, 4), "pred_text": to_text(tokens[0][i])}
        if cfg.compare_nemo:
            record["nemo_pred_text"] = to_text(tokens[1][i])
            record["identical"] = tokens[0][i] == tokens[1][i]
        transcripts.append(record)

    result = StreamingRunResult(
        config=OmegaConf.to_container(cfg),
        environment=_environment(setup.device),
        geometry=asdict(setup.geometry),
        paths=stats,
        transcripts=transcripts,
        identical_streams=_agreement(tokens),
    )
    # the simulated run's results are on disk before the fixed-batch step runs: a failure there keeps them
    _write(result, Path(cfg.output_dir), cfg.tag)
    if cfg.fixed_step_repeats > 0:
        log(f"Simulated run written ({', '.join(result.files.values())}); now the fixed-batch step.")
        result.fixed_step = _fixed_step(cfg, setup, paths, plans, num_slots)
        _write(result, Path(cfg.output_dir), cfg.tag)
    for record in transcripts[: 4 if not setup.demo else len(transcripts)]:
        log(f"stream {record['stream']} ({Path(record['audio']).name}): {record['pred_text']!r}")
    log(format_markdown(result))
    log("Wrote " + ", ".join(result.files.values()))
    return result


def run_sweep(cfg: DictConfig, setup: _Setup, log: Callable[[str], None] = print) -> SweepResult:
    """Ours and NeMo's path at every stream count of ``cfg.num_streams_sweep``: latency vs streams.

    One streamer per path serves every count (slots: ``num_slots`` or the largest count; warmed up once for
    the largest batch). Writes ``streaming_sweep{_tag}.json`` / ``.md`` and the plot ``.png`` (matplotlib) or,
    without matplotlib, ``.svg``.
    """
    counts = sorted(set(int(n) for n in cfg.num_streams_sweep))
    num_slots = max(cfg.num_slots or 0, counts[-1])
    log(_describe(cfg, setup, num_slots, "/".join(map(str, counts))))
    paths = _make_paths(cfg, setup, num_slots, counts[-1])
    points = []
    for n in counts:
        stats, tokens, fixed = _measure(cfg, setup, paths, _plans(cfg, setup, n), num_slots)
        points.append(SweepPoint(n, stats, fixed, _agreement(tokens)))
        summary = "; ".join(f"{p.name}: p95 {p.latency_p95_ms} ms, busy {p.busy_share:.2f}" for p in stats)
        log(f"{n} streams: {summary}")
    target = cfg.latency_target_ms
    best: dict[str, int | None] = {}
    for i, path in enumerate(paths):
        ok = [pt.num_streams for pt in points if _realtime(pt.paths[i], target)]
        best[path.name] = max(ok) if ok else None
    result = SweepResult(
        config=OmegaConf.to_container(cfg),
        environment=_environment(setup.device),
        geometry=asdict(setup.geometry),
        num_slots=num_slots,
        points=points,
        max_realtime_streams=best,
    )
    _write_sweep(result, Path(cfg.output_dir), cfg.tag)
    log(format_sweep_markdown(result))
    log("Wrote " + ", ".join(result.files.values()))
    return result


def _realtime(stats: PathStats, target_ms: float) -> bool:
    """Served in real time: the server keeps up (busy < 1) with p95 chunk latency within the target."""
    return stats.busy_share < 1.0 and stats.latency_p95_ms <= target_ms


def _environment(device: torch.device) -> dict[str, Any]:
    env = {"device": str(device), "torch": torch.__version__, "python": platform.python_version()}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    else:
        env["cpu_threads"] = torch.get_num_threads()
    return env


def _setup_lines(
    config: dict[str, Any], environment: dict[str, Any], g: dict[str, Any], streams: str, slots: int
) -> list[str]:
    return [
        f"- device: {environment.get('gpu', environment['device'])}, torch {environment['torch']}",
        f"- att_context_size {list(g['att_context_size'])}: {g['chunk'] * 10} ms chunks, {g['out_frames']} encoder "
        f"frame(s) per chunk, {g['att_cache']} frames of left context",
        f"- {streams} streams, {slots} slots, starts uniform in "
        f"[0, {config['stagger_seconds']}) s, streams cut to {config['max_stream_seconds']} s, dtype {config['dtype']}",
    ]


def _fixed_step_line(fixed: FixedStep | None) -> list[str]:
    if fixed is None:
        return []
    times = ", ".join(f"{name}: {ms} ms" for name, ms in fixed.step_ms.items())
    line = f"Step with all {fixed.streams} streams together ({fixed.slots} slots, median of {fixed.repeats}): {times}"
    if fixed.ours_over_nemo is not None:
        line += f"; ours / NeMo = {fixed.ours_over_nemo:.3f} (target <= 0.1)"
    tokens = ", ".join(map(str, fixed.tokens.values()))
    return [line + f"; tokens decoded for these streams (first chunk included): {tokens}."]


def format_markdown(result: StreamingRunResult) -> str:
    """The results as a Markdown report: setup, one table row per path, ratios, agreement."""
    c = result.config
    lines = [
        f"# Cache-aware streaming: {c['model']}, {c['num_streams']} streams",
        "",
        *_setup_lines(
            c, result.environment, result.geometry, str(c["num_streams"]), c["num_slots"] or c["num_streams"]
        ),
        "",
        "| path | steps | mean batch | step p50 / p95 (ms) | chunk latency p50 / p95 / p99 (ms) | RTFx | busy | warm-up (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in result.paths:
        lines.append(
            f"| {p.name} | {p.steps} | {p.batch_mean} | {p.step_p50_ms} / {p.step_p95_ms} | "
            f"{p.latency_p50_ms} / {p.latency_p95_ms} / {p.latency_p99_ms} | {p.throughput} | {p.busy_share:.2f} | "
            f"{p.warmup_seconds} |"
        )
    lines.append("")
    if len(result.paths) > 1:
        ours, nemo = result.paths[0], result.paths[1]
        ratio = nemo.compute_seconds / ours.compute_seconds if ours.compute_seconds else float("nan")
        lines.append(f"Compute time: NeMo / ours = {ratio:.2f}x over the same chunks.")
        lines.append(f"Streams with identical tokens (ours vs NeMo's path): {100 * result.identical_streams:.1f}%")
    lines += _fixed_step_line(result.fixed_step)
    lines += ["", "Median step time by batch size (ms):", ""]
    lines += [f"- {p.name}: {p.step_ms_by_batch}" for p in result.paths]
    lines += [
        "",
        "Busy = compute time / simulated time; below 1 the server keeps up with real-time arrival. Warm-up (graph",
        "captures, lazy library set-up) ran before the simulated clock started.",
    ]
    return "\n".join(lines)


def format_sweep_markdown(result: SweepResult) -> str:
    """The sweep as Markdown: one row per (stream count, path), and the largest real-time count per path."""
    c = result.config
    target = c["latency_target_ms"]
    counts = "/".join(str(p.num_streams) for p in result.points)
    lines = [
        f"# Cache-aware streaming, latency vs streams: {c['model']}",
        "",
        *_setup_lines(c, result.environment, result.geometry, counts, result.num_slots),
        "",
        "| streams | path | chunk latency p50 / p95 / p99 (ms) | step p50 (ms) | step, all together (ms) | busy "
        "| identical tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for pt in result.points:
        for p in pt.paths:
            fixed = pt.fixed_step.step_ms.get(p.name, "") if pt.fixed_step else ""
            same = f"{100 * pt.identical_streams:.1f}%" if pt.identical_streams is not None else ""
            lines.append(
                f"| {pt.num_streams} | {p.name} | {p.latency_p50_ms} / {p.latency_p95_ms} / {p.latency_p99_ms} | "
                f"{p.step_p50_ms} | {fixed} | {p.busy_share:.2f} | {same} |"
            )
    lines.append("")
    for name, best in result.max_realtime_streams.items():
        lines.append(f"- {name}: largest count in real time with p95 <= {target} ms: {best if best else 'none'}")
    for pt in result.points:
        if pt.fixed_step is not None and pt.fixed_step.ours_over_nemo is not None:
            tokens = " / ".join(str(count) for count in pt.fixed_step.tokens.values())
            lines.append(
                f"- {pt.num_streams} streams stepping together: ours / NeMo step time = "
                f"{pt.fixed_step.ours_over_nemo:.3f} (tokens decoded for those streams: {tokens})"
            )
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
    if result.fixed_step is not None:
        payload["fixed_step"]["ours_over_nemo"] = result.fixed_step.ours_over_nemo
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    md_path.write_text(format_markdown(result) + "\n")
    with open(jsonl_path, "w", encoding="utf8") as f:
        for record in result.transcripts:
            f.write(json.dumps(record) + "\n")


def _write_sweep(result: SweepResult, out_dir: Path, tag: str | None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"streaming_sweep{f'_{tag}' if tag else ''}"
    payload = asdict(result)
    for point, saved in zip(result.points, payload["points"], strict=True):
        if point.fixed_step is not None:
            saved["fixed_step"]["ours_over_nemo"] = point.fixed_step.ours_over_nemo
    result.files = {"json": f"{stem}.json", "markdown": f"{stem}.md"}
    Path(f"{stem}.json").write_text(json.dumps(payload, indent=2) + "\n")
    Path(f"{stem}.md").write_text(format_sweep_markdown(result) + "\n")
    plot = plot_sweep(result, stem)
    if plot is not None:
        result.files["plot"] = str(plot)


def plot_sweep(result: SweepResult, stem: Path) -> Path | None:
    """p50/p95/p99 chunk latency vs streams, one colour per path: ``stem.png`` (matplotlib) or ``stem.svg``."""
    series = _sweep_series(result)
    target = result.config["latency_target_ms"]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        path = stem.with_suffix(".svg")
        path.write_text(_svg_plot(series, target))
        return path
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (name, q), (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", linestyle=_DASHES[q], color=_colour(name, series), label=f"{name} p{q}")
    ax.axhline(target, color="grey", linewidth=0.8, linestyle=":", label=f"{target} ms")
    ax.set(xscale="log", yscale="log", xlabel="concurrent streams", ylabel="chunk latency (ms)")
    ax.set_xticks(sorted({x for xs, _ in series.values() for x in xs}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = stem.with_suffix(".png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


_DASHES = {50: "-", 95: "--", 99: ":"}
_SVG_DASHES = {50: "", 95: "6,3", 99: "2,3"}
_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def _sweep_series(result: SweepResult) -> dict[tuple[str, int], tuple[list[int], list[float]]]:
    series: dict[tuple[str, int], tuple[list[int], list[float]]] = {}
    for pt in result.points:
        for p in pt.paths:
            for q in (50, 95, 99):
                xs, ys = series.setdefault((p.name, q), ([], []))
                xs.append(pt.num_streams)
                ys.append(max(getattr(p, f"latency_p{q}_ms"), 1e-3))
    return series


def _colour(name: str, series: dict) -> str:
    names = list(dict.fromkeys(n for n, _ in series))
    return _COLOURS[names.index(name) % len(_COLOURS)]


def _svg_plot(series: dict[tuple[str, int], tuple[list[int], list[float]]], target: float) -> str:
    """A dependency-free log-log line plot of ``series`` (same content as the matplotlib one)."""
    width, height, left, right, top, bottom = 720, 450, 70, 250, 20, 50
    xs = [x for xs, _ in series.values() for x in xs]
    ys = [y for _, ys in series.values() for y in ys] + [target]
    lx = (np.log10(min(xs)), np.log10(max(xs)) if max(xs) > min(xs) else np.log10(min(xs)) + 1)
    ly = (np.floor(np.log10(min(ys))), np.ceil(np.log10(max(ys))) + (min(ys) == max(ys)))

    def px(x: float) -> float:
        return left + (np.log10(x) - lx[0]) / (lx[1] - lx[0]) * (width - left - right)

    def py(y: float) -> float:
        return height - bottom - (np.log10(y) - ly[0]) / (ly[1] - ly[0]) * (height - top - bottom)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="11"><rect width="100%" height="100%" fill="white"/>'
    ]
    for e in range(int(ly[0]), int(ly[1]) + 1):
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{py(10**e):.1f}" y2="{py(10**e):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{py(10**e) + 4:.1f}" text-anchor="end">{10**e:g}</text>')
    for x in sorted(set(xs)):
        out.append(f'<text x="{px(x):.1f}" y="{height - bottom + 16}" text-anchor="middle">{x}</text>')
    out.append(
        f'<text x="{(left + width - right) / 2}" y="{height - 10}" text-anchor="middle">concurrent streams</text>'
    )
    out.append(
        f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" text-anchor="middle">'
        "chunk latency (ms)</text>"
    )
    out.append(
        f'<line x1="{left}" x2="{width - right}" y1="{py(target):.1f}" y2="{py(target):.1f}" stroke="grey" '
        'stroke-dasharray="2,2"/>'
    )
    for i, ((name, q), (sx, sy)) in enumerate(series.items()):
        colour, dash = _colour(name, series), _SVG_DASHES[q]
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(sx, sy, strict=True))
        out.append(
            f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.6" stroke-dasharray="{dash}"/>'
        )
        out += [
            f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{colour}"/>' for x, y in zip(sx, sy, strict=True)
        ]
        ty = top + 14 * i + 8
        out.append(
            f'<line x1="{width - right + 10}" x2="{width - right + 34}" y1="{ty}" y2="{ty}" stroke="{colour}" '
            f'stroke-width="1.6" stroke-dasharray="{dash}"/>'
        )
        label = f"{name[:28]} p{q}".replace("&", "&amp;").replace("<", "&lt;")
        out.append(f'<text x="{width - right + 38}" y="{ty + 4}">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
