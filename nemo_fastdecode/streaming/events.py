"""What flows between a client and the :class:`~nemo_fastdecode.streaming.engine.StreamingEngine`: options in,
events out, and the errors a server catches per request.

* :class:`StreamOptions` -- how a stream's audio is encoded (and, per stream, what its events carry).
* :class:`StreamEvent` -- a partial or final transcript of one stream, with word timestamps and the audio it covers.
* :class:`CapacityError` -- every slot holds a stream: refuse the new one (or queue it), nothing else is affected.
* :class:`StreamError` (:class:`UnknownStreamError`, :class:`StreamEndedError`) -- a bad request about one stream:
  an id never opened, audio after the end, audio of the wrong type, rate, channels or values.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CapacityError",
    "EndReason",
    "StreamEndedError",
    "StreamError",
    "StreamEvent",
    "StreamOptions",
    "StreamingEngineError",
    "UnknownStreamError",
]


@dataclass(frozen=True)
class StreamOptions:
    """How a stream's audio arrives, and what its events carry.

    Attributes:
        sample_rate: Hz; must be the model's (16 kHz for NeMo's ASR models). ``None``: the model's.
        sample_format: ``"int16"`` (16-bit PCM, little-endian, scaled ``x / 32768`` as NeMo reads WAV files) or
            ``"float32"`` (little-endian, finite). Raw bytes are read in this format; numpy arrays must have its dtype.
        channels: must be 1 (mono).
        partial_words: word timestamps on partial events too (host work per event; final events always have them).
    """

    sample_rate: int | None = None
    sample_format: str = "int16"
    channels: int = 1
    partial_words: bool = False


class EndReason(str, enum.Enum):
    """Why a final event was emitted."""

    END = "end"  #: the client ended the stream (:meth:`StreamingEngine.close` / :meth:`StreamingEngine.finish`)
    IDLE_TIMEOUT = "idle_timeout"  #: no push for ``idle_timeout_seconds``: the engine ended it
    SEGMENT = "segment"  #: a segment ended mid-stream (:meth:`StreamingEngine.end_segment`); the stream goes on


@dataclass
class StreamEvent:
    """A transcript of one stream: partial (it may still grow) or final (this segment's text will not change).

    Attributes:
        stream_id: the id :meth:`StreamingEngine.open` returned.
        text: the segment's transcript so far (NeMo's ``decode_ids_to_str`` of ``token_ids``).
        token_ids: the segment's token ids.
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
    """

    stream_id: int
    text: str
    token_ids: list[int]
    words: list[dict[str, Any]] | None
    is_final: bool
    is_last: bool = False
    reason: EndReason | None = None
    segment: int = 0
    start: float = 0.0
    end: float = 0.0


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
