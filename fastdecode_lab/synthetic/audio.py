"""Synthetic speech-like audio with LibriSpeech test-other-like durations, and writers for WAV files and manifests."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fastdecode_lab.synthetic.presets import SAMPLE_RATE
from nemo_fastdecode.apps.manifests import write_wavs


def _clipped_lognormal_mean(mu: float, sigma: float, a: float, b: float) -> float:
    """E[clip(X, a, b)] for X ~ LogNormal(mu, sigma)."""

    def cdf(z: float) -> float:
        return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))

    la, lb = math.log(a), math.log(b)
    inside = math.exp(mu + 0.5 * sigma**2) * (cdf((lb - mu - sigma**2) / sigma) - cdf((la - mu - sigma**2) / sigma))
    return a * cdf((la - mu) / sigma) + b * (1.0 - cdf((lb - mu) / sigma)) + inside


def librispeech_like_durations(
    total_seconds: float = 3600.0,
    seed: int = 0,
    mean: float = 6.3,
    min_s: float = 1.3,
    max_s: float = 35.0,
    sigma: float = 0.75,
) -> list[float]:
    """Synthetic utterance durations shaped like LibriSpeech test-other, longest first.

    Draws from a log-normal distribution (log-std ``sigma``) whose location is solved so that the
    mean after clipping to ``[min_s, max_s]`` equals ``mean``, until the durations add up to
    ``total_seconds``; the last one is shortened to land on the total (or dropped if that would
    make it shorter than ``min_s``), so the sum is within ``min_s`` of ``total_seconds``. Values are
    rounded to 1/100 s.

    Returns:
        Durations in seconds, sorted longest first.
    """
    if not 0 < min_s <= mean <= max_s:
        raise ValueError(f"need 0 < min_s <= mean <= max_s, got min_s={min_s}, mean={mean}, max_s={max_s}")
    if total_seconds <= 0:
        raise ValueError(f"total_seconds must be > 0, got {total_seconds}")
    lo, hi = math.log(min_s) - 5 * sigma, math.log(max_s) + 5 * sigma
    for _ in range(100):
        mu = 0.5 * (lo + hi)
        if _clipped_lognormal_mean(mu, sigma, min_s, max_s) < mean:
            lo = mu
        else:
            hi = mu
    rng = np.random.default_rng(seed)
    durations: list[float] = []
    total = 0.0
    while total < total_seconds:
        d = round(float(np.clip(rng.lognormal(mu, sigma), min_s, max_s)), 2)
        if total + d > total_seconds:
            d = round(total_seconds - total, 2)
            if d < min_s:
                break
        durations.append(d)
        total += d
    if not durations:  # total_seconds < min_s
        durations.append(round(min_s, 2))
    return sorted(durations, reverse=True)


def synthetic_audio(durations: Sequence[float], sample_rate: int = SAMPLE_RATE, seed: int = 0) -> list[np.ndarray]:
    """Speech-like synthetic signals (not speech): one float32 array per duration.

    Each is white noise shaped by a spectral tilt and three random "formant" resonances, modulated
    by a 3-6 Hz syllable-rate envelope and gated into words separated by short pauses. Utterance
    ``i`` depends only on ``(seed, i, durations[i])``. Samples lie on the int16 grid (``k / 32768``,
    peak 0.5), so writing them as 16-bit PCM with :func:`write_wavs` and reading back is lossless.
    """
    out = []
    for i, duration in enumerate(durations):
        n = max(1, round(float(duration) * sample_rate))
        rng = np.random.default_rng([seed, i])
        spec = np.fft.rfft(rng.standard_normal(n))
        freqs = np.fft.rfftfreq(n, 1.0 / sample_rate)
        shape = 1.0 / (1.0 + freqs / 500.0)  # spectral tilt
        for centre, width in zip(
            rng.uniform([300, 900, 2200], [900, 2200, 3500]), rng.uniform(80, 250, 3), strict=True
        ):
            shape += 3.0 / (1.0 + ((freqs - centre) / width) ** 2)
        shape[freqs < 60] = 0.0
        x = np.fft.irfft(spec * shape, n)
        t = np.arange(n) / sample_rate
        envelope = (0.5 * (1.0 - np.cos(2 * np.pi * rng.uniform(3.0, 6.0) * t + rng.uniform(0, 2 * np.pi)))) ** 2
        # words: ~0.2-0.8 s on, ~0.05-0.3 s off, with 10 ms ramps
        gate = np.zeros(n)
        pos = int(rng.uniform(0.0, 0.2) * sample_rate)
        while pos < n:
            length = int(rng.uniform(0.2, 0.8) * sample_rate)
            gate[pos : pos + length] = 1.0
            pos += length + int(rng.uniform(0.05, 0.3) * sample_rate)
        ramp = max(1, sample_rate // 100)
        gate = np.convolve(gate, np.ones(ramp) / ramp, mode="same")
        x = x * envelope * gate + 1e-3 * rng.standard_normal(n)
        peak = float(np.abs(x).max())
        x = x * (0.5 / peak) if peak > 0 else x
        out.append((np.round(x * 32768.0) / 32768.0).astype(np.float32))
    return out


# (F1, F2, F3) in Hz of a few vowels (Peterson & Barney's adult male averages)
_VOWELS = ((730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410),
           (440, 1020, 2240), (660, 1720, 2410))  # fmt: skip
_FORMANT_BANDWIDTHS = (70.0, 90.0, 130.0)


def synthetic_voiced_audio(
    durations: Sequence[float], sample_rate: int = SAMPLE_RATE, seed: int = 0
) -> list[np.ndarray]:
    """Voiced synthetic utterances (vowel sequences, not speech) that a voice activity detector takes for speech.

    :func:`synthetic_audio`'s shaped noise has no pitch, and Silero VAD gives it a speech probability near 0. Here
    each utterance is "words" of 0.3-0.7 s separated by 30-120 ms gaps; a word is vowels of 0.12-0.3 s: a glottal
    pulse train (pitch 100-180 Hz with a slow intonation) through the three formant resonances of a random vowel,
    at equal loudness, with a rise-and-fall envelope. Utterance ``i`` depends only on ``(seed, i, durations[i])``; samples lie on the
    int16 grid (peak 0.5, a little noise under it), as in :func:`synthetic_audio`.
    """
    from scipy.signal import lfilter

    out = []
    for i, duration in enumerate(durations):
        n = max(1, round(float(duration) * sample_rate))
        rng = np.random.default_rng([seed, i, 1])
        t = np.arange(n) / sample_rate
        pitch = rng.uniform(100, 180) * (1 + 0.12 * np.sin(2 * np.pi * rng.uniform(0.3, 1.0) * t + rng.uniform(0, 6)))
        pulses = np.diff(np.floor(np.cumsum(pitch) / sample_rate), prepend=0.0)  # one per pitch period
        source = lfilter([1.0], [1.0, -0.95], pulses) + 0.02 * rng.standard_normal(n)  # glottal roll-off, breath
        x = np.zeros(n)
        word_end = pos = 0
        while pos < n:
            if pos >= word_end:  # a gap, then the next word
                pos += int(rng.uniform(0.03, 0.12) * sample_rate) if pos else 0
                word_end = pos + int(rng.uniform(0.3, 0.7) * sample_rate)
            length = min(int(rng.uniform(0.12, 0.3) * sample_rate), word_end - pos, n - pos)
            if length <= 0:
                continue
            vowel = source[pos : pos + length]
            for centre, bandwidth in zip(_VOWELS[rng.integers(len(_VOWELS))], _FORMANT_BANDWIDTHS, strict=True):
                r, theta = np.exp(-np.pi * bandwidth / sample_rate), 2 * np.pi * centre / sample_rate
                vowel = lfilter([1 - r], [1.0, -2 * r * np.cos(theta), r * r], vowel)  # a two-pole resonance
            vowel = vowel / max(float(np.sqrt(np.mean(vowel**2))), 1e-9)  # equal loudness (silero hears it better)
            x[pos : pos + length] = vowel * np.sin(np.pi * np.arange(length) / length) ** 0.6
            pos += length
        peak = float(np.abs(x).max())
        x = (x * (0.5 / peak) if peak > 0 else x) + 1e-3 * rng.standard_normal(n)
        out.append((np.round(np.clip(x, -1, 1) * 32768.0) / 32768.0).astype(np.float32))
    return out


def write_manifest(
    audio_paths: Sequence[str | os.PathLike],
    durations: Sequence[float],
    manifest_path: str | os.PathLike,
    texts: Sequence[str] | None = None,
) -> Path:
    """Write a NeMo JSON-lines manifest (``audio_filepath``, ``duration``, ``text``; text "" by default)."""
    if len(audio_paths) != len(durations) or (texts is not None and len(texts) != len(audio_paths)):
        raise ValueError(
            f"audio_paths ({len(audio_paths)}), durations ({len(durations)}) and texts "
            f"({'None' if texts is None else len(texts)}) must have the same length"
        )
    path = Path(manifest_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf8") as f:
        for i, (audio, duration) in enumerate(zip(audio_paths, durations, strict=True)):
            entry = {
                "audio_filepath": str(Path(audio).resolve()),
                "duration": float(duration),
                "text": texts[i] if texts is not None else "",
            }
            f.write(json.dumps(entry) + "\n")
    return path


def write_synthetic_dataset(output_dir: str | os.PathLike, total_seconds: float, seed: int = 0) -> Path:
    """Speech-like WAV files (:func:`synthetic_audio`) of LibriSpeech test-other-like durations
    (:func:`librispeech_like_durations`, longest first) adding up to about ``total_seconds``, written to
    ``output_dir/wavs/``, and their manifest ``output_dir/manifest.jsonl`` (returned; ``duration`` per entry).

    The audio is made in memory first: about 64 KB per second of audio (230 MB for an hour).
    """
    out = Path(output_dir)
    durations = librispeech_like_durations(total_seconds=total_seconds, seed=seed)
    paths = write_wavs(synthetic_audio(durations, seed=seed), out / "wavs")
    return write_manifest(paths, durations, out / "manifest.jsonl")
