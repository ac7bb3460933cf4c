"""``scripts/transcribe.py``: transcribe a folder or a manifest with a decoding strategy, and compare strategies.

The script follows NeMo's ``examples/asr/transcribe_speech.py``: a folder of audio or a JSON-lines
manifest in, a manifest with ``pred_text`` (and timestamps on request) out, the decoding strategy
applied with ``model.change_decoding_strategy``. The model comes from :mod:`~nemo_fastdecode.apps.models`,
inputs and outputs from :mod:`~nemo_fastdecode.apps.manifests`. Here:

* :func:`transcribe_files` -- NeMo's ``transcribe`` with the model's current strategy.
* :func:`compare_strategies` / :func:`format_comparison` -- ``fast_greedy`` against NeMo's
  ``greedy_batch`` on the same encoder outputs: decode time, tokens, identical hypotheses.
* :func:`run` -- all of it for a :class:`~nemo_fastdecode.apps.configs.TranscribeConfig`, including
  the embedded demo when no input is given: the shipped example utterances (synthetic audio for a synthetic
  preset), with each reference, hypothesis and the WER where the input has reference texts.
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from nemo_fastdecode.apps.comparison import agreement, as_int_list, decode_all, encode
from nemo_fastdecode.apps.configs import TranscribeConfig
from nemo_fastdecode.apps.manifests import (
    Utterance,
    audio_problem,
    default_output_path,
    load_audio,
    output_records,
    read_inputs,
    resampling_note,
    write_output_manifest,
    write_wavs,
)
from nemo_fastdecode.apps.models import (
    DEMO_DURATIONS,
    apply_decoding,
    inference_device,
    load_model,
    model_banner,
    model_device,
    model_family,
)
from nemo_fastdecode.apps.timing import best_time
from nemo_fastdecode.apps.trained_models import EXAMPLES_MANIFEST
from nemo_fastdecode.apps.wer import report_wer
from nemo_fastdecode.config import FastBeamConfig, greedy_max_symbols, option_names
from nemo_fastdecode.nemo.context import quiet_nemo
from nemo_fastdecode.nemo.registry import valid_strategies
from nemo_fastdecode.offline import enable_fast_transcribe

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel
    from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis


__all__ = [
    "StrategyRun",
    "apply_transcribe_decoding",
    "TranscribeResult",
    "compare_strategies",
    "comparison_configs",
    "format_comparison",
    "resolve_config",
    "run",
    "transcribe_files",
    "transcribe_utterances",
]


def resolve_config(
    cfg: TranscribeConfig | DictConfig | dict[str, Any] | None = None, schema_class: type = TranscribeConfig
) -> DictConfig:
    """Validate ``cfg`` against ``schema_class`` (:class:`TranscribeConfig`, or
    :class:`~nemo_fastdecode.apps.configs.ParallelTranscribeConfig`) and fill in its defaults.

    Top-level keys are checked (an unknown key or a value of the wrong type raises). The
    ``decoding`` section may carry further NeMo ``RNNTDecodingConfig`` keys (e.g. ``beam`` for
    ``strategy: beam``); they are passed through to NeMo.
    """
    schema = OmegaConf.structured(schema_class)
    OmegaConf.set_struct(schema.decoding, False)
    if cfg is None:
        return schema
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.structured(cfg) if not isinstance(cfg, dict) else OmegaConf.create(cfg)
    merged = OmegaConf.merge(schema, cfg)
    if merged.batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {merged.batch_size}")
    if merged.audio_dir is not None and merged.dataset_manifest is not None:
        raise ValueError(
            f"give audio_dir ({merged.audio_dir!r}) or dataset_manifest ({merged.dataset_manifest!r}), not both"
        )
    strategy = merged.decoding.strategy
    if strategy not in valid_strategies():
        raise ValueError(
            f"Unknown transducer decoding strategy {strategy!r}; valid strategies: {', '.join(valid_strategies())}"
        )
    return merged


def _autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager:
    if bf16 and device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def transcribe_files(
    model: ASRModel,
    audio_paths: Sequence[str | os.PathLike],
    *,
    batch_size: int = 32,
    timestamps: bool = False,
    bf16: bool = False,
    progress: bool = True,
) -> list[Hypothesis]:
    """Transcribe audio files with the model's current decoding strategy (NeMo's ``transcribe``).

    Args:
        model: a transducer model (see :func:`apply_decoding` for the strategy).
        audio_paths: audio files, transcribed in this order.
        batch_size: utterances per batch.
        timestamps: have NeMo compute char/word/segment timestamps into ``Hypothesis.timestamp``.
        bf16: ``torch.autocast(dtype=torch.bfloat16)`` when the model is on a GPU (ignored on the CPU).
        progress: NeMo's tqdm progress bar.

    Returns:
        One best ``Hypothesis`` per file, with ``text``.
    """
    device = model_device(model)
    with _autocast(device, bf16):
        hyps = model.transcribe(
            [str(p) for p in audio_paths],
            batch_size=batch_size,
            return_hypotheses=True,
            timestamps=timestamps,
            verbose=progress,
        )
    if isinstance(hyps, tuple):  # older NeMo: (best, all)
        hyps = hyps[0]
    return [h[0] if isinstance(h, list) else h for h in hyps]


def apply_transcribe_decoding(model: ASRModel, decoding: DictConfig, timestamps: bool) -> DictConfig:
    """Apply a config's ``decoding`` section to ``model`` (:func:`apply_decoding`), with NeMo's
    ``compute_timestamps`` set as ``timestamps`` asks; returns the section applied (the config is not changed)."""
    decoding = copy.deepcopy(decoding)
    with open_dict(decoding):
        decoding.compute_timestamps = timestamps
    apply_decoding(model, decoding)
    return decoding


def transcribe_utterances(
    model: ASRModel,
    utterances: Sequence[Utterance],
    *,
    batch_size: int = 32,
    timestamps: bool = False,
    bf16: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Output records of ``utterances`` (in their order) and the ``(audio path, reason)`` of those that could not be
    read: each such file gets ``pred_text: null`` and an ``error``, and the others are transcribed all the same. Files
    at another rate than the model's are named in one line (NeMo resamples them as it reads them)."""
    problems = {i: reason for i, u in enumerate(utterances) if (reason := audio_problem(u.audio_path)) is not None}
    for i, reason in problems.items():
        log(f"Cannot transcribe {utterances[i].audio_path}: it {reason}")
    readable = [u for i, u in enumerate(utterances) if i not in problems]
    note = resampling_note([u.audio_path for u in readable], int(model.cfg.get("sample_rate", 16000)))
    if note is not None:  # NeMo's transcribe resamples them as it reads them
        log(note)
    hyps = (
        transcribe_files(
            model,
            [u.audio_path for u in readable],
            batch_size=batch_size,
            timestamps=timestamps,
            bf16=bf16,
            progress=progress,
        )
        if readable
        else []
    )
    transcribed = iter(output_records(readable, hyps, timestamps=timestamps))
    records = [
        {**u.entry, "pred_text": None, "error": f"it {problems[i]}"} if i in problems else next(transcribed)
        for i, u in enumerate(utterances)
    ]
    return records, [(str(utterances[i].audio_path), reason) for i, reason in problems.items()]


