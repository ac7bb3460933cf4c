"""``model.transcribe`` on length-sorted, budgeted batches with audio read ahead on threads.

NeMo's ``transcribe`` runs the files in the order given, in batches of a fixed count, reads each batch's audio on
the calling thread between GPU batches, and builds a manifest and a dataset on every call. Here the utterances
are sorted by length and grouped under a padded-audio budget (:func:`~nemo_fastdecode.offline.batching.plan_batches`),
read ahead on threads (:class:`~nemo_fastdecode.offline.audio_batches.PrefetchedAudioBatches`), and handed to
NeMo's own ``transcribe`` as a ``DataLoader``: the forward pass, the decoding strategy and the text and timestamp
post-processing are NeMo's, unchanged. Results come back in the input order.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from nemo_fastdecode.graphs.owner import CapturedLoopOwner
from nemo_fastdecode.logs import logger
from nemo_fastdecode.offline.audio_batches import (
    AudioClip,
    AudioInput,
    PrefetchedAudioBatches,
    audio_length,
    manifest_clips,
)
from nemo_fastdecode.offline.batching import plan_batches
from nemo_fastdecode.offline.fast_encoder import fast_encoder

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

__all__ = [
    "FastTranscribeOptions",
    "disable_fast_transcribe",
    "enable_fast_transcribe",
    "fast_transcribe",
    "transcribe_call",
]


@dataclass(frozen=True)
class FastTranscribeOptions:
    """How :func:`fast_transcribe` batches and reads audio.

    Attributes:
        max_batch_seconds: padded audio per batch (utterances x the longest one), seconds; ``None``:
            ``batch_size`` x 30 s, what NeMo's ``batch_size`` utterances of its recommended maximum length take.
        max_batch_size: utterances per batch at most; ``None``: 4 x ``batch_size`` (short utterances share
            larger batches within the same padded-audio budget).
        threads: threads reading and resampling audio files.
        prefetch: batches read ahead of the one on the GPU.
        freeze_gc: on the first call in the process, move every object that exists then (the model, NeMo, torch)
            out of Python's cyclic garbage collector (``gc.freeze()``). In a process holding a NeMo model a full
            collection otherwise walks several hundred thousand objects and lands in whichever call crosses the
            collector's threshold; after the freeze it walks only what was made since. The frozen objects are
            never collected as cycles (they are the long-lived ones); ``gc.unfreeze()`` undoes it.
        fast_encoder: opt-in: the encoder's convolution modules channels last, with one fused kernel between their
            two GEMMs (:mod:`~nemo_fastdecode.offline.fast_encoder`); faster on CUDA, equal to NeMo's encoder to
            rounding only, so a near-tie can decode the other way (the transcribe benchmark reports the agreement).
    """

    max_batch_seconds: float | None = None
    max_batch_size: int | None = None
    threads: int = 4
    prefetch: int = 2
    freeze_gc: bool = True
    fast_encoder: bool = False

    def __post_init__(self) -> None:
        if self.max_batch_seconds is not None and self.max_batch_seconds <= 0:
            raise ValueError(f"max_batch_seconds must be > 0 or None, got {self.max_batch_seconds}")
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {self.max_batch_size}")
        if self.threads < 1 or self.prefetch < 1:
            raise ValueError(f"threads and prefetch must be >= 1, got threads={self.threads}, prefetch={self.prefetch}")


def _model_device(model: ASRModel) -> torch.device:
    return next(model.parameters()).device


def _is_manifest(audio: Any) -> bool:
    return isinstance(audio, str | os.PathLike) and str(audio).endswith((".json", ".jsonl"))


def _describe(audio: AudioInput, index: int) -> str:
    if isinstance(audio, AudioClip):
        return repr(audio.path)
    return f"{str(audio)!r}" if isinstance(audio, str | os.PathLike) else f"array at index {index}"


def fast_transcribe(
    model: ASRModel,
    audio: Sequence[AudioInput],
    batch_size: int = 4,
    *,
    options: FastTranscribeOptions | None = None,
    return_hypotheses: bool = False,
    timestamps: bool | None = None,
    verbose: bool = False,
    transcribe: Any = None,
) -> list[Any]:
    """Transcribe ``audio`` with the model's current decoding strategy; results in the input order.

    Args:
        model: a NeMo ASR model whose ``transcribe`` takes a ``DataLoader`` of ``(audio, lengths)`` batches
            (RNN-T, TDT, hybrid RNN-T/CTC).
        audio: paths to audio files (read and resampled as NeMo does), mono arrays ``[samples]`` at the model's
            sample rate, or the path of a NeMo JSON-lines manifest (each entry's ``offset`` and ``duration`` read
            as NeMo's datasets read them).
        batch_size: NeMo's ``batch_size``; sets the default budget (:class:`FastTranscribeOptions`).
        options: batching and reading; ``None``: the defaults.
        return_hypotheses, timestamps, verbose: as for NeMo's ``transcribe``.
        transcribe: the ``transcribe`` to hand the batches to (the model's own class method when ``None``).

    Returns:
        What NeMo's ``transcribe`` returns (texts or ``Hypothesis`` objects), one per input, in the input order.

    Raises:
        ValueError: an empty input list, a file that cannot be read or has no samples (named).
        RuntimeError: the GPU ran out of memory on a batch (the message names its padded length and the option
            that bounds it).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if _is_manifest(audio):
        audio = manifest_clips(audio)
    elif isinstance(audio, str | os.PathLike | np.ndarray | torch.Tensor):
        audio = [audio]
    if len(audio) == 0:
        raise ValueError("no audio to transcribe: the input list is empty")
    options = options or FastTranscribeOptions()
    if options.freeze_gc:
        _freeze_long_lived_objects()
    sample_rate = int(model.cfg.preprocessor.sample_rate)
    audio = [_as_nemo_pads_arrays(a, sample_rate) for a in audio]
    lengths = [audio_length(a, sample_rate) for a in audio]
    for i, n in enumerate(lengths):
        if n == 0:
            raise ValueError(f"audio {_describe(audio[i], i)} has no samples")
    max_seconds = options.max_batch_seconds or 30.0 * batch_size
    batches = plan_batches(lengths, options.max_batch_size or 4 * batch_size, int(max_seconds * sample_rate))
    logger.info(
        "nemo_fastdecode: transcribe on the offline path: %d inputs in %d length-sorted batches",
        len(audio),
        len(batches),
    )
    device = _model_device(model)
    loader = PrefetchedAudioBatches(
        audio,
        batches,
        sample_rate,
        options.threads,
        options.prefetch,
        pin_memory=device.type == "cuda",
        expected_lengths=lengths,
    )
    transcribe = transcribe or functools.partial(type(model).transcribe, model)
    loader.start()  # the first batches are read while the decoder is sized and captured
    try:
        _reserve_decoder(model, max(len(b) for b in batches), max(lengths), sample_rate)
        with fast_encoder(model) if options.fast_encoder else contextlib.nullcontext():
            results = transcribe(
                loader,
                batch_size=batch_size,
                return_hypotheses=return_hypotheses,
                timestamps=timestamps,
                verbose=verbose,
            )
    except torch.OutOfMemoryError as error:
        longest = max(lengths) / sample_rate
        raise RuntimeError(
            f"out of GPU memory on a batch of up to {max_seconds:.0f} s of padded audio (longest utterance "
            f"{longest:.1f} s): lower FastTranscribeOptions.max_batch_seconds; for audio of many minutes, switch "
            "the encoder to local attention first (model.change_attention_model('rel_pos_local_attn', [128, 128]))"
        ) from error
    finally:
        loader.close()  # reading that NeMo's transcribe never took over (it failed before its first batch)
    order = [i for batch in batches for i in batch]
    return _in_input_order(results, order)


_frozen_once = False


def _freeze_long_lived_objects() -> None:
    """``gc.freeze()`` once per process (a few microseconds): see :attr:`FastTranscribeOptions.freeze_gc`. Undone at
    exit, so that the interpreter's last collection still finds what was garbage when frozen (native extensions
    report objects never freed)."""
    global _frozen_once
    if not _frozen_once:
        gc.freeze()
        atexit.register(gc.unfreeze)
        _frozen_once = True


def _reserve_decoder(model: ASRModel, batch_size: int, samples: int, sample_rate: int) -> None:
    """Size our decoder's captured graphs for the plan's largest batch and longest utterance up front, and capture
    them now, in the caller's precision: one capture (and one set of kernel specialisations) instead of one per
    growth step as batches change shape, done while the first batch's audio is read rather than after its
    encoder."""
    computer = getattr(getattr(getattr(model, "decoding", None), "decoding", None), "computer", None)
    if not isinstance(computer, CapturedLoopOwner):
        return  # NeMo's own strategies size themselves
    hop = int(float(model.cfg.preprocessor.window_stride) * sample_rate)
    subsampling = int(getattr(model.encoder, "subsampling_factor", 1))
    frames = math.ceil((samples // hop + 1) / subsampling) + 1  # one frame of slack over the encoder's rounding
    computer.reserve(batch_size, frames)
    encoder = next(model.encoder.parameters())
    computer.prepare_reserved(encoder.device, encoder.dtype)


def _as_nemo_pads_arrays(audio: AudioInput, sample_rate: int) -> AudioInput:
    """NeMo's ``transcribe`` pads in-memory audio shorter than 1 s with zeros on both sides to 1 s (its
    ``TranscriptionTensorDataset``, as its Lhotse loader does); files it takes as they are. Arrays get the same here,
    so that the results equal NeMo's for either kind of input."""
    if not isinstance(audio, np.ndarray | torch.Tensor) or audio.ndim != 1 or not 0 < audio.shape[0] < sample_rate:
        return audio
    samples = audio.detach().cpu().numpy() if isinstance(audio, torch.Tensor) else audio
    missing = sample_rate - samples.shape[0]
    return np.pad(samples.astype(np.float32, copy=False), (missing // 2, missing - missing // 2))


def _in_input_order(results: Any, order: list[int]) -> Any:
    if isinstance(results, tuple):  # (best, all) from models that return both
        return tuple(_in_input_order(r, order) for r in results)
    if len(results) != len(order):
        raise RuntimeError(f"transcribe returned {len(results)} results for {len(order)} utterances")
    out: list[Any] = [None] * len(order)
    for position, index in enumerate(order):
        out[index] = results[position]
    return out


def _takes_fast_path(audio: Any, kwargs: dict[str, Any]) -> bool:
    """Inputs the fast path handles: a list of files or mono arrays, one file or a manifest, with no option that
    changes what NeMo reads (channel selection, augmentation, partial hypotheses, a multitask prompt)."""
    if any(kwargs.get(k) is not None for k in ("channel_selector", "augmentor", "partial_hypothesis")):
        return False
    override = kwargs.get("override_config")
    if override is not None and any(
        getattr(override, k, None) is not None
        for k in ("channel_selector", "augmentor", "partial_hypothesis", "prompt")
    ):
        return False
    if isinstance(audio, str | os.PathLike):
        return True  # an audio file, or a manifest (.json / .jsonl)
    if isinstance(audio, np.ndarray | torch.Tensor):
        return audio.ndim == 1
    return isinstance(audio, list | tuple) and all(
        isinstance(a, str | os.PathLike) or (isinstance(a, np.ndarray | torch.Tensor) and a.ndim == 1) for a in audio
    )


def transcribe_call(
    model: ASRModel,
    audio: Any,
    kwargs: dict[str, Any],
    nemo_transcribe: Any,
    options: FastTranscribeOptions | None = None,
) -> Any:
    """One call of ``model.transcribe(audio, **kwargs)``: on the fast path where :func:`_takes_fast_path` allows,
    else NeMo's ``nemo_transcribe`` (the model's own method, bound) with the same arguments.

    As in NeMo, an ``override_config`` supplies ``batch_size``, ``return_hypotheses``, ``timestamps`` and
    ``verbose`` in place of the keyword arguments (``timestamps=True`` given beside it still counts).
    """
    if not _takes_fast_path(audio, kwargs):
        return nemo_transcribe(audio, **kwargs)
    override = kwargs.get("override_config")

    def value(name: str, default: Any) -> Any:
        return getattr(override, name, default) if override is not None else kwargs.get(name, default)

    timestamps = kwargs.get("timestamps") or value("timestamps", None)
    return fast_transcribe(
        model,
        audio,
        int(value("batch_size", 4)),
        options=options,
        return_hypotheses=bool(value("return_hypotheses", False)),
        timestamps=timestamps,
        verbose=bool(value("verbose", True)),
        transcribe=nemo_transcribe,
    )


def enable_fast_transcribe(model: ASRModel, options: FastTranscribeOptions | None = None) -> None:
    """Route ``model.transcribe`` through :func:`fast_transcribe` (this model instance only).

    Calls the fast path cannot serve (a ``DataLoader``, ``channel_selector``, ``augmentor``,
    ``partial_hypothesis``, a multitask prompt) go to NeMo's ``transcribe`` unchanged.
    :func:`disable_fast_transcribe` undoes it. ``decoding.greedy.offline_batching: true`` does the same for every
    model decoding with ``fast_greedy``, from its config.
    """
    options = options or FastTranscribeOptions()
    nemo_transcribe = functools.partial(type(model).transcribe, model)

    @functools.wraps(type(model).transcribe)
    def transcribe(audio: Any, *args: Any, **kwargs: Any) -> Any:
        if args:  # positional options: NeMo's own signature
            return nemo_transcribe(audio, *args, **kwargs)
        return transcribe_call(model, audio, kwargs, nemo_transcribe, options)

    model.transcribe = transcribe
    model.fast_transcribe_options = options


def disable_fast_transcribe(model: ASRModel) -> None:
    """Give ``model.transcribe`` back to NeMo (a no-op where :func:`enable_fast_transcribe` was not called)."""
    model.__dict__.pop("transcribe", None)
    model.__dict__.pop("fast_transcribe_options", None)
