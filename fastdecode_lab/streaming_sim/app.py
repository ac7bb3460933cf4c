"""``scripts/streaming.py``: a model and its inputs, both streaming paths through the schedule, the reports.

Mirrors NeMo's ``examples/asr/asr_cache_aware_streaming/speech_to_text_cache_aware_streaming_infer.py``
(features of each file computed whole, cut into NeMo's chunks) but serves ``num_streams`` concurrent
streams that start at staggered times (:mod:`.schedule`). The same schedule runs through ours
(:class:`~nemo_fastdecode.streaming.transcriber.StreamingTranscriber`) and, for comparison, NeMo's path
(:class:`~fastdecode_lab.streaming_sim.nemo_path.NemoSlotStreamer`); the transcripts are compared
stream by stream. With ``decoding=beam`` NeMo has no batched streaming beam path: no NeMo path is timed, and NeMo's
beam search of each of the first streams alone is the exactness reference of our final tokens. Streams may open with
their own phrases to boost. With no input given, the streams play the shipped example utterances (synthetic audio for a
synthetic preset); where the inputs have reference texts, each stream's reference and final transcript are printed
with the WER.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from fastdecode_lab import synthetic
from fastdecode_lab.configs import StreamingConfig
from fastdecode_lab.streaming_sim.paths import fast_path, nemo_path
from fastdecode_lab.streaming_sim.phrases import stream_boosting
from fastdecode_lab.streaming_sim.report import (
    BeamReference,
    FixedStep,
    StreamingRunResult,
    SweepPoint,
    SweepResult,
    format_markdown,
    format_sweep_markdown,
    write_run_result,
    write_sweep_result,
)
from fastdecode_lab.streaming_sim.schedule import (
    FRAME_SECONDS,
    PathStats,
    StreamingPath,
    StreamPlan,
    plan_streams,
    served_in_real_time,
    simulate,
    time_fixed_steps,
)
from nemo_fastdecode.apps import models
from nemo_fastdecode.apps.environment import environment
from nemo_fastdecode.apps.manifests import load_audio, read_inputs
from nemo_fastdecode.apps.trained_models import EXAMPLES_MANIFEST
from nemo_fastdecode.apps.wer import report_wer, word_error_rate_of
from nemo_fastdecode.streaming.geometry import StreamingGeometry
from nemo_fastdecode.streaming.transcriber import set_att_context_size

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel


def resolve_config(cfg: StreamingConfig | DictConfig | dict[str, Any] | None = None) -> DictConfig:
    """Validate ``cfg`` against :class:`~nemo_fastdecode.config.StreamingConfig` and fill in its defaults."""
    schema = OmegaConf.structured(StreamingConfig)
    if cfg is None:
        return schema
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.structured(cfg) if not isinstance(cfg, dict) else OmegaConf.create(cfg)
    merged = OmegaConf.merge(schema, cfg)
    StreamingConfig(**OmegaConf.to_container(merged))  # value checks (__post_init__)
    if merged.num_streams is not None and merged.num_streams < 1:
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


@dataclass
class _Setup:
    """The model and the input features shared by every run of one invocation.

    ``texts``: each input's reference text, ``None`` where it has none or ``max_stream_seconds`` cuts it.
    """

    model: Any
    device: torch.device
    dtype: torch.dtype
    geometry: StreamingGeometry
    features: list[torch.Tensor]
    names: list[str]
    demo: bool
    texts: list[str | None]


def whole_features(model: ASRModel, audios: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
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
    device = models.inference_device(cfg.cuda)
    dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
    demo = cfg.audio_dir is None and cfg.dataset_manifest is None
    model = models.load_model(cfg.model, device=device, seed=cfg.seed, vocab=cfg.vocab)
    if models.model_family(cfg.model) is not None:
        log(models.model_banner(cfg.model, model))
    if cfg.att_context_size is not None:
        set_att_context_size(model.encoder, list(cfg.att_context_size))
    geometry = StreamingGeometry.from_encoder(model.encoder)
    sample_rate = int(model.cfg.get("sample_rate", synthetic.SAMPLE_RATE))
    if demo and models.model_family(cfg.model) is not None:
        names = [f"demo_{i}" for i in range(len(models.DEMO_DURATIONS))]
        audios = models.model_family(cfg.model).demo_audio(models.DEMO_DURATIONS, cfg.seed)
        texts: list[str | None] = [None] * len(audios)
        log(f"No audio_dir or dataset_manifest: {len(audios)} synthetic utterances ({models.DEMO_DURATIONS} s).")
    else:
        if demo:
            utterances = read_inputs(dataset_manifest=EXAMPLES_MANIFEST)
            log(
                f"No audio_dir or dataset_manifest: the {len(utterances)} example utterances (English speech "
                "synthesised by eSpeak NG, voices the shipped models never heard in training)."
            )
        else:
            utterances = read_inputs(cfg.audio_dir, cfg.dataset_manifest)
        names = [str(u.entry["audio_filepath"]) for u in utterances]
        audios = load_audio([u.audio_path for u in utterances], sample_rate)
        texts = [
            _reference_text(u.entry, len(a) / sample_rate, cfg.max_stream_seconds)
            for u, a in zip(utterances, audios, strict=True)
        ]
    features = whole_features(model, audios, device)
    return _Setup(model, device, dtype, geometry, features, names, demo, texts)


def _reference_text(entry: dict[str, Any], seconds: float, max_stream_seconds: float | None) -> str | None:
    """The entry's ``text``, unless the stream is cut before the audio ends (then the text no longer matches)."""
    text = entry.get("text")
    if not isinstance(text, str) or (max_stream_seconds is not None and seconds > max_stream_seconds + FRAME_SECONDS):
        return None
    return text


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
    boosting = stream_boosting(
        setup.model, num_streams, cfg.boosting_streams_share, cfg.boosting_alpha, cfg.boosting_phrases, cfg.seed
    )
    return plan_streams(
        setup.features,
        setup.names,
        setup.geometry,
        num_streams,
        cfg.stagger_seconds,
        cfg.seed,
        cfg.max_stream_seconds,
        boosting,
    )


