"""Augmentation of synthetic speech toward what real audio does to it: speed, pitch, room, line, noise, level.

Every transform takes float32 mono audio ``[N]`` at ``sample_rate`` and returns float32 audio; the random ones take a
``numpy.random.Generator``. :func:`augment` draws a chain from an :class:`AugmentConfig` with a generator seeded by
the example alone, so an example's audio does not depend on which worker made it or in which order.

Chain order (each step with its own probability): speed -> pitch -> reverberation -> telephone band or 8 kHz round
trip -> noise at an SNR -> level.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from scipy.signal import butter, fftconvolve, resample_poly, sosfiltfilt


def _rational(factor: float, max_denominator: int = 100) -> tuple[int, int]:
    fraction = Fraction(factor).limit_denominator(max_denominator)
    return fraction.numerator, fraction.denominator


def speed(audio: np.ndarray, factor: float) -> np.ndarray:
    """Play ``audio`` ``factor`` times as fast (tempo and pitch together, as Kaldi's speed perturbation): the length
    becomes ``len / factor`` (``factor`` as a fraction with a denominator of at most 100)."""
    if factor <= 0:
        raise ValueError(f"speed factor must be > 0, got {factor}")
    up, down = _rational(factor)
    return resample_poly(np.asarray(audio, dtype=np.float64), down, up).astype(np.float32)


def time_stretch(audio: np.ndarray, rate: float, n_fft: int = 512, hop: int = 128) -> np.ndarray:
    """``audio`` ``rate`` times as fast at the same pitch (a phase vocoder): about ``len / rate`` samples."""
    if rate <= 0:
        raise ValueError(f"stretch rate must be > 0, got {rate}")
    x = np.asarray(audio, dtype=np.float64)
    window = np.hanning(n_fft)
    padded = np.concatenate([np.zeros(n_fft), x, np.zeros(n_fft)])
    frames = 1 + (padded.size - n_fft) // hop
    index = np.arange(n_fft)[None, :] + hop * np.arange(frames)[:, None]
    spectra = np.fft.rfft(padded[index] * window, axis=1)
    steps = np.arange(0, frames - 1, rate)
    expected = 2 * np.pi * hop * np.arange(n_fft // 2 + 1) / n_fft
    phase = np.angle(spectra[0])
    out_frames = np.empty((steps.size, n_fft // 2 + 1), dtype=np.complex128)
    for k, step in enumerate(steps):
        lo = int(step)
        frac = step - lo
        magnitude = (1 - frac) * np.abs(spectra[lo]) + frac * np.abs(spectra[lo + 1])
        out_frames[k] = magnitude * np.exp(1j * phase)
        advance = np.angle(spectra[lo + 1]) - np.angle(spectra[lo]) - expected
        phase = phase + expected + (advance - 2 * np.pi * np.round(advance / (2 * np.pi)))
    out = np.zeros(hop * (steps.size - 1) + n_fft)
    norm = np.zeros_like(out)
    for k, frame in enumerate(np.fft.irfft(out_frames, n=n_fft, axis=1)):
        out[k * hop : k * hop + n_fft] += frame * window
        norm[k * hop : k * hop + n_fft] += window**2
    out = out / np.maximum(norm, 1e-3)
    target = round(x.size / rate)
    start = round(n_fft / rate)
    return out[start : start + target].astype(np.float32)


def pitch_shift(audio: np.ndarray, semitones: float) -> np.ndarray:
    """``audio`` ``semitones`` higher (lower where negative) at the same tempo and length: :func:`speed` by the
    pitch ratio, then :func:`time_stretch` back."""
    ratio = 2.0 ** (semitones / 12.0)
    up, down = _rational(ratio)
    shifted = speed(audio, up / down)
    stretched = time_stretch(shifted, down / up)
    return np.pad(stretched, (0, max(0, audio.size - stretched.size)))[: audio.size]


def set_level(audio: np.ndarray, gain_db: float) -> np.ndarray:
    """``audio`` scaled by ``gain_db`` dB (its RMS changes by the same amount)."""
    return (np.asarray(audio, dtype=np.float32) * np.float32(10.0 ** (gain_db / 20.0))).astype(np.float32)


def colored_noise(size: int, rng: np.random.Generator, exponent: float = 0.0) -> np.ndarray:
    """Unit-power noise ``[size]`` with a ``1 / f**exponent`` power spectrum (0 white, 1 pink, 2 brown)."""
    white = rng.standard_normal(size)
    if exponent == 0.0 or size < 2:
        noise = white
    else:
        spectrum = np.fft.rfft(white)
        frequencies = np.maximum(np.fft.rfftfreq(size), 1.0 / size)
        noise = np.fft.irfft(spectrum / frequencies ** (exponent / 2.0), n=size)
    return noise / max(float(np.sqrt(np.mean(noise**2))), 1e-12)


def add_noise(
    audio: np.ndarray,
    snr_db: float,
    rng: np.random.Generator,
    exponent: float = 0.0,
    reference: np.ndarray | None = None,
) -> np.ndarray:
    """``audio`` plus noise (:func:`colored_noise`) ``snr_db`` dB below the power of ``reference`` (default: the
    audio's samples whose magnitude is above 1% of the peak, so that pauses do not lower the speech's power)."""
    x = np.asarray(audio, dtype=np.float64)
    if reference is None:
        peak = float(np.abs(x).max()) if x.size else 0.0
        reference = x[np.abs(x) > 0.01 * peak] if peak > 0 else x
    power = float(np.mean(np.asarray(reference, dtype=np.float64) ** 2)) if np.size(reference) else 0.0
    noise = colored_noise(x.size, rng, exponent) * np.sqrt(power / 10.0 ** (snr_db / 10.0))
    return (x + noise).astype(np.float32)


def room_impulse_response(
    rt60: float, sample_rate: int, rng: np.random.Generator, direct_to_reverberant_db: float = 3.0
) -> np.ndarray:
    """A synthetic room impulse response: a direct path, then exponentially decaying noise whose level falls by 60 dB
    in ``rt60`` seconds, ``direct_to_reverberant_db`` below the direct path in energy."""
    length = max(2, int(rt60 * sample_rate))
    t = np.arange(length) / sample_rate
    tail = rng.standard_normal(length) * np.exp(-6.9078 * t / rt60)  # ln(1000): 60 dB of amplitude
    tail[0] = 0.0
    tail *= np.sqrt(10.0 ** (-direct_to_reverberant_db / 10.0) / max(float(np.sum(tail**2)), 1e-12))
    tail[0] = 1.0
    return tail


def reverberate(audio: np.ndarray, rir: np.ndarray) -> np.ndarray:
    """``audio`` convolved with ``rir``, cut to its length, at the same peak level."""
    x = np.asarray(audio, dtype=np.float64)
    wet = fftconvolve(x, rir)[: x.size]
    peak_in, peak_out = float(np.abs(x).max(initial=0.0)), float(np.abs(wet).max(initial=0.0))
    return (wet * (peak_in / peak_out if peak_out > 0 else 1.0)).astype(np.float32)


def band_pass(audio: np.ndarray, sample_rate: int, low_hz: float = 300.0, high_hz: float = 3400.0) -> np.ndarray:
    """A telephone channel: 6th-order Butterworth band-pass (zero phase)."""
    sos = butter(6, [low_hz, high_hz], btype="bandpass", fs=sample_rate, output="sos")
    return sosfiltfilt(sos, np.asarray(audio, dtype=np.float64)).astype(np.float32)


def round_trip(audio: np.ndarray, sample_rate: int, through_rate: int = 8000) -> np.ndarray:
    """``audio`` down-sampled to ``through_rate`` and back (polyphase FIR): nothing above ``through_rate / 2`` is
    left; same length."""
    up, down = _rational(through_rate / sample_rate, 1000)
    low = resample_poly(np.asarray(audio, dtype=np.float64), up, down)
    back = resample_poly(low, down, up)
    return np.pad(back, (0, max(0, audio.size - back.size)))[: audio.size].astype(np.float32)


@dataclass
class AugmentConfig:
    """Probabilities and ranges (drawn uniformly) of :func:`augment`'s steps.

    Attributes:
        speed_p / speed: speed perturbation (tempo and pitch), as a factor.
        pitch_p / pitch_semitones: pitch shift at the same tempo.
        reverb_p / rt60 / direct_to_reverberant_db: a synthetic room.
        telephone_p: a 300-3400 Hz channel; else ``narrowband_p``: an 8 kHz round trip.
        noise_p / snr_db / noise_exponents: noise at an SNR, its colour one of ``noise_exponents`` (0 white, 1
            pink, 2 brown).
        level_db: the peak level of the result, in dB below full scale (always applied; clipped at full scale).
    """

    speed_p: float = 0.5
    speed: tuple[float, float] = (0.85, 1.15)
    pitch_p: float = 0.3
    pitch_semitones: tuple[float, float] = (-3.0, 3.0)
    reverb_p: float = 0.3
    rt60: tuple[float, float] = (0.15, 0.8)
    direct_to_reverberant_db: tuple[float, float] = (-3.0, 10.0)
    telephone_p: float = 0.1
    narrowband_p: float = 0.1
    noise_p: float = 0.7
    snr_db: tuple[float, float] = (5.0, 40.0)
    noise_exponents: tuple[float, ...] = (0.0, 1.0, 2.0)
    level_db: tuple[float, float] = (-30.0, -1.0)


def augment(
    audio: np.ndarray, sample_rate: int, seed: int, config: AugmentConfig | None = None
) -> tuple[np.ndarray, dict[str, Any]]:
    """``audio`` through the chain of the module docstring, each step drawn from ``config`` with a generator seeded
    by ``seed`` alone; returns the audio and the parameters of the steps applied (for the manifest)."""
    config = config or AugmentConfig()
    rng = np.random.default_rng(seed)
    # every draw is made whether or not its step applies, so that one probability does not move the others' values
    draws = {
        "speed": (rng.random() < config.speed_p, rng.uniform(*config.speed)),
        "pitch": (rng.random() < config.pitch_p, rng.uniform(*config.pitch_semitones)),
        "rt60": (rng.random() < config.reverb_p, rng.uniform(*config.rt60)),
        "drr_db": (True, rng.uniform(*config.direct_to_reverberant_db)),
        "line": (True, rng.random()),
        "snr_db": (rng.random() < config.noise_p, rng.uniform(*config.snr_db)),
        "noise_exponent": (True, config.noise_exponents[rng.integers(len(config.noise_exponents))]),
        "level_db": (True, rng.uniform(*config.level_db)),
    }
    applied: dict[str, Any] = {}
    x = np.asarray(audio, dtype=np.float32)
    if draws["speed"][0]:
        applied["speed"] = round(float(draws["speed"][1]), 3)
        x = speed(x, applied["speed"])
    if draws["pitch"][0]:
        applied["pitch_semitones"] = round(float(draws["pitch"][1]), 2)
        x = pitch_shift(x, applied["pitch_semitones"])
    if draws["rt60"][0]:
        applied["rt60"] = round(float(draws["rt60"][1]), 3)
        rir = room_impulse_response(applied["rt60"], sample_rate, rng, float(draws["drr_db"][1]))
        x = reverberate(x, rir)
    line = draws["line"][1]
    if line < config.telephone_p:
        applied["channel"] = "telephone"
        x = band_pass(x, sample_rate)
    elif line < config.telephone_p + config.narrowband_p:
        applied["channel"] = "8k"
        x = round_trip(x, sample_rate)
    if draws["snr_db"][0]:
        applied["snr_db"] = round(float(draws["snr_db"][1]), 2)
        applied["noise_exponent"] = float(draws["noise_exponent"][1])
        x = add_noise(x, applied["snr_db"], rng, applied["noise_exponent"])
    peak = float(np.abs(x).max(initial=0.0))
    applied["level_db"] = round(float(draws["level_db"][1]), 2)
    if peak > 0:
        x = set_level(x / peak, applied["level_db"])
    return np.clip(x, -1.0, 1.0).astype(np.float32), applied
