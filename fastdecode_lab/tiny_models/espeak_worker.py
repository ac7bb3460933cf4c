"""One eSpeak NG synthesis process: utterance requests in (JSON lines on stdin), 16 kHz WAV files out.

Run by :mod:`.speech` as ``python espeak_worker.py`` (by path, so that it imports neither this package nor NeMo and
starts in a fraction of a second); it imports only numpy, scipy and soundfile, and eSpeak NG from the
``espeakng-loader`` wheel (the library and its voice data).

eSpeak keeps synthesis state between utterances inside the library (pitch-flutter phase, gain control, noise
generator), so one process that speaks utterance after utterance makes each one depend on those before it. This
process initialises eSpeak once and speaks every utterance in a child forked from that initial state, which makes
an utterance's audio a function of its own request alone (text, voice, rate, pitch, range, seed, noise): the same
request gives the same file in any order, on any worker.

Request fields (all required): ``path`` (the WAV file to write), ``text``, ``voice`` (``en-us+f3``), ``rate``
(words per minute), ``pitch`` and ``pitch_range`` (eSpeak's 0-99 scales), ``seed``, ``snr_db`` (white noise level
under the speech), ``gain_db`` (level of the speech peak relative to full scale), ``lead_seconds`` /
``trail_seconds`` (silence added before and after). One JSON line per request comes back on stdout:
``{"path": ..., "num_samples": N}`` or ``{"path": ..., "error": "..."}``.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import Any

import numpy as np
import soundfile as sf
from scipy.signal import resample_poly

ESPEAK_SAMPLE_RATE = 22050
SAMPLE_RATE = 16000
# 16000 / 22050 = 320 / 441
_UP, _DOWN = 320, 441
_AUDIO_OUTPUT_SYNCHRONOUS = 2  # synthesis runs in the calling thread (no library thread to lose across fork)
_ESPEAK_RATE, _ESPEAK_PITCH, _ESPEAK_RANGE = 1, 3, 4
_ESPEAK_CHARS_UTF8 = 1
_ESPEAK_ENDPAUSE = 0x1000
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


def resample_to_16k(pcm: np.ndarray) -> np.ndarray:
    """eSpeak's 22050 Hz audio ``[N]`` at 16 kHz ``[ceil(N * 320 / 441)]`` (polyphase FIR, scipy), as float32."""
    return resample_poly(np.asarray(pcm, dtype=np.float64), _UP, _DOWN).astype(np.float32)


def finish_audio(speech: np.ndarray, request: dict[str, Any]) -> np.ndarray:
    """Float speech ``[N]`` at 16 kHz -> the int16 samples of the utterance: peak at ``gain_db``, the silences added
    before and after, white noise ``snr_db`` below the speech's power (seeded by ``seed``)."""
    rng = np.random.default_rng(int(request["seed"]))
    peak = float(np.abs(speech).max()) if speech.size else 0.0
    speech = speech * (10.0 ** (float(request["gain_db"]) / 20.0) / peak) if peak > 0 else speech
    lead = np.zeros(round(float(request["lead_seconds"]) * SAMPLE_RATE), dtype=np.float32)
    trail = np.zeros(round(float(request["trail_seconds"]) * SAMPLE_RATE), dtype=np.float32)
    audio = np.concatenate([lead, speech.astype(np.float32), trail])
    power = float(np.mean(speech.astype(np.float64) ** 2)) if speech.size else 0.0
    noise_std = np.sqrt(power / 10.0 ** (float(request["snr_db"]) / 10.0))
    audio = audio + noise_std * rng.standard_normal(audio.size)
    return np.clip(np.round(audio * 32767.0), -32768, 32767).astype(np.int16)


class Espeak:
    """The eSpeak NG library of the ``espeakng-loader`` wheel, initialised for synchronous retrieval of samples."""

    def __init__(self) -> None:
        import espeakng_loader

        self.data_path = espeakng_loader.get_data_path()
        self.lib = ctypes.cdll.LoadLibrary(espeakng_loader.get_library_path())
        rate = self.lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, self.data_path.encode(), 0)
        if rate != ESPEAK_SAMPLE_RATE:
            raise RuntimeError(f"eSpeak NG initialised at {rate} Hz, expected {ESPEAK_SAMPLE_RATE}")
        self._chunks: list[np.ndarray] = []
        self._callback = _SYNTH_CALLBACK(self._collect)  # kept referenced: the library calls it
        self.lib.espeak_SetSynthCallback(self._callback)

    def _collect(self, wav: Any, count: int, events: Any) -> int:
        if count > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(count,)).copy())
        return 0

    def synthesize(self, text: str, voice: str, rate: int, pitch: int, pitch_range: int, seed: int) -> np.ndarray:
        """``text`` spoken by ``voice`` -> int16 samples at 22050 Hz ``[N]``."""
        if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ValueError(f"eSpeak NG has no voice {voice!r}")
        self.lib.espeak_ng_SetRandSeed(int(seed) & 0x7FFFFFFF)
        for parameter, value in ((_ESPEAK_RATE, rate), (_ESPEAK_PITCH, pitch), (_ESPEAK_RANGE, pitch_range)):
            self.lib.espeak_SetParameter(parameter, int(value), 0)
        self._chunks.clear()
        data = text.encode("utf8")
        status = self.lib.espeak_Synth(data, len(data) + 1, 0, 0, 0, _ESPEAK_CHARS_UTF8 | _ESPEAK_ENDPAUSE, None, None)
        if status != 0:
            raise RuntimeError(f"espeak_Synth failed with status {status} on {text!r}")
        self.lib.espeak_Synchronize()
        return np.concatenate(self._chunks) if self._chunks else np.zeros(0, dtype=np.int16)


def _speak(espeak: Espeak, request: dict[str, Any]) -> int:
    """Synthesise ``request`` into its WAV file; returns the number of samples written."""
    pcm = espeak.synthesize(
        request["text"], request["voice"], request["rate"], request["pitch"], request["pitch_range"], request["seed"]
    )
    if pcm.size == 0:
        raise RuntimeError(f"eSpeak NG produced no audio for {request['text']!r}")
    audio = finish_audio(resample_to_16k(pcm), request)
    tmp = request["path"] + ".tmp"
    sf.write(tmp, audio, SAMPLE_RATE, subtype="PCM_16", format="WAV")
    os.replace(tmp, request["path"])  # a file that exists is complete
    return int(audio.size)


def _speak_in_child(espeak: Espeak, request: dict[str, Any]) -> dict[str, Any]:
    """:func:`_speak` in a child forked from the untouched initial state (see the module docstring)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: speak, report, exit without running the parent's clean-up
        os.close(read_end)
        try:
            result: dict[str, Any] = {"path": request["path"], "num_samples": _speak(espeak, request)}
        except Exception as error:  # reported to the parent, which reports it to the caller
            result = {"path": request["path"], "error": f"{type(error).__name__}: {error}"}
        os.write(write_end, json.dumps(result).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        payload = reader.read()
    _, status = os.waitpid(pid, 0)
    if not payload:
        return {"path": request["path"], "error": f"synthesis process ended with status {status}"}
    return json.loads(payload)


def main() -> int:
    espeak = Espeak()
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(_speak_in_child(espeak, json.loads(line))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