def _make_paths(
    cfg: DictConfig, setup: _Setup, num_slots: int, max_batch: int, plans: list[StreamPlan]
) -> list[StreamingPath]:
    """Ours, then (``compare_nemo`` with greedy decoding) NeMo's, both warmed up for batches up to ``max_batch`` streams
    (ours with room for the phrases of every stream of ``plans``).

    With beam search no NeMo path is timed: NeMo has none for batched streams (see :func:`_beam_reference`).
    """
    paths = [
        fast_path(
            setup.model, num_slots, setup.dtype, cfg.use_cuda_graphs, cfg.fast_math, cfg.encoder_matmul,
            cfg.capture_decoder_step, cfg.decoding, cfg.beam_size, cfg.ngram_lm_model, cfg.ngram_lm_alpha,
            cfg.boosting_streams_share, cfg.boosting_alpha, [plan.boosting for plan in plans],
        )
    ]  # fmt: skip
    if cfg.compare_nemo and cfg.decoding == "greedy":
        tf32 = cfg.encoder_matmul == "tf32"  # like for like: NeMo at matmul_precision=high
        paths.append(
            nemo_path(
                setup.model, num_slots, setup.dtype, warm_streams=max_batch, tf32_matmuls=tf32,
                ngram_lm_model=cfg.ngram_lm_model, ngram_lm_alpha=cfg.ngram_lm_alpha,
            )
        )  # fmt: skip
    return paths