@dataclass
class StrategyRun:
    """One row of :func:`compare_strategies`.

    Attributes:
        name: the strategy and algorithm, e.g. ``greedy_batch (frame loop)``.
        decoding: the decoding section it ran with.
        seconds: best wall-clock time of one decoding pass over all utterances (encoder excluded).
        tokens: tokens emitted over all utterances.
        identical: tokens and per-token timestamps equal those of the first row (the reference).
        max_score_diff: largest absolute difference of a hypothesis score from the reference's.
    """

    name: str
    decoding: dict[str, Any]
    seconds: float
    tokens: int
    identical: bool
    max_score_diff: float


#: Strategies the comparison runs beam search rows for (NeMo's batched beam search and ours); greedy rows otherwise.
BEAM_COMPARISON_STRATEGIES = ("fast_beam", "malsd_batch")


def comparison_kind(decoding: DictConfig | dict[str, Any] | None) -> str:
    """``"beam"`` when the user's strategy is a batched beam search (:data:`BEAM_COMPARISON_STRATEGIES`), else
    ``"greedy"``: which rows :func:`compare_strategies` times."""
    strategy = (decoding or {}).get("strategy", "fast_greedy")
    return "beam" if strategy in BEAM_COMPARISON_STRATEGIES else "greedy"


def comparison_configs(
    model: ASRModel, decoding: DictConfig | dict[str, Any] | None
) -> list[tuple[str, dict[str, Any]]]:
    """``(row name, decoding section)`` of each row :func:`compare_strategies` runs: NeMo's reference (no CUDA
    graphs) first, then ours with the user's options; greedy or beam rows (:func:`comparison_kind`)."""
    user = OmegaConf.to_container(decoding, resolve=True) if isinstance(decoding, DictConfig) else dict(decoding or {})
    if comparison_kind(user) == "beam":
        user_beam = dict(user.get("beam") or {})
        beam = {
            "beam_size": user_beam.get("beam_size", FastBeamConfig.beam_size),
            "max_symbols": user_beam.get("max_symbols", FastBeamConfig.max_symbols),
            "score_norm": user_beam.get("score_norm", FastBeamConfig.score_norm),
            "return_best_hypothesis": True,
        }
        own = (
            {k: v for k, v in user_beam.items() if k in option_names(FastBeamConfig)}
            if user["strategy"] == "fast_beam"
            else {}
        )
        return [
            ("malsd_batch", {"strategy": "malsd_batch", "beam": {**beam, "allow_cuda_graphs": False}}),
            ("fast_beam", {"strategy": "fast_beam", "beam": {**own, **beam}}),
        ]
    user_greedy = dict(user.get("greedy") or {}) if user.get("strategy") == "fast_greedy" else {}
    is_tdt = model.cfg.decoding.get("model_type", "rnnt") == "tdt" or bool(model.cfg.decoding.get("durations"))
    max_symbols = greedy_max_symbols(user_greedy, bounded=True)
    nemo_algorithms = [("label loop", True)] if is_tdt else [("frame loop", False), ("label loop", True)]
    fast_algorithms = [("label loop", True)] if is_tdt else [("label loop", True), ("frame loop", False)]
    configs = []
    for label, loop_labels in nemo_algorithms:
        greedy = {"max_symbols": max_symbols, "loop_labels": loop_labels, "use_cuda_graph_decoder": False}
        configs.append((f"greedy_batch ({label})", {"strategy": "greedy_batch", "greedy": greedy}))
    for label, loop_labels in fast_algorithms:
        greedy = {**user_greedy, "max_symbols": max_symbols, "loop_labels": loop_labels}
        configs.append((f"fast_greedy ({label})", {"strategy": "fast_greedy", "greedy": greedy}))
    return configs


