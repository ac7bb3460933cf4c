"""What flows between a client and the :class:`~nemo_fastdecode.streaming.engine.StreamingEngine`: options in,
events out, and the errors a server catches per request.

* :class:`StreamOptions` -- how a stream's audio is encoded (and, per stream, what its events carry).
* :class:`EndpointingOptions` -- when an utterance ends mid-stream (Silero VAD, NeMo's runs of blanks); off by default.
* :class:`BoostingOptions` -- a stream's own phrases to boost (NeMo's per-stream boosting tree); none by default.
* :class:`SpeechEvent` -- Silero VAD heard speech start or stop in a stream (streams with ``vad`` on).
* :class:`StreamEvent` -- a partial or final transcript of one stream, with word timestamps and the audio it covers.
* :class:`CapacityError` -- every slot holds a stream: refuse the new one (or queue it), nothing else is affected.
* :class:`StreamError` (:class:`UnknownStreamError`, :class:`StreamEndedError`) -- a bad request about one stream:
  an id never opened, audio after the end, audio of the wrong type, rate, channels or values.
"""

from __future__ import annotations

import enum
import math
import warnings
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BoostingOptions",
    "CapacityError",
    "EndReason",
    "EndpointingOptions",
    "SpeechEvent",
    "StreamEndedError",
    "StreamError",
    "StreamEvent",
    "StreamOptions",
    "StreamingEngineError",
    "UnknownStreamError",
]


