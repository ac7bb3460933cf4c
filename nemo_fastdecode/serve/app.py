"""The server: one asyncio event loop owns every WebSocket, one engine thread owns the GPU.

Routes (one port): ``/v1/realtime`` (WebSocket, the transcription protocol), ``/health`` (200 while the engine loop
runs), ``/ready`` (200 once the engine is warm, 503 before and while shutting down), ``/metrics`` (Prometheus).

Example (a model already loaded; ``nemo-fastdecode serve`` does this from a config)::

    import asyncio
    from nemo_fastdecode.serve import RealtimeServer, ServeConfig, build_engine

    config = ServeConfig(port=8000, slots=256)
    server = RealtimeServer(build_engine(model, config), config, model_name="my-model")
    asyncio.run(server.run())  # until SIGTERM / SIGINT: then the open items' finals, then exit
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import signal
import sys
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import TYPE_CHECKING

import torch
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from nemo_fastdecode.serve.admission import SUBPROTOCOL_KEY_PREFIX, Admission, Refusal
from nemo_fastdecode.serve.config import ServeConfig
from nemo_fastdecode.serve.connection import Connection
from nemo_fastdecode.serve.engine_loop import Delivery, EngineLoop
from nemo_fastdecode.serve.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from nemo_fastdecode.serve.protocol import CloseCode, ErrorCode, ErrorDetail, ErrorEvent
from nemo_fastdecode.streaming import StreamEvent, StreamingEngine

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

__all__ = ["REALTIME_PATH", "RealtimeServer", "build_engine"]

log = logging.getLogger(__name__)

REALTIME_PATH = "/v1/realtime"
#: the subprotocol OpenAI's browser clients offer next to their key (the server must pick one they offered)
REALTIME_SUBPROTOCOL = "realtime"


def build_engine(model: ASRModel, config: ServeConfig) -> StreamingEngine:
    """The streaming engine ``config`` asks for, on the model's device (no idle timeout: connections time out; Silero
    VAD with ``config.vad``, for the streams of sessions that ask for ``server_vad``)."""
    return StreamingEngine(
        model,
        config.slots,
        att_context_size=config.att_context_size,
        dtype=getattr(torch, config.dtype),
        use_cuda_graphs=config.use_cuda_graphs,
        encoder_matmul=config.encoder_matmul,
        fast_math=config.fast_math,
        max_symbols=config.max_symbols,
        endpointing=config.endpointing,
        phrase_boosting=config.phrase_boosting,
        decoding=config.decoding,
        beam_size=config.beam_size,
        ngram_lm_model=config.ngram_lm_model,
        ngram_lm_alpha=config.ngram_lm_alpha,
    )


class RealtimeServer:
    """A WebSocket server of the OpenAI Realtime transcription protocol over one :class:`StreamingEngine`.

    Args:
        engine: the engine (its ``num_slots`` bounds the connections served at once).
        config: address, limits, timeouts, API key (``config.slots`` is taken from the engine).
        model_name: reported in sessions.
        endpointer: the engine loop's endpointing hook; with it, sessions may ask for ``server_vad``. Without it,
            they may when the engine runs Silero VAD (``EndpointingOptions(vad=True)``: ``build_engine`` with
            ``config.vad``).
        warm_up: warm the engine up (CUDA graphs) before ``/ready`` says so.
    """

    def __init__(
        self,
        engine: StreamingEngine,
        config: ServeConfig,
        *,
        model_name: str = "nemo-fastdecode",
        endpointer: Callable[[list[StreamEvent]], Iterable[int]] | None = None,
        warm_up: bool = True,
    ):
        self.config, self.model_name, self._warm_up = config, model_name, warm_up
        self.metrics = ServerMetrics(engine.device)
        self.admission = Admission(engine.num_slots, config.api_key)
        self.engine_loop = EngineLoop(engine, self._from_engine, self.metrics, endpointer=endpointer)
        self.rate = engine.front.settings.sample_rate
        self._vad = engine.endpointing if engine.endpointing.vad else None
        self.connections: dict[int, Connection] = {}
        self._handlers: set[asyncio.Task] = set()
        self._ids = itertools.count(1)
        self._server: Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._switch_interval: float | None = None  # Python's, while the server has its own
        self.shutting_down = False

    # ---- lifetime ------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the engine thread (it warms up) and listen; returns once bound (``/ready`` follows the warm-up)."""
        self._loop = asyncio.get_running_loop()
        if self.config.gil_switch_interval_ms is not None:  # process-wide: restored by shutdown()
            self._switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(self.config.gil_switch_interval_ms / 1000)
        self.engine_loop.start(warm_up=self._warm_up)
        limits = self.config.limits
        self._server = await serve(
            self._handle,
            self.config.host,
            self.config.port,
            process_request=self._http,
            select_subprotocol=_select_subprotocol,
            compression=None,  # PCM does not compress; deflate would cost CPU per message
            max_size=4 * limits.max_message_bytes,  # larger: closed with 1009 before it is read into memory
            max_queue=16,  # messages read ahead of the handler
            write_limit=limits.write_buffer_bytes,
            close_timeout=2.0,
            ping_interval=20.0,
            ping_timeout=20.0,
        )

    @property
    def port(self) -> int:
        """The bound port (``config.port`` 0 picks a free one)."""
        assert self._server is not None, "start() first"
        return next(iter(self._server.sockets)).getsockname()[1]

    @property
    def ready(self) -> bool:
        return self.engine_loop.ready.is_set() and self.engine_loop.failed is None and not self.shutting_down

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Until the engine is warm (raises ``TimeoutError`` after ``timeout`` s, ``RuntimeError`` if it failed)."""
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(loop.run_in_executor(None, self.engine_loop.ready.wait), timeout)
        if self.engine_loop.failed is not None:
            raise RuntimeError("the engine failed while warming up") from self.engine_loop.failed

    async def shutdown(self, timeout: float | None = None) -> None:
        """Graceful: stop listening; every open connection gets the final of the audio it sent, then close 1001."""
        if self.shutting_down:
            return
        self.shutting_down = True
        timeout = self.config.shutdown_timeout_seconds if timeout is None else timeout
        if self._server is not None:
            self._server.close(close_connections=False)
        for connection in list(self.connections.values()):
            connection.shut_down()
        if self._handlers:
            _, late = await asyncio.wait(self._handlers, timeout=timeout + 5.0)
            for task in late:
                task.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        await asyncio.get_running_loop().run_in_executor(None, self.engine_loop.stop, 10.0)
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)

    async def run(
        self, install_signal_handlers: bool = True, on_ready: Callable[[RealtimeServer], None] | None = None
    ) -> None:
        """Serve until SIGTERM / SIGINT, then shut down gracefully; ``on_ready`` is called once the engine is warm."""
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
        await self.wait_ready()
        log.info("serving ws://%s:%d%s", self.config.host, self.port, REALTIME_PATH)
        if on_ready is not None:
            on_ready(self)
        await stop.wait()
        await self.shutdown()

    # ---- connections ---------------------------------------------------------------------------------------------
    async def _handle(self, ws: ServerConnection) -> None:
        refusal = self.admission.check_key(ws.request.headers, _offered_subprotocols(ws.request))
        if refusal is None and self.shutting_down:
            refusal = Refusal(ErrorCode.SHUTTING_DOWN, "the server is shutting down", CloseCode.GOING_AWAY)
        if refusal is None:
            refusal = self.admission.admit()
        if refusal is not None:
            await self._refuse(ws, refusal)
            return
        connection_id = next(self._ids)
        connection = Connection(
            ws,
            connection_id,
            self.engine_loop,
            self.metrics,
            self.config.limits,
            rate=self.rate,
            model_name=self.model_name,
            idle_timeout=self.config.idle_timeout_seconds,
            segmenting=self.engine_loop.endpointer is not None,
            vad=self._vad,
        )
        self.connections[connection_id] = connection
        self.metrics.connections.set(len(self.connections))
        task = asyncio.current_task()
        self._handlers.add(task)
        try:
            await connection.run()
        finally:
            self._handlers.discard(task)
            del self.connections[connection_id]
            self.admission.release()
            self.metrics.connections.set(len(self.connections))

    async def _refuse(self, ws: ServerConnection, refusal: Refusal) -> None:
        self.metrics.refused(refusal.code.value)
        detail = ErrorDetail(type=refusal.code.error_type, code=refusal.code.value, message=refusal.message)
        with contextlib.suppress(Exception):  # the client may be gone already
            await asyncio.wait_for(ws.send(ErrorEvent(event_id="event_0", error=detail).model_dump_json()), 2.0)
        await ws.close(refusal.close_code, refusal.code.value)

    def _from_engine(self, deliveries: list[Delivery]) -> None:
        """From the engine thread: hand the batch to the event loop (never waits)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
            self._loop.call_soon_threadsafe(self._route, deliveries)

    def _route(self, deliveries: list[Delivery]) -> None:
        for delivery in deliveries:
            connection = self.connections.get(delivery.key[0])
            if connection is not None:
                connection.deliver(delivery)

    # ---- plain HTTP ----------------------------------------------------------------------------------------------
    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.partition("?")[0]
        if path == REALTIME_PATH:
            return None  # the WebSocket handshake goes on
        if path == "/health":
            ok = self.engine_loop.failed is None
            return connection.respond(
                HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, "ok\n" if ok else "failed\n"
            )
        if path == "/ready":
            return connection.respond(
                HTTPStatus.OK if self.ready else HTTPStatus.SERVICE_UNAVAILABLE,
                "ready\n" if self.ready else "not ready\n",
            )
        if path == "/metrics":
            response = connection.respond(HTTPStatus.OK, self.metrics.exposition().decode())
            response.headers["Content-Type"] = CONTENT_TYPE_LATEST
            return response
        return connection.respond(HTTPStatus.NOT_FOUND, f"not found; the WebSocket is at {REALTIME_PATH}\n")


def _offered_subprotocols(request: Request) -> list[str]:
    return [p.strip() for value in request.headers.get_all("Sec-WebSocket-Protocol") for p in value.split(",")]


def _select_subprotocol(connection: ServerConnection, offered: list[str]) -> str | None:
    """A browser that offered subprotocols needs one back: ``realtime``, else the first that is not a key."""
    if REALTIME_SUBPROTOCOL in offered:
        return REALTIME_SUBPROTOCOL
    return next((p for p in offered if not p.startswith(SUBPROTOCOL_KEY_PREFIX)), offered[0] if offered else None)
