"""Speech from several synthesisers, augmented and joined into multi-utterance examples, and the evaluation splits.

Engines: Festival with Debian's English festvox voices; Flite, the held-out engine, which only ever speaks evaluation
splits (:func:`plan_splits` refuses it in training); and eSpeak NG through :mod:`.speech`'s workers (whose own
single-utterance splits are unchanged) for augmented multi-utterance eSpeak examples. Festival and Flite run as
programs: from ``synthesisers_dir/bin`` (the relocatable copy of ``scripts/pack_synthesisers.sh``, for hosts
without apt) or from ``PATH``.

Splits (each a manifest under ``{root}/manifests/``):

* ``train_{engine}`` -- training sentences, the engine's training voices; each example joins 1 to N utterances with
  pauses and goes through :func:`.augment.augment`;
* ``test_{engine}_voices`` -- test sentences (never in training) by the engine's held-out voices;
* ``test_{engine}_sentences`` -- test sentences by the engine's training voices;
* ``test_{engine}`` for an evaluation-only engine (Flite) -- test sentences by all its voices.

Evaluation examples are single utterances, not augmented unless ``augment_eval``. Every example's audio depends on
its own request alone (festival and flite are deterministic; the augmentation is seeded by the example), so files
that exist are kept and an interrupted run continues.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fastdecode_lab.tiny_models import speech
from fastdecode_lab.tiny_models.augment import AugmentConfig, augment
from fastdecode_lab.tiny_models.espeak_worker import SAMPLE_RATE

#: the engines this module runs, and the English voices Debian packages for each
ENGINE_VOICES: dict[str, tuple[str, ...]] = {
    "espeak": tuple(
        speech.voice_name(accent, variant)
        for accent in speech.ACCENTS
        for variant in speech.TRAIN_VARIANTS + speech.HELD_OUT_VARIANTS
    ),
    "festival": ("kal_diphone", "ked_diphone", "cmu_us_slt_arctic_hts"),
    "flite": ("kal", "kal16", "awb", "rms", "slt"),
}
#: eSpeak NG voices of the default ``train_espeak`` split (its pause-joined, augmented examples): one per accent
ESPEAK_EXAMPLE_VOICES: tuple[str, ...] = (
    "en-us+m3",
    "en+f2",
    "en-gb-scotland+klatt",
    "en-gb-x-rp+f1",
    "en-029+m7",
    "en-us-nyc+max",
    "en-gb-x-gbclan+Andy",
    "en-gb-x-gbcwmd+linda",
)
#: engines that never speak a training example
EVAL_ONLY_ENGINES: tuple[str, ...] = ("flite",)
# beside the manifests: the examples already written, one JSON line each, appended chunk by chunk
PROGRESS_JOURNAL = ".examples_written.jsonl"


@dataclass
class VoicesConfig:
    """The multi-synthesiser data of ``train_tiny_models``'s data stage (``voices:`` in its YAML).

    Attributes:
        engines: the engines used, among those the tables name; ``[]``: eSpeak NG only, as before.
        train_voices: engine -> the voices that speak its ``train_{engine}`` split (and ``test_{engine}_sentences``).
        held_out_voices: engine -> voices heard only in ``test_{engine}_voices``.
        eval_only: engine -> voices heard only in ``test_{engine}`` (Flite, the held-out engine).
        num_train: training examples per trained engine.
        num_test: utterances per evaluation split.
        utterances_per_example: the range of utterances a training example joins.
        pause_seconds: the range of each pause between them.
        max_example_seconds: utterances past this length are left out of the example (the models' ``max_duration``
            is 20 s).
        duration_stretch: Festival's ``Duration_Stretch`` range (speaking rate).
        augment: the augmentation of training examples.
        augment_eval: augment the evaluation splits too.
        synthesisers_dir: the packed synthesisers (``scripts/pack_synthesisers.sh``); ``None``: the programs on
            ``PATH``.
    """

    engines: list[str] = field(default_factory=lambda: ["espeak", "festival", "flite"])
    train_voices: dict[str, list[str]] = field(
        default_factory=lambda: {
            "espeak": list(ESPEAK_EXAMPLE_VOICES),
            "festival": ["kal_diphone", "cmu_us_slt_arctic_hts"],
        }
    )
    held_out_voices: dict[str, list[str]] = field(default_factory=lambda: {"festival": ["ked_diphone"]})
    eval_only: dict[str, list[str]] = field(default_factory=lambda: {"flite": list(ENGINE_VOICES["flite"])})
    num_train: int = 16000
    num_test: int = 300
    utterances_per_example: tuple[int, int] = (1, 4)
    pause_seconds: tuple[float, float] = (0.15, 1.5)
    max_example_seconds: float = 18.0
    duration_stretch: tuple[float, float] = (0.8, 1.25)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    augment_eval: bool = False
    synthesisers_dir: str | None = None

    def used(self, table: str) -> dict[str, list[str]]:
        """``train_voices``, ``held_out_voices`` or ``eval_only`` restricted to :attr:`engines`."""
        return {engine: list(v) for engine, v in getattr(self, table).items() if engine in self.engines}


@dataclass(frozen=True)
class Utterance:
    """One synthesised sentence of an example."""

    engine: str
    voice: str
    text: str
    stretch: float = 1.0


@dataclass(frozen=True)
class ExampleRequest:
    """One audio file: its utterances joined by ``pauses`` (one fewer), then augmented with ``seed`` if ``augment``."""

    path: str
    utterances: tuple[Utterance, ...]
    pauses: tuple[float, ...]
    seed: int
    augment: bool


# ---- the engines ---------------------------------------------------------------------------------------------------
def executable(engine: str, synthesisers_dir: str | os.PathLike | None = None) -> str | None:
    """The program that runs ``engine``: the packed launcher under ``synthesisers_dir/bin``, else the one on
    ``PATH``; ``None`` where there is neither."""
    if engine not in ENGINE_VOICES:
        raise ValueError(f"unknown engine {engine!r}; valid engines: {', '.join(ENGINE_VOICES)}")
    if engine == "espeak":  # the espeakng-loader wheel, through speech.py's worker processes
        import importlib.util

        return speech.espeak_worker.__file__ if importlib.util.find_spec("espeakng_loader") else None
    if synthesisers_dir is not None:
        packed = Path(synthesisers_dir) / "bin" / engine
        return str(packed) if os.access(packed, os.X_OK) else None
    return shutil.which(engine)


def _to_16k(path: str | os.PathLike) -> np.ndarray:
    """A WAV file as float32 samples at 16 kHz (polyphase resampling where it is at another rate)."""
    import soundfile as sf
    from scipy.signal import resample_poly

    audio, rate = sf.read(path, dtype="float32", always_2d=True)
    audio = audio.mean(axis=1)
    if rate != SAMPLE_RATE:
        divisor = np.gcd(SAMPLE_RATE, rate)
        audio = resample_poly(audio, SAMPLE_RATE // divisor, rate // divisor).astype(np.float32)
    return audio


def _scheme_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def festival_speak(
    utterances: Sequence[Utterance], synthesisers_dir: str | os.PathLike | None = None
) -> list[np.ndarray]:
    """Every utterance spoken by one Festival process (one start-up for all): float32 16 kHz audio each."""
    program = executable("festival", synthesisers_dir)
    if program is None:
        raise FileNotFoundError(f"festival not found (synthesisers_dir={synthesisers_dir!r}, PATH)")
    with tempfile.TemporaryDirectory(prefix="festival_") as folder:
        lines, voice = [], None
        for index, utterance in enumerate(utterances):
            if utterance.voice != voice:
                lines.append(f"(voice_{utterance.voice})")
                voice = utterance.voice
            wav = os.path.join(folder, f"{index}.wav")
            lines.append(f"(Parameter.set 'Duration_Stretch {utterance.stretch:.3f})")
            lines.append(f"(utt.save.wave (SynthText {_scheme_string(utterance.text)}) {_scheme_string(wav)} 'riff)")
        script = os.path.join(folder, "speak.scm")
        Path(script).write_text("\n".join(lines) + "\n", encoding="utf8")
        done = subprocess.run([program, "-b", script], capture_output=True, text=True, check=False)
        missing = [i for i in range(len(utterances)) if not os.path.exists(os.path.join(folder, f"{i}.wav"))]
        if done.returncode != 0 or missing:
            raise RuntimeError(
                f"festival failed (exit {done.returncode}, {len(missing)} of {len(utterances)} files missing):\n"
                f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
        return [_to_16k(os.path.join(folder, f"{i}.wav")) for i in range(len(utterances))]


def flite_speak(utterances: Sequence[Utterance], synthesisers_dir: str | os.PathLike | None = None) -> list[np.ndarray]:
    """Every utterance spoken by Flite (one process each; it starts in milliseconds): float32 16 kHz audio each."""
    program = executable("flite", synthesisers_dir)
    if program is None:
        raise FileNotFoundError(f"flite not found (synthesisers_dir={synthesisers_dir!r}, PATH)")
    audio = []
    with tempfile.TemporaryDirectory(prefix="flite_") as folder:
        wav = os.path.join(folder, "out.wav")
        for utterance in utterances:
            stretch = ["--setf", f"duration_stretch={utterance.stretch:.3f}"]
            command = [program, "-voice", utterance.voice, *stretch, "-t", utterance.text, "-o", wav]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0 or not os.path.exists(wav):
                raise RuntimeError(f"flite failed (exit {done.returncode}) on {utterance}:\n{done.stderr[-2000:]}")
            audio.append(_to_16k(wav))
            os.remove(wav)
    return audio


def espeak_speak(
    utterances: Sequence[Utterance], synthesisers_dir: str | os.PathLike | None = None
) -> list[np.ndarray]:
    """Every utterance spoken by eSpeak NG (one :mod:`.espeak_worker` process, ``voice`` as ``en-us+m3``, the rate
    175 words per minute over ``stretch``, no noise): float32 16 kHz audio each. ``synthesisers_dir`` is unused."""
    import soundfile as sf

    with tempfile.TemporaryDirectory(prefix="espeak_") as folder:
        requests = [
            speech.SpeechRequest(
                path=os.path.join(folder, f"{index}.wav"),
                text=u.text,
                voice=u.voice,
                rate=round(175 / u.stretch),
                pitch=50,
                pitch_range=50,
                seed=index,
                snr_db=300.0,  # noise 300 dB down: none in int16
                gain_db=-1.0,
                lead_seconds=0.0,
                trail_seconds=0.0,
            )
            for index, u in enumerate(utterances)
        ]
        failures = [f"{r['path']}: {r['error']}" for r in speech.run_worker(requests) if "error" in r]
        if failures:
            raise RuntimeError("eSpeak NG failed:\n" + "\n".join(failures[:10]))
        return [sf.read(r.path, dtype="float32")[0] for r in requests]


_SPEAKERS: dict[str, Callable[..., list[np.ndarray]]] = {
    "espeak": espeak_speak,
    "festival": festival_speak,
    "flite": flite_speak,
}


def speak(utterances: Sequence[Utterance], synthesisers_dir: str | os.PathLike | None = None) -> list[np.ndarray]:
    """Each utterance's float32 16 kHz audio, in order (one batch per engine)."""
    out: list[np.ndarray | None] = [None] * len(utterances)
    for engine in sorted({u.engine for u in utterances}):
        indices = [i for i, u in enumerate(utterances) if u.engine == engine]
        for index, audio in zip(
            indices, _SPEAKERS[engine]([utterances[i] for i in indices], synthesisers_dir), strict=True
        ):
            out[index] = audio
    return [a for a in out if a is not None]


