"""``benchmarks/stream_audio_bench.py``: the model, the inputs and the reference, then every stream count, both sides.

Per stream count ``N``, ours first (an engine with ``N`` slots, warmed up, served on the virtual clock, then timed with
all streams stepping together), then NeMo's pipeline (built by NeMo's builder with ``batch_size = num_slots = N``,
timed with all streams stepping together); each is freed before the next, so that one side's memory does not limit
the other's. A side that fails at a count (e.g. out of GPU memory) is reported for that count and the run goes on;
the report is rewritten after every count, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import gc
import shlex
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from fastdecode_lab import synthetic
from fastdecode_lab.benchmarks.stream_audio.engine_clock import (
    plan_pcm_streams,
    serve_on_clock,
    time_cycles,
    warm_up_engine,
)
from fastdecode_lab.benchmarks.stream_audio.nemo_steps import (
    build_nemo_pipeline,
    nemo_settings,
    pipeline_config,
    pipeline_texts,
    time_pipeline_steps,
)
from fastdecode_lab.benchmarks.stream_audio.report import BenchResult, CountResult, format_markdown, write_result
from fastdecode_lab.configs import StreamAudioBenchConfig
from nemo_fastdecode.apps import models
from nemo_fastdecode.apps.environment import environment
from nemo_fastdecode.apps.manifests import load_audio, read_inputs
from nemo_fastdecode.apps.streaming_reference import reference_transcript
from nemo_fastdecode.apps.timing import synchronize
from nemo_fastdecode.streaming import StreamingEngine, StreamingGeometry
from nemo_fastdecode.streaming.transcriber import set_att_context_size


def resolve_config(cfg: StreamAudioBenchConfig | DictConfig | dict[str, Any] | None = None) -> DictConfig:
    """Validate ``cfg`` against :class:`StreamAudioBenchConfig` and fill in its defaults."""
    schema = OmegaConf.structured(StreamAudioBenchConfig)
    if cfg is None:
        return schema
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg) if isinstance(cfg, dict) else OmegaConf.structured(cfg)
    merged = OmegaConf.merge(schema, cfg)
    OmegaConf.to_object(merged)  # the dataclasses, their value checks included
    return merged


def _inputs(cfg: DictConfig, sample_rate: int) -> tuple[list[str], list[np.ndarray]]:
    """Names and float32 audio on the int16 grid (what the engine's int16 pushes and the WAV files hold exactly)."""
    if cfg.audio_dir is None and cfg.dataset_manifest is None:
        durations = synthetic.librispeech_like_durations(6.3 * cfg.num_files + 35.0, seed=cfg.seed)[: cfg.num_files]
        audios = synthetic.synthetic_audio(durations, sample_rate=sample_rate, seed=cfg.seed)
        names = [f"synthetic_{i}" for i in range(len(audios))]
    else:
        utterances = read_inputs(cfg.audio_dir, cfg.dataset_manifest)
        names = [str(u.entry["audio_filepath"]) for u in utterances]
        audios = load_audio([u.audio_path for u in utterances], sample_rate)
    if cfg.max_stream_seconds is not None:
        audios = [a[: round(cfg.max_stream_seconds * sample_rate)] for a in audios]
    return names, [(np.round(np.clip(a, -1.0, 32767 / 32768) * 32768) / 32768).astype(np.float32) for a in audios]


def _load(cfg: DictConfig, device: torch.device, out_dir: Path, log: Callable[[str], None]) -> tuple[Any, str]:
    """Our copy of the model (on ``device``, fp32) and the ``.nemo`` NeMo's builder loads its own copy from."""
    model = models.load_model(cfg.model, device=device, seed=cfg.seed, vocab="bpe")
    if models.model_family(cfg.model) is not None:
        log(models.model_banner(cfg.model, model))
        path = out_dir / f"{cfg.model}_seed{cfg.seed}.nemo"
        model.save_to(str(path))
        return model, str(path)
    return model, cfg.model


def _release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _failure(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def run(
    cfg: StreamAudioBenchConfig | DictConfig | dict[str, Any] | None = None,
    *,
    log: Callable[[str], None] = print,
    command: str | None = None,
) -> BenchResult:
    """Run the benchmark (see :class:`StreamAudioBenchConfig` and the module docstring); returns what it wrote."""
    cfg = resolve_config(cfg)
    device = models.inference_device(cfg.cuda)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, nemo_model = _load(cfg, device, out_dir, log)
    if cfg.att_context_size is not None:
        set_att_context_size(model.encoder, list(cfg.att_context_size))
    geometry = StreamingGeometry.from_encoder(model.encoder)
    sample_rate = int(model.cfg.get("sample_rate", synthetic.SAMPLE_RATE))
    names, audios = _inputs(cfg, sample_rate)
    pcm = [np.round(a * 32768).astype(np.int16) for a in audios]
    counts = sorted({int(n) for n in cfg.stream_counts})
    stagger = geometry.chunk_seconds if cfg.stagger_seconds is None else float(cfg.stagger_seconds)
    result = BenchResult(
        command=command or " ".join(shlex.quote(a) for a in sys.argv),
        config=OmegaConf.to_container(cfg),
        environment=environment(device),
        geometry=asdict(geometry),
        inputs={"files": len(audios), "seconds": round(sum(len(a) for a in audios) / sample_rate, 2), "names": names},
        chunk_seconds=geometry.chunk_seconds,
        stagger_seconds=stagger,
        counts=[],
    )
    log(
        f"{cfg.model} on {device}: {len(audios)} inputs ({result.inputs['seconds']} s), {geometry.chunk_seconds * 1000:.0f}"
        f" ms chunks, streams {counts}"
    )
    reference, texts, wavs = None, None, []
    if cfg.compare_transcripts:
        # NeMo's cache-aware streaming of each input alone, on the PCM the engine gets (true fp32 inside)
        reference = [reference_transcript(model, p).token_ids for p in pcm]
        texts = [model.decoding.decode_ids_to_str(ids) for ids in reference]
        wavs = [str(p) for p in synthetic.write_wavs(audios, out_dir / "inputs", sample_rate)]
    att = list(geometry.att_context_size)
    settings: StreamAudioBenchConfig = OmegaConf.to_object(cfg)  # its engine_config builds our engine's options
    for n in counts:
        count = CountResult(n)
        result.counts.append(count)
        try:
            engine = StreamingEngine(model, settings.engine_config(n))
            warmup = warm_up_engine(engine, pcm, n)
            streams = plan_pcm_streams(
                pcm, n, geometry.chunk_seconds, stagger, engine.front.settings.complete_frames, sample_rate, cfg.seed
            )
            name = f"nemo_fastdecode StreamingEngine ({cfg.dtype}, {cfg.encoder_matmul})"
            count.ours, tokens, count.ours_parts = serve_on_clock(engine, streams, device, name, warmup)
            if reference is not None:
                count.ours_identical = sum(t == reference[s.file] for t, s in zip(tokens, streams, strict=True)) / n
            count.ours_cycle = time_cycles(engine, pcm, n, cfg.cycle_repeats, device)
        except (RuntimeError, ValueError) as error:  # out of memory among them: reported, the run goes on
            count.errors["ours"] = _failure(error)
            log(f"{n} streams, ours: {count.errors['ours']}")
        engine = None
        _release()
        if cfg.nemo.enabled:
            pipeline = None
            try:
                with nemo_settings():
                    nemo_cfg = pipeline_config(
                        nemo_model, device, n, att, cfg.nemo.compute_dtype, cfg.nemo.use_cuda_graph_decoder,
                        cfg.nemo.matmul_precision,
                    )  # fmt: skip
                    pipeline = build_nemo_pipeline(
                        nemo_cfg, model=model if (models.model_family(cfg.model) is not None) else None
                    )
                    count.nemo_step = time_pipeline_steps(pipeline, audios, n, cfg.cycle_repeats, device)
                    if texts is not None and result.pipeline_agreement is None:
                        theirs = pipeline_texts(pipeline, wavs)
                        result.pipeline_agreement = sum(a == b for a, b in zip(theirs, texts, strict=True)) / len(texts)
            except (RuntimeError, ValueError) as error:
                count.errors["nemo"] = _failure(error)
                log(f"{n} streams, NeMo's pipeline: {count.errors['nemo']}")
            pipeline = None
            _release()
        synchronize(device)
        log(_summary(count))
        write_result(result, out_dir, cfg.tag)
    log(format_markdown(result))
    log("Wrote " + ", ".join(result.files.values()))
    return result


def _summary(count: CountResult) -> str:
    parts = [f"{count.num_streams} streams"]
    if count.ours is not None:
        parts.append(f"ours p95 {count.ours.latency_p95_ms} ms, busy {count.ours.busy_share:.2f}")
    if count.ours_cycle is not None:
        parts.append(f"ours cycle {count.ours_cycle.cycle_ms} ms")
    if count.nemo_step is not None:
        parts.append(f"NeMo step {count.nemo_step.step_ms} ms")
    return "; ".join(parts)
