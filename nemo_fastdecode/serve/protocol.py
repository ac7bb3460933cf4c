"""The OpenAI Realtime transcription protocol as pydantic schemas: client events in, server events out.

Two flavours, chosen by the client's handshake: GA (``session.*`` events, the GA session shape) and beta (the
``OpenAI-Beta: realtime=v1`` header: ``transcription_session.created`` / ``.updated`` and the beta session shape).
Either flavour's update event is taken on either; the reply is in the shape of the event sent.

Client events (JSON text messages; raw binary messages are audio in the session's format, as
``input_audio_buffer.append``):

* ``session.update`` / ``transcription_session.update`` -- the audio format (``audio/pcm`` 16-bit PCM at 24 kHz,
  OpenAI's default, or at another ``rate`` the engine resamples from, the model's included; ``audio/pcmu`` /
  ``audio/pcma``: G.711 at 8 kHz; beta names ``pcm16``, ``g711_ulaw``, ``g711_alaw``), ``turn_detection``
  (``null``, or ``server_vad`` where the engine runs VAD or the server has an endpointer), and the transcription:
  ``keywords`` (phrases boosted in the session's next items), ``delay``, ``language`` / ``languages`` / ``prompt``
  (reported back); ``include: ["item.input_audio_transcription.logprobs"]`` (token log-probabilities on finals);
  and (an extension) ``boosting`` ``{"phrases": [...], "weight": 1.0, ...}`` (NeMo's per-stream
  boosting tree with every option; ``null`` turns it off); only the fields present change.
* ``input_audio_buffer.append`` -- base64 audio.
* ``input_audio_buffer.commit`` -- the buffer's audio is one item: its ``completed`` event follows.
* ``input_audio_buffer.clear`` -- drop the audio appended since the last commit.

Server events: ``session.created`` / ``session.updated`` (``transcription_session.*`` for the beta flavour),
``input_audio_buffer.committed`` / ``cleared``, ``input_audio_buffer.speech_started`` / ``speech_stopped`` (with
``server_vad`` on a server with VAD), ``conversation.item.input_audio_transcription.delta`` (partials) and
``.completed`` (finals, word timestamps in ``words``), and ``error`` (``error.code`` names every refusal). Every one
validates under the official SDK's types of its flavour (tested with the SDK).

Every incoming message is validated here; :func:`parse_client_event` returns an event or a :class:`ProtocolError`
whose code and message go back to the client in an ``error`` event.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

__all__ = [
    "AudioAppend",
    "Boosting",
    "AudioClear",
    "AudioCommit",
    "ClientEvent",
    "CloseCode",
    "ErrorCode",
    "ProtocolError",
    "SessionConfig",
    "SessionUpdate",
    "decode_audio",
    "parse_client_event",
]


class CloseCode(enum.IntEnum):
    """WebSocket close codes the server uses (RFC 6455 section 7.4.1)."""

    NORMAL = 1000  #: idle timeout (after the last final)
    GOING_AWAY = 1001  #: graceful shutdown (after the last finals)
    POLICY = 1008  #: bad or missing API key; a client that does not read its events
    TOO_BIG = 1009  #: a message above the hard size cap (the WebSocket layer closes before reading it)
    TRY_AGAIN_LATER = 1013  #: every stream slot is in use


class ErrorCode(str, enum.Enum):
    """``error.code`` of the server's ``error`` events: one per kind of refusal."""

    INVALID_JSON = "invalid_json"
    INVALID_EVENT = "invalid_event"
    UNKNOWN_EVENT_TYPE = "unknown_event_type"
    UNSUPPORTED_EVENT = "unsupported_event"
    INVALID_VALUE = "invalid_value"
    UNSUPPORTED_AUDIO_FORMAT = "unsupported_audio_format"
    INVALID_AUDIO = "invalid_audio"
    MESSAGE_TOO_LARGE = "message_too_large"
    COMMIT_EMPTY = "input_audio_buffer_commit_empty"
    SERVER_AT_CAPACITY = "server_at_capacity"
    INVALID_API_KEY = "invalid_api_key"
    IDLE_TIMEOUT = "idle_timeout"
    SLOW_READER = "slow_reader"
    SHUTTING_DOWN = "server_shutting_down"
    STREAM_ERROR = "stream_error"

    @property
    def error_type(self) -> str:
        """OpenAI's ``error.type``: the client's doing, or the server's state."""
        server = (ErrorCode.SERVER_AT_CAPACITY, ErrorCode.SHUTTING_DOWN, ErrorCode.STREAM_ERROR)
        return "server_error" if self in server else "invalid_request_error"


class ProtocolError(Exception):
    """A refused client message: ``code`` and ``message`` for the ``error`` event, ``param`` the field at fault."""

    def __init__(self, code: ErrorCode, message: str, param: str | None = None, event_id: str | None = None):
        super().__init__(message)
        self.code, self.message, self.param, self.event_id = code, message, param, event_id


