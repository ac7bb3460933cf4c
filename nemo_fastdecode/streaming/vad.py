"""Silero VAD for every stream at once, on the samples the audio front end already decoded on the device.

`Silero VAD <https://github.com/snakers4/silero-vad>`_ (the ``silero-vad`` package, MIT licence; its TorchScript
model ships in the wheel) reads 16 kHz audio in windows of 512 samples (8 kHz: 256), each prefixed with the last 64
(32) samples before it, and carries an LSTM state ``[2, B, 128]`` from window to window; its speech probabilities
then go through a small state machine (``get_speech_timestamps`` offline, ``VADIterator`` online) that turns them
into speech segments. Here both run for all streams in one batch:

* :class:`BatchedVAD` reads each stream's new whole windows from the front end's sample rings
  (:meth:`~nemo_fastdecode.streaming.frontend.AudioFrontEnd.read_samples`, one gather), and runs silero's network
  once per window position for every stream that has a window there; the recurrent state and the context samples
  live in slot tensors (``[2, S, 128]``, ``[S, 64]``) read with ``index_select`` and written back with
  ``index_copy_``. Streams at different positions run in the same batch.
* :class:`SpeechStateMachine` is silero's speech start/end logic as tensor operations over the streams of a window
  position, with per-slot settings (no Python per stream or per window beyond the loop over positions).

Exactness: per stream, the probabilities are those of silero's own model run on that stream alone (same network,
same windows, zero-padded last window at the stream's end); batching changes only the summation order of a few
kernels, i.e. fp32 rounding (tests/test_streaming_vad.py). The speech segments are ``get_speech_timestamps``'s on
the same probabilities (same decisions at the same windows; its padding via :func:`pad_segments`), and the
``VADIterator`` events are the same starts and ends moved by the pad. Not supported: ``max_speech_duration_s``
(silero's default, no limit, is what runs).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from nemo_fastdecode.streaming.events import EndpointingOptions
    from nemo_fastdecode.streaming.frontend import AudioFrontEnd

__all__ = [
    "BatchedVAD",
    "SileroNetwork",
    "SpeechEnds",
    "SpeechMarks",
    "SpeechStateMachine",
    "VADOutput",
    "pad_segments",
    "speech_segments",
]

SILERO_PACKAGE = "silero-vad"
_WINDOWS = {16000: 512, 8000: 256}  # silero's window per sample rate
_STATE = 128  # LSTM width: state [2, B, 128]


def silero_model_path() -> Path:
    """The TorchScript model inside the installed ``silero_vad`` package (found without importing it: its import
    sets torch's global thread count to 1)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"voice activity detection (EndpointingOptions(vad=True)) needs the {SILERO_PACKAGE} package; install it "
            f"with `pip install {SILERO_PACKAGE}`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.jit"
    if not path.is_file():
        raise ImportError(f"the installed {SILERO_PACKAGE} package has no {path.name}; install silero-vad >= 5")
    return path


class SileroNetwork:
    """Silero's network at one sample rate: ``[B, context + window]`` samples and state ``[2, B, 128]`` in, speech
    probability ``[B]`` and the next state out (the TorchScript module silero's own wrapper calls).

    Args:
        sample_rate: 16000 or 8000 Hz.
        device: where it runs.
    """

    def __init__(self, sample_rate: int, device: torch.device):
        if sample_rate not in _WINDOWS:
            raise ValueError(
                f"Silero VAD runs at {sorted(_WINDOWS)} Hz; this model's audio is {sample_rate} Hz (turn "
                "EndpointingOptions.vad off)"
            )
        wrapper = torch.jit.load(str(silero_model_path()), map_location=device).eval()
        self.module = wrapper._model if sample_rate == 16000 else wrapper._model_8k
        self.window = _WINDOWS[sample_rate]
        self.context = int(self.module.context_size_samples)

    def __call__(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [B, context + window]``, ``state [2, B, 128]`` -> ``(prob [B], state [2, B, 128])``."""
        out, state = self.module(x, state)
        return out[:, 0], state


class SpeechStateMachine:
    """Silero's speech segmentation (``get_speech_timestamps_from_probs`` with no ``max_speech_duration_s``) for
    ``S`` slots, one window position at a time, as tensor operations over the streams that have a window there.

    Per slot (device tensors): ``triggered`` (in speech), ``start`` (first sample of the speech segment),
    ``temp_end`` (first sample of the silence that may end it; 0: none, as silero keeps it); per slot settings:
    ``threshold``, ``neg_threshold`` (float64: silero compares Python floats), ``min_silence`` and ``min_speech``
    (samples, float64).
    """

    def __init__(self, num_slots: int, device: torch.device):
        with torch.inference_mode():
            self.triggered = torch.zeros(num_slots, dtype=torch.bool, device=device)
            self.start = torch.zeros(num_slots, dtype=torch.long, device=device)
            self.temp_end = torch.zeros(num_slots, dtype=torch.long, device=device)
            # threshold, neg_threshold, min_silence, min_speech per slot
            self.settings = torch.zeros(4, num_slots, dtype=torch.float64, device=device)

    def reset(self, slot: int, settings: tuple[float, float, float, float]) -> None:
        """A new stream in ``slot``: outside speech, with ``(threshold, neg_threshold, min_silence, min_speech)``."""
        with torch.inference_mode():
            self.triggered[slot] = False
            self.start[slot] = self.temp_end[slot] = 0
            self.settings[:, slot] = torch.tensor(settings, dtype=torch.float64)

    def step(
        self, rows: torch.Tensor, probs: torch.Tensor, window_start: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One window of each of ``rows``: update their states in place (:meth:`advance` without its marks).

        Returns:
            ``ended [N]``, ``start [N]``, ``end [N]`` as :meth:`advance` returns them.
        """
        return self.advance(rows, probs, window_start)[:3]

    def advance(
        self, rows: torch.Tensor, probs: torch.Tensor, window_start: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One window of each of ``rows``: update their states in place.

        Args:
            rows: ``[N]`` distinct slots (device).
            probs: ``[N]`` the window's speech probability.
            window_start: ``[N]`` int64 first sample of the window (silero's ``cur_sample``).

        Returns:
            ``ended [N]`` (a speech segment ended at this window and is longer than ``min_speech``), and its
            ``start [N]`` and ``end [N]`` samples (silero's unpadded segment; meaningful where ``ended``), then
            ``began [N]`` (speech starts at this window: ``VADIterator``'s start, at ``start``) and ``stopped [N]``
            (a speech segment ended here, whatever its length: ``VADIterator``'s end, at ``end``).
        """
        threshold, neg_threshold, min_silence, min_speech = self.settings[:, rows]
        p = probs.double()
        triggered, start = self.triggered[rows], self.start[rows]
        temp_end = self.temp_end[rows]
        speech = p >= threshold
        temp_end = torch.where(speech, 0, temp_end)  # speech came back: forget the silence
        begins = speech & ~triggered
        start = torch.where(begins, window_start, start)
        triggered = triggered | begins
        silent = (p < neg_threshold) & triggered & ~begins  # silero `continue`s after a start
        temp_end = torch.where(silent & (temp_end == 0), window_start, temp_end)
        ended = silent & ((window_start - temp_end).double() >= min_silence)
        kept = ended & ((temp_end - start).double() > min_speech)
        end = temp_end
        self.triggered.index_copy_(0, rows, triggered & ~ended)
        self.start.index_copy_(0, rows, start)
        self.temp_end.index_copy_(0, rows, torch.where(ended, 0, temp_end))
        return kept, start, end, begins, ended


@dataclass
class SpeechMarks:
    """Where speech started or stopped (host arrays ``[M]``): ``slots``, ``samples`` (from the stream's start) and
    ``started`` (``True``: a start, ``False``: an end), per stream in time order."""

    slots: np.ndarray
    samples: np.ndarray
    started: np.ndarray


@dataclass
class SpeechEnds:
    """Speech segments that ended (host arrays ``[E]``): ``slots``, ``starts`` / ``ends`` (samples, unpadded) and
    ``decided`` (samples: the end of the window that confirmed the silence; the audio needed to know)."""

    slots: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    decided: np.ndarray


@dataclass
class VADOutput:
    """What one :meth:`BatchedVAD.process` call computed.

    Attributes:
        slots: ``[N]`` the streams that had windows, in the order of ``probs``' rows.
        first_window: ``[N]`` index of each stream's first window here (from the stream's start).
        windows: ``[N]`` windows per stream.
        probs: ``[N, max(windows)]`` float32 speech probabilities on the device (NaN past a row's windows).
        ends: the speech segments that ended (longer than ``min_speech``: the ones that end utterances).
        marks: every speech start and end (silero's ``VADIterator`` events, unpadded), short segments included.
    """

    slots: np.ndarray
    first_window: np.ndarray
    windows: np.ndarray
    probs: torch.Tensor
    ends: SpeechEnds
    marks: SpeechMarks


class BatchedVAD:
    """Silero VAD over the sample rings of an :class:`~nemo_fastdecode.streaming.frontend.AudioFrontEnd`.

    Call :meth:`process` after every append of the front end (the rings keep only the newest samples), with the
    streams that ended as ``flush``: their last, partial window is read zero-padded, as silero pads it.

    Args:
        front: the front end whose rings hold the streams' decoded samples (its slots are these slots).
        network: silero's network (default: loaded for the front end's rate, on its device).
    """

    def __init__(self, front: AudioFrontEnd, network: SileroNetwork | None = None):
        self.front = front
        self.device = front.device
        self.sample_rate = front.settings.sample_rate
        self.network = SileroNetwork(self.sample_rate, self.device) if network is None else network
        num_slots = front.num_slots
        with torch.inference_mode():
            self.state = torch.zeros(2, num_slots, _STATE, device=self.device)
            self.context = torch.zeros(num_slots, self.network.context, device=self.device)
        self.machine = SpeechStateMachine(num_slots, self.device)
        self._windows = np.zeros(num_slots, dtype=np.int64)  # windows run per slot
        self._min_speech = np.zeros(num_slots)
        self._pad = np.zeros(num_slots)
        self._segments: list[list[tuple[int, int]]] = [[] for _ in range(num_slots)]

    @property
    def window(self) -> int:
        return self.network.window

    def open(self, slot: int, options: EndpointingOptions) -> None:
        """A new stream in ``slot``, with ``options``' VAD settings: silero's state and context zeroed."""
        with torch.inference_mode():
            self.state[:, slot] = 0.0
            self.context[slot] = 0.0
        min_silence, min_speech, pad = (
            self.sample_rate * ms / 1000  # silero's rounding
            for ms in (options.min_silence_ms, options.min_speech_ms, options.speech_pad_ms)
        )
        self.machine.reset(slot, (options.vad_threshold, options.neg_threshold, min_silence, min_speech))
        self._windows[slot] = 0
        self._min_speech[slot], self._pad[slot] = min_speech, pad
        self._segments[slot].clear()

    @torch.inference_mode()
    def process(self, slots: np.ndarray, flush: np.ndarray = ()) -> VADOutput:
        """Run every whole window of ``slots`` that arrived since the last call (and, for ``flush``, the last one).

        Args:
            slots: ``[N]`` distinct open slots (those without a new window cost nothing).
            flush: slots among them whose audio ended: their last partial window runs, zero-padded.
        """
        w = self.window
        slots = np.asarray(slots, dtype=np.int64)
        received = self.front.received_samples(slots)
        ending = np.isin(slots, np.asarray(flush, dtype=np.int64))
        available = np.where(ending, -(-received // w), received // w)
        counts = available - self._windows[slots]
        order = np.argsort(-counts, kind="stable")  # most windows first: window j runs on a prefix of the rows
        order = order[counts[order] > 0]
        slots, counts = slots[order], counts[order]
        first = self._windows[slots]
        width = int(counts.max()) if counts.size else 0
        probs = torch.full((slots.size, width), math.nan, device=self.device)
        if width == 0:
            return VADOutput(slots, first, counts, probs, _no_ends(), _no_marks())
        audio = self.front.read_samples(slots, first * w, width * w).view(slots.size, width, w)
        rows = torch.from_numpy(slots).to(self.device)
        starts = torch.from_numpy(first * w).to(self.device)
        # ended, start, end, began, stopped
        found = torch.zeros(5, slots.size, width, dtype=torch.long, device=self.device)
        active = (counts[None, :] > np.arange(width)[:, None]).sum(1)  # [width] streams with a window j
        for j, n in enumerate(active.tolist()):
            sl = rows[:n]
            x = torch.cat([self.context.index_select(0, sl), audio[:n, j]], dim=1)
            p, state = self.network(x, self.state.index_select(1, sl))
            self.state.index_copy_(1, sl, state)
            self.context.index_copy_(0, sl, x[:, -self.network.context :])
            probs[:n, j] = p
            decision = self.machine.advance(sl, p, starts[:n] + j * w)
            found[:, :n, j] = torch.stack([d.long() for d in decision])
        self._windows[slots] += counts
        host = found.cpu().numpy()  # the one read back to the host
        row, col = np.nonzero(host[0])
        ends = SpeechEnds(slots[row], host[1, row, col], host[2, row, col], (first[row] + col + 1) * w)
        for slot, start, end in zip(ends.slots.tolist(), ends.starts.tolist(), ends.ends.tolist(), strict=True):
            self._segments[slot].append((start, end))
        row, col = np.nonzero(host[3] | host[4])  # row-major: each stream's marks in time order
        began = host[3, row, col].astype(bool)
        marks = SpeechMarks(slots[row], np.where(began, host[1, row, col], host[2, row, col]), began)
        return VADOutput(slots, first, counts, probs, ends, marks)

    def segments(self, slot: int, padded: bool = True) -> list[dict[str, int]]:
        """The stream's speech segments so far, as ``get_speech_timestamps`` returns them for its audio so far
        (``{"start": sample, "end": sample}``; an open segment ends at the last sample received).

        ``padded=False``: silero's segments before :func:`pad_segments` (the starts and ends the state machine found).
        """
        length = int(self.front.received_samples(np.array([slot]))[0])
        in_speech = int(self.machine.start[slot]) if bool(self.machine.triggered[slot]) else None
        pad = float(self._pad[slot]) if padded else None
        return speech_segments(self._segments[slot], in_speech, length, float(self._min_speech[slot]), pad)


def _no_ends() -> SpeechEnds:
    empty = np.zeros(0, dtype=np.int64)
    return SpeechEnds(empty, empty, empty, empty)


def _no_marks() -> SpeechMarks:
    empty = np.zeros(0, dtype=np.int64)
    return SpeechMarks(empty, empty, np.zeros(0, dtype=bool))


def speech_segments(
    ended: list[tuple[int, int]], in_speech: int | None, length: int, min_speech: float, pad: float | None
) -> list[dict[str, int]]:
    """Silero's speech segments of audio of ``length`` samples (the end of ``get_speech_timestamps_from_probs``,
    MIT licence): the segments that ended, then the one still open at the end if longer than ``min_speech``
    samples, then padded (:func:`pad_segments`, unless ``pad`` is ``None``).

    Args:
        ended: ``(start, end)`` samples of the segments that ended, in order.
        in_speech: first sample of the open segment, ``None`` if the audio ends outside speech.
    """
    raw = list(ended)
    if in_speech is not None and length - in_speech > min_speech:
        raw.append((in_speech, length))
    if pad is None:
        return [{"start": start, "end": end} for start, end in raw]
    return pad_segments(raw, length, pad)


def pad_segments(raw: list[tuple[int, int]], length: int, pad: float) -> list[dict[str, int]]:
    """Silero's padding of speech segments (the last loop of ``get_speech_timestamps_from_probs``, MIT licence):
    each side moves out by ``pad`` samples, or, where two segments are closer than ``2 * pad``, both meet halfway.

    Args:
        raw: ``(start, end)`` samples, in order.
        length: the audio's sample count (segments are clipped to it).
        pad: ``speech_pad_ms`` in samples.
    """
    speeches = [{"start": start, "end": end} for start, end in raw]
    for i, speech in enumerate(speeches):
        if i == 0:
            speech["start"] = int(max(0, speech["start"] - pad))
        if i != len(speeches) - 1:
            silence = speeches[i + 1]["start"] - speech["end"]
            if silence < 2 * pad:
                speech["end"] += int(silence // 2)
                speeches[i + 1]["start"] = int(max(0, speeches[i + 1]["start"] - silence // 2))
            else:
                speech["end"] = int(min(length, speech["end"] + pad))
                speeches[i + 1]["start"] = int(max(0, speeches[i + 1]["start"] - pad))
        else:
            speech["end"] = int(min(length, speech["end"] + pad))
    return speeches
