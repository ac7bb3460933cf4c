"""Cache-aware streaming for many desynchronised streams: slot caches read in place, bucketed CUDA graphs.

* :mod:`~nemo_fastdecode.streaming.geometry` -- chunk sizes of NeMo's cache-aware streaming, its chunk schedule.
* :mod:`~nemo_fastdecode.streaming.slots` -- the pre-allocated per-slot caches.
* :mod:`~nemo_fastdecode.streaming.encoder` -- the encoder step over slot caches (indexed attention).
* :mod:`~nemo_fastdecode.streaming.subsampling` -- NeMo's causal subsampling convolutions, fewer passes (tf32x3).
* :mod:`~nemo_fastdecode.streaming.buckets` -- batch-size buckets, one CUDA graph replay per step.
* :mod:`~nemo_fastdecode.streaming.decoding` -- per-slot greedy decoding state (``fast_greedy``), n-gram LM fusion.
* :mod:`~nemo_fastdecode.streaming.boosting` -- per-slot phrase boosting trees (NeMo's per-stream biasing).
* :mod:`~nemo_fastdecode.streaming.transcriber` -- ``open`` / ``step`` / ``flush`` / ``close``.
* :mod:`~nemo_fastdecode.streaming.frontend` -- every stream's PCM in one copy, NeMo's whole-file mel features out.
* :mod:`~nemo_fastdecode.streaming.chunking` -- NeMo's chunk schedule as frames arrive, the frames waiting per slot.
* :mod:`~nemo_fastdecode.streaming.events` -- the engine's options, events and errors.
* :mod:`~nemo_fastdecode.streaming.vad` -- Silero VAD for every stream at once, on the front end's samples.
* :mod:`~nemo_fastdecode.streaming.endpointing` -- NeMo's blank-run end of utterance for every stream at once.
* :mod:`~nemo_fastdecode.streaming.config` -- ``EngineConfig``: the engine's options, checked once.
* :mod:`~nemo_fastdecode.streaming.streams` -- the engine's stream ids, slots and lifecycle.
* :mod:`~nemo_fastdecode.streaming.pcm` -- what a push may carry: PCM checks, split samples.
* :mod:`~nemo_fastdecode.streaming.inbox` -- pushed audio in pinned host memory until a cycle takes it.
* :mod:`~nemo_fastdecode.streaming.cycle` -- one engine cycle: audio in, features, one batched step, events.
* :mod:`~nemo_fastdecode.streaming.utterance_ends` -- where utterances end in the cycle (VAD cuts, blank runs).
* :mod:`~nemo_fastdecode.streaming.event_builder` -- segments and the partial / final events' text, tokens, words.
* :mod:`~nemo_fastdecode.streaming.engine` -- ``StreamingEngine``: PCM in, partial and final transcripts out.
* :mod:`~nemo_fastdecode.nemo.streaming_pipeline` -- NeMo's streaming pipeline interface over the engine
  (``pipeline_type: fast_cache_aware``).
* :mod:`~nemo_fastdecode.streaming.nemo_path` -- NeMo's own path (slot gather/scatter + ``conformer_stream_step``).
"""

from nemo_fastdecode.streaming.config import EngineConfig
from nemo_fastdecode.streaming.engine import StreamingEngine
from nemo_fastdecode.streaming.events import (
    BoostingOptions,
    CapacityError,
    EndpointingOptions,
    EndReason,
    SpeechEvent,
    StreamEndedError,
    StreamError,
    StreamEvent,
    StreamingEngineError,
    StreamOptions,
    UnknownStreamError,
)
from nemo_fastdecode.streaming.geometry import StreamingGeometry, split_features
from nemo_fastdecode.streaming.transcriber import StepResult, StreamingTranscriber, StreamResult

__all__ = [
    "BoostingOptions",
    "CapacityError",
    "EndReason",
    "EndpointingOptions",
    "EngineConfig",
    "SpeechEvent",
    "StepResult",
    "StreamEndedError",
    "StreamError",
    "StreamEvent",
    "StreamOptions",
    "StreamResult",
    "StreamingEngine",
    "StreamingEngineError",
    "StreamingGeometry",
    "StreamingTranscriber",
    "UnknownStreamError",
    "split_features",
]