def compare_strategies(
    model: ASRModel,
    audio: Sequence[np.ndarray],
    *,
    decoding: DictConfig | dict[str, Any] | None = None,
    batch_size: int = 32,
    repeats: int = 3,
) -> list[StrategyRun]:
    """Time ours against NeMo's decoder on the same encoder outputs, in fp32: greedy or beam rows.

    The encoder runs once; each strategy then decodes every batch (one warm-up pass, then the best
    of ``repeats`` passes). For greedy strategies the first row, NeMo's ``greedy_batch`` without CUDA graphs
    (frame looping for RNN-T, label looping for TDT), is the reference; for ``fast_beam`` / ``malsd_batch``
    (:func:`comparison_kind`) it is NeMo's ``malsd_batch`` without CUDA graphs, against ``fast_beam``. A row is
    ``identical`` when every hypothesis has the reference's tokens and per-token timestamps. The model's
    decoding configuration is restored afterwards.

    Args:
        model: a transducer model.
        audio: mono float arrays at the model's sample rate (see :func:`load_audio`).
        decoding: the user's decoding section; its ``fast_greedy`` / ``fast_beam`` options are used for our rows.
        batch_size: utterances per encoder/decoder batch.
        repeats: timed passes per strategy (the best is reported).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    device = model_device(model)
    encoded, lengths = encode(model, audio, batch_size=batch_size, device=device)
    batches = list(zip(encoded, lengths, strict=True))
    original = copy.deepcopy(model.cfg.decoding)
    rows: list[StrategyRun] = []
    reference: list[Hypothesis] | None = None
    try:
        for name, config in comparison_configs(model, decoding):
            with quiet_nemo():
                apply_decoding(model, config)
            infer = model.decoding.decoding
            decode_all(infer, batches)  # warm-up (and, on a GPU, graph capture)
            best, hyps = best_time(infer, batches, repeats)
            if reference is None:
                reference = hyps
            identical_share, score_diff = agreement(reference, hyps)
            rows.append(
                StrategyRun(
                    name=name,
                    decoding=config,
                    seconds=best,
                    tokens=sum(len(as_int_list(h.y_sequence)) for h in hyps),
                    identical=identical_share == 1.0,
                    max_score_diff=score_diff,
                )
            )
    finally:
        with quiet_nemo():
            apply_decoding(model, original)
    return rows


def format_comparison(rows: Sequence[StrategyRun]) -> str:
    """A plain-text table of :func:`compare_strategies` rows (speed-up relative to the first row)."""
    header = ("strategy", "decode s", "speed-up", "tokens", "identical", "max |score diff|")
    reference = rows[0].seconds if rows else 0.0
    body = [
        (
            row.name,
            f"{row.seconds:.4f}",
            f"{reference / row.seconds:.2f}x" if row.seconds > 0 else "-",
            str(row.tokens),
            "reference" if i == 0 else ("yes" if row.identical else "NO"),
            f"{row.max_score_diff:.2e}",
        )
        for i, row in enumerate(rows)
    ]
    widths = [max(len(cell) for cell in column) for column in zip(header, *body, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) if j == 0 else cell.rjust(width)
            for j, (cell, width) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(cells) for cells in body)])


@contextlib.contextmanager
def _demo_threads(single: bool) -> Iterator[None]:
    """One intra-op thread for the demo's tiny model on the CPU, restored afterwards.

    Its operations are far too small to gain from threads, and on a busy machine OpenMP threads that
    wait for each other make the step-by-step decoding loops many times slower.
    """
    if not single:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass
class TranscribeResult:
    """What :func:`run` did.

    Attributes:
        output_path: the output manifest.
        records: its entries (input entry + ``pred_text`` [+ timestamps]; files that could not be read have
            ``pred_text: null`` and ``error``, the reason).
        failed: ``(audio path, reason)`` of each input that could not be transcribed, then ``(manifest:line,
            reason)`` of each manifest line skipped (not JSON, no ``audio_filepath``, a missing file).
        comparison: the strategy comparison rows, if it ran.
        demo: whether this was the embedded demo (the shipped example utterances, or synthetic audio in a temporary
            folder for a synthetic model).
        model: the model that transcribed.
        wer: NeMo's word error rate over the transcribed inputs that have a reference ``text``; ``None`` if none has.
    """

    output_path: Path
    records: list[dict[str, Any]]
    failed: list[tuple[str, str]]
    comparison: list[StrategyRun] | None
    demo: bool
    model: Any
    wer: float | None = None


def run(
    cfg: TranscribeConfig | DictConfig | dict[str, Any] | None = None,
    *,
    log: Callable[[str], None] = print,
    progress: bool = True,
) -> TranscribeResult:
    """Transcribe as ``scripts/transcribe.py`` does (see :class:`~nemo_fastdecode.config.TranscribeConfig`).

    With neither ``audio_dir`` nor ``dataset_manifest``, runs the embedded demo: ``cfg.model`` (the shipped
    ``trained-tdt`` by default) transcribes the shipped example utterances
    (:data:`~nemo_fastdecode.apps.trained_models.EXAMPLES_MANIFEST`, synthesised English speech) and the demo prints
    each reference, hypothesis and the WER; a synthetic preset (random weights) gets 4 synthetic utterances of 2-6 s
    in a temporary folder instead. Unless ``compare_strategies=false``, the demo then compares ``fast_greedy`` with
    NeMo's ``greedy_batch`` on the same encoder outputs. On the CPU the demo runs PyTorch with one thread.
    Any input with reference ``text`` entries gets its WER reported.

    Args:
        cfg: the configuration (validated with :func:`resolve_config`).
        log: where the banner, transcripts and table go.
        progress: NeMo's progress bar.
    """
    cfg = resolve_config(cfg)
    device = inference_device(cfg.cuda)
    demo = cfg.audio_dir is None and cfg.dataset_manifest is None
    compare = cfg.compare_strategies if cfg.compare_strategies is not None else demo
    output_path = (
        Path(cfg.output_filename) if cfg.output_filename else default_output_path(cfg.audio_dir, cfg.dataset_manifest)
    )

    family = model_family(cfg.model)
    skipped: list[tuple[str, str]] = []  # bad manifest lines: (manifest:line, reason), named as they are read
    with tempfile.TemporaryDirectory(prefix="fastdecode_demo_") as tmp, _demo_threads(demo and device.type == "cpu"):
        if demo and family is None:
            paths = None
            utterances = read_inputs(dataset_manifest=EXAMPLES_MANIFEST)
            log(
                f"No audio_dir or dataset_manifest given: embedded demo on {len(utterances)} example utterances "
                "(English speech synthesised by eSpeak NG, voices the shipped models never heard in training)."
            )
        elif demo:
            log(
                f"No audio_dir or dataset_manifest given: embedded demo on {len(DEMO_DURATIONS)} utterances made for a "
                f"{family.description}."
            )
            paths = write_wavs(family.demo_audio(DEMO_DURATIONS, cfg.seed), tmp, prefix="demo")
            utterances = read_inputs(audio_dir=tmp)
            for utterance in utterances:  # the folder is deleted on exit: keep file names only
                utterance.entry["audio_filepath"] = utterance.audio_path.name
        else:
            paths = None
            utterances = read_inputs(cfg.audio_dir, cfg.dataset_manifest, log=log, skipped=skipped)

        model = load_model(cfg.model, device=device, seed=cfg.seed)
        if cfg.bf16 and device.type != "cuda":
            log(f"bf16=true: bfloat16 autocast applies on a GPU only; running in fp32 on {device}.")
        banner = model_banner(cfg.model, model)
        if banner is not None:
            log(banner)

        decoding = apply_transcribe_decoding(model, cfg.decoding, bool(cfg.timestamps))
        if cfg.offline_path:
            enable_fast_transcribe(model)
        log(f"Model {cfg.model!r} on {device}, decoding strategy {decoding.strategy!r}; {len(utterances)} file(s).")

        records, failed = transcribe_utterances(
            model, utterances, batch_size=cfg.batch_size, timestamps=bool(cfg.timestamps), bf16=cfg.bf16,
            progress=progress, log=log,
        )  # fmt: skip
        unreadable = {path for path, _ in failed}
        readable = [u for u in utterances if str(u.audio_path) not in unreadable]
        write_output_manifest(records, output_path)

        show = len(records) if demo else 10
        wer = report_wer(records, log, show)
        if wer is None:
            for record in records[:show]:
                log(f"{Path(record['audio_filepath']).name}: {record['pred_text']!r}")
            if len(records) > show:
                log(f"... and {len(records) - show} more")
        log(f"Wrote {len(records) - len(failed)} transcript(s) to {output_path}")
        if failed:
            log(f"{len(failed)} of {len(records)} file(s) could not be transcribed (each has an 'error' entry there):")
            log("\n".join(f"  {path}: {reason}" for path, reason in failed))
        if skipped:
            log(f"{len(skipped)} manifest line(s) skipped (not in the output manifest):")
            log("\n".join(f"  {where}: {reason}" for where, reason in skipped))

        comparison = None
        if compare and (paths is not None or readable):
            sample_rate = int(model.cfg.get("sample_rate", 16000))
            audio = (
                family.demo_audio(DEMO_DURATIONS, cfg.seed)
                if paths is not None
                else load_audio([u.audio_path for u in readable], sample_rate, log=None)  # named above
            )
            comparison = compare_strategies(model, audio, decoding=cfg.decoding, batch_size=cfg.batch_size)
            kind = comparison_kind(cfg.decoding)
            log(
                f"\n{kind.capitalize()} decoder comparison on the same fp32 encoder outputs ({len(audio)} utterances, "
                f"{device}; best of 3, encoder excluded):"
            )
            if kind == "greedy" and cfg.decoding.strategy not in ("fast_greedy", "greedy_batch"):
                log(f"(strategy {cfg.decoding.strategy!r} has no counterpart here: greedy rows are compared)")
            log(format_comparison(comparison))
            if device.type == "cpu":
                log("CPU timings of a tiny model: they check the set-up and do not represent GPU decoding speed.")
    return TranscribeResult(output_path, records, failed + skipped, comparison, demo, model, wer)
