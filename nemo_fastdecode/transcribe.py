"""Offline transcription with ``fast_greedy``: the reusable logic behind ``scripts/transcribe.py``.

The script follows NeMo's ``examples/asr/transcribe_speech.py``: a folder of audio or a JSON-lines
manifest in, a manifest with ``pred_text`` (and timestamps on request) out, the decoding strategy
applied with ``model.change_decoding_strategy``. Each step is a function here:

* :func:`load_model` -- a synthetic preset (random weights, calibrated blank bias), a ``.nemo``
  checkpoint or a pretrained name.
* :func:`read_inputs` -- ``audio_dir`` or ``dataset_manifest`` to a list of :class:`Utterance`.
* :func:`apply_decoding` / :func:`transcribe_files` -- the decoding strategy and NeMo's ``transcribe``.
* :func:`output_records` / :func:`write_output_manifest` -- the output manifest.
* :func:`compare_strategies` / :func:`format_comparison` -- ``fast_greedy`` against NeMo's
  ``greedy_batch`` on the same encoder outputs: decode time, tokens, identical hypotheses.
* :func:`run` -- all of the above for a :class:`~nemo_fastdecode.config.TranscribeConfig`, including
  the embedded demo (synthetic model and audio) when no input is given.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from nemo_fastdecode import synthetic
from nemo_fastdecode.comparison import agreement, as_int_list, best_time, decode_all
from nemo_fastdecode.config import TranscribeConfig
from nemo_fastdecode.registry import valid_strategies

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel
    from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis

__all__ = [
    "AUDIO_EXTENSIONS",
    "DEFAULT_OUTPUT_FILENAME",
    "DEMO_DURATIONS",
    "StrategyRun",
    "TranscribeResult",
    "Utterance",
    "apply_decoding",
    "compare_strategies",
    "default_output_path",
    "demo_audio",
    "format_comparison",
    "inference_device",
    "is_synthetic",
    "load_audio",
    "load_model",
    "output_records",
    "read_inputs",
    "resolve_config",
    "run",
    "synthetic_banner",
    "transcribe_files",
    "write_output_manifest",
]

#: File extensions picked up from ``audio_dir`` (case-insensitive).
AUDIO_EXTENSIONS: tuple[str, ...] = (".wav", ".flac")
#: Output manifest of the embedded demo, in the current directory.
DEFAULT_OUTPUT_FILENAME = "transcribe_output.jsonl"
#: Durations (seconds) of the embedded demo's synthetic utterances.
DEMO_DURATIONS: tuple[float, ...] = (5.8, 4.4, 3.1, 2.0)
#: Tokens per encoder frame that synthetic models are calibrated to (trained Parakeet models: about 0.3).
TARGET_TOKENS_PER_FRAME = 0.3


# ----------------------------------------------------------------------------------------------
# configuration and device


def resolve_config(cfg: TranscribeConfig | DictConfig | dict[str, Any] | None = None) -> DictConfig:
    """Validate ``cfg`` against :class:`TranscribeConfig` and fill in its defaults.

    Top-level keys are checked (an unknown key or a value of the wrong type raises). The
    ``decoding`` section may carry further NeMo ``RNNTDecodingConfig`` keys (e.g. ``beam`` for
    ``strategy: beam``); they are passed through to NeMo.
    """
    schema = OmegaConf.structured(TranscribeConfig)
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


def inference_device(cuda: int | None = None) -> torch.device:
    """NeMo's convention: ``None`` -> GPU 0 if available else CPU; ``< 0`` -> CPU; ``k`` -> GPU ``k``."""
    if cuda is None:
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if cuda < 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"cuda={cuda} asks for a GPU but CUDA is not available; use cuda=-1 (or null) for the CPU")
    if cuda >= torch.cuda.device_count():
        raise ValueError(f"cuda={cuda} but only {torch.cuda.device_count()} GPU(s) are visible")
    return torch.device(f"cuda:{cuda}")


# ----------------------------------------------------------------------------------------------
# models


def is_synthetic(name: str) -> bool:
    """True for a synthetic preset name (:data:`nemo_fastdecode.synthetic.PRESETS`)."""
    return name in synthetic.PRESETS