# ---- audio formats and session options ---------------------------------------------------------------------------
PCM, PCMU, PCMA = "audio/pcm", "audio/pcmu", "audio/pcma"
#: the engine's sample format of each audio format (what its bytes hold)
SAMPLE_FORMATS: dict[str, str] = {PCM: "int16", PCMU: "mulaw", PCMA: "alaw"}
#: the beta flavour's ``input_audio_format`` names of the formats
BETA_FORMAT_NAMES: dict[str, str] = {PCM: "pcm16", PCMU: "g711_ulaw", PCMA: "g711_alaw"}
#: ``audio/pcm``'s rate when a session does not name one: OpenAI's (its SDK types the rate ``Literal[24000]``)
DEFAULT_PCM_RATE = 24000
G711_RATE = 8000  #: G.711's one rate
#: ``transcription.delay``, shortest look-ahead first
DELAYS: tuple[str, ...] = ("minimal", "low", "medium", "high", "xhigh")
LOGPROBS_INCLUDE = "item.input_audio_transcription.logprobs"  #: the one ``include`` value


def format_named(name: str) -> str | None:
    """The audio format a client names (GA ``audio/pcm``, beta ``pcm16``, ...), or ``None`` for no known format."""
    beta = {beta_name: ga_name for ga_name, beta_name in BETA_FORMAT_NAMES.items()}
    return name if name in SAMPLE_FORMATS else beta.get(name)


# ---- client events -----------------------------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AudioFormat(_Strict):
    """``{"type": "audio/pcm", "rate": 24000}``: 16-bit little-endian mono PCM at ``rate`` Hz (24 kHz when left
    out); ``{"type": "audio/pcmu"}`` / ``{"type": "audio/pcma"}``: G.711 mu-law / A-law at 8 kHz."""

    type: str = PCM
    rate: int | None = None


class TurnDetection(BaseModel):
    """``{"type": "server_vad", ...}`` (thresholds are kept for the endpointer); ``null`` turns it off."""

    model_config = ConfigDict(extra="allow")
    type: str = "server_vad"
    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None


class Boosting(BaseModel):
    """Phrase boosting (an extension): NeMo's per-stream boosting tree of ``phrases`` fused into the greedy decoding
    or beam search with ``weight`` (NeMo's ``boosting_model_alpha``); the other fields are NeMo's ``BoostingTreeModelConfig`` options
    of the same names (``None``: NeMo's default). Other keys are kept for the connection to refuse by name."""

    model_config = ConfigDict(extra="allow")
    phrases: list[str]
    weight: float | None = Field(default=None, allow_inf_nan=False)
    context_score: float | None = Field(default=None, allow_inf_nan=False)
    depth_scaling: float | None = Field(default=None, allow_inf_nan=False)
    unk_score: float | None = Field(default=None, allow_inf_nan=False)
    final_eos_score: float | None = Field(default=None, allow_inf_nan=False)
    score_per_phrase: float | None = Field(default=None, allow_inf_nan=False)
    uniform_weights: bool | None = None


