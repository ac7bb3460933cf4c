"""Emission statistics of a greedy transducer decoder: how often, and in what pattern, it emits tokens.

Decoder speed depends on this pattern, not only on the number of tokens: a frame-looping decoder runs one inner
step per token of a frame, a label-looping one skips blank frames. Every statistic here is counted over *encoder
frames*, for RNN-T and TDT alike:

* a frame *emits* when at least one token's timestamp (``Hypothesis.timestamp``) is that frame; its *burst* is the
  number of tokens it emits (at most ``max_symbols``);
* a *blank run* is a maximal stretch of consecutive frames that emit nothing, including the stretches before the
  first and after the last emitting frame. The frames a TDT decoder jumps over (a duration above 1) count as frames
  that emit nothing, like frames where it predicts blank: TDT's statistics are therefore comparable with RNN-T's, and
  its durations are reported separately (the duration predicted with each emitted token; the steps that predict
  blank are not in the hypotheses).

The statistics of the shipped trained models (:mod:`~nemo_fastdecode.apps.trained_models`), measured with NeMo's
greedy decoding on the tiny-model recipe's held-out test set, are in ``nemo_fastdecode/assets/emission_statistics.json``
(:func:`trained_emission_stats`; reproduced by :func:`write_trained_emission_stats`). The benchmarks' ``trained``
calibration (:func:`~fastdecode_lab.synthetic.calibrate_trained_like`) makes synthetic models emit like them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from nemo_fastdecode.apps.trained_models import ASSETS_DIR

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

#: the shipped statistics of the trained models (see :func:`write_trained_emission_stats`)
EMISSION_STATISTICS_PATH = ASSETS_DIR / "emission_statistics.json"

#: transducer kind -> the shipped trained model whose statistics stand for it (the hybrid's RNN-T head for RNN-T)
TRAINED_REFERENCE_MODELS: dict[str, str] = {"rnnt": "trained-streaming", "tdt": "trained-tdt"}

#: blank runs of this many frames or more share the last histogram bucket (``"64+"``)
BLANK_RUN_BUCKETS = 64


@dataclass
class EmissionStats:
    """Emission statistics over encoder frames (see the module docstring for the definitions).

    Attributes:
        tokens_per_frame: tokens / frames.
        tokens_per_emitting_frame: tokens / emitting frames, the mean burst length.
        mean_blank_run: mean length of the blank runs, in frames.
        emitting_frame_share: emitting frames / frames.
        frames: sum of the encoded lengths.
        tokens: tokens emitted.
        burst_histogram: tokens of a frame (``"1"``, ``"2"``, ...) -> number of emitting frames.
        blank_run_histogram: run length (``"1"`` ... ``"63"``, ``"64+"``) -> number of blank runs.
        duration_histogram: TDT only: duration predicted with a token (``"0"``, ``"1"``, ...) -> number of tokens.
    """

    tokens_per_frame: float
    tokens_per_emitting_frame: float
    mean_blank_run: float
    emitting_frame_share: float = 0.0
    frames: int = 0
    tokens: int = 0
    burst_histogram: dict[str, int] = field(default_factory=dict)
    blank_run_histogram: dict[str, int] = field(default_factory=dict)
    duration_histogram: dict[str, int] | None = None

    def summary(self) -> str:
        """One line: tokens/frame, burst length, emitting share and mean blank run."""
        return (
            f"{self.tokens_per_frame:.3f} tokens/frame, {self.tokens_per_emitting_frame:.2f} tokens per emitting "
            f"frame, {self.emitting_frame_share:.1%} of frames emit, mean blank run {self.mean_blank_run:.1f} frames"
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EmissionStats:
        """The inverse of ``dataclasses.asdict``."""
        return cls(**data)


def _steps(hyp: Any) -> list[int]:
    stamps = hyp.timestamp["timestep"] if isinstance(hyp.timestamp, dict) else hyp.timestamp
    return [int(t) for t in (stamps.tolist() if isinstance(stamps, torch.Tensor) else stamps)]


def emission_stats(hyps: Sequence[Any], lengths: Iterable[int] | None = None) -> EmissionStats:
    """Emission statistics of greedy hypotheses.

    Args:
        hyps: NeMo ``Hypothesis`` objects (or anything with ``timestamp``: the frame index of each token, a list,
            a tensor or NeMo's ``{"timestep": ...}`` dict; ``length``: the encoded length; for TDT
            ``token_duration``, the duration of each token, used where present and non-empty).
        lengths: the encoded length of each hypothesis, where the hypotheses do not carry it (NeMo's greedy infer
            modules leave ``length`` at 0; ``transcribe`` sets it). ``None``: ``hyp.length``.

    Returns:
        The statistics over all hypotheses together.
    """
    lengths = list(lengths) if lengths is not None else [None] * len(hyps)
    if len(lengths) != len(hyps):
        raise ValueError(f"got {len(hyps)} hypotheses but {len(lengths)} lengths")
    tokens = frames = 0
    bursts: Counter[int] = Counter()
    runs: Counter[int] = Counter()
    durations: Counter[int] = Counter()
    has_durations = False
    for hyp, length in zip(hyps, lengths, strict=True):
        steps = _steps(hyp)
        if length is None:
            length = int(hyp.length) if getattr(hyp, "length", None) is not None else 0
        length = max(int(length), max(steps) + 1 if steps else 0)
        tokens, frames = tokens + len(steps), frames + length
        per_frame = Counter(steps)
        bursts.update(per_frame.values())
        distinct = sorted(per_frame)
        runs.update(b - a - 1 for a, b in zip([-1, *distinct], [*distinct, length], strict=True) if b - a - 1 > 0)
        token_duration = getattr(hyp, "token_duration", None)
        if token_duration is not None and len(token_duration) > 0:
            has_durations = True
            durations.update(int(d) for d in token_duration)
    emitting = sum(bursts.values())
    run_count = sum(runs.values())
    run_histogram: Counter[str] = Counter()
    for run, count in runs.items():
        run_histogram[str(run) if run < BLANK_RUN_BUCKETS else f"{BLANK_RUN_BUCKETS}+"] += count
    by_length = sorted(run_histogram, key=lambda k: int(k.rstrip("+")))
    return EmissionStats(
        tokens_per_frame=tokens / max(frames, 1),
        tokens_per_emitting_frame=tokens / max(emitting, 1),
        mean_blank_run=sum(r * c for r, c in runs.items()) / run_count if run_count else 0.0,
        emitting_frame_share=emitting / max(frames, 1),
        frames=frames,
        tokens=tokens,
        burst_histogram={str(k): bursts[k] for k in sorted(bursts)},
        blank_run_histogram={k: run_histogram[k] for k in by_length},
        duration_histogram={str(k): durations[k] for k in sorted(durations)} if has_durations else None,
    )


def model_emission_stats(model: ASRModel, audio_paths: Sequence[str], batch_size: int = 32) -> EmissionStats:
    """Emission statistics of NeMo's own greedy decoding (``greedy_batch``, fp32) of ``model`` on audio files.

    Runs ``model.transcribe`` on the model's device without autocast; a hybrid RNN-T/CTC model decodes with its
    RNN-T head; TDT models report their token durations. The model's decoding strategy is left changed (greedy,
    RNN-T head, token durations on) and its modules in eval mode.
    """
    from omegaconf import open_dict

    decoding = model.cfg.decoding.copy()
    with open_dict(decoding):
        decoding.strategy = "greedy_batch"
        decoding.tdt_include_token_duration = True
    kwargs = {"decoder_type": "rnnt"} if hasattr(model, "cur_decoder") else {}
    model.change_decoding_strategy(decoding, verbose=False, **kwargs)
    with torch.inference_mode():
        hyps = model.transcribe(list(audio_paths), batch_size=batch_size, return_hypotheses=True, verbose=False)
    model.eval()  # NeMo's transcribe leaves the modules in train mode
    return emission_stats(hyps[0] if isinstance(hyps, tuple) else hyps)


def write_trained_emission_stats(
    manifest: str | Path,
    path: str | Path = EMISSION_STATISTICS_PATH,
    assets_dir: Path = ASSETS_DIR,
    batch_size: int = 32,
    max_utterances: int | None = None,
) -> dict[str, Any]:
    """Measure the shipped trained models' emission statistics on a test manifest and write them as JSON.

    Each model of :data:`TRAINED_REFERENCE_MODELS` is loaded on the CPU and decoded in fp32 with
    :func:`model_emission_stats`. The JSON holds, per transducer kind (``rnnt``, ``tdt``), the model's name, the
    manifest's name and size, and the statistics; it is what :func:`trained_emission_stats` reads.

    Args:
        manifest: a JSON-lines manifest (``audio_filepath`` relative to it or absolute), e.g. the tiny-model
            recipe's ``manifests/test.jsonl``.
        path: where to write the JSON.
        assets_dir: where the shipped ``.nemo`` files are.
        batch_size: ``transcribe`` batch size.
        max_utterances: only the first utterances of the manifest; ``None``: all.

    Returns:
        The JSON content.
    """
    from nemo.collections.asr.models import ASRModel

    from nemo_fastdecode.apps.manifests import read_manifest
    from nemo_fastdecode.apps.trained_models import trained_model_path

    entries = read_manifest(manifest)[:max_utterances]
    paths = [e["audio_filepath"] for e in entries]
    content: dict[str, Any] = {}
    for kind, name in TRAINED_REFERENCE_MODELS.items():
        model = ASRModel.restore_from(str(trained_model_path(name, assets_dir)), map_location="cpu")
        stats = model_emission_stats(model, paths, batch_size)
        content[kind] = {
            "model": name,
            "decoding": "NeMo greedy_batch, fp32, CPU" + (", RNN-T head" if kind == "rnnt" else ""),
            "test_set": Path(manifest).name,
            "utterances": len(paths),
            "audio_seconds": round(sum(float(e.get("duration", 0.0)) for e in entries), 1),
            "statistics": asdict(stats),
        }
        del model
    with open(path, "w", encoding="utf8") as f:
        json.dump(content, f, indent=1)
        f.write("\n")
    return content


def trained_emission_stats(kind: str, path: str | Path = EMISSION_STATISTICS_PATH) -> EmissionStats:
    """The shipped trained model's emission statistics for ``kind`` (``"rnnt"`` or ``"tdt"``).

    Raises:
        ValueError: unknown ``kind``.
        FileNotFoundError: the JSON is missing (write it with :func:`write_trained_emission_stats`).
    """
    if kind not in TRAINED_REFERENCE_MODELS:
        raise ValueError(f"unknown transducer kind {kind!r}; valid kinds: {', '.join(TRAINED_REFERENCE_MODELS)}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist; write it with fastdecode_lab.emissions.write_trained_emission_stats "
            "(scripts/train_tiny_models.py stages=[ship])"
        )
    with open(path, encoding="utf8") as f:
        return EmissionStats.from_dict(json.load(f)[kind]["statistics"])


def trained_emission_stats_for(model: ASRModel) -> EmissionStats | None:
    """The shipped statistics of the trained model of ``model``'s kind (TDT if its joint has duration outputs, else
    RNN-T); ``None`` where the JSON is missing."""
    kind = "tdt" if int(getattr(model.joint, "num_extra_outputs", 0) or 0) > 0 else "rnnt"
    try:
        return trained_emission_stats(kind)
    except FileNotFoundError:
        return None


def emission_report_lines(achieved: EmissionStats | None, trained: EmissionStats | None, source: str) -> list[str]:
    """Markdown lines for a benchmark report: a test set's statistics (measured on ``source``'s hypotheses) next to
    the trained model's, each followed by a blank line."""
    lines = [f"Emissions ({source}): {achieved.summary()}.", ""] if achieved else []
    if trained:
        lines += [f"Trained model of the same kind, held-out test set: {trained.summary()}.", ""]
    return lines
