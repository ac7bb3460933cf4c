"""A streaming ASR server: WebSocket in (OpenAI Realtime transcription protocol), transcripts out.

* :mod:`~nemo_fastdecode.serve.config` -- the server's options (mirrored by ``configs/serve.yaml``).
* :mod:`~nemo_fastdecode.serve.protocol` -- client and server events as pydantic schemas, error and close codes.
* :mod:`~nemo_fastdecode.serve.admission` -- the API key and the slot count: who gets a stream.
* :mod:`~nemo_fastdecode.serve.look_aheads` -- ``transcription.delay`` as the look-ahead: an engine per look-ahead.
* :mod:`~nemo_fastdecode.serve.connection` -- one client: session, audio buffer and items, bounded queues, pacing.
* :mod:`~nemo_fastdecode.serve.listener` -- one event loop's clients: listening, admission, routing, HTTP routes.
* :mod:`~nemo_fastdecode.serve.engine_loop` -- the engine's own thread: one batched cycle for every stream.
* :mod:`~nemo_fastdecode.serve.workers` -- network worker processes: the sockets in N processes, the engine in one.
* :mod:`~nemo_fastdecode.serve.metrics` -- Prometheus metrics.
* :mod:`~nemo_fastdecode.serve.app` -- the server: routes, lifetime, graceful shutdown.

``nemo-fastdecode serve`` (``nemo_fastdecode.apps.serve``) loads a model and runs :class:`RealtimeServer`.
"""

from nemo_fastdecode.serve.app import REALTIME_PATH, RealtimeServer, build_engine, build_engines
from nemo_fastdecode.serve.config import LimitsConfig, ServeConfig
from nemo_fastdecode.serve.protocol import CloseCode, ErrorCode

__all__ = [
    "REALTIME_PATH",
    "CloseCode",
    "ErrorCode",
    "LimitsConfig",
    "RealtimeServer",
    "ServeConfig",
    "build_engine",
    "build_engines",
]