@dataclass(frozen=True)
class EndpointingOptions:
    """When an utterance ends mid-stream: the engine then emits the final event of its segment and the stream goes on
    (reason :attr:`EndReason.SEGMENT`). Two rules, each off by default; either one ends an utterance.

    Only the events are cut: encoder caches and decoder state continue across an utterance end, as in NeMo's
    ``CacheAwareRNNTPipeline`` (which keeps the previous hypothesis at an end of utterance and clears only the text
    it accumulated), so the segments' tokens joined are the tokens of the stream without endpointing. A segment
    without tokens is never finalised (NeMo emits no empty final transcript either).

    Attributes:
        vad: Silero VAD (the ``silero-vad`` package, MIT licence) on the stream's audio: an utterance ends where
            silero's speech state machine (``get_speech_timestamps`` / ``VADIterator``) ends a speech segment. Its
            final event is emitted once the decoder has passed the point where the silence was confirmed, with the
            tokens before that point; later tokens open the next segment.
        vad_threshold: speech probability at or above which a window is speech (silero's ``threshold``).
        vad_neg_threshold: probability below which a window is silence while in speech; ``None``: silero's
            ``max(threshold - 0.15, 0.01)``.
        min_silence_ms: silence that ends a speech segment (silero's ``min_silence_duration_ms``; silero's default of
            100 ms splits at pauses between words, so utterance ends want longer).
        speech_pad_ms: padding of speech segments (silero's ``speech_pad_ms``; reported segments only).
        min_speech_ms: a speech segment not longer than this ends no utterance (silero's ``min_speech_duration_ms``).
        blank_run_ms: NeMo's ``endpointing.stop_history_eou``: an utterance ends when the decoder emitted only blanks
            for longer than this (``RNNTGreedyEndpointing``); ``None``: off. NeMo's streaming config uses 800.
        residue_tokens_at_end: NeMo's ``endpointing.residue_tokens_at_end`` (its config: 2). With NeMo's label buffer
            the rule reads: the ``H + 1`` encoder frames before the newest one emitted nothing (``H``: ``blank_run_ms``
            in frames, rounded up). Below 2 NeMo's buffer is too short for that: the rule never fires, here as there.
    """

    vad: bool = False
    vad_threshold: float = 0.5
    vad_neg_threshold: float | None = None
    min_silence_ms: float = 500.0
    speech_pad_ms: float = 30.0
    min_speech_ms: float = 250.0
    blank_run_ms: int | None = None
    residue_tokens_at_end: int = 2

    def __post_init__(self):
        probabilities = {"vad_threshold": self.vad_threshold, "vad_neg_threshold": self.vad_neg_threshold}
        for name, value in probabilities.items():
            if value is not None and not (_is_number(value) and 0.0 <= value <= 1.0):
                raise ValueError(f"EndpointingOptions.{name}={value!r} is not a probability; valid: 0 to 1")
        for name in ("min_silence_ms", "speech_pad_ms", "min_speech_ms"):
            value = getattr(self, name)
            if not (_is_number(value) and math.isfinite(value) and value >= 0):
                raise ValueError(f"EndpointingOptions.{name}={value!r}; valid: a finite number of ms >= 0")
        if self.blank_run_ms is not None and (isinstance(self.blank_run_ms, bool) or not self.blank_run_ms > 0):
            raise ValueError(f"EndpointingOptions.blank_run_ms={self.blank_run_ms!r}; valid: ms > 0, or None (off)")
        if not isinstance(self.residue_tokens_at_end, int) or self.residue_tokens_at_end < 0:
            raise ValueError(
                f"EndpointingOptions.residue_tokens_at_end={self.residue_tokens_at_end!r}; valid: int >= 0"
            )
        if self.blank_run_ms is not None and self.residue_tokens_at_end < 2:
            warnings.warn(
                f"EndpointingOptions(blank_run_ms={self.blank_run_ms}, residue_tokens_at_end="
                f"{self.residue_tokens_at_end}): NeMo's blank-run rule never ends an utterance with fewer than 2 "
                "residue tokens; use 2 (NeMo's streaming config)",
                stacklevel=3,
            )

    @property
    def enabled(self) -> bool:
        """Whether any rule can end an utterance."""
        return self.vad or self.blank_run_ms is not None

    @property
    def neg_threshold(self) -> float:
        """The silence threshold in speech, silero's default where not set."""
        if self.vad_neg_threshold is not None:
            return self.vad_neg_threshold
        return max(self.vad_threshold - 0.15, 0.01)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class BoostingOptions:
    """A stream's phrase boosting: NeMo's per-stream boosting tree (``BiasingRequestItemConfig`` of NeMo's streaming
    pipelines, its ``BoostingTreeModelConfig`` built from ``key_phrases_list``), fused into the stream's greedy decoding
    as NeMo's label-looping decoder fuses it (``greedy.enable_per_stream_biasing``), or into its beam search as NeMo's
    ``malsd_batch`` fuses a boosting tree of the phrases (``beam.boosting_tree``). Defaults are NeMo's.

    Attributes:
        phrases: the phrases to boost (NeMo's ``key_phrases_list``), tokenised by the model's tokenizer; at least one,
            none empty.
        weight: the tree's weight in the fusion (NeMo's ``boosting_model_alpha``).
        context_score: NeMo's ``context_score``: the score of each arc into a phrase.
        depth_scaling: NeMo's ``depth_scaling`` (2.0 for RNN-T and TDT).
        unk_score: NeMo's ``unk_score``: the score of tokens that start no phrase.
        final_eos_score: NeMo's ``final_eos_score`` (read by attention decoders only; kept for the tree's equality).
        score_per_phrase: NeMo's ``score_per_phrase``.
        uniform_weights: NeMo's ``uniform_weights``.
    """

    phrases: tuple[str, ...]
    weight: float = 1.0
    context_score: float = 1.0
    depth_scaling: float = 2.0
    unk_score: float = 0.0
    final_eos_score: float = 1.0
    score_per_phrase: float = 0.0
    uniform_weights: bool = False

    def __post_init__(self):
        phrases = self.phrases
        if isinstance(phrases, str) or not isinstance(phrases, (list, tuple)):
            raise TypeError(f"BoostingOptions.phrases must be a list of strings, got {type(phrases).__name__}")
        if not phrases:
            raise ValueError("BoostingOptions.phrases is empty; give at least one phrase (or no BoostingOptions)")
        for i, phrase in enumerate(phrases):
            if not isinstance(phrase, str):
                raise TypeError(f"BoostingOptions.phrases[{i}] must be a string, got {type(phrase).__name__}")
            if not phrase.strip():
                raise ValueError(f"BoostingOptions.phrases[{i}]={phrase!r} is empty; valid: a non-empty phrase")
        object.__setattr__(self, "phrases", tuple(phrases))  # hashable: equal options share one built tree
        for name in ("weight", "context_score", "depth_scaling", "unk_score", "final_eos_score", "score_per_phrase"):
            value = getattr(self, name)
            if not (_is_number(value) and math.isfinite(value)):
                raise ValueError(f"BoostingOptions.{name}={value!r}; valid: a finite number")
        if not isinstance(self.uniform_weights, bool):
            raise TypeError(f"BoostingOptions.uniform_weights={self.uniform_weights!r}; valid: True or False")


@dataclass(frozen=True)
class StreamOptions:
    """How a stream's audio arrives, and what its events carry.

    Attributes:
        sample_rate: Hz: the model's (16 kHz for NeMo's ASR models; ``None``: the model's), or one of
            :data:`~nemo_fastdecode.streaming.frontend.INPUT_RATES` (8000, 11025, 12000, 16000, 22050, 24000, 32000,
            44100, 48000), resampled to the model's rate on the device exactly as ``scipy.signal.resample_poly`` does
            on the whole stream (its default filter). Other rates are refused at open, naming the valid ones.
            Events' times (``start``, ``end``, word timestamps) are seconds of the stream's audio whatever its rate.
        sample_format: ``"int16"`` (16-bit PCM, little-endian, scaled ``x / 32768`` as NeMo reads WAV files),
            ``"float32"`` (little-endian, finite), ``"mulaw"`` or ``"alaw"`` (G.711, one byte a sample, e.g. 8 kHz
            telephone audio: OpenAI Realtime's ``audio/pcmu`` / ``audio/pcma``; decoded to the G.711 16-bit linear
            value / 32768). Raw bytes are read in this format; numpy arrays must have its dtype (uint8 for G.711).
        channels: must be 1 (mono).
        partial_words: word timestamps on partial events too (host work per event; final events always have them).
        partial_token_ids: partial events carry the segment's token ids so far; ``False``: their ``token_ids`` is
            ``None`` (text only: a partial then costs its new tokens alone, where a copy of the segment's ids grows
            with it; final events always have them).
        endpointing: this stream's end-of-utterance rules; ``None``: the engine's (``StreamingEngine(endpointing=)``).
        boosting: this stream's phrases to boost (:class:`BoostingOptions`); ``None``: none.
        token_logprobs: final events carry each token's log-probability (``logprobs``: the model's
            ``log_softmax`` at the token's step, :mod:`~nemo_fastdecode.streaming.token_logprobs`; greedy decoding
            only). Costs a teacher-forced pass over the stream's new tokens after each step it takes.
    """

    sample_rate: int | None = None
    sample_format: str = "int16"
    channels: int = 1
    partial_words: bool = False
    partial_token_ids: bool = True
    endpointing: EndpointingOptions | None = None
    boosting: BoostingOptions | None = None
    token_logprobs: bool = False