# ---- examples ------------------------------------------------------------------------------------------------------
def trim_silence(audio: np.ndarray, threshold: float = 0.01) -> np.ndarray:
    """``audio`` without its leading and trailing samples below ``threshold`` times the peak."""
    loud = np.flatnonzero(np.abs(audio) > threshold * float(np.abs(audio).max(initial=0.0)))
    return audio[loud[0] : loud[-1] + 1] if loud.size else audio[:0]


def join_utterances(parts: Sequence[np.ndarray], pauses: Sequence[float], sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """The parts (each at the same peak level) one after the other, ``pauses[i]`` seconds of silence after part i."""
    if len(pauses) != len(parts) - 1:
        raise ValueError(f"{len(parts)} parts need {len(parts) - 1} pauses, got {len(pauses)}")
    pieces: list[np.ndarray] = []
    for index, part in enumerate(parts):
        peak = float(np.abs(part).max(initial=0.0))
        pieces.append((part / peak * 0.5).astype(np.float32) if peak > 0 else part.astype(np.float32))
        if index < len(pauses):
            pieces.append(np.zeros(round(pauses[index] * sample_rate), dtype=np.float32))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)


def make_example(
    request: ExampleRequest,
    config: VoicesConfig,
    speeches: Sequence[np.ndarray],
) -> tuple[np.ndarray, dict[str, Any]]:
    """The audio and manifest entry of ``request`` from its utterances' speech: trimmed, cut to
    ``max_example_seconds`` (at least one utterance stays), joined, augmented, with 0.1-0.3 s of silence around."""
    parts = [trim_silence(s) for s in speeches]
    keep, total = 0, 0.0
    for index, part in enumerate(parts):
        total += part.size / SAMPLE_RATE + (request.pauses[index - 1] if index else 0.0)
        if index and total > config.max_example_seconds:
            break
        keep = index + 1
    rng = random.Random(request.seed)
    edges = [np.zeros(round(rng.uniform(0.1, 0.3) * SAMPLE_RATE), dtype=np.float32) for _ in range(2)]
    audio = np.concatenate([edges[0], join_utterances(parts[:keep], request.pauses[: keep - 1]), edges[1]])
    applied: dict[str, Any] = {}
    if request.augment:
        audio, applied = augment(audio, SAMPLE_RATE, request.seed, config.augment)
    utterances = request.utterances[:keep]
    entry = {
        "text": " ".join(u.text for u in utterances),
        "engine": "+".join(sorted({u.engine for u in utterances})),
        "voice": " ".join(u.voice for u in utterances),
        "utterances": keep,
        "pauses": list(request.pauses[: keep - 1]),
        "augment": applied,
    }
    return audio, entry