def _measure(
    cfg: DictConfig, setup: _Setup, paths: list[StreamingPath], plans: list[StreamPlan], num_slots: int
) -> tuple[list[PathStats], list[list[list[int]]], FixedStep | None]:
    """Every path through the schedule, then (``fixed_step_repeats > 0``) the fixed-batch step."""
    stats, tokens = _simulate_paths(setup, paths, plans, num_slots)
    return stats, tokens, _fixed_step(cfg, setup, paths, plans, num_slots)


def _simulate_paths(
    setup: _Setup, paths: list[StreamingPath], plans: list[StreamPlan], num_slots: int
) -> tuple[list[PathStats], list[list[list[int]]]]:
    """Every path through the simulated real-time schedule: stats and each stream's tokens, per path."""
    stats, tokens = [], []
    for path in paths:
        result, path_tokens = simulate(path, plans, num_slots, setup.device)
        stats.append(result)
        tokens.append(path_tokens)
    return stats, tokens


def _fixed_step(
    cfg: DictConfig, setup: _Setup, paths: list[StreamingPath], plans: list[StreamPlan], num_slots: int
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


def _beam_reference(
    cfg: DictConfig, setup: _Setup, plans: list[StreamPlan], tokens: list[list[int]], log: Callable[[str], None]
) -> tuple[BeamReference, list[list[int] | None]]:
    """NeMo's beam search of each of the first ``nemo_beam_reference_streams`` streams alone, on the features the
    simulation fed it (:attr:`StreamPlan.features`), with the same beam size, LM and phrases; against our ``tokens``.

    Returns the check and NeMo's tokens per stream (``None`` for streams not checked).
    """
    from nemo_fastdecode.apps.comparison import as_int_list
    from nemo_fastdecode.apps.streaming_reference import nemo_alone_beam

    count = min(cfg.nemo_beam_reference_streams, len(plans))
    lm = None
    if cfg.ngram_lm_model is not None and count > 0:
        from nemo.collections.asr.parts.submodules.ngram_lm import NGramGPULanguageModel

        # loaded once, as nemo_alone_beam would load it for each stream (NeMo's RNNTDecoding set-up)
        lm = NGramGPULanguageModel.from_file(lm_path=cfg.ngram_lm_model, vocab_size=int(setup.model.decoding.blank_id))
    log(f"Checking {count} stream(s) against NeMo's beam search of each stream alone (untimed).")
    nemo_tokens: list[list[int] | None] = [None] * len(plans)
    for i, plan in enumerate(plans[:count]):
        hyp = nemo_alone_beam(
            setup.model, plan.features, cfg.beam_size, ngram_lm_model=lm, ngram_lm_alpha=cfg.ngram_lm_alpha,
            boosting=plan.boosting,
        )  # fmt: skip
        nemo_tokens[i] = as_int_list(hyp.y_sequence) if hyp is not None else []
    checked = plans[:count]
    reference = BeamReference(
        checked=count,
        identical=sum(nemo_tokens[i] == tokens[i] for i in range(count)),
        boosted=sum(plan.boosting is not None for plan in checked),
    )
    return reference, nemo_tokens


def _describe(cfg: DictConfig, setup: _Setup, num_slots: int, streams: str) -> str:
    g = setup.geometry
    return (
        f"Model {cfg.model!r} on {setup.device}, att_context_size {list(g.att_context_size)} "
        f"({g.chunk_seconds * 1000:.0f} ms chunks), {streams} streams in {num_slots} slots, "
        f"starts staggered over {cfg.stagger_seconds} s, {cfg.dtype}."
    )


def stream_count(num_streams: int | None, inputs: int, log: Callable[[str], None] = print) -> int:
    """``num_streams``, or one stream per input when ``None``; fewer streams than inputs are logged (the inputs
    past them are not streamed)."""
    if num_streams is None:
        return inputs
    if num_streams < inputs:
        log(
            f"num_streams={num_streams}: streaming the first {num_streams} of {inputs} inputs "
            f"(num_streams=null streams each input once)."
        )
    return num_streams


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
    num_streams = stream_count(cfg.num_streams, len(setup.features), log)
    num_slots = cfg.num_slots or num_streams
    plans = _plans(cfg, setup, num_streams)
    log(_describe(cfg, setup, num_slots, str(num_streams)))
    paths = _make_paths(cfg, setup, num_slots, min(num_streams, num_slots), plans)
    stats, tokens = _simulate_paths(setup, paths, plans, num_slots)

    reference, nemo_beam = None, [None] * len(plans)
    if cfg.decoding == "beam" and cfg.compare_nemo:
        reference, nemo_beam = _beam_reference(cfg, setup, plans, tokens[0], log)

    to_text = setup.model.decoding.decode_ids_to_str
    transcripts = []
    for i, plan in enumerate(plans):
        record = {"stream": i, "audio": plan.name, "start": round(plan.start, 4), "pred_text": to_text(tokens[0][i])}
        if plan.boosting is not None:
            record["boosting_phrases"] = list(plan.boosting.phrases)
        if len(tokens) > 1:  # NeMo's timed path, same decoding
            record["nemo_pred_text"] = to_text(tokens[1][i])
            record["identical"] = tokens[0][i] == tokens[1][i]
        if nemo_beam[i] is not None:  # NeMo's beam search of this stream alone
            record["nemo_beam_pred_text"] = to_text(nemo_beam[i])
            record["identical_to_nemo_beam"] = tokens[0][i] == nemo_beam[i]
        text = setup.texts[i % len(setup.texts)]
        if text is not None:
            record["text"] = text
        transcripts.append(record)

    result = StreamingRunResult(
        config={**OmegaConf.to_container(cfg), "num_streams": num_streams},  # the count run (null: one per input)
        environment=environment(setup.device),
        geometry=asdict(setup.geometry),
        paths=stats,
        transcripts=transcripts,
        identical_streams=_agreement(tokens),
        wer=word_error_rate_of(transcripts),
        beam_reference=reference,
    )
    # the simulated run's results are on disk before the fixed-batch step runs: a failure there keeps them
    write_run_result(result, Path(cfg.output_dir), cfg.tag)
    if cfg.fixed_step_repeats > 0:
        log(f"Simulated run written ({', '.join(result.files.values())}); now the fixed-batch step.")
        result.fixed_step = _fixed_step(cfg, setup, paths, plans, num_slots)
        write_run_result(result, Path(cfg.output_dir), cfg.tag)
    show = len(transcripts) if setup.demo else 4
    if report_wer(transcripts, log, show, label=lambda r: f"stream {r['stream']} ({Path(r['audio']).name})") is None:
        for record in transcripts[:show]:
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
    plans = {n: _plans(cfg, setup, n) for n in counts}
    paths = _make_paths(cfg, setup, num_slots, counts[-1], plans[counts[-1]])
    points = []
    for n in counts:
        stats, tokens, fixed = _measure(cfg, setup, paths, plans[n], num_slots)
        points.append(SweepPoint(n, stats, fixed, _agreement(tokens)))
        summary = "; ".join(f"{p.name}: p95 {p.latency_p95_ms} ms, busy {p.busy_share:.2f}" for p in stats)
        log(f"{n} streams: {summary}")
    target = cfg.latency_target_ms
    best: dict[str, int | None] = {}
    for i, path in enumerate(paths):
        ok = [pt.num_streams for pt in points if served_in_real_time(pt.paths[i], target)]
        best[path.name] = max(ok) if ok else None
    result = SweepResult(
        config=OmegaConf.to_container(cfg),
        environment=environment(setup.device),
        geometry=asdict(setup.geometry),
        num_slots=num_slots,
        points=points,
        max_realtime_streams=best,
    )
    write_sweep_result(result, Path(cfg.output_dir), cfg.tag)
    log(format_sweep_markdown(result))
    log("Wrote " + ", ".join(result.files.values()))
    return result