class EndReason(str, enum.Enum):
    """Why a final event was emitted."""

    END = "end"  #: the client ended the stream (:meth:`StreamingEngine.close` / :meth:`StreamingEngine.finish`)
    IDLE_TIMEOUT = "idle_timeout"  #: no push for ``idle_timeout_seconds``: the engine ended it
    SEGMENT = "segment"  #: a segment ended mid-stream (an utterance end or :meth:`StreamingEngine.end_segment`)


@dataclass
class StreamEvent:
    """A transcript of one stream: partial (it may still grow) or final (this segment's text will not change).

    Attributes:
        stream_id: the id :meth:`StreamingEngine.open` returned.
        text: the segment's transcript so far (NeMo's ``decode_ids_to_str`` of ``token_ids``).
        token_ids: the segment's token ids; ``None`` on partial events of a stream opened with
            ``StreamOptions(partial_token_ids=False)``.
        words: word timestamps as NeMo computes them (``RNNTDecoding.compute_rnnt_timestamps`` then
            ``process_timestamp_outputs``): dicts with ``word``, ``start_offset`` / ``end_offset`` (encoder frames from
            the stream's start) and ``start`` / ``end`` (seconds). Always on final events; on partial events with
            ``StreamOptions.partial_words``, else ``None``.
        is_final: the segment is over: nothing will be added to this text.
        is_last: the stream is over (its slot is free); ``False`` for partial events and mid-stream finals.
        reason: why it is final (:class:`EndReason`), ``None`` for partial events.
        segment: index of the segment in the stream (0 until a mid-stream final starts the next one).
        start: seconds from the stream's start where the segment's audio starts.
        end: seconds of the stream's audio the transcript accounts for: the feature frames decoded (10 ms each at
            NeMo's hop), for a stream's last event all the audio it received.
        logprobs: on final events of a stream opened with ``StreamOptions(token_logprobs=True)``: one
            ``(piece, log-probability)`` per token of ``token_ids`` (the piece as the tokenizer spells it, a
            sentencepiece word start ``▁`` as a space); else ``None``.
    """

    stream_id: int
    text: str
    token_ids: list[int] | None
    words: list[dict[str, Any]] | None
    is_final: bool
    is_last: bool = False
    reason: EndReason | None = None
    segment: int = 0
    start: float = 0.0
    end: float = 0.0
    logprobs: list[tuple[str, float]] | None = None


@dataclass(frozen=True)
class SpeechEvent:
    """Silero VAD heard speech start or stop in a stream (``VADIterator``'s events, unpadded).

    Every speech segment that starts gets a stop once silence longer than ``min_silence_ms`` follows it, short ones
    included; only segments longer than ``min_speech_ms`` end an utterance (a final event with the tokens before the
    point where the silence was confirmed follows once the decoder gets there, if there are any).

    Attributes:
        stream_id: the id :meth:`StreamingEngine.open` returned.
        started: ``True``: speech starts at ``seconds``; ``False``: it stopped at ``seconds`` (where the silence that
            ended it began).
        seconds: from the stream's start.
        segment: the index of the segment this speech belongs to, counting the utterance ends found before it (an
            utterance end without tokens finalises nothing: then the later segments' indices are one lower).
    """

    stream_id: int
    started: bool
    seconds: float
    segment: int


class StreamingEngineError(Exception):
    """Base of the engine's request errors."""


class CapacityError(StreamingEngineError, RuntimeError):
    """Every slot holds a stream; ``capacity`` is their number."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        super().__init__(
            f"all {capacity} stream slots are in use; close or finish a stream first (or build the engine with "
            "more num_slots)"
        )


class StreamError(StreamingEngineError, ValueError):
    """A bad request about one stream (``stream_id``); other streams are not affected."""

    def __init__(self, stream_id: Any, message: str):
        self.stream_id = stream_id
        super().__init__(message)


class UnknownStreamError(StreamError):
    """No stream was ever opened with this id."""


class StreamEndedError(StreamError):
    """The stream was closed, finished or timed out: it takes no more audio (ids are never reused)."""