def _write_chunk(requests: Sequence[ExampleRequest], config: VoicesConfig) -> list[dict[str, Any]]:
    """Synthesise, join, augment and write the examples of one chunk (in a worker process): their manifest entries
    (``path``, ``num_samples`` and :func:`make_example`'s fields)."""
    import soundfile as sf

    utterances = [u for r in requests for u in r.utterances]
    speeches = iter(speak(utterances, config.synthesisers_dir))
    entries = []
    for request in requests:
        audio, entry = make_example(request, config, [next(speeches) for _ in request.utterances])
        Path(request.path).parent.mkdir(parents=True, exist_ok=True)
        tmp = request.path + ".tmp"
        sf.write(
            tmp,
            np.clip(np.round(audio * 32767.0), -32768, 32767).astype(np.int16),
            SAMPLE_RATE,
            subtype="PCM_16",
            format="WAV",
        )
        os.replace(tmp, request.path)
        entries.append({"path": request.path, "num_samples": int(audio.size), **entry})
    return entries


# ---- splits --------------------------------------------------------------------------------------------------------
def check_config(config: VoicesConfig) -> None:
    """Raise ``ValueError`` for unknown engines or voices, an evaluation-only engine among the trained ones, or a
    voice both trained and held out."""
    unknown_engines = sorted(set(config.engines) - set(ENGINE_VOICES))
    if unknown_engines:
        raise ValueError(f"engines: unknown {unknown_engines}; valid engines: {', '.join(ENGINE_VOICES)}")
    for name in ("train_voices", "held_out_voices", "eval_only"):
        for engine, voices in getattr(config, name).items():
            if engine not in ENGINE_VOICES:
                raise ValueError(f"{name}: unknown engine {engine!r}; valid engines: {', '.join(ENGINE_VOICES)}")
            unknown = sorted(set(voices) - set(ENGINE_VOICES[engine]))
            if unknown:
                raise ValueError(f"{name}: {engine} has no voices {unknown}; valid: {', '.join(ENGINE_VOICES[engine])}")
    trained_eval_only = sorted(set(config.train_voices) & (set(EVAL_ONLY_ENGINES) | set(config.eval_only)))
    if trained_eval_only:
        raise ValueError(f"train_voices: {trained_eval_only} are evaluation-only engines and never speak training data")
    test_variants = [
        v for v in config.train_voices.get("espeak", ()) if v.partition("+")[2] in speech.HELD_OUT_VARIANTS
    ]
    if test_variants:
        raise ValueError(
            f"train_voices: {test_variants} use eSpeak variants of the test split (speech.HELD_OUT_VARIANTS)"
        )
    for engine, voices in config.held_out_voices.items():
        both = sorted(set(voices) & set(config.train_voices.get(engine, ())))
        if both:
            raise ValueError(f"{engine}: voices {both} are both trained and held out")


