"""The server's options as dataclasses, mirrored one to one by ``configs/serve.yaml``.

* :class:`ServeConfig` -- model, address, engine (slots, look-ahead, precision, decoding), lifetime, access. Its
  engine settings are flat keys (``slots=1024 att_context_size=[70,1]``); :attr:`ServeConfig.engine` builds the
  engine's :class:`~nemo_fastdecode.streaming.config.EngineConfig` from them, in one place, and that config's checks
  are the server's (their messages name the server's keys).
* :class:`LimitsConfig` -- what one connection may send and hold: message size, audio rate, outgoing queue.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from nemo_fastdecode.serve.look_aheads import ALL, engine_order
from nemo_fastdecode.streaming.config import EngineConfig
from nemo_fastdecode.streaming.events import EndpointingOptions

__all__ = ["LimitsConfig", "ServeConfig"]


@dataclass
class LimitsConfig:
    """Per-connection limits: what a client may send, and how much the server holds for it.

    Attributes:
        max_message_bytes: largest client message (text or binary) that is read; a larger one (up to
            ``4 x`` this) is refused with an ``error`` event and the connection goes on; beyond that the WebSocket
            layer closes with 1009 (message too big) before reading it into memory.
        max_audio_rate: audio seconds a connection may send per wall-clock second, sustained (1.0 = real time).
            Reads pause (TCP back-pressure) when a client goes faster: nothing is dropped.
        max_audio_burst_seconds: audio a connection may send at once above that rate (a file's first seconds).
        max_outgoing_events: server events queued for a client that does not read them; one more engine event
            (a delta, a final, ...) is a slow reader: an ``error`` event ``slow_reader`` (when it can still be
            written) and close code 1008. The replies to the client's own messages never overflow it: the server
            stops reading while half of it waits (TCP holds the client back; nothing is dropped).
        slow_reader_seconds: the server pings each client every ``slow_reader_seconds / 2``; a client whose pong is
            overdue by this long has not read what was sent before the ping (a WebSocket client answers pings as it
            reads; one that stops reading is caught however much the socket buffers still take) and is closed as a
            slow reader: ``error`` ``slow_reader`` (when it can still be written), close 1008, the ``slow_reader``
            refusal counted and logged. A peer that is gone without closing is caught the same way (this is the
            server's keepalive). Time the server paces the client (``max_audio_rate``) does not count.
        write_buffer_bytes: bytes the WebSocket layer buffers per connection before a send waits for the client.
        max_boost_phrases: most phrases a session's ``transcription.boosting`` may list.
        max_boost_phrase_chars: longest boosting phrase, in characters.
    """

    max_message_bytes: int = 1 << 20
    max_audio_rate: float = 4.0
    max_audio_burst_seconds: float = 30.0
    max_outgoing_events: int = 256
    slow_reader_seconds: float = 20.0
    write_buffer_bytes: int = 64 * 1024
    max_boost_phrases: int = 1000
    max_boost_phrase_chars: int = 200

    def __post_init__(self) -> None:
        if self.max_message_bytes < 1024:
            raise ValueError(f"limits.max_message_bytes must be >= 1024, got {self.max_message_bytes}")
        if not self.max_audio_rate > 0 or not self.max_audio_burst_seconds > 0:
            raise ValueError(
                "limits.max_audio_rate and limits.max_audio_burst_seconds must be > 0, got "
                f"{self.max_audio_rate} and {self.max_audio_burst_seconds}"
            )
        if self.max_outgoing_events < 1 or self.write_buffer_bytes < 1:
            raise ValueError(
                f"limits.max_outgoing_events and limits.write_buffer_bytes must be >= 1, got "
                f"{self.max_outgoing_events} and {self.write_buffer_bytes}"
            )
        if isinstance(self.slow_reader_seconds, bool) or not (
            isinstance(self.slow_reader_seconds, int | float) and 0 < self.slow_reader_seconds <= 3600
        ):
            raise ValueError(
                f"limits.slow_reader_seconds must be > 0 and <= 3600 seconds, got {self.slow_reader_seconds!r}"
            )
        if self.max_boost_phrases < 0 or self.max_boost_phrase_chars < 1:
            raise ValueError(
                f"limits.max_boost_phrases must be >= 0 (0: no boosting) and limits.max_boost_phrase_chars >= 1, got "
                f"{self.max_boost_phrases} and {self.max_boost_phrase_chars}"
            )


@dataclass
class ServeConfig:
    """``nemo-fastdecode serve``: the streaming ASR server (OpenAI Realtime transcription protocol).

    Attributes:
        model: the shipped trained cache-aware model (``trained-streaming``, the default: a small hybrid trained on
            synthesised English speech, CPU-quick), a ``.nemo`` checkpoint of a cache-aware streaming transducer, a
            pretrained name, or a synthetic preset (``tiny-streaming``: random weights, gibberish text).
        host: address to bind. Loopback by default; TLS belongs to a reverse proxy in front.
        port: TCP port (0: any free port, printed at start).
        slots: streams served at once (pre-allocated caches); one per connection, more are refused (1013). With
            ``look_aheads``: per engine.
        att_context_size: ``[left, lookahead]`` among the encoder's look-aheads; ``None``: its default. With
            ``look_aheads``: the look-ahead of a session that sets no ``delay`` (one of them; ``None``: the encoder's
            default if offered, else the shortest).
        look_aheads: the look-aheads a session's ``transcription.delay`` chooses from, one engine each
            (:mod:`~nemo_fastdecode.serve.look_aheads`): ``None`` (the default): one engine at ``att_context_size``,
            every delay gets it; ``all``: every look-ahead the encoder was trained with; or a list of ``[left,
            lookahead]``. Each engine has ``slots`` slots of its own (its caches: memory grows with the number of
            look-aheads) and its own cycles, run in turn by the one engine thread on the one device. Not with
            ``network_workers``.
        max_symbols: greedy ``max_symbols`` (``None``: the model's).
        fast_math: opt-in fast-math greedy decoding (not bit-identical to NeMo's).
        dtype: ``float32`` (exact) or ``bfloat16`` (caches and encoder compute).
        encoder_matmul: ``fp32`` (exact), or opt-in ``tf32x3`` / ``tf32`` (float32 only).
        use_cuda_graphs: one CUDA graph replay per engine cycle and batch-size bucket (GPU).
        cuda: GPU index; ``None``: GPU 0 if any, else the CPU; negative: the CPU.
        seed: weights of a synthetic model.
        idle_timeout_seconds: a connection that sends nothing for this long gets the final of its audio, an
            ``error`` event (``idle_timeout``) and is closed; ``None``: never.
        shutdown_timeout_seconds: on SIGTERM, how long open connections get to receive their last finals.
        vad: Silero VAD on the engine: sessions may ask for ``turn_detection: {type: server_vad}``; the server then
            ends an item where speech stops (``speech_started`` / ``speech_stopped``, then ``committed`` and
            ``completed`` per utterance). Sessions without turn detection are not affected.
        vad_threshold: speech probability at or above which audio is speech (a session's ``threshold`` overrides it).
        vad_min_silence_ms: silence after speech that ends an utterance (a session's ``silence_duration_ms``
            overrides it).
        api_key: when set, clients must send it (``Authorization: Bearer <key>`` or the WebSocket subprotocol
            ``openai-insecure-api-key.<key>``) before anything else is read; others are closed with 1008.
        gil_switch_interval_ms: Python's thread switch interval while the server runs (``sys.setswitchinterval``;
            ``None``: leave Python's 5 ms). The engine thread and the network thread share the GIL, and the engine
            gives it up at every GPU synchronisation of a cycle: with 5 ms, each of those may wait up to 5 ms for the
            network thread to hand it back, which stretches cycles under load (the load test's tables in
            ``benchmarks/results/`` compare the two).
        phrase_boosting: set per-stream phrase boosting (a session's ``transcription.boosting``) up at start, so that
            the warm-up captures the decoder that fuses the streams' trees too (needs a model with a tokenizer);
            ``false``: the first item with phrases sets it up (its first steps capture it).
        keywords_weight: the boosting weight (NeMo's ``boosting_model_alpha``) of a session's
            ``transcription.keywords`` (OpenAI's field has no weight; the ``boosting`` extension sets its own).
        decoding: ``greedy`` or ``beam``: NeMo's ``malsd_batch`` beam search per stream, continued chunk after chunk
            (partial transcripts are the best beam so far and may change; with per-stream
            phrase boosting and the n-gram LM too; not with ``vad`` or ``fast_math``).
        beam_size: beams per stream with ``decoding: beam``.
        ngram_lm_model: an n-gram LM over the model's tokens fused into every stream's decoding (an ARPA file or
            NeMo's ``.nemo`` n-gram LM, as NeMo's ``greedy.ngram_lm_model`` / ``beam.ngram_lm_model``); ``None``: none.
        ngram_lm_alpha: the LM's weight, > 0 with a model (NeMo's ``greedy.ngram_lm_alpha``).
        network_workers: ``0``: one process, its event loop serving every WebSocket next to the engine thread.
            ``N >= 1``: N worker processes serve the WebSockets (all on ``host:port``, ``SO_REUSEPORT``: the kernel
            spreads connections over them) and do all the protocol work (validation, base64, JSON, sending); this
            process keeps the engine and its thread, so the network side no longer shares its interpreter lock.
            Commands and events cross between them in batches; slots count across workers; a worker that dies is
            replaced (its connections' items are dropped, nothing else is touched). For hundreds or thousands of
            clients, where one event loop next to the engine falls behind: give each worker a few hundred clients
            and a core, leaving cores to the main process (e.g. 4 on a 16-core host for 2,000 clients); with fewer
            clients, 0 saves the hop between processes.
        network_batch_ms: with network workers, each sends its connections' commands to this process at most once
            per this many milliseconds (else once per turn of its event loop, which under load is every millisecond
            or so): fewer, larger messages for the one thread that reads every worker's pipe, which shares this
            process's interpreter lock with the engine thread, for at most this much more latency. ``0``: once per
            turn.
        limits: per-connection limits.
    """

    model: str = "trained-streaming"
    host: str = "127.0.0.1"
    port: int = 8000
    slots: int = 64
    att_context_size: list[int] | None = None
    look_aheads: Any = None  # None, "all" or list[list[int]]: OmegaConf types no union of a list and a string
    max_symbols: int | None = None
    fast_math: bool = False
    dtype: str = "float32"
    encoder_matmul: str = "fp32"
    use_cuda_graphs: bool = True
    cuda: int | None = None
    seed: int = 0
    idle_timeout_seconds: float | None = 60.0
    shutdown_timeout_seconds: float = 30.0
    vad: bool = False
    vad_threshold: float = 0.5
    vad_min_silence_ms: float = 500.0
    api_key: str | None = None
    gil_switch_interval_ms: float | None = 0.5
    phrase_boosting: bool = False
    keywords_weight: float = 1.0
    decoding: str = "greedy"
    beam_size: int = 4
    ngram_lm_model: str | None = None
    ngram_lm_alpha: float = 0.0
    network_workers: int = 0
    network_batch_ms: float = 2.0
    limits: LimitsConfig = field(default_factory=LimitsConfig)

    def __post_init__(self) -> None:
        self.engine  # noqa: B018 -- the engine settings' checks (EngineConfig's), before any model loads
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if not math.isfinite(self.keywords_weight):
            raise ValueError(f"keywords_weight must be a finite number, got {self.keywords_weight}")
        if self.idle_timeout_seconds is not None and not self.idle_timeout_seconds > 0:
            raise ValueError(f"idle_timeout_seconds must be > 0 or null, got {self.idle_timeout_seconds}")
        if not self.shutdown_timeout_seconds >= 0:
            raise ValueError(f"shutdown_timeout_seconds must be >= 0, got {self.shutdown_timeout_seconds}")
        if not isinstance(self.vad, bool):
            raise ValueError(f"vad must be true or false, got {self.vad!r}")
        self._vad_options()  # checks vad_threshold and vad_min_silence_ms even with vad off
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must be null or a non-empty string")
        if self.gil_switch_interval_ms is not None and not self.gil_switch_interval_ms > 0:
            raise ValueError(f"gil_switch_interval_ms must be > 0 or null, got {self.gil_switch_interval_ms}")
        if (
            isinstance(self.network_workers, bool)
            or not isinstance(self.network_workers, int)
            or self.network_workers < 0
        ):
            raise ValueError(
                f"network_workers must be 0 (one process) or a number of worker processes >= 1, got "
                f"{self.network_workers!r}"
            )
        self._check_look_aheads()
        if not (isinstance(self.network_batch_ms, int | float) and 0 <= self.network_batch_ms <= 100):
            raise ValueError(f"network_batch_ms must be in [0, 100] milliseconds, got {self.network_batch_ms!r}")

    def _check_look_aheads(self) -> None:
        value = self.look_aheads
        if value is None or value == ALL:
            pass
        elif isinstance(value, str) or not (
            isinstance(value, list | tuple)
            and value
            and all(
                isinstance(size, list | tuple) and len(size) == 2 and all(type(v) is int for v in size)
                for size in value
            )
        ):
            raise ValueError(
                f"look_aheads must be null, '{ALL}' or a non-empty list of [left, lookahead], got {value!r}"
            )
        if value is not None and self.network_workers:
            raise ValueError("look_aheads (an engine per look-ahead) needs network_workers: 0")

    @property
    def engines(self) -> list[EngineConfig]:
        """The engines of an explicit ``look_aheads`` list (shortest look-ahead first), else the one of ``att_context_size``
        (``look_aheads: all`` is resolved against the model: ``build_engines``)."""
        if self.look_aheads is None or self.look_aheads == ALL:
            return [self.engine]
        return [dataclasses.replace(self.engine, att_context_size=size) for size in engine_order(self.look_aheads)]

    @property
    def engine(self) -> EngineConfig:
        """The engine these settings ask for (``build_engine`` builds it): ``slots`` slots, Silero VAD with ``vad``,
        no idle timeout (connections time out, with ``idle_timeout_seconds``). Raises ``ValueError`` naming the
        server's key for settings the engine cannot take."""
        try:
            return EngineConfig(
                num_slots=self.slots,
                att_context_size=self.att_context_size,
                dtype=self.dtype,
                use_cuda_graphs=self.use_cuda_graphs,
                encoder_matmul=self.encoder_matmul,
                fast_math=self.fast_math,
                max_symbols=self.max_symbols,
                endpointing=self.endpointing,
                phrase_boosting=self.phrase_boosting,
                decoding=self.decoding,
                beam_size=self.beam_size,
                ngram_lm_model=self.ngram_lm_model,
                ngram_lm_alpha=self.ngram_lm_alpha,
            )
        except (ValueError, TypeError) as error:  # name the setting as this config spells it
            message = str(error)
            if message.startswith("num_slots "):
                message = message.removeprefix("num_")
            elif message.startswith("endpointing (vad or a blank-run rule) needs decoding='greedy'"):
                message = "vad: true needs decoding: greedy; valid with decoding: beam: vad: false"
            raise ValueError(message) from None

    @property
    def endpointing(self) -> EndpointingOptions | None:
        """The engine's endpointing: Silero VAD with these settings when ``vad`` is on, else ``None``."""
        return self._vad_options() if self.vad else None

    def _vad_options(self) -> EndpointingOptions:
        try:
            return EndpointingOptions(
                vad=True, vad_threshold=self.vad_threshold, min_silence_ms=self.vad_min_silence_ms
            )
        except (ValueError, TypeError) as error:  # name the setting as this config spells it
            message = str(error).replace("EndpointingOptions.vad_threshold", "vad_threshold")
            raise ValueError(message.replace("EndpointingOptions.min_silence_ms", "vad_min_silence_ms")) from None