def demo_audio(seed: int = 0) -> list[np.ndarray]:
    """The embedded demo's utterances: :data:`DEMO_DURATIONS` of speech-like synthetic audio (16 kHz)."""
    return synthetic.synthetic_audio(DEMO_DURATIONS, seed=seed)


def load_model(name: str, *, device: str | torch.device = "cpu", seed: int = 0) -> ASRModel:
    """Load a NeMo transducer model by name.

    Args:
        name: a synthetic preset (``tiny-rnnt``, ...; built with random weights by
            :func:`~nemo_fastdecode.synthetic.build_synthetic_model`, then its blank bias is calibrated
            on its own encoder outputs of :func:`demo_audio` so that greedy decoding emits about 0.3
            tokens per frame), a path ending in ``.nemo`` (``ASRModel.restore_from``), or a pretrained
            model name (``ASRModel.from_pretrained``, which needs network access).
        device: where to put the model.
        seed: weights of a synthetic model (ignored otherwise).

    Returns:
        The model in ``eval()`` mode on ``device``.

    Raises:
        FileNotFoundError: a ``.nemo`` path that does not exist.
        RuntimeError: a pretrained name that could not be loaded (e.g. offline).
        ValueError: the model is not a transducer (RNN-T / TDT / hybrid RNN-T) model.
    """
    from nemo.collections.asr.models import ASRModel

    device = torch.device(device)
    if is_synthetic(name):
        model = synthetic.build_synthetic_model(name, seed=seed, device=device)
        audio = demo_audio(seed)
        encoded, lengths = synthetic.encode(model, audio, batch_size=len(audio), device=device)
        model._fastdecode_tokens_per_frame = synthetic.calibrate_blank_bias(
            model, encoded, lengths, TARGET_TOKENS_PER_FRAME, iterations=6, tolerance=0.03
        )
    elif name.endswith(".nemo"):
        if not os.path.isfile(name):
            raise FileNotFoundError(f"model checkpoint {name!r} does not exist")
        model = ASRModel.restore_from(name, map_location=device)
    else:
        if os.path.exists(name):
            raise ValueError(f"model={name!r} is a path but not a .nemo checkpoint; pass a file ending in .nemo")
        try:
            model = ASRModel.from_pretrained(name, map_location=device)
        except Exception as error:
            raise RuntimeError(
                f"could not load pretrained model {name!r} with ASRModel.from_pretrained ({type(error).__name__}: "
                f"{error}). Without network access use a local checkpoint (model=/path/to/model.nemo) or a "
                f"synthetic preset (random weights): {', '.join(synthetic.PRESETS)}"
            ) from error
    _check_transducer(model, name)
    model.eval()
    return model.to(device)


def _check_transducer(model: ASRModel, name: str) -> None:
    from nemo.collections.asr.models import EncDecRNNTModel

    if not isinstance(model, EncDecRNNTModel):
        raise ValueError(
            f"model {name!r} is a {type(model).__name__}, not a transducer (RNN-T / TDT / hybrid RNN-T-CTC) model; "
            "fast_greedy decodes transducer models only"
        )


def _is_hybrid(model: ASRModel) -> bool:
    from nemo.collections.asr.models import EncDecHybridRNNTCTCModel

    return isinstance(model, EncDecHybridRNNTCTCModel)


def synthetic_banner(name: str, tokens_per_frame: float | None = None) -> str:
    """The warning printed whenever a synthetic (random-weight) model transcribes."""
    lines = [
        f"SYNTHETIC MODEL {name!r}: RANDOM, UNTRAINED WEIGHTS -- the transcripts are gibberish.",
        "Real NeMo architecture: decoding speed and exactness are meaningful, the text is not.",
    ]
    if tokens_per_frame is not None:
        lines.append(f"Blank bias calibrated to emit {tokens_per_frame:.2f} tokens/frame (trained models: ~0.3).")
    lines.append("For real transcripts pass a checkpoint: model=/path/to/model.nemo")
    rule = "=" * max(len(line) for line in lines)
    return "\n".join([rule, *lines, rule])


@contextlib.contextmanager
def _quiet_nemo() -> Iterator[None]:
    from nemo.utils import logging as nemo_logging

    with nemo_logging.temp_verbosity(nemo_logging.ERROR):
        yield


# ----------------------------------------------------------------------------------------------
# inputs and outputs