def training_splits(config: VoicesConfig) -> list[str]:
    """The splits :func:`plan_splits` makes for training (``train_{engine}``), in order."""
    return [f"train_{engine}" for engine in config.used("train_voices")]


def evaluation_splits(config: VoicesConfig) -> list[str]:
    """The evaluation splits :func:`plan_splits` makes, in order."""
    return [
        *(f"test_{engine}_sentences" for engine in config.used("train_voices")),
        *(f"test_{engine}_voices" for engine in config.used("held_out_voices")),
        *(f"test_{engine}" for engine in config.used("eval_only")),
    ]


def _path(out_dir: str | os.PathLike, split: str, index: int, fields: dict[str, Any]) -> str:
    digest = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]
    return str(Path(out_dir) / "wavs" / split / f"{index // 1000:03d}" / f"{split}_{index:06d}_{digest}.wav")


def draw_examples(
    split: str,
    sentences: Sequence[str],
    voices: Sequence[tuple[str, str]],
    count: int,
    out_dir: str | os.PathLike,
    config: VoicesConfig,
    seed: int,
    training: bool,
) -> list[ExampleRequest]:
    """``count`` examples of ``split``: sentences taken from ``sentences`` in order (cycling), each utterance by a
    voice drawn from ``voices`` (``(engine, voice)`` pairs); training examples join several utterances and are
    augmented, evaluation examples are single utterances."""
    # training splits start at a split's own place in the sentences (engines speak different ones first); evaluation
    # splits all speak the same first test sentences, so that their WERs compare voices on the same text
    requests, cursor = [], random.Random(f"{seed}/{split}").randrange(len(sentences)) if training else 0
    for index in range(count):
        rng = random.Random(f"{seed}/{split}/{index}")
        n = rng.randint(*config.utterances_per_example) if training else 1
        utterances = []
        for _ in range(n):
            engine, voice = voices[rng.randrange(len(voices))]
            stretch = round(rng.uniform(*config.duration_stretch), 3)
            utterances.append(Utterance(engine, voice, sentences[cursor % len(sentences)], stretch))
            cursor += 1
        pauses = tuple(round(rng.uniform(*config.pause_seconds), 3) for _ in range(n - 1))
        fields = {
            "utterances": [asdict(u) for u in utterances],
            "pauses": pauses,
            "seed": rng.randrange(2**31),
            "augment": training or config.augment_eval,
            "augment_config": asdict(config.augment) if (training or config.augment_eval) else None,
        }
        path = _path(out_dir, split, index, fields)
        requests.append(ExampleRequest(path, tuple(utterances), pauses, fields["seed"], fields["augment"]))
    return requests