class Transcription(BaseModel):
    """``model`` / ``language`` / ``languages`` / ``prompt``: accepted, reported back and otherwise ignored (the
    served model transcribes the language it was trained on); ``keywords``: phrases to boost in the session's next
    items (per-stream phrase boosting at the server's weight); ``delay``: one of :data:`DELAYS`; ``boosting``
    (extension): the phrases and every boosting option, ``null``: none."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    language: str | None = None
    languages: list[str] | None = None
    prompt: str | None = None
    keywords: list[str] | None = None
    delay: str | None = None
    boosting: Boosting | None = None


class AudioInput(_Strict):
    format: AudioFormat | None = None
    transcription: Transcription | None = None
    turn_detection: TurnDetection | None = None
    noise_reduction: dict[str, Any] | None = None


class AudioConfig(_Strict):
    input: AudioInput | None = None


class SessionConfig(_Strict):
    """A transcription session's settings: the GA shape (``type``, ``audio.input``) or the beta one
    (``input_audio_format``, ``turn_detection``, ...). Only the fields present in an update change."""

    type: Literal["transcription"] | None = None
    model: str | None = None
    audio: AudioConfig | None = None
    include: list[str] | None = None
    input_audio_format: str | None = None
    input_audio_transcription: Transcription | None = None
    turn_detection: TurnDetection | None = None
    input_audio_noise_reduction: dict[str, Any] | None = None


class _ClientEvent(_Strict):
    event_id: str | None = Field(default=None, max_length=128)


class SessionUpdate(_ClientEvent):
    type: Literal["session.update", "transcription_session.update"]
    session: SessionConfig


class AudioAppend(_ClientEvent):
    type: Literal["input_audio_buffer.append"]
    audio: str


class AudioCommit(_ClientEvent):
    type: Literal["input_audio_buffer.commit"]


class AudioClear(_ClientEvent):
    type: Literal["input_audio_buffer.clear"]


ClientEvent = Annotated[SessionUpdate | AudioAppend | AudioCommit | AudioClear, Field(discriminator="type")]
_CLIENT_EVENT = TypeAdapter(ClientEvent)
CLIENT_EVENT_TYPES: tuple[str, ...] = (
    "session.update",
    "transcription_session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
)
#: the Realtime API's conversation events: known, but a transcription session has no responses or items to edit
CONVERSATION_EVENT_PREFIXES: tuple[str, ...] = ("response.", "conversation.", "output_audio_buffer.")


def oversized(message: str | bytes, limit: int) -> int | None:
    """A client message's size in bytes when it is over ``limit`` bytes, else ``None``. A text message counts its
    UTF-8 encoding (up to 4 bytes a character), not its characters; it is encoded only when its characters could
    exceed the limit."""
    if isinstance(message, str):
        if 4 * len(message) <= limit:
            return None
        size = len(message.encode("utf-8", "surrogatepass"))
    else:
        size = len(message)
    return size if size > limit else None


def parse_client_event(text: str | bytes) -> SessionUpdate | AudioAppend | AudioCommit | AudioClear:
    """One JSON text message -> its validated event.

    Raises:
        ProtocolError: not JSON (nested too deeply to parse included), not an event object, an unknown or unsupported type, or a field of the wrong
            shape (``param`` names it, e.g. ``session.audio.input.format.rate``).
    """
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"the message is not valid JSON: {error}") from None
    except RecursionError:  # arrays or objects nested deeper than the parser's recursion limit
        raise ProtocolError(ErrorCode.INVALID_JSON, "the message is nested too deeply to parse") from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise ProtocolError(ErrorCode.INVALID_EVENT, "an event is a JSON object with a string 'type'", param="type")
    kind, event_id = data["type"], data.get("event_id") if isinstance(data.get("event_id"), str) else None
    if kind not in CLIENT_EVENT_TYPES:
        shown = kind if len(kind) <= 64 else kind[:64] + "..."
        if kind.startswith(CONVERSATION_EVENT_PREFIXES):
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_EVENT,
                f"{shown!r} is a conversation event; this server holds transcription sessions only. Client events: "
                + ", ".join(CLIENT_EVENT_TYPES),
                param="type",
                event_id=event_id,
            )
        raise ProtocolError(
            ErrorCode.UNKNOWN_EVENT_TYPE,
            f"unknown event type {shown!r}; valid: {', '.join(CLIENT_EVENT_TYPES)}",
            param="type",
            event_id=event_id,
        )
    try:
        return _CLIENT_EVENT.validate_python(data)
    except RecursionError:
        raise ProtocolError(
            ErrorCode.INVALID_EVENT, f"{kind}: the event is nested too deeply", event_id=event_id
        ) from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"][1:])  # [0] is the union's tag
        raise ProtocolError(
            ErrorCode.INVALID_EVENT, f"{kind}: {where or 'event'}: {first['msg']}", param=where, event_id=event_id
        ) from None


def decode_audio(event: AudioAppend) -> bytes:
    """The appended PCM bytes (standard base64).

    Raises:
        ProtocolError: not base64.
    """
    try:
        return base64.b64decode(event.audio, validate=True)
    except (binascii.Error, ValueError) as error:
        raise ProtocolError(
            ErrorCode.INVALID_AUDIO, f"'audio' is not valid base64: {error}", param="audio", event_id=event.event_id
        ) from None


# ---- server events -----------------------------------------------------------------------------------------------
class ErrorDetail(BaseModel):
    type: str
    code: str
    message: str
    param: str | None = None
    event_id: str | None = None


class Word(BaseModel):
    """A word of a final, NeMo's word timestamps: seconds, and encoder frames, from the stream's start."""

    word: str
    start: float
    end: float
    start_offset: int
    end_offset: int


class Usage(BaseModel):
    type: Literal["duration"] = "duration"
    seconds: float


class PcmFormat(BaseModel):
    type: Literal["audio/pcm"] = PCM
    rate: int


class G711Format(BaseModel):
    type: Literal["audio/pcmu", "audio/pcma"]


class SessionTranscription(BaseModel):
    """The session's transcription settings; ``boosting`` is an extension (every boosting option, defaults filled);
    so is ``att_context_size``: the ``[left, lookahead]`` the session's next items stream at (the engine its ``delay``
    picks among the server's look-aheads; ``None`` with network workers, whose sessions do not know it)."""

    model: str
    language: str | None = None
    languages: list[str] | None = None
    prompt: str | None = None
    keywords: list[str] | None = None
    delay: Literal["minimal", "low", "medium", "high", "xhigh"] | None = None
    boosting: Boosting | None = None
    att_context_size: list[int] | None = None


