"""The streaming audio front end: every stream's raw PCM in, the mel features NeMo computes on the whole file out.

Per engine cycle, :meth:`AudioFrontEnd.append_staged` takes the new bytes of any number of streams from ONE host
buffer (pinned on a GPU host; the engine's pushes are written there as they arrive:
:class:`~nemo_fastdecode.streaming.inbox.AudioInbox`), copies it to the device in one copy, and one kernel per sample
format (:mod:`~nemo_fastdecode.kernels.pcm_frames`: int16, float32, G.711 mu-law, A-law) decodes and appends the
samples to each slot's sample ring.

Streams at another rate than the model's (:data:`INPUT_RATES`: 8, 11.025, 12, 16, 22.05, 24, 32, 44.1 and 48 kHz) are
resampled on the device: the decode kernel writes their samples into a per-slot *input ring*, and ONE launch of the
resampler (:mod:`~nemo_fastdecode.kernels.resample`; its rows travel in the same copy as the audio) computes, for all
of them whatever their rates, the samples at the model's rate, ``scipy.signal.resample_poly(x, up, down)`` of the
whole stream with its default filter (designed with ``scipy.signal.firwin`` once per rate) up to fp32 rounding,
whatever the push sizes. A resampled sample is final once the newest input its filter reads has arrived (``half_len /
up`` inputs later, 0.6 ms at 24 kHz); the outputs past it are computed too, as if the stream ended there, so that a
stream's end needs no kernel of its own (they are recomputed with the next push). From there on everything is in the
model's time base: sample counts (:meth:`AudioFrontEnd.samples_received`), frames, the VAD, events' times.
:meth:`AudioFrontEnd.features` then computes, for all streams in one batched pass, every feature frame whose
samples have all arrived: one kernel cuts the windowed, pre-emphasised frames from the rings
(:mod:`~nemo_fastdecode.kernels.stft_frames`), torch's FFT transforms them, one kernel takes the power spectrum
(:mod:`~nemo_fastdecode.kernels.power_spectrum`, on a GPU), and torch's mel product and log finish. These are
exactly the frames of NeMo's ``AudioToMelSpectrogramPreprocessor`` on the whole file (``FilterbankFeatures.forward``
in eval mode)::

    y[0] = x[0],  y[i] = x[i] - preemph * x[i - 1]       pre-emphasis (first sample kept)
    p = [n_fft // 2 zeros, y, n_fft // 2 zeros]            torch.stft(center=True, pad_mode="constant")
    frame t = p[t * hop : t * hop + n_fft] * window        (win_length window centred in n_fft, zeros around)
    features[:, t] = log(fb @ |rfft(frame t)| ** mag_power + guard),   t < seq_len = floor(L / hop)

Frame ``t`` reads the pre-emphasised samples where its padded window is non-zero: for NeMo's 400-sample Hann
window (``periodic=False``, zero at both ends) in a 512-point FFT, ``y[t*hop - 199 : t*hop + 199]``, i.e. the
samples ``x[t*hop - 200 : t*hop + 199]``. So it is emitted as soon as sample ``t*hop + 198`` has arrived
(:attr:`MelSettings.lookahead`: 199 samples, 12.4 ms at 16 kHz, not the 256 of the whole FFT frame), and at a
stream's end (``flush``) the remaining valid frames are computed with NeMo's zero padding.
The frames past ``seq_len`` (which NeMo masks to ``pad_value``) are never emitted: a stream of ``L`` samples
yields exactly ``seq_len`` frames.

Exactness (fp32): every step rounds as NeMo's torch operations do, on the same values, in the same layouts; only
the number of frames per call differs (and the FFT's batch, rounded up by :func:`fft_rows` with zero frames so that
cuFFT meets few batch sizes). On the CPU that changes nothing: the features equal NeMo's bit for bit
(tested). On a GPU the frames, the FFT and the power spectrum stay bit-exact (cuFFT transforms each frame alone;
checked on an H100), but cuBLAS may pick another algorithm for another number of frames: the mel product sums 257
non-negative terms, so another summation order moves a mel energy by at most ~257 fp32 roundings (relative 1.5e-5,
the same absolute after the log), in practice one or two (max 3.6e-7 after the log on an H100). Dither is not
applied: NeMo adds it in training mode only, and eval-mode features are the reference (a model's ``dither: 1e-5``
changes nothing here).

What is refused, with an error naming the value: preprocessors other than NeMo's ``FilterbankFeatures``
(e.g. its torchaudio variant), ``normalize`` other than ``"NA"`` (per-utterance statistics would look at the
whole future of a stream), ``frame_splicing != 1``, ``exact_pad=True``, no window; streams at a sample rate that is
neither the model's nor one of :data:`INPUT_RATES`, sample formats other than int16, float32, mu-law and A-law, more
than one channel, non-finite float samples, more than ``max_push_seconds`` of a stream's audio between two
:meth:`AudioFrontEnd.features` calls. Memory is bounded: each slot keeps a ring of ``max_push_seconds`` of audio plus
one frame's context, overwritten as frames are emitted (and, once a stream at another rate opens, an input ring of
``max_push_seconds`` at 48 kHz plus the filter's reach).

Not thread-safe: one engine thread calls ``append`` and ``features``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

try:  # Triton is optional: without it the kernel's torch reference decodes
    import triton
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None

from nemo_fastdecode.graphs.capture import capture_graph
from nemo_fastdecode.kernels import triton_runs_on
from nemo_fastdecode.kernels.pcm_frames import ROW_FIELDS, SampleFormat, pcm_frames, pcm_frames_reference
from nemo_fastdecode.kernels.power_spectrum import power_spectrum, power_spectrum_reference
from nemo_fastdecode.kernels.resample import (
    FilterBank,
    Ratio,
    ready_outputs,
    resample,
    resample_reference,
    total_outputs,
)
from nemo_fastdecode.kernels.stft_frames import FrameIndex, stft_frames, stft_frames_reference
from nemo_fastdecode.streaming.inbox import AudioInbox, StagedAudio, earlier_in_slot
from nemo_fastdecode.streaming.staging import HostStaging

__all__ = ["INPUT_RATES", "AudioFrontEnd", "FrontEndOutput", "MelSettings", "SampleFormat"]

_NO_NORMALIZATION = ("NA", None, "", False)  # NeMo's FilterbankFeatures skips normalize_batch or passes x through

INPUT_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
"""Sample rates (Hz) a stream may have besides the model's: the others are resampled to the model's rate on the
device (:mod:`~nemo_fastdecode.kernels.resample`, ``scipy.signal.resample_poly``'s filter)."""


@dataclass(frozen=True)
class MelSettings:
    """NeMo's mel-spectrogram settings, read once from a model's preprocessor.

    Attributes:
        sample_rate: the model's sample rate (``preprocessor._sample_rate``).
        n_fft, hop, win_length: FFT size, frame hop and window length in samples.
        window: ``[n_fft]`` float32, the window centred in ``n_fft`` as ``torch.stft`` pads it.
        fb: ``[1, n_mels, n_fft // 2 + 1]`` float32 mel filterbank (NeMo's ``fb``).
        preemph: pre-emphasis coefficient, or ``None`` for none.
        mag_power: power applied to the magnitude spectrum.
        log: whether the log is taken; ``log_guard_type`` ``"add"`` or ``"clamp"``; ``log_guard`` its value.
        sqrt_guard: added before the magnitude's square root (NeMo: 0 unless ``use_grads``).
        pad: samples of zero padding on each side (``n_fft // 2``, ``torch.stft(center=True)``).
        first_tap, last_tap: first and last index of the padded window that is non-zero.
    """

    sample_rate: int
    n_fft: int
    hop: int
    win_length: int
    window: torch.Tensor
    fb: torch.Tensor
    preemph: float | None
    mag_power: float
    log: bool
    log_guard_type: str
    log_guard: float
    sqrt_guard: float
    pad: int
    first_tap: int
    last_tap: int

    @classmethod
    def from_preprocessor(cls, preprocessor: torch.nn.Module) -> MelSettings:
        """Read (and check) the settings of a NeMo ``AudioToMelSpectrogramPreprocessor``."""
        from nemo.collections.asr.parts.preprocessing.features import CONSTANT, FilterbankFeatures

        featurizer = getattr(preprocessor, "featurizer", None)
        if type(featurizer) is not FilterbankFeatures:
            raise ValueError(
                "the audio front end computes NeMo's FilterbankFeatures (AudioToMelSpectrogramPreprocessor with "
                f"use_torchaudio=False); got featurizer {type(featurizer).__name__}"
            )
        checks = {
            "normalize": (featurizer.normalize, featurizer.normalize in _NO_NORMALIZATION, "'NA'"),
            "frame_splicing": (featurizer.frame_splicing, featurizer.frame_splicing == 1, "1"),
            "exact_pad": (featurizer.exact_pad, not featurizer.exact_pad, "False"),
            "window": ("none", featurizer.window is not None, "a window name such as 'hann'"),
        }
        for name, (value, ok, valid) in checks.items():
            if not ok:
                raise ValueError(
                    f"preprocessor setting {name}={value!r} is not supported by the streaming front end "
                    f"(cache-aware models use {name}={valid})"
                )
        n_fft, win_length = int(featurizer.n_fft), int(featurizer.win_length)
        if win_length > n_fft:
            raise ValueError(f"preprocessor setting n_window_size={win_length} exceeds n_fft={n_fft}")
        # torch.stft centres a shorter window in n_fft with zeros around it
        window = torch.zeros(n_fft)
        left = (n_fft - win_length) // 2
        window[left : left + win_length] = featurizer.window.detach().float().cpu()
        taps = torch.nonzero(window).flatten()
        if taps.numel() == 0:
            raise ValueError("preprocessor window is all zeros")
        guard_probe = torch.zeros((), dtype=torch.float32)  # 'tiny' / 'eps' guards depend on the dtype
        preemph = featurizer.preemph
        return cls(
            sample_rate=int(preprocessor._sample_rate),
            n_fft=n_fft,
            hop=int(featurizer.hop_length),
            win_length=win_length,
            window=window,
            fb=featurizer.fb.detach().float().cpu(),
            preemph=None if preemph is None else float(preemph),
            mag_power=float(featurizer.mag_power),
            log=bool(featurizer.log),
            log_guard_type=str(featurizer.log_zero_guard_type),
            log_guard=float(featurizer.log_zero_guard_value_fn(guard_probe)),
            sqrt_guard=CONSTANT if featurizer.use_grads else 0.0,
            pad=n_fft // 2,
            first_tap=int(taps[0]),
            last_tap=int(taps[-1]),
        )

    @property
    def features(self) -> int:
        """Mel features per frame (``feat_in`` of the encoder)."""
        return int(self.fb.shape[1])

    @property
    def lookahead(self) -> int:
        """Samples at and after ``t * hop`` that frame ``t`` reads (199 for NeMo's 400-in-512 Hann window)."""
        return self.last_tap + 1 - self.pad

    def seq_len(self, samples: np.ndarray) -> np.ndarray:
        """NeMo's valid frame count for ``samples`` samples (``get_seq_len``, center=True), element-wise."""
        return np.maximum((samples + 2 * self.pad - self.n_fft) // self.hop, 0)

    def complete_frames(self, samples: np.ndarray) -> np.ndarray:
        """Frames whose every sample is among the first ``samples`` (and valid however the stream ends)."""
        # frame t reads padded positions up to t * hop + last_tap, i.e. samples up to t * hop + last_tap - pad
        reach = samples + self.pad - self.last_tap - 1
        complete = np.where(reach >= 0, reach // self.hop + 1, 0)
        return np.minimum(complete, self.seq_len(samples))


@dataclass
class FrontEndOutput:
    """New feature frames of one :meth:`AudioFrontEnd.features` call, packed along time.

    Attributes:
        features: ``[F, R]`` float32 on the front end's device: the new frames of ``slots[i]`` are columns
            ``offsets[i] : offsets[i] + counts[i]``, in time order.
        slots: ``[N]`` int64, the streams that got frames (slot ids), in increasing order.
        starts: ``[N]`` int64, index of each stream's first new frame in its whole-file features.
        counts: ``[N]`` int64, new frames per stream.
        offsets: ``[N]`` int64, first column of each stream in ``features``.
        ended: ``[E]`` int64, the slots flushed by this call, in increasing order (their last frames are here; they
            accept no more audio).
    """

    features: torch.Tensor
    slots: np.ndarray
    starts: np.ndarray
    counts: np.ndarray
    offsets: np.ndarray
    ended: np.ndarray

    def for_slot(self, slot: int) -> torch.Tensor:
        """``[F, n]`` view of one stream's new frames (``n = 0`` if it got none)."""
        i = int(np.searchsorted(self.slots, slot))
        if i == len(self.slots) or self.slots[i] != slot:
            return self.features[:, :0]
        offset = int(self.offsets[i])
        return self.features[:, offset : offset + int(self.counts[i])]

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor]]:
        """``(slot, [F, n] view)`` per stream that got frames."""
        for slot, offset, count in zip(self.slots.tolist(), self.offsets.tolist(), self.counts.tolist(), strict=True):
            yield slot, self.features[:, offset : offset + count]


def _host_bytes(audio: Any, sample_format: SampleFormat, slot: int) -> bytes | memoryview:
    """The raw bytes of one push: bytes-like, or a mono numpy array / CPU tensor of the stream's dtype (or uint8)."""
    if type(audio) is bytes:  # what a socket gives: no view needed
        return audio
    if isinstance(audio, torch.Tensor):
        audio = audio.detach().cpu().numpy()
    if isinstance(audio, np.ndarray):
        if audio.ndim != 1:
            raise ValueError(f"stream {slot}: audio must be mono (1-D), got an array of shape {audio.shape}")
        expected = sample_format.dtype
        if audio.dtype not in (expected, np.dtype(np.uint8)):
            raise ValueError(
                f"stream {slot}: an array of dtype {audio.dtype} was pushed to a {sample_format.value} stream "
                f"(valid: {expected} or raw bytes as uint8)"
            )
        audio = np.ascontiguousarray(audio)
    view = memoryview(audio)
    if not view.c_contiguous:
        raise ValueError(f"stream {slot}: audio bytes must be contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def fft_rows(frames: int) -> int:
    """The batch size the FFT runs at for ``frames`` frames: rounded up on a ladder of 8 sizes per octave (at most
    1/8 more rows). cuFFT builds a plan for every new batch size (about a millisecond); a cycle's frame count varies
    with the streams in it, so unrounded a server would meet new sizes for as long as it runs."""
    if frames <= 16:
        return 16
    step = 1 << (frames.bit_length() - 4)
    return -(-frames // step) * step


def _frame_index(meta: torch.Tensor, width: int, streams: int, frames: int) -> FrameIndex:
    """The :class:`FrameIndex` in a device copy of :meth:`AudioFrontEnd._mel`'s int64 layout: ``[frame count,
    slot [width], start [width], offset [width], end [width], stream_of [frames]]``, ``streams`` entries used."""
    slot, start, offset, end = meta[1 : 1 + 4 * width].view(4, width)[:, :streams]
    return FrameIndex(meta[1 + 4 * width : 1 + 4 * width + frames], slot, start, offset, end)


class _FeatureGraphs:
    """The feature pass of :meth:`AudioFrontEnd.features` as CUDA graphs, one per power-of-two row count.

    A pass launches about ten operations (frame cut, FFT, power spectrum, mel product, log and their allocations),
    whose host cost is most of the front end's time while the GPU's work is small. A graph replays them in one
    launch. Each graph reads a static int64 input (the frame count, the per-stream facts sized for every slot, the
    stream of each row), filled by one copy before the replay; rows past the frame count are the FFT's zero padding.
    Graphs share one memory pool: only one runs at a time, and its features are copied out before the next pass. The
    mel product runs on the padded row count, so cuBLAS may sum in another order than for the exact count: the
    module docstring's GPU precision.
    """

    MAX_ROWS = 1 << 17
    """Larger passes (a thousand streams catching up a second each) run eagerly: their graph's memory (about 5 KiB a
    row in the pool) would be held for a rare cycle."""

    def __init__(self, front: AudioFrontEnd):
        self._front = front
        self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}

    @staticmethod
    def rows(frames: int) -> int:
        """The row count a pass of ``frames`` frames runs at: the next power of two, at least 16."""
        return max(16, 1 << (frames - 1).bit_length())

    @property
    def captured(self) -> list[int]:
        """Row counts whose graph has been captured."""
        return sorted(self._graphs)

    def capture_up_to(self, frames: int) -> None:
        """Capture the graphs of every row count a pass of at most ``frames`` frames runs at."""
        rows = 16
        while rows <= self.MAX_ROWS:
            if rows not in self._graphs:
                self._graphs[rows] = self._capture(rows)
            if rows >= frames:
                return
            rows *= 2

    def takes(self, frames: int) -> bool:
        """Whether a pass of ``frames`` frames runs as a replay (at most :attr:`MAX_ROWS` rows)."""
        return self.rows(frames) <= self.MAX_ROWS

    def run(self, nbytes: int, frames: int) -> torch.Tensor:
        """``[F, frames]`` features of the pass staged in the front end's meta buffer (``nbytes`` of it)."""
        rows = self.rows(frames)
        entry = self._graphs.get(rows)
        if entry is None:
            entry = self._graphs[rows] = self._capture(rows)
        graph, inputs, features = entry
        self._front._meta.send(nbytes, into=inputs)
        graph.replay()
        return features[:, :frames].clone()  # the caller's own tensor, as an eager pass gives: the next replay reuses

    def _capture(self, rows: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
        front, s = self._front, self._front.settings
        width = front.num_slots
        inputs = torch.zeros(1 + 4 * width + rows, dtype=torch.int64, device=front.device)  # outside the pool
        inputs[0] = 1  # warm-up and capture cut one frame of slot 0 (nothing is written but the graph's own output)

        def feature_pass() -> torch.Tensor:
            index = _frame_index(inputs, width, width, rows)
            cut = stft_frames(
                front.ring, front._window, index, hop=s.hop, pad=s.pad, preemph=s.preemph, frame_count=inputs[:1]
            )
            return front._spectrum_to_mel(cut, rows)

        graph, features = capture_graph(feature_pass, front.device, warmup=1, pool=self._pool)
        return graph, inputs, features


class AudioFrontEnd:
    """Raw audio of ``num_slots`` streams in, NeMo's whole-file mel features out, for all streams at once.

    Typical cycle of a streaming engine::

        front = AudioFrontEnd(model.preprocessor, num_slots=1024, device="cuda")
        front.open(3)                                  # int16 PCM at the model's rate, mono
        front.open(7, sample_rate=8000, sample_format="mulaw")  # G.711 mu-law at 8 kHz: resampled on the device
        front.append({3: pcm_bytes, 7: other_bytes})   # any number of streams: one host-to-device copy
        out = front.features(flush={7})                # every complete frame, batched; stream 7 ends
        for slot, frames in out:                       # [F, n] views, in time order
            ...

    Args:
        preprocessor: the model's ``AudioToMelSpectrogramPreprocessor`` (settings read once: :class:`MelSettings`).
        num_slots: the most streams open at once (slots ``0 .. num_slots - 1``).
        device: where the sample rings, the kernels and the features live.
        max_push_seconds: the most audio a stream may receive between two :meth:`features` calls. Sizes the rings:
            ``num_slots x (max_push_seconds * rate + n_fft + hop + 1 + lag)`` float32 (``lag``: a few dozen samples,
            what a resampled stream's end adds), and once a stream at another rate opens, the input rings of the
            resampled streams: ``num_slots x (max_push_seconds * 48000 + history)`` float32 (``history``: about 64).
        cuda_graphs: on a CUDA device with Triton, run each :meth:`features` pass (frame cut, FFT, power, mel product,
            log) as one CUDA graph replay per power-of-two frame count up to 131,072 (:class:`_FeatureGraphs`).
    """

    def __init__(
        self,
        preprocessor: torch.nn.Module,
        num_slots: int,
        device: str | torch.device = "cpu",
        *,
        max_push_seconds: float = 1.0,
        cuda_graphs: bool = False,
    ):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        if not max_push_seconds > 0:
            raise ValueError(f"max_push_seconds must be > 0, got {max_push_seconds}")
        self.settings = s = MelSettings.from_preprocessor(preprocessor)
        self.num_slots, self.device = num_slots, torch.device(device)
        self.max_push_seconds = max_push_seconds
        # Resampling: one ratio per supported input rate; the bounds below hold for every one of them
        self._ratios = {rate: Ratio.of(rate, s.sample_rate) for rate in INPUT_RATES if rate != s.sample_rate}
        self._taps = max((r.taps for r in self._ratios.values()), default=1)
        lag = max((r.lag for r in self._ratios.values()), default=0)
        # Ring row of a slot: absolute padded sample position q (sample index + pad) lives at column q % capacity.
        # Once features() has emitted every complete frame, the next frame's samples (from one before its first
        # tap) span < n_fft + hop + 1 positions; one push comes on top (for a resampled stream: its outputs up to
        # the stream's end as if it ended there, at most `lag` more).
        self.capacity = math.ceil(max_push_seconds * s.sample_rate) + s.n_fft + s.hop + 1 + lag
        self.ring = torch.zeros(num_slots, self.capacity, dtype=torch.float32, device=self.device)
        # Input ring row of a resampled stream: input k at column k % input_capacity; it holds the inputs the first
        # output not yet final reads, and one push (allocated when the first resampled stream opens)
        history = max((r.history for r in self._ratios.values()), default=0)
        self.input_capacity = math.ceil(max_push_seconds * max(INPUT_RATES)) + history + 1
        self.input_ring: torch.Tensor | None = None
        self._filters = FilterBank(self.device)
        self._window = s.window.to(self.device)
        self._fb = s.fb.to(self.device)
        self._use_triton = triton is not None and triton_runs_on(self.device)
        self._packing = AudioInbox(num_slots, self.device)  # append()'s pushes, packed for append_staged()
        self._meta = HostStaging(self.device)
        self._reads = HostStaging(self.device)  # read_samples' indices
        self._graphs = _FeatureGraphs(self) if cuda_graphs and self._use_triton and self.device.type == "cuda" else None
        # host-side state per slot: the host knows every count, so no decision waits on the GPU
        self._open = np.zeros(num_slots, dtype=bool)
        self._ended = np.zeros(num_slots, dtype=bool)
        self._samples = np.zeros(num_slots, dtype=np.int64)  # whole samples received
        self._emitted = np.zeros(num_slots, dtype=np.int64)  # feature frames emitted
        self._format = [SampleFormat.INT16] * num_slots
        self._itemsize = np.full(num_slots, SampleFormat.INT16.itemsize, dtype=np.int64)
        self._format_code = np.zeros(num_slots, dtype=np.int64)  # SampleFormat.code
        self._partial: dict[int, bytes] = {}  # leading bytes of a sample whose other bytes have not arrived yet
        # resampled streams (rate other than the model's): rate, ratio, filter, input samples received; _samples
        # counts the outputs final so far (all of them once the stream ended)
        self._rate = np.full(num_slots, s.sample_rate, dtype=np.int64)
        self._resampled = np.zeros(num_slots, dtype=bool)
        self._up = np.ones(num_slots, dtype=np.int64)
        self._down = np.ones(num_slots, dtype=np.int64)
        self._half_len = np.zeros(num_slots, dtype=np.int64)
        self._filter_offset = np.zeros(num_slots, dtype=np.int64)
        self._inputs = np.zeros(num_slots, dtype=np.int64)

    # ---- streams -------------------------------------------------------------------------------------------
    def open(
        self,
        slot: int,
        *,
        sample_rate: int | None = None,
        channels: int = 1,
        sample_format: str | SampleFormat = "int16",
    ) -> None:
        """Start a stream in a free slot.

        Args:
            slot: a closed slot.
            sample_rate: the audio's rate in Hz: the model's (``None``), or one of :data:`INPUT_RATES` (resampled to
                the model's rate on the device, as ``scipy.signal.resample_poly`` does on the whole stream).
            channels: must be 1 (mono).
            sample_format: ``"int16"`` (16-bit PCM, scaled ``x / 32768`` as NeMo reads WAV files), ``"float32"``
                (both little-endian), ``"mulaw"`` or ``"alaw"`` (G.711, one byte a sample, decoded to its 16-bit
                linear value / 32768).

        Raises:
            ValueError: a rate, channel count or format not taken, naming it and the valid ones.
        """
        self._check_slot(slot)
        if self._open[slot]:
            raise ValueError(f"slot {slot} is already open; close or reset it first")
        model_rate = self.settings.sample_rate
        rate = model_rate if sample_rate is None else sample_rate
        if (
            isinstance(rate, bool)
            or not isinstance(rate, (int, np.integer))
            or (rate != model_rate and rate not in self._ratios)
        ):
            valid = ", ".join(str(r) for r in sorted({model_rate, *INPUT_RATES}))
            raise ValueError(
                f"stream {slot}: sample rate {sample_rate!r} Hz is not supported; valid: {valid} Hz (the model runs "
                f"at {model_rate} Hz; other rates are resampled to it)"
            )
        if channels != 1:
            raise ValueError(f"stream {slot}: {channels} channels are not supported; valid: 1 (mono)")
        self._format[slot] = sample_format = SampleFormat.parse(sample_format)
        self._itemsize[slot] = sample_format.itemsize
        self._format_code[slot] = sample_format.code
        rate = int(rate)
        self._rate[slot] = rate
        self._resampled[slot] = resampled = rate != model_rate
        if resampled:
            ratio = self._ratios[rate]
            self._up[slot], self._down[slot], self._half_len[slot] = ratio.up, ratio.down, ratio.half_len
            self._filter_offset[slot] = self._filters.add(ratio)  # designed once per rate
            if self.input_ring is None:
                self.input_ring = torch.zeros(self.num_slots, self.input_capacity, device=self.device)
        else:
            self._up[slot] = self._down[slot] = 1
            self._half_len[slot] = 0
        self._open[slot] = True
        self.reset(slot)

    def reset(self, slot: int) -> None:
        """Restart an open stream at its first sample (same format); audio not yet turned into frames is dropped."""
        self._check_open(slot)
        self._ended[slot] = False
        self._samples[slot] = self._emitted[slot] = self._inputs[slot] = 0
        self._partial.pop(slot, None)
        # the ring row keeps old samples: frames read only positions this stream has written (masks in features)

    def close(self, slot: int) -> None:
        """Free a slot; audio not yet turned into frames is dropped."""
        self._check_open(slot)
        self._open[slot] = False
        self._partial.pop(slot, None)

    def samples_received(self, slot: int) -> int:
        """Samples of the stream at the model's rate in its ring so far: those received, or for a resampled stream
        the resampled samples final so far (all ``ceil(inputs * up / down)`` of them once it was flushed)."""
        return int(self._samples[slot])

    def input_rate(self, slot: int) -> int:
        """The stream's sample rate in Hz (the model's, or the rate it is resampled from)."""
        return int(self._rate[slot])

    def input_samples(self, slots: np.ndarray, model_samples: int) -> np.ndarray:
        """``[N]``: how many input samples of each of ``slots`` make at most ``model_samples`` samples at the model's
        rate (``model_samples * in_rate / model_rate``, rounded down): a push limit in the streams' own rates."""
        return model_samples * self._down[slots] // self._up[slots]

    def frames_emitted(self, slot: int) -> int:
        """Feature frames of the stream emitted so far (= the index of its next frame)."""
        return int(self._emitted[slot])

    def received_samples(self, slots: np.ndarray) -> np.ndarray:
        """``[N]`` samples at the model's rate of each of ``slots`` (:meth:`samples_received` for many streams)."""
        return self._samples[slots]

    def read_samples(self, slots: np.ndarray, starts: np.ndarray, length: int) -> torch.Tensor:
        """``[N, length]`` float32: samples ``starts[i] .. starts[i] + length - 1`` of each ``slots[i]``, read in place
        from the device sample rings (one gather; the audio is not copied from the host again), zero from the
        stream's received sample count on (as a reader pads a stream's last window).

        A ring keeps its stream's newest ``capacity`` positions: a reader must read every cycle (``starts`` at most
        ``capacity`` samples behind the stream's end), else this raises, naming the stream.
        """
        received = self._samples[slots]
        for i in np.flatnonzero(received - starts > self.capacity)[:1].tolist():
            raise ValueError(
                f"stream {slots[i]}: sample {starts[i]} was overwritten in the front end's ring ({received[i]} samples "
                f"received, {self.capacity} kept); read the samples every cycle"
            )
        meta = self._reads.upload(np.stack([slots, starts, received]).astype(np.int64))
        slot, start, end = meta[:, :, None]  # [N, 1] each
        index = start + torch.arange(length, device=self.device)  # [N, length] sample indices
        samples = self.ring[slot, (index + self.settings.pad) % self.capacity]  # ring column of sample i: pad + i
        return torch.where(index < end, samples, 0.0)

    def ended(self, slot: int) -> bool:
        """Whether the stream was flushed (all its frames emitted; it takes no more audio until reset)."""
        return bool(self._ended[slot])

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot} is out of range; valid: 0 to {self.num_slots - 1}")

    def _check_open(self, slot: int) -> None:
        self._check_slot(slot)
        if not self._open[slot]:
            raise ValueError(f"slot {slot} is not open")

    def _check_live(self, slots: np.ndarray) -> None:
        """Every slot is open and not flushed (vectorised: an append may name thousands)."""
        if slots.size == 0:
            return
        bad = (slots < 0) | (slots >= self.num_slots)
        bad[~bad] = ~self._open[slots[~bad]]
        for slot in slots[bad][:1].tolist():
            self._check_open(slot)
        for slot in slots[self._ended[slots]][:1].tolist():
            raise ValueError(f"stream {slot} was flushed; reset or close it before pushing more audio")

    def warm_up(self) -> int:
        """Launch every kernel variant a cycle can launch once, on up to two slots; returns the slots used (0 while any
        stream is open: a features() call would take the open streams' frames, so it launches nothing then).

        Triton compiles (or loads from its disk cache) one binary per specialisation of a kernel's arguments: here
        the sample format and the number of frames in one call (1, a multiple of 16, any other), on one and on two
        streams, and the resampler (on a stream at another rate than the model's). Every supported rate's
        resampling filter is designed here too (else at the first stream of that rate), and the input rings
        allocated. A server that meets a variant first under load stalls every stream for that compile, so it launches
        them all before it is ready. The slots are closed again afterwards; their ring rows keep zeros, which no
        later stream reads. With ``cuda_graphs``, the feature pass's graphs are captured first, for every row count
        a call can reach (this part runs also while streams are open: a capture writes only the graph's own
        buffers).
        """
        for ratio in self._ratios.values():
            self._filters.add(ratio)
        if self._ratios and self.input_ring is None:
            self.input_ring = torch.zeros(self.num_slots, self.input_capacity, device=self.device)
        if self._graphs is not None:
            self._graphs.capture_up_to(self.num_slots * (self.capacity // self.settings.hop + 1))
        if self._open.any():
            return 0
        free = list(range(min(2, self.num_slots)))
        s = self.settings
        # per stream and call: 1 frame, then 8 (16 in all with two streams) and 3, within what one push may carry
        most = (self.capacity - s.n_fft - s.hop - 1) // s.hop
        pushes = [s.lookahead] + [frames * s.hop for frames in (min(8, most), min(3, most)) if frames > 0]
        # every format on one and two streams at the model's rate; G.711 and a resampled stream (its decode rows
        # target the input ring; the resampler's one variant) on one
        other_rate = next(iter(self._ratios), None)
        variants = [(f, None, len(free)) for f in (SampleFormat.INT16, SampleFormat.FLOAT32)]
        variants += [(f, None, 1) for f in (SampleFormat.MULAW, SampleFormat.ALAW)]
        if other_rate is not None:
            variants.append((SampleFormat.INT16, other_rate, 1))
        for sample_format, rate, most_streams in variants:
            for count in range(1, most_streams + 1):
                slots = free[:count]
                for slot in slots:
                    self.open(slot, sample_format=sample_format, sample_rate=rate)
                for samples in pushes:
                    inputs = int(self.input_samples(np.array(slots[:1]), samples)[0])
                    silence = bytes(inputs * sample_format.itemsize)
                    self.append({slot: silence for slot in slots})
                    self.features()
                self.features(flush=slots)
                for slot in slots:
                    self.close(slot)
        return len(free)

    # ---- audio in ------------------------------------------------------------------------------------------
    def append(self, pushes: Mapping[int, Any]) -> None:
        """Append new audio of any number of open streams: one host buffer, one copy, one kernel per format.

        The pushes are packed into a host buffer (an :class:`~nemo_fastdecode.streaming.inbox.AudioInbox` of the
        front end's own) and appended by :meth:`append_staged`.

        Args:
            pushes: ``{slot: audio}``; audio is bytes-like (``bytes``, ``bytearray``, ``memoryview``) in the stream's
                format, or a 1-D numpy array / CPU tensor of its dtype (or uint8 bytes; G.711 streams: uint8). Any byte count: the bytes of
                a sample split between two pushes wait on the host until the rest arrives. Empty pushes do nothing.

        Raises:
            ValueError: a closed or flushed slot, a multi-channel array, a wrong dtype, non-finite float samples, or
                more audio than ``max_push_seconds`` since the last :meth:`features` (each names the stream).
                Nothing is appended when an error is raised.
        """
        slots = np.fromiter(pushes, dtype=np.int64, count=len(pushes))
        self._check_live(slots)
        data = [_host_bytes(audio, self._format[slot], slot) for slot, audio in pushes.items()]
        partial = {}
        for i, slot in enumerate(slots.tolist()):
            if slot in self._partial:  # the first bytes of a split sample come first (rare: copies are fine)
                data[i] = self._partial[slot] + bytes(data[i])
            split = len(data[i]) % int(self._itemsize[slot])
            if split:
                partial[slot] = bytes(data[i][len(data[i]) - split :])
                data[i] = memoryview(data[i])[: len(data[i]) - split]
        for slot, audio in zip(slots.tolist(), data, strict=True):
            self._packing.write(slot, audio)
        staged = self._packing.take(slots, self._packing.pending_bytes[slots])
        if staged is not None:
            self.append_staged(staged)
        # every check passed: commit the split samples' first bytes
        for slot in slots.tolist():
            self._partial.pop(slot, None)
        self._partial.update(partial)

    def append_staged(self, staged: StagedAudio) -> None:
        """Append audio staged in a host log (:meth:`AudioInbox.take`): one copy, one kernel per sample format, one
        resampler launch for the streams at other rates.

        Each record holds whole samples of its slot's format; a slot's records follow each other in its ring. The
        int32 rows ``[R, 5]`` (byte offset, samples, slot, first ring position, target ring) are written after the
        log's payloads and go with them in the same copy; :func:`~nemo_fastdecode.kernels.pcm_frames.pcm_frames`
        decodes them (a resampled stream's into its input ring). So do the int64 rows of
        :func:`~nemo_fastdecode.kernels.resample.resample`, one per resampled stream: its outputs from the first not
        yet final to the stream's end so far.

        Raises:
            ValueError: a closed or flushed slot, a record of partial samples, non-finite float samples, or more audio
                than ``max_push_seconds`` since the last :meth:`features` (each names the stream). Nothing is
                appended when an error is raised.
        """
        s = self.settings
        slots, sizes = staged.slots, staged.sizes
        self._check_live(slots)
        if slots.size == 0:
            return
        itemsize = self._itemsize[slots]
        for i in np.flatnonzero(sizes % itemsize)[:1].tolist():
            raise ValueError(f"stream {slots[i]}: a staged record of {sizes[i]} bytes holds a partial sample")
        counts = sizes // itemsize
        totals = np.zeros(self.num_slots, dtype=np.int64)  # new samples per slot (at the stream's rate)
        if staged.unique_slots:  # the usual cycle: one record per stream
            before, touched = np.zeros_like(counts), slots
            totals[slots] = counts
        else:
            before = earlier_in_slot(slots, counts)
            np.add.at(totals, slots, counts)
            touched = np.flatnonzero(totals)
        # samples at the model's rate after this append: a resampled stream's outputs up to its end as if it ended
        # now (computed now, so that a flush needs no kernel; final only up to ready_outputs)
        resampled = touched[self._resampled[touched]]
        inputs = self._inputs[resampled] + totals[resampled]
        up, down, half_len = self._up[resampled], self._down[resampled], self._half_len[resampled]
        after = self._samples[touched] + totals[touched]
        after[self._resampled[touched]] = total_outputs(inputs, up, down)
        # the next frame still reads from one sample before its first padded position on
        held = s.pad + after - (self._emitted[touched] * s.hop - 1)
        # a resampled stream's input ring holds what its first output not yet final reads, and the new inputs
        oldest = np.maximum(-(-(self._samples[resampled] * down - half_len) // up), 0)
        over = np.flatnonzero(held > self.capacity)
        over_inputs = resampled[inputs - oldest > self.input_capacity]
        for slot in np.union1d(touched[over], over_inputs)[:1].tolist():
            raise ValueError(
                f"stream {slot}: {totals[slot]} new samples exceed what the front end holds between two "
                f"features() calls (max_push_seconds={self.max_push_seconds}); call features() more often or raise "
                "max_push_seconds"
            )
        code = self._format_code[slots]
        for i in np.flatnonzero(code == SampleFormat.FLOAT32.code).tolist():
            values = staged.payload(i).view(np.float32)
            if not np.isfinite(values).all():
                bad = int(np.flatnonzero(~np.isfinite(values))[0])
                raise ValueError(
                    f"stream {slots[i]}: non-finite sample {values[bad]} at sample "
                    f"{int(self._received(slots[i]) + before[i]) + bad}; audio must be finite"
                )
        to_input = self._resampled[slots]  # resampled streams' samples go to their input rings
        rows = np.empty((len(slots), ROW_FIELDS), dtype=np.int32)
        rows[:, 0] = staged.offsets
        rows[:, 1] = counts
        rows[:, 2] = slots
        rows[:, 3] = np.where(
            to_input,
            (self._inputs[slots] + before) % self.input_capacity,
            (s.pad + self._samples[slots] + before) % self.capacity,
        )
        rows[:, 4] = to_input
        if (code != code[0]).any():  # formats grouped: one kernel launch each
            order = np.argsort(code, kind="stable")
            rows, code = rows[order], code[order]
        # the resampler's rows: each resampled stream's outputs from its first one not yet final to its end so far
        table = None
        if resampled.size:
            first = self._samples[resampled]
            table = np.stack(
                [
                    resampled,
                    first,
                    after[self._resampled[touched]] - first,
                    up,
                    down,
                    half_len,
                    self._filter_offset[resampled],
                    inputs,
                    (s.pad + first) % self.capacity,
                ],
                axis=1,
            )
        received, device_rows, device_table = staged.upload(rows, table)
        # every check passed: commit
        self._samples[touched] += totals[touched]
        self._samples[resampled] = ready_outputs(inputs, up, down, half_len)
        self._inputs[resampled] = inputs
        decode = pcm_frames if self._use_triton else pcm_frames_reference
        bounds = np.flatnonzero(np.r_[True, code[1:] != code[:-1], True])
        for first_row, end_row in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            sample_format = list(SampleFormat)[int(code[first_row])]
            max_samples = int(rows[first_row:end_row, 1].max())
            decode(received, device_rows[first_row:end_row], self.ring, sample_format, max_samples, **self._inputs_arg)
        if device_table is not None:
            run = resample if self._use_triton else resample_reference
            run(self.input_ring, self._filters.bank, device_table, self.ring, int(table[:, 2].max()), self._taps)

    @property
    def _inputs_arg(self) -> dict[str, torch.Tensor]:
        return {} if self.input_ring is None else {"input_ring": self.input_ring}

    def _received(self, slot: int) -> int:
        """Samples the stream has received at its own rate."""
        return int(self._inputs[slot] if self._resampled[slot] else self._samples[slot])

    # ---- features out --------------------------------------------------------------------------------------
    def features(self, flush: Iterable[int] = ()) -> FrontEndOutput:
        """Every feature frame that became complete since the last call, for all streams in one batched pass.

        Args:
            flush: streams that end now: their remaining frames (up to NeMo's ``seq_len``) are computed with NeMo's
                zero padding after the last sample (a resampled stream: after its last resampled sample, which
                ``resample_poly`` computes with zeros past the last input), and they take no more audio until reset. The first bytes of a
                sample still waiting for the rest are dropped, with a warning.

        Returns:
            :class:`FrontEndOutput`: the new frames of each stream, equal to its whole-file NeMo features (see the
            module docstring for the precision).
        """
        s = self.settings
        ending = np.asarray(flush if isinstance(flush, np.ndarray) else list(flush), dtype=np.int64)
        if ending.size:
            ending = np.unique(ending)
        self._check_live(ending)
        if self._partial:
            for slot in ending.tolist():
                if slot in self._partial:
                    warnings.warn(
                        f"stream {slot} ends with {len(self._partial.pop(slot))} byte(s) of an incomplete "
                        f"{self._format[slot].value} sample; dropped",
                        stacklevel=2,
                    )
        # a resampled stream's last outputs (zeros past its end) are in its ring already: computed with the others
        ends = ending[self._resampled[ending]]
        self._samples[ends] = total_outputs(self._inputs[ends], self._up[ends], self._down[ends])
        live = self._open & ~self._ended
        ready = np.where(live, s.complete_frames(self._samples), self._emitted)
        ready[ending] = s.seq_len(self._samples[ending])
        counts = ready - self._emitted
        slots = np.flatnonzero(counts > 0)
        counts, starts = counts[slots], self._emitted[slots]
        offsets = np.cumsum(counts) - counts
        total = int(counts.sum())
        features = self._mel(slots, starts, counts, offsets, total)
        self._emitted[slots] += counts
        self._ended[ending] = True
        return FrontEndOutput(features, slots, starts, counts, offsets, ending)

    def _mel(
        self, slots: np.ndarray, starts: np.ndarray, counts: np.ndarray, offsets: np.ndarray, total: int
    ) -> torch.Tensor:
        """``[F, total]`` features of frames ``starts[i] .. starts[i] + counts[i] - 1`` of each ``slots[i]``."""
        s = self.settings
        if total == 0:
            return torch.empty(s.features, 0, device=self.device)
        # one small copy: the frame count; per stream (at most num_slots) its slot, first frame, first column and end
        # of valid samples; then the stream of each frame (built here: the host knows the counts, and one copy is
        # cheaper than a device repeat)
        streams, width = len(slots), self.num_slots
        nbytes = 8 * (1 + 4 * width + total)
        host = self._meta.host(nbytes).view(np.int64)
        host[0] = total
        meta = host[1 : 1 + 4 * width].reshape(4, width)
        meta[0, :streams], meta[1, :streams], meta[2, :streams] = slots, starts, offsets
        np.add(self._samples[slots], s.pad, out=meta[3, :streams])
        host[1 + 4 * width : 1 + 4 * width + total] = np.repeat(np.arange(streams), counts)
        if self._graphs is not None and self._graphs.takes(total):
            return self._graphs.run(nbytes, total)
        device = self._meta.send(nbytes).view(torch.int64)
        index = _frame_index(device, width, streams, total)
        cut = stft_frames if self._use_triton else stft_frames_reference
        frames = cut(self.ring, self._window, index, hop=s.hop, pad=s.pad, preemph=s.preemph, rows=fft_rows(total))
        return self._spectrum_to_mel(frames, total)

    def _spectrum_to_mel(self, frames: torch.Tensor, count: int) -> torch.Tensor:
        """The first ``count`` of ``[R, n_fft]`` windowed frames -> ``[F, count]`` features, by NeMo's operations in
        NeMo's layout. Each frame is transformed alone: the rows past ``count`` (padding) change no bit of the rest."""
        s = self.settings
        spectrum = torch.fft.rfft(frames)[:count]  # [count, n_fft // 2 + 1]: torch.stft's one-sided r2c FFT
        # on the CPU, NeMo's (torch's) square root is not IEEE's: there the torch operations give NeMo's bits
        fused = self.device.type == "cuda" and s.mag_power == 2.0
        power = (power_spectrum if fused else power_spectrum_reference)(spectrum, s.sqrt_guard, s.mag_power)
        # NeMo multiplies fb [1, F, n_freq] by a contiguous [B, n_freq, T]: the same layout here. One column would
        # take BLAS's matrix-vector path, which orders the sums differently: a copy of it makes it a GEMM.
        frames = power.shape[1]
        if frames == 1:
            power = power.expand(-1, 2).contiguous()
        mel = torch.matmul(self._fb, power.unsqueeze(0))[0, :, :frames]
        if s.log:
            # in place: NeMo's operations on the product's own fresh buffer
            mel = mel.add_(s.log_guard).log_() if s.log_guard_type == "add" else mel.clamp_(min=s.log_guard).log_()
        return mel
