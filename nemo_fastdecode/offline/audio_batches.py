"""Audio for the offline path: read ahead on threads, padded into batches, handed to NeMo as a ``DataLoader``.

NeMo's ``transcribe`` accepts a ``DataLoader`` of ``(audio [B, S], lengths [B])`` batches in place of file
names. :class:`PrefetchedAudioBatches` is one: it reads the files of the next batches on a thread pool while the
GPU works on the current one (decoding and resampling release the GIL), so the model rarely waits for audio,
and it skips NeMo's per-call manifest and dataset set-up.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

__all__ = ["AudioClip", "AudioInput", "PrefetchedAudioBatches", "audio_length", "manifest_clips", "read_audio"]


@dataclass(frozen=True)
class AudioClip:
    """A manifest entry's audio: ``duration`` seconds of ``path`` from ``offset`` (``duration`` ``None``: to the
    end), read as NeMo's datasets read an entry."""

    path: str
    offset: float = 0.0
    duration: float | None = None


#: One utterance: a path to an audio file, a manifest entry's clip, or mono samples at the model's rate.
AudioInput = str | os.PathLike | AudioClip | np.ndarray | torch.Tensor


def manifest_clips(manifest: str | os.PathLike) -> list[AudioClip]:
    """The clips of a NeMo JSON-lines manifest (``audio_filepath``, optional ``offset`` and ``duration``), paths
    resolved against the manifest's folder as NeMo resolves them.

    Raises:
        ValueError: a line that is not a JSON object with ``audio_filepath`` (the line is named).
    """
    from nemo.collections.common.parts.preprocessing.manifest import get_full_path

    clips = []
    with open(manifest, encoding="utf8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                path = entry["audio_filepath"]
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise ValueError(
                    f"{str(manifest)!r} line {number}: not a JSON object with 'audio_filepath' ({error})"
                ) from error
            clips.append(
                AudioClip(
                    str(get_full_path(path, str(manifest))), float(entry.get("offset") or 0.0), entry.get("duration")
                )
            )
    return clips


def read_audio(audio: AudioInput, sample_rate: int) -> np.ndarray:
    """Mono float32 samples of ``audio`` at ``sample_rate``; files are read and resampled as NeMo's datasets do.

    Raises:
        ValueError: the file cannot be decoded, or an array is not one-dimensional.
    """
    if isinstance(audio, torch.Tensor):
        audio = audio.detach().cpu().numpy()
    if isinstance(audio, np.ndarray):
        if audio.ndim != 1:
            raise ValueError(f"audio arrays must be mono, shape [samples]; got shape {tuple(audio.shape)}")
        return audio.astype(np.float32, copy=False)
    from nemo.collections.asr.parts.preprocessing.segment import AudioSegment

    clip = audio if isinstance(audio, AudioClip) else AudioClip(str(audio))
    try:
        segment = AudioSegment.from_file(
            clip.path, target_sr=sample_rate, offset=clip.offset, duration=clip.duration or 0
        )
    except Exception as error:  # soundfile / librosa raise several types by format
        raise ValueError(f"cannot read audio file {clip.path!r}: {type(error).__name__}: {error}") from error
    return segment.samples.astype(np.float32, copy=False)


def audio_length(audio: AudioInput, sample_rate: int) -> int:
    """Samples of ``audio`` at ``sample_rate``, from the file's header where it is a file (nothing is decoded)."""
    if isinstance(audio, np.ndarray | torch.Tensor):
        return int(audio.shape[-1])
    clip = audio if isinstance(audio, AudioClip) else AudioClip(str(audio))
    if clip.duration:
        return int(round(float(clip.duration) * sample_rate))
    import soundfile as sf

    try:
        info = sf.info(clip.path)
    except Exception as error:
        raise ValueError(f"cannot read audio file {clip.path!r}: {type(error).__name__}: {error}") from error
    return max(int(round((info.frames / info.samplerate - clip.offset) * sample_rate)), 0)


def _padded(
    reads: Sequence[Future], pin: bool, expected_samples: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch ``[B, S]`` of the signals ``reads`` resolve to, zero-padded to the longest, and their lengths.

    With ``expected_samples`` (the longest signal, from the files' headers) the buffer is allocated before the
    reads finish, so that allocating page-locked memory overlaps them; a signal of another length than expected
    (a resampler rounding differently) makes a buffer of the right width instead.
    """
    batch = None
    if expected_samples is not None:
        batch = torch.zeros(len(reads), max(expected_samples, 1), dtype=torch.float32, pin_memory=pin)
    signals = [r.result() for r in reads]
    lengths = torch.tensor([len(s) for s in signals], dtype=torch.long)
    width = max(int(lengths.max()), 1)
    if batch is None or batch.shape[1] != width:
        batch = torch.zeros(len(signals), width, dtype=torch.float32, pin_memory=pin)
    for row, signal in zip(batch, signals, strict=True):
        row[: len(signal)] = torch.from_numpy(signal)
    return batch, lengths


class _BatchReader:
    """The reading of one pass over the batches: files read on ``threads`` threads, each batch padded on one more
    thread (which waits on its batch's reads, so readers never wait on each other), at most ``prefetch + 1``
    batches in flight."""

    def __init__(self, owner: PrefetchedAudioBatches) -> None:
        self.owner = owner
        self.readers = ThreadPoolExecutor(owner.threads, thread_name_prefix="nemo_fastdecode-read")
        self.padder = ThreadPoolExecutor(1, thread_name_prefix="nemo_fastdecode-pad")
        self.pending: deque[Future] = deque()
        self.submitted = 0

    def fill(self) -> None:
        owner = self.owner
        while self.submitted < len(owner.batches) and len(self.pending) <= owner.prefetch:
            batch = owner.batches[self.submitted]
            reads = [self.readers.submit(read_audio, owner.audio[i], owner.sample_rate) for i in batch]
            expected = None if owner.expected_lengths is None else max(owner.expected_lengths[i] for i in batch)
            self.pending.append(self.padder.submit(_padded, reads, owner.pin, expected))
            self.submitted += 1

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        try:
            self.fill()
            while self.pending:
                batch = self.pending.popleft().result()
                self.fill()
                yield batch
        finally:
            self.close()

    def close(self) -> None:
        for future in self.pending:
            future.cancel()
        self.pending.clear()
        self.readers.shutdown(wait=True, cancel_futures=True)
        self.padder.shutdown(wait=True, cancel_futures=True)


class _Batches(IterableDataset):
    def __init__(self, owner: PrefetchedAudioBatches) -> None:
        self.owner = owner

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.owner.iterate()


class PrefetchedAudioBatches(DataLoader):
    """A ``DataLoader`` of ``(audio [B, S] float32, lengths [B])`` batches for ``model.transcribe``.

    Args:
        audio: the utterances (paths or mono arrays at ``sample_rate``).
        batches: indices into ``audio``, one list per batch, in the order to run them.
        sample_rate: the model's sample rate.
        threads: threads that read and resample files.
        prefetch: batches read ahead of the one being transcribed.
        pin_memory: pad into page-locked memory (faster copies to the GPU).
        expected_lengths: samples of each utterance, as :func:`audio_length` reads them from the headers: each
            batch's buffer is then allocated while its files are read (``None``: after).
    """

    def __init__(
        self,
        audio: Sequence[AudioInput],
        batches: Sequence[Sequence[int]],
        sample_rate: int,
        threads: int = 4,
        prefetch: int = 2,
        pin_memory: bool = False,
        expected_lengths: Sequence[int] | None = None,
    ) -> None:
        if threads < 1 or prefetch < 1:
            raise ValueError(f"threads and prefetch must be >= 1, got threads={threads}, prefetch={prefetch}")
        if expected_lengths is not None and len(expected_lengths) != len(audio):
            raise ValueError(f"expected_lengths has {len(expected_lengths)} entries for {len(audio)} utterances")
        super().__init__(_Batches(self), batch_size=None, num_workers=0)
        self.audio = audio
        self.batches = [list(b) for b in batches]
        self.sample_rate = sample_rate
        self.threads = threads
        self.prefetch = prefetch
        self.pin = pin_memory
        self.expected_lengths = None if expected_lengths is None else list(expected_lengths)
        self._started: _BatchReader | None = None

    def __len__(self) -> int:
        return len(self.batches)

    def start(self) -> None:
        """Begin reading the first batches now, before the consumer asks for them (the next pass over the loader
        continues this reading); :meth:`close` stops it if that pass never comes."""
        if self._started is None:
            self._started = _BatchReader(self)
            self._started.fill()

    def close(self) -> None:
        """Stop a reading :meth:`start` began and no pass has taken over (a no-op otherwise)."""
        if self._started is not None:
            self._started.close()
            self._started = None

    def iterate(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        reader, self._started = self._started or _BatchReader(self), None
        yield from reader
