"""Audio inputs (a folder or a NeMo JSON-lines manifest) and output manifests, as NeMo's ``transcribe_speech.py`` reads and writes them."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis


#: File extensions picked up from ``audio_dir`` (case-insensitive).
AUDIO_EXTENSIONS: tuple[str, ...] = (".wav", ".flac")


#: Output manifest of the embedded demo, in the current directory.
DEFAULT_OUTPUT_FILENAME = "outputs/transcribe_output.jsonl"


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
    audio_dir: str | os.PathLike | None = None,
    dataset_manifest: str | os.PathLike | None = None,
    *,
    strict: bool = False,
    log: Callable[[str], None] = print,
    skipped: list[tuple[str, str]] | None = None,
) -> list[Utterance]:
    """Read ``audio_dir`` (every ``.wav``/``.flac``, sorted by name) or a JSON-lines ``dataset_manifest``.

    Manifest entries need ``audio_filepath``; a relative path is taken relative to the manifest's
    folder, as NeMo does; other keys (``text``, ``duration``, ...) are kept for the output.

    A bad manifest line (not a JSON object, no ``audio_filepath``, an audio file that does not exist) is named
    through ``log`` (``manifest:line: reason``) and skipped, and ``(manifest:line, reason)`` appended to ``skipped``
    when given; the other lines are read all the same. ``strict=True`` raises at the first one instead.

    Raises:
        ValueError: both or neither given, no audio in the folder, a manifest with no usable entry; with ``strict``,
            a line that is not a JSON object or lacks ``audio_filepath`` (the message names the line).
        FileNotFoundError: the folder or the manifest does not exist; with ``strict``, an audio file it names.
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
    bad: list[tuple[str, str]] = []
    with open(manifest, encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            where = f"{manifest}:{line_number}"
            try:
                utterances.append(_manifest_line(manifest, line))
            except (ValueError, FileNotFoundError) as error:
                if strict:
                    raise type(error)(f"{where}: {error}") from None
                log(f"Skipping {where}: {error}")
                bad.append((where, str(error)))
    if skipped is not None:
        skipped.extend(bad)
    if not utterances:
        reasons = "".join(f"; {where}: {reason}" for where, reason in bad[:3]) + ("; ..." if len(bad) > 3 else "")
        raise ValueError(f"dataset_manifest {str(manifest)!r} has no {'usable ' if bad else ''}entries{reasons}")
    if bad:
        log(f"{len(bad)} line(s) of {manifest} skipped (named above); {len(utterances)} entries read.")
    return utterances


def _manifest_line(manifest: Path, line: str) -> Utterance:
    """One manifest line's :class:`Utterance`; ``ValueError`` / ``FileNotFoundError`` say what is wrong with it."""
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"not valid JSON ({error.msg})") from None
    if not isinstance(entry, dict):
        raise ValueError(f"expected a JSON object per line, got {type(entry).__name__}")
    if "audio_filepath" not in entry:
        raise ValueError(f"entry has no 'audio_filepath' (keys: {', '.join(entry) or 'none'})")
    path = Path(entry["audio_filepath"]).expanduser()
    if not path.is_absolute():
        path = manifest.parent / path
    if not path.is_file():
        raise FileNotFoundError(f"audio_filepath {entry['audio_filepath']!r} not found ({path})")
    return Utterance(audio_path=path.resolve(), entry=entry)


def default_output_path(audio_dir: str | os.PathLike | None, dataset_manifest: str | os.PathLike | None) -> Path:
    """Where the output manifest goes when ``output_filename`` is not given.

    ``dir/test.jsonl`` -> ``dir/test_transcribed.jsonl``; ``data/wavs/`` -> ``data/wavs_transcribed.jsonl``;
    neither (the demo) -> ``outputs/transcribe_output.jsonl`` (a folder git ignores).
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


def load_audio(
    paths: Sequence[str | os.PathLike], sample_rate: int, log: Callable[[str], None] | None = print
) -> list[np.ndarray]:
    """Read audio files as mono float32 arrays at ``sample_rate`` (resampled where needed, as NeMo does; ``log`` gets
    one line naming the files resampled and their rates, :func:`resampling_note`)."""
    from nemo.collections.asr.parts.preprocessing.segment import AudioSegment

    note = resampling_note(paths, sample_rate) if log is not None else None
    if note is not None:
        log(note)
    return [AudioSegment.from_file(str(p), target_sr=sample_rate).samples.astype(np.float32) for p in paths]


def resampling_note(paths: Sequence[str | os.PathLike], sample_rate: int, show: int = 5) -> str | None:
    """One line naming the files whose rate is not ``sample_rate`` (resampled to it as they are read) and their rates,
    e.g. ``Resampled 2 of 6 file(s) to the model's 16000 Hz: a.wav (8000 Hz), b.wav (44100 Hz)``; ``None`` when
    every file is at ``sample_rate`` (files that cannot be read are left to :func:`audio_problem`)."""
    import soundfile as sf

    other = []
    for path in paths:
        try:
            rate = sf.info(str(path)).samplerate
        except Exception:  # unreadable: reported elsewhere
            continue
        if rate != sample_rate:
            other.append(f"{Path(path).name} ({rate} Hz)")
    if not other:
        return None
    more = f", ... and {len(other) - show} more" if len(other) > show else ""
    return (
        f"Resampled {len(other)} of {len(paths)} file(s) to the model's {sample_rate} Hz: {', '.join(other[:show])}"
        f"{more}"
    )


def audio_problem(path: str | os.PathLike) -> str | None:
    """Why NeMo's ``transcribe`` could not read ``path`` (corrupt, not audio, empty, more than one channel), or
    ``None`` when it can: the file is decoded once here, so that one bad file is reported instead of stopping
    the batch it would land in."""
    import soundfile as sf

    try:
        data, _ = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as error:  # soundfile raises LibsndfileError, RuntimeError, TypeError ... by format
        return f"cannot be decoded as audio ({type(error).__name__}: {str(error).strip() or 'no detail'})"
    if data.shape[0] == 0:
        return "has no samples"
    if data.shape[1] != 1:
        return f"has {data.shape[1]} channels; the model takes mono audio (mix it down first, e.g. sox in.wav -c 1 out.wav)"
    if not np.isfinite(data).all():
        return "has NaN or inf samples"
    return None


def write_wavs(
    audios: Sequence[np.ndarray], out_dir: str | os.PathLike, sample_rate: int = 16000, prefix: str = "utt"
) -> list[Path]:
    """Write mono float arrays in [-1, 1) as 16-bit PCM WAV files ``{prefix}_{i:05d}.wav``; return their paths."""
    import soundfile as sf

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, audio in enumerate(audios):
        path = out / f"{prefix}_{i:05d}.wav"
        sf.write(str(path), np.asarray(audio, dtype=np.float32), sample_rate, subtype="PCM_16")
        paths.append(path)
    return paths


def read_manifest(path: str | os.PathLike) -> list[dict[str, Any]]:
    """A JSON-lines manifest's entries, ``audio_filepath`` made absolute (relative paths are relative to it)."""
    folder = Path(path).parent
    entries = []
    with open(path, encoding="utf8") as f:
        for line in f:
            if line.strip():
                entry = json.loads(line)
                entry["audio_filepath"] = str((folder / entry["audio_filepath"]).resolve())
                entries.append(entry)
    return entries
