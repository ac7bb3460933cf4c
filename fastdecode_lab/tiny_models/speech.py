"""Speech for the corpus: eSpeak NG voices, per-utterance speaking parameters, parallel synthesis, NeMo manifests.

Each utterance gets a voice (an English accent with a voice variant) and speaking rate, pitch, pitch range, level,
noise and silences drawn from a seed of its own (:func:`draw_requests`). The ``test`` split is spoken only by the
variants of :data:`HELD_OUT_VARIANTS`, which training never hears. :func:`synthesize` runs
:mod:`.espeak_worker` processes in parallel (eSpeak NG is one global state per process) and skips files that exist,
so an interrupted run continues where it stopped; each file depends only on its own request.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from fastdecode_lab.tiny_models import espeak_worker

SAMPLE_RATE = espeak_worker.SAMPLE_RATE

#: eSpeak NG's English accents (voice names)
ACCENTS: tuple[str, ...] = (
    "en-us",
    "en",
    "en-gb-scotland",
    "en-gb-x-rp",
    "en-gb-x-gbclan",
    "en-gb-x-gbcwmd",
    "en-029",
    "en-us-nyc",
)

_NAMED_VARIANTS = (
    "Alex Alicia Andrea Andy Annie Denis Gene Jacky Lee Marco Michael Mike Nguyen Reed adam anika antonio aunty "
    "belinda benjamin boris caleb david ed edward grandma gustave ian iven john linda max michel miguel norbert "
    "pablo paul pedro quincy rob robert sandro shelby steph travis victor zac"
)

#: voice variants (espeak-ng-data/voices/!v) heard in training and in ``dev``; ``""`` is the accent's own voice
TRAIN_VARIANTS: tuple[str, ...] = (
    "",
    *(f"m{i}" for i in (1, 2, 3, 4, 5, 7)),
    *(f"f{i}" for i in (1, 2, 3, 5)),
    "klatt",
    "klatt2",
    "klatt4",
    "klatt5",
    *_NAMED_VARIANTS.split(),
)

#: voice variants of the ``test`` split only: voices the models never hear in training
HELD_OUT_VARIANTS: tuple[str, ...] = ("m6", "f4", "klatt3", "Hugo", "edward2", "iven2", "mike2", "grandpa", "steph2")


@dataclass(frozen=True)
class SpeakingStyle:
    """Ranges the per-utterance speaking parameters are drawn from (uniformly).

    Attributes:
        rate: words per minute (eSpeak's default is 175).
        pitch / pitch_range: eSpeak's 0-99 scales (default 50).
        snr_db: white noise this many dB below the speech.
        gain_db: peak level relative to full scale.
        lead_seconds / trail_seconds: silence before / after the speech.
    """

    rate: tuple[int, int] = (130, 230)
    pitch: tuple[int, int] = (25, 75)
    pitch_range: tuple[int, int] = (20, 80)
    snr_db: tuple[float, float] = (20.0, 45.0)
    gain_db: tuple[float, float] = (-12.0, -1.0)
    lead_seconds: tuple[float, float] = (0.0, 0.3)
    trail_seconds: tuple[float, float] = (0.0, 0.3)


@dataclass(frozen=True)
class SpeechRequest:
    """One utterance to synthesise (the fields :mod:`.espeak_worker` reads)."""

    path: str
    text: str
    voice: str
    rate: int
    pitch: int
    pitch_range: int
    seed: int
    snr_db: float
    gain_db: float
    lead_seconds: float
    trail_seconds: float


def variants_for(split: str) -> tuple[str, ...]:
    """The voice variants of a split: :data:`HELD_OUT_VARIANTS` for ``test``, :data:`TRAIN_VARIANTS` otherwise."""
    return HELD_OUT_VARIANTS if split == "test" else TRAIN_VARIANTS


def check_voices(variants: Sequence[str]) -> None:
    """Raise ``ValueError`` naming any variant that the installed eSpeak NG data does not have."""
    import espeakng_loader

    folder = Path(espeakng_loader.get_data_path()) / "voices" / "!v"
    available = {p.name for p in folder.iterdir()}
    missing = sorted(v for v in variants if v and v not in available)
    if missing:
        raise ValueError(f"eSpeak NG voice variants not found in {folder}: {missing}; available: {sorted(available)}")


def voice_name(accent: str, variant: str) -> str:
    """eSpeak's voice name of an accent spoken with a variant (``en-us+f3``; the accent alone for ``""``)."""
    return f"{accent}+{variant}" if variant else accent


def draw_requests(
    sentences: Sequence[str],
    split: str,
    out_dir: str | os.PathLike,
    seed: int,
    style: SpeakingStyle | None = None,
) -> list[SpeechRequest]:
    """One :class:`SpeechRequest` per sentence, its voice and parameters drawn from ``(seed, split, index)``.

    WAV paths are ``{out_dir}/wavs/{split}/{index // 1000:03d}/{split}_{index:06d}_{digest}.wav``, the digest
    a hash of the request's fields.
    """
    style = style or SpeakingStyle()
    variants = variants_for(split)
    requests = []
    for index, text in enumerate(sentences):
        rng = random.Random(f"{seed}/{split}/{index}")
        fields = {
            "text": text,
            "voice": voice_name(rng.choice(ACCENTS), rng.choice(variants)),
            "rate": rng.randint(*style.rate),
            "pitch": rng.randint(*style.pitch),
            "pitch_range": rng.randint(*style.pitch_range),
            "seed": rng.randrange(2**31),
            "snr_db": round(rng.uniform(*style.snr_db), 2),
            "gain_db": round(rng.uniform(*style.gain_db), 2),
            "lead_seconds": round(rng.uniform(*style.lead_seconds), 3),
            "trail_seconds": round(rng.uniform(*style.trail_seconds), 3),
        }
        # the name carries the request's digest: a changed request never reuses an old file
        digest = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]
        path = Path(out_dir) / "wavs" / split / f"{index // 1000:03d}" / f"{split}_{index:06d}_{digest}.wav"
        requests.append(SpeechRequest(path=str(path), **fields))
    return requests