@dataclass
class Utterance:
    """One input: the audio file to read and the manifest entry it came from.

    Attributes:
        audio_path: the resolved path of the audio file.
        entry: the input manifest's entry, unchanged (``{"audio_filepath": ...}`` for ``audio_dir``).
    """

    audio_path: Path
    entry: dict[str, Any]


def read_inputs(
    audio_dir: str | os.PathLike | None = None, dataset_manifest: str | os.PathLike | None = None
) -> list[Utterance]:
    """Read ``audio_dir`` (every ``.wav``/``.flac``, sorted by name) or a JSON-lines ``dataset_manifest``.

    Manifest entries need ``audio_filepath``; a relative path is taken relative to the manifest's
    folder, as NeMo does; other keys (``text``, ``duration``, ...) are kept for the output.

    Raises:
        ValueError: both or neither given, no audio in the folder, an empty manifest, a line that is
            not a JSON object or lacks ``audio_filepath`` (the message names the line).
        FileNotFoundError: the folder, the manifest or an audio file it names does not exist.
    """
    if (audio_dir is None) == (dataset_manifest is None):
        raise ValueError("give exactly one of audio_dir and dataset_manifest")
    if audio_dir is not None:
        folder = Path(audio_dir)
        if not folder.is_dir():
            raise FileNotFoundError(f"audio_dir {str(folder)!r} does not exist or is not a directory")
        files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in AUDIO_EXTENSIONS)
        if not files:
            raise ValueError(f"audio_dir {str(folder)!r} contains no audio files ({', '.join(AUDIO_EXTENSIONS)})")
        return [Utterance(audio_path=p.resolve(), entry={"audio_filepath": str(p.resolve())}) for p in files]

    manifest = Path(dataset_manifest)
    if not manifest.is_file():
        raise FileNotFoundError(f"dataset_manifest {str(manifest)!r} does not exist")
    utterances = []
    with open(manifest, encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            where = f"{manifest}:{line_number}"
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not valid JSON ({error.msg})") from None
            if not isinstance(entry, dict):
                raise ValueError(f"{where}: expected a JSON object per line, got {type(entry).__name__}")
            if "audio_filepath" not in entry:
                raise ValueError(f"{where}: entry has no 'audio_filepath' (keys: {', '.join(entry) or 'none'})")
            path = Path(entry["audio_filepath"]).expanduser()
            if not path.is_absolute():
                path = manifest.parent / path
            if not path.is_file():
                raise FileNotFoundError(f"{where}: audio_filepath {entry['audio_filepath']!r} not found ({path})")
            utterances.append(Utterance(audio_path=path.resolve(), entry=entry))
    if not utterances:
        raise ValueError(f"dataset_manifest {str(manifest)!r} has no entries")
    return utterances


def default_output_path(audio_dir: str | os.PathLike | None, dataset_manifest: str | os.PathLike | None) -> Path:
    """Where the output manifest goes when ``output_filename`` is not given.

    ``dir/test.jsonl`` -> ``dir/test_transcribed.jsonl``; ``data/wavs/`` -> ``data/wavs_transcribed.jsonl``;
    neither (the demo) -> ``./transcribe_output.jsonl``.
    """
    if dataset_manifest is not None:
        manifest = Path(dataset_manifest)
        return manifest.with_name(f"{manifest.stem}_transcribed.jsonl")
    if audio_dir is not None:
        folder = Path(audio_dir).resolve()
        return folder.with_name(f"{folder.name}_transcribed.jsonl")
    return Path(DEFAULT_OUTPUT_FILENAME)


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def output_records(
    utterances: Sequence[Utterance], hypotheses: Sequence[Hypothesis], timestamps: bool = False
) -> list[dict[str, Any]]:
    """The output manifest's entries: each input entry plus ``pred_text``.

    With ``timestamps``, the keys of ``hypothesis.timestamp`` (``word``, ``char``, ``segment``:
    lists of dicts with ``start_offset``/``end_offset`` in encoder frames and ``start``/``end`` in
    seconds) are added as in NeMo's ``transcribe_speech.py``; the raw per-token ``timestep`` is left out.
    """
    if len(utterances) != len(hypotheses):
        raise ValueError(f"{len(utterances)} utterances but {len(hypotheses)} hypotheses")
    records = []
    for utterance, hyp in zip(utterances, hypotheses, strict=True):
        record = dict(utterance.entry)
        record["pred_text"] = hyp.text
        if timestamps:
            if not isinstance(hyp.timestamp, dict):
                raise ValueError(
                    f"timestamps were requested but the hypothesis of {utterance.audio_path} has none; "
                    "decode with compute_timestamps=true"
                )
            for key, values in hyp.timestamp.items():
                if key != "timestep":
                    record[key] = _jsonable(values)
        records.append(record)
    return records


def write_output_manifest(records: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path:
    """Write ``records`` as JSON lines (UTF-8, non-ASCII kept) to ``path``, creating its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


# ----------------------------------------------------------------------------------------------
# decoding and transcription


def apply_decoding(model: ASRModel, decoding: DictConfig | dict[str, Any], verbose: bool = False) -> None:
    """Apply a decoding section: ``model.change_decoding_strategy`` (the RNN-T head of a hybrid model).

    ``decoding`` is merged over the model's current ``cfg.decoding`` first, as NeMo users do by hand
    (``cfg = model.cfg.decoding; cfg.strategy = ...``), so that what belongs to the model is kept:
    ``model_type: tdt`` and ``durations`` of a TDT model, timestamp settings, the ``beam`` section.
    NeMo then fills in its ``RNNTDecodingConfig`` defaults; an unknown strategy raises and lists the
    valid ones.
    """
    current = model.cfg.get("decoding") or {}
    if isinstance(current, DictConfig):  # plain (untyped) nodes: NeMo and the registry edit the config
        current = OmegaConf.to_container(current, resolve=True)
    if isinstance(decoding, DictConfig):
        decoding = OmegaConf.to_container(decoding, resolve=True)
    merged = OmegaConf.merge(OmegaConf.create(current), OmegaConf.create(copy.deepcopy(decoding)))
    kwargs = {"decoder_type": "rnnt"} if _is_hybrid(model) else {}
    model.change_decoding_strategy(merged, verbose=verbose, **kwargs)


def _autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager:
    if bf16 and device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _model_device(model: ASRModel) -> torch.device:
    return next(model.parameters()).device


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
    device = _model_device(model)
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


def load_audio(paths: Sequence[str | os.PathLike], sample_rate: int) -> list[np.ndarray]:
    """Read audio files as mono float32 arrays at ``sample_rate`` (resampled where needed), as NeMo does."""
    from nemo.collections.asr.parts.preprocessing.segment import AudioSegment

    return [AudioSegment.from_file(str(p), target_sr=sample_rate).samples.astype(np.float32) for p in paths]


# ----------------------------------------------------------------------------------------------
# strategy comparison


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


def _comparison_configs(
    model: ASRModel, decoding: DictConfig | dict[str, Any] | None
) -> list[tuple[str, dict[str, Any]]]:
    """NeMo's baselines (no CUDA graphs) first, then ``fast_greedy`` with the user's greedy options."""
    user = OmegaConf.to_container(decoding, resolve=True) if isinstance(decoding, DictConfig) else dict(decoding or {})
    user_greedy = dict(user.get("greedy") or {}) if user.get("strategy") == "fast_greedy" else {}
    is_tdt = model.cfg.decoding.get("model_type", "rnnt") == "tdt" or bool(model.cfg.decoding.get("durations"))
    max_symbols = user_greedy.get("max_symbols", 10)
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
    """Time ``fast_greedy`` against NeMo's ``greedy_batch`` on the same encoder outputs, in fp32.

    The encoder runs once; each strategy then decodes every batch (one warm-up pass, then the best
    of ``repeats`` passes). The first row, NeMo's ``greedy_batch`` without CUDA graphs (frame
    looping for RNN-T, label looping for TDT), is the reference the others are checked against:
    a row is ``identical`` when every hypothesis has the same tokens and per-token timestamps.
    The model's decoding configuration is restored afterwards.

    Args:
        model: a transducer model.
        audio: mono float arrays at the model's sample rate (see :func:`load_audio`).
        decoding: the user's decoding section; its ``fast_greedy`` greedy options are used for our rows.
        batch_size: utterances per encoder/decoder batch.
        repeats: timed passes per strategy (the best is reported).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    device = _model_device(model)
    encoded, lengths = synthetic.encode(model, audio, batch_size=batch_size, device=device)
    batches = list(zip(encoded, lengths, strict=True))
    original = copy.deepcopy(model.cfg.decoding)
    rows: list[StrategyRun] = []
    reference: list[Hypothesis] | None = None
    try:
        for name, config in _comparison_configs(model, decoding):
            with _quiet_nemo():
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
        with _quiet_nemo():
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


# ----------------------------------------------------------------------------------------------
# the script


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
        records: its entries (input entry + ``pred_text`` [+ timestamps]).
        comparison: the strategy comparison rows, if it ran.
        demo: whether this was the embedded demo (synthetic audio in a temporary folder).
        model: the model that transcribed.
    """

    output_path: Path
    records: list[dict[str, Any]]
    comparison: list[StrategyRun] | None
    demo: bool
    model: Any


def run(
    cfg: TranscribeConfig | DictConfig | dict[str, Any] | None = None,
    *,
    log: Callable[[str], None] = print,
    progress: bool = True,
) -> TranscribeResult:
    """Transcribe as ``scripts/transcribe.py`` does (see :class:`~nemo_fastdecode.config.TranscribeConfig`).

    With neither ``audio_dir`` nor ``dataset_manifest``, runs the embedded demo: the synthetic model
    ``cfg.model`` (``tiny-rnnt`` by default, random weights), 4 synthetic utterances of 2-6 s written to
    a temporary folder, transcripts printed, and (unless ``compare_strategies=false``) the comparison
    of ``fast_greedy`` with NeMo's ``greedy_batch``. On the CPU the demo runs PyTorch with one thread.

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

    with tempfile.TemporaryDirectory(prefix="fastdecode_demo_") as tmp, _demo_threads(demo and device.type == "cpu"):
        if demo:
            log(f"No audio_dir or dataset_manifest given: embedded demo on {len(DEMO_DURATIONS)} synthetic utterances.")
            paths = synthetic.write_wavs(demo_audio(cfg.seed), tmp, prefix="demo")
            utterances = read_inputs(audio_dir=tmp)
            for utterance in utterances:  # the folder is deleted on exit: keep file names only
                utterance.entry["audio_filepath"] = utterance.audio_path.name
        else:
            paths = None
            utterances = read_inputs(cfg.audio_dir, cfg.dataset_manifest)

        model = load_model(cfg.model, device=device, seed=cfg.seed)
        if cfg.bf16 and device.type != "cuda":
            log(f"bf16=true: bfloat16 autocast applies on a GPU only; running in fp32 on {device}.")
        if is_synthetic(cfg.model):
            log(synthetic_banner(cfg.model, getattr(model, "_fastdecode_tokens_per_frame", None)))

        decoding = copy.deepcopy(cfg.decoding)
        with open_dict(decoding):
            decoding.compute_timestamps = bool(cfg.timestamps)
        apply_decoding(model, decoding)
        log(f"Model {cfg.model!r} on {device}, decoding strategy {decoding.strategy!r}; {len(utterances)} file(s).")

        hyps = transcribe_files(
            model,
            [u.audio_path for u in utterances],
            batch_size=cfg.batch_size,
            timestamps=bool(cfg.timestamps),
            bf16=cfg.bf16,
            progress=progress,
        )
        records = output_records(utterances, hyps, timestamps=bool(cfg.timestamps))
        write_output_manifest(records, output_path)

        shown = records if demo or len(records) <= 10 else records[:10]
        for record in shown:
            log(f"{Path(record['audio_filepath']).name}: {record['pred_text']!r}")
        if len(shown) < len(records):
            log(f"... and {len(records) - len(shown)} more")
        log(f"Wrote {len(records)} transcript(s) to {output_path}")

        comparison = None
        if compare:
            sample_rate = int(model.cfg.get("sample_rate", synthetic.SAMPLE_RATE))
            audio = (
                demo_audio(cfg.seed)
                if paths is not None
                else load_audio([u.audio_path for u in utterances], sample_rate)
            )
            comparison = compare_strategies(model, audio, decoding=cfg.decoding, batch_size=cfg.batch_size)
            log(
                f"\nDecoder comparison on the same fp32 encoder outputs ({len(audio)} utterances, {device}; "
                f"best of 3, encoder excluded):"
            )
            log(format_comparison(comparison))
    return TranscribeResult(output_path=output_path, records=records, comparison=comparison, demo=demo, model=model)