def plan_splits(
    config: VoicesConfig,
    train_sentences: Sequence[str],
    test_sentences: Sequence[str],
    out_dir: str | os.PathLike,
    seed: int = 0,
) -> dict[str, list[ExampleRequest]]:
    """The examples of every split of the module docstring, by split name (checked by :func:`check_config`)."""
    check_config(config)
    splits: dict[str, list[ExampleRequest]] = {}
    for engine, voices in config.used("train_voices").items():
        pairs = [(engine, v) for v in voices]
        splits[f"train_{engine}"] = draw_examples(
            f"train_{engine}", train_sentences, pairs, config.num_train, out_dir, config, seed, training=True
        )
        splits[f"test_{engine}_sentences"] = draw_examples(
            f"test_{engine}_sentences", test_sentences, pairs, config.num_test, out_dir, config, seed, training=False
        )
    # the held-out voices of trained engines, then the held-out engines: test sentences, one split per engine
    for kind, suffix in (("held_out_voices", "_voices"), ("eval_only", "")):
        for engine, voices in config.used(kind).items():
            name = f"test_{engine}{suffix}"
            pairs = [(engine, v) for v in voices]
            splits[name] = draw_examples(
                name, test_sentences, pairs, config.num_test, out_dir, config, seed, training=False
            )
    return splits