def run_worker(requests: Sequence[SpeechRequest]) -> list[dict]:
    """One :mod:`.espeak_worker` process over ``requests``; its result lines in request order."""
    payload = "".join(json.dumps(asdict(r)) + "\n" for r in requests)
    done = subprocess.run(
        [sys.executable, espeak_worker.__file__],
        input=payload,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"eSpeak worker failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    results = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    if len(results) != len(requests):
        raise RuntimeError(f"eSpeak worker answered {len(results)} of {len(requests)} requests:\n{done.stderr[-4000:]}")
    return results


def synthesize(
    requests: Sequence[SpeechRequest],
    workers: int | None = None,
    chunk_size: int = 256,
    log: Callable[[str], None] = print,
) -> list[float]:
    """Write every request's WAV file (16 kHz mono PCM16) with ``workers`` parallel eSpeak processes.

    Files that exist are kept (a file appears only once complete), so a second call finishes an interrupted one.

    Returns:
        Each request's duration in seconds, in request order.

    Raises:
        RuntimeError: naming the utterances that could not be synthesised.
    """
    workers = workers or os.cpu_count() or 1
    todo = [r for r in requests if not os.path.exists(r.path)]
    for directory in sorted({os.path.dirname(r.path) for r in todo}):
        os.makedirs(directory, exist_ok=True)
    chunks = [todo[i : i + chunk_size] for i in range(0, len(todo), chunk_size)]
    start = time.perf_counter()
    failures: list[str] = []
    if todo:
        log(f"Synthesising {len(todo)} utterances ({len(requests) - len(todo)} already there) with {workers} workers")
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for finished, results in enumerate(pool.map(run_worker, chunks), start=1):
            failures += [f"{r['path']}: {r['error']}" for r in results if "error" in r]
            if finished % max(1, len(chunks) // 10) == 0 or finished == len(chunks):
                log(f"  {min(finished * chunk_size, len(todo))}/{len(todo)} in {time.perf_counter() - start:.1f} s")
    if failures:
        raise RuntimeError(f"{len(failures)} utterances could not be synthesised, e.g.:\n" + "\n".join(failures[:10]))
    import soundfile as sf

    return [sf.info(r.path).frames / SAMPLE_RATE for r in requests]


def write_manifest(
    requests: Sequence[SpeechRequest], durations: Sequence[float], manifest_path: str | os.PathLike
) -> Path:
    """A NeMo JSON-lines manifest: ``audio_filepath`` (relative to the manifest's folder), ``duration``, ``text``,
    and the voice and speaking parameters of each utterance."""
    path = Path(manifest_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf8") as f:
        for request, duration in zip(requests, durations, strict=True):
            entry = {
                "audio_filepath": os.path.relpath(request.path, path.parent),
                "duration": round(float(duration), 4),
                "text": request.text,
                "voice": request.voice,
                "rate": request.rate,
                "pitch": request.pitch,
                "pitch_range": request.pitch_range,
                "snr_db": request.snr_db,
            }
            f.write(json.dumps(entry) + "\n")
    os.replace(tmp, path)
    return path