class SessionAudioInput(BaseModel):
    format: PcmFormat | G711Format
    transcription: SessionTranscription
    turn_detection: TurnDetection | None = None
    noise_reduction: None = None


class SessionAudio(BaseModel):
    input: SessionAudioInput


class Session(BaseModel):
    """The effective session in the GA shape, as ``session.created`` / ``session.updated`` report it."""

    id: str
    object: Literal["realtime.transcription_session"] = "realtime.transcription_session"
    type: Literal["transcription"] = "transcription"
    audio: SessionAudio
    include: list[str] = Field(default_factory=list)


class BetaTranscription(BaseModel):
    """``model``: what the client named (``None`` if it named none); the served model is ``served_model``
    (extension): the beta SDK types ``model`` as one of OpenAI's three model names. ``att_context_size`` (extension):
    as in :class:`SessionTranscription`."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    served_model: str
    att_context_size: list[int] | None = None


class ClientSecret(BaseModel):
    """A WebSocket session has no client secret; the beta SDK's session type requires the field."""

    value: str = ""
    expires_at: int = 0


class BetaSession(BaseModel):
    """The effective session in the beta shape (``transcription_session.created`` / ``.updated``);
    ``input_audio_sample_rate`` (extension): the rate of ``pcm16`` audio (24 kHz unless the client set another)."""

    id: str
    object: Literal["realtime.transcription_session"] = "realtime.transcription_session"
    client_secret: ClientSecret = Field(default_factory=ClientSecret)
    modalities: list[Literal["text"]] = Field(default_factory=lambda: ["text"])
    input_audio_format: Literal["pcm16", "g711_ulaw", "g711_alaw"]
    input_audio_sample_rate: int
    input_audio_transcription: BetaTranscription
    turn_detection: TurnDetection | None = None
    input_audio_noise_reduction: None = None
    include: list[str] = Field(default_factory=list)


class ServerEvent(BaseModel):
    event_id: str
    type: str


class ErrorEvent(ServerEvent):
    type: Literal["error"] = "error"
    error: ErrorDetail


class SessionEvent(ServerEvent):
    type: Literal[
        "session.created", "session.updated", "transcription_session.created", "transcription_session.updated"
    ]
    session: Session | BetaSession


class Committed(ServerEvent):
    type: Literal["input_audio_buffer.committed"] = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None = None


class SpeechStarted(ServerEvent):
    """The VAD heard speech start at ``audio_start_ms`` (of the connection's audio); ``item_id``: the item the speech
    will be committed as."""

    type: Literal["input_audio_buffer.speech_started"] = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str


class SpeechStopped(ServerEvent):
    """The VAD heard speech stop at ``audio_end_ms`` (of the connection's audio; where the silence that ended it
    began); the item's ``committed`` and ``completed`` follow once its audio is decoded (if it has any text)."""

    type: Literal["input_audio_buffer.speech_stopped"] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


class Cleared(ServerEvent):
    type: Literal["input_audio_buffer.cleared"] = "input_audio_buffer.cleared"


class TranscriptionDelta(ServerEvent):
    """A partial: ``delta`` extends the item's text; ``text`` (extension) is all of it so far, ``audio_end_ms``
    (extension) the audio it accounts for."""

    type: Literal["conversation.item.input_audio_transcription.delta"] = (
        "conversation.item.input_audio_transcription.delta"
    )
    item_id: str
    content_index: int = 0
    delta: str
    text: str
    audio_end_ms: int


class TranscriptionFailed(ServerEvent):
    """The item could not be transcribed (the engine refused its audio or failed); ``error`` says why."""

    type: Literal["conversation.item.input_audio_transcription.failed"] = (
        "conversation.item.input_audio_transcription.failed"
    )
    item_id: str
    content_index: int = 0
    error: ErrorDetail


class LogProb(BaseModel):
    """A token of a final and its log-probability (``include: ["item.input_audio_transcription.logprobs"]``):
    ``token`` its text (a word start as a space), ``bytes`` its UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int]


class TranscriptionCompleted(ServerEvent):
    """A final: the item's transcript; ``logprobs`` each token's log-probability when the session includes them;
    ``words`` (extension) NeMo's word timestamps, ``audio_start_ms`` / ``audio_end_ms`` (extensions) the item's
    audio within the connection's stream."""

    type: Literal["conversation.item.input_audio_transcription.completed"] = (
        "conversation.item.input_audio_transcription.completed"
    )
    item_id: str
    content_index: int = 0
    transcript: str
    usage: Usage
    logprobs: list[LogProb] | None = None
    words: list[Word]
    audio_start_ms: int
    audio_end_ms: int