def synthesize_splits(
    splits: dict[str, list[ExampleRequest]],
    config: VoicesConfig,
    manifest_path: Callable[[str], Path],
    workers: int | None = None,
    chunk_size: int = 64,
    log: Callable[[str], None] = print,
) -> dict[str, Path]:
    """Write every example that is not there yet (``workers`` processes, ``chunk_size`` examples per Festival
    start-up) and each split's NeMo manifest at ``manifest_path(split)``; returns the manifests by split.

    Each finished chunk's entries are appended at once to a journal beside the manifests
    (:data:`PROGRESS_JOURNAL`), so a run stopped part-way (a time limit, a lost machine) carries on from the chunks
    it finished instead of synthesising everything again."""
    workers = workers or os.cpu_count() or 1
    journal = manifest_path(next(iter(splits))).with_name(PROGRESS_JOURNAL) if splits else None
    known = {
        os.path.abspath(manifest_path(split).parent / k): e
        for split in splits
        for k, e in _read_entries(manifest_path(split)).items()
    }
    if journal is not None:
        known.update(_read_journal(journal))
    every = [r for requests in splits.values() for r in requests]
    # an example is done when its file exists and a manifest or the journal has its entry (both written after it)
    todo = [r for r in every if not (os.path.exists(r.path) and os.path.abspath(r.path) in known)]
    for engine in sorted({u.engine for r in todo for u in r.utterances}):
        if executable(engine, config.synthesisers_dir) is None:
            raise FileNotFoundError(
                f"{engine} is not installed (synthesisers_dir={config.synthesisers_dir!r}): apt-get install {engine}, "
                "or pack it with scripts/pack_synthesisers.sh and set voices.synthesisers_dir"
            )
    start = time.perf_counter()
    if todo:
        log(
            f"Synthesising {len(todo)} multi-engine examples ({len(every) - len(todo)} already there), {workers} workers"
        )
    chunks = [todo[i : i + chunk_size] for i in range(0, len(todo), chunk_size)]
    entries = dict(known)  # keyed by absolute path, as the finished chunks' entries are
    if chunks:
        journal.parent.mkdir(parents=True, exist_ok=True)
        with ProcessPoolExecutor(max_workers=workers) as pool, open(journal, "a", encoding="utf8") as progress:
            futures = [pool.submit(_write_chunk, chunk, config) for chunk in chunks]
            for finished, future in enumerate(as_completed(futures), start=1):
                results = future.result()
                entries.update((os.path.abspath(e["path"]), e) for e in results)
                progress.writelines(json.dumps(_journal_entry(e, journal.parent)) + "\n" for e in results)
                progress.flush()
                if finished % max(1, len(chunks) // 10) == 0 or finished == len(chunks):
                    log(f"  {min(finished * chunk_size, len(todo))}/{len(todo)} in {time.perf_counter() - start:.1f} s")
    manifests = {}
    for split, requests in splits.items():
        path = manifest_path(split)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".tmp"), "w", encoding="utf8") as f:
            for request in requests:
                entry = entries[os.path.abspath(request.path)]
                f.write(json.dumps(_manifest_entry(request, entry, path.parent)) + "\n")
        os.replace(path.with_name(path.name + ".tmp"), path)
        manifests[split] = path
        log(f"{split}: {len(requests)} examples -> {path}")
    return manifests


def _journal_entry(entry: dict[str, Any], folder: Path) -> dict[str, Any]:
    # paths relative to the journal, so a moved output folder keeps its progress
    return {**entry, "path": os.path.relpath(entry["path"], folder)}


def _read_journal(path: Path) -> dict[str, dict[str, Any]]:
    """The journal's entries by absolute path; a line cut short by an interruption is skipped (redone)."""
    if not path.is_file():
        return {}
    entries = {}
    with open(path, encoding="utf8") as f:
        for line in f:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            entry["path"] = os.path.abspath(path.parent / entry["path"])
            entries[entry["path"]] = entry
    return entries


def _read_entries(path: Path) -> dict[str, dict[str, Any]]:
    if not path.is_file():
        return {}
    with open(path, encoding="utf8") as f:
        return {e["audio_filepath"]: e for e in map(json.loads, f) if e}


def _manifest_entry(request: ExampleRequest, entry: dict[str, Any], folder: Path) -> dict[str, Any]:
    import soundfile as sf

    fields = {k: v for k, v in entry.items() if k not in ("path", "num_samples", "audio_filepath", "duration")}
    return {
        "audio_filepath": os.path.relpath(request.path, folder),
        "duration": round(sf.info(request.path).frames / SAMPLE_RATE, 4),
        **fields,
    }
