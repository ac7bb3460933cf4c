"""The network side of the server: one asyncio loop's listening socket, its connections and its plain HTTP routes.

A :class:`Listener` admits clients (API key, slots), runs a :class:`~nemo_fastdecode.serve.connection.Connection`
per client, sends their commands to an :class:`~nemo_fastdecode.serve.engine_loop.EnginePort` and routes the
engine's :class:`~nemo_fastdecode.serve.engine_loop.Delivery` batches back to them. The server runs one in its own
process (next to the engine thread) or one in each network worker process (:mod:`~nemo_fastdecode.serve.workers`),
all serving the same port.

Routes (one port): ``/v1/realtime`` (WebSocket, the transcription protocol), ``/health``, ``/ready``, ``/metrics``.

The port answers from the moment it is bound: while the engine warms up, ``/health`` says 200, ``/ready`` 503 and a
WebSocket upgrade is answered with HTTP 503 (``Retry-After``: nothing is admitted before the engine can serve it).
On a graceful shutdown the port stays open while the open connections drain (each gets the finals of its audio):
``/ready`` says 503 and a new WebSocket gets the ``server_shutting_down`` error and close 1001; the port closes once
they are done.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from http import HTTPStatus

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from nemo_fastdecode.serve.admission import SUBPROTOCOL_KEY_PREFIX, Admission, Refusal
from nemo_fastdecode.serve.config import ServeConfig
from nemo_fastdecode.serve.connection import Connection
from nemo_fastdecode.serve.engine_loop import Delivery, EnginePort
from nemo_fastdecode.serve.look_aheads import LookAheads
from nemo_fastdecode.serve.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from nemo_fastdecode.serve.protocol import CloseCode, ErrorCode, ErrorDetail, ErrorEvent
from nemo_fastdecode.streaming import EndpointingOptions
from nemo_fastdecode.streaming.frontend import INPUT_RATES

__all__ = ["REALTIME_PATH", "Listener"]

REALTIME_PATH = "/v1/realtime"
#: the subprotocol OpenAI's browser clients offer next to their key (the server must pick one they offered)
REALTIME_SUBPROTOCOL = "realtime"


class Listener:
    """Clients on one event loop: admission, connections, delivery routing, ``/health`` ``/ready`` ``/metrics``.

    Args:
        engine: where the connections' commands go.
        config: address, limits, timeouts.
        metrics: this process's metrics (connections, refusals, audio, events).
        admission: the key and the slots.
        rate: the model's sample rate.
        model_name: reported in sessions.
        segmenting: whether the engine loop has an endpointer (``server_vad`` is accepted with it).
        boosting: whether the model can boost phrases (it has a tokenizer): sessions' keywords are taken.
        vad: the engine's VAD settings when it runs Silero VAD; ``None``: no VAD.
        healthy: ``/health`` answers 200 while this is true.
        ready: ``/ready`` answers 200 while this is true (and this frontend is not shutting down).
        serving: WebSocket upgrades are taken while this is true (the engine is warm and has not failed), else
            answered with HTTP 503; ``None``: while ``ready`` is.
        exposition: the ``/metrics`` text (a coroutine: a worker asks the main process for it).
        first_id: connection ids count up from ``first_id + 1`` (each worker has its own range).
        look_aheads: the engines' look-aheads (a session's ``delay`` picks one; a new connection takes a slot of the
            default's); ``None``: one engine, not reported.
    """

    def __init__(
        self,
        engine: EnginePort,
        config: ServeConfig,
        metrics: ServerMetrics,
        admission: Admission,
        *,
        rate: int,
        model_name: str,
        segmenting: bool,
        boosting: bool = True,
        vad: EndpointingOptions | None,
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
        exposition: Callable[[], Awaitable[bytes]],
        first_id: int = 0,
        serving: Callable[[], bool] | None = None,
        look_aheads: LookAheads | None = None,
    ):
        self.engine, self.config, self.metrics, self.admission = engine, config, metrics, admission
        self.rate, self.model_name, self.segmenting, self.vad = rate, model_name, segmenting, vad
        self.boosting, self.look_aheads = boosting, look_aheads
        self._healthy, self._ready, self._exposition = healthy, ready, exposition
        self._serving = ready if serving is None else serving
        self.connections: dict[int, Connection] = {}
        self._handlers: set[asyncio.Task] = set()
        self._ids = itertools.count(first_id + 1)
        self._server: Server | None = None
        self.shutting_down = False

    async def listen(self, port: int | None = None, reuse_port: bool = False) -> None:
        """Bind ``config.host`` and ``port`` (default ``config.port``); ``reuse_port``: share it with other
        processes (``SO_REUSEPORT``: the kernel spreads new connections over them)."""
        limits = self.config.limits
        self._server = await serve(
            self._handle,
            self.config.host,
            self.config.port if port is None else port,
            process_request=self._http,
            select_subprotocol=_select_subprotocol,
            compression=None,  # PCM does not compress; deflate would cost CPU per message
            max_size=4 * limits.max_message_bytes,  # larger: closed with 1009 before it is read into memory
            max_queue=16,  # messages read ahead of the handler
            write_limit=limits.write_buffer_bytes,
            close_timeout=2.0,
            ping_interval=None,  # each Connection pings its client (limits.slow_reader_seconds: slow readers too)
            ping_timeout=None,
            reuse_port=reuse_port or None,
        )

    @property
    def port(self) -> int:
        """The bound port."""
        assert self._server is not None, "listen() first"
        return next(iter(self._server.sockets)).getsockname()[1]

    async def close(self, timeout: float) -> None:
        """Graceful: every open connection gets the final of the audio it sent, then close 1001; meanwhile the port
        still answers (``/ready`` 503, new WebSockets refused with ``server_shutting_down``); then it closes."""
        self.shutting_down = True
        for connection in list(self.connections.values()):
            connection.shut_down()
        if self._handlers:
            _, late = await asyncio.wait(self._handlers, timeout=timeout + 5.0)
            for task in late:
                task.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def route(self, deliveries: list[Delivery]) -> None:
        """The engine's deliveries to their connections (on the event loop; a gone connection's are dropped)."""
        for delivery in deliveries:
            connection = self.connections.get(delivery.key[0])
            if connection is not None:
                connection.deliver(delivery)

    # ---- connections ---------------------------------------------------------------------------------------------
    async def _handle(self, ws: ServerConnection) -> None:
        refusal = self.admission.check_key(ws.request.headers, _offered_subprotocols(ws.request))
        if refusal is None and self.shutting_down:
            refusal = Refusal(ErrorCode.SHUTTING_DOWN, "the server is shutting down", CloseCode.GOING_AWAY)
        if refusal is None:
            refusal = self.admission.admit(self.look_aheads.default if self.look_aheads is not None else 0)
        if refusal is not None:
            await self._refuse(ws, refusal)
            return
        connection_id = next(self._ids)
        connection = Connection(
            ws,
            connection_id,
            self.engine,
            self.metrics,
            self.config.limits,
            rate=self.rate,
            model_name=self.model_name,
            idle_timeout=self.config.idle_timeout_seconds,
            segmenting=self.segmenting,
            boosting=self.boosting,
            keywords_weight=self.config.keywords_weight,
            logprobs=self.config.decoding == "greedy",
            vad=self.vad,
            pcm_rates=INPUT_RATES,
            look_aheads=self.look_aheads,
            admission=self.admission,
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
            connection.release()
            self.metrics.connections.set(len(self.connections))

    async def _refuse(self, ws: ServerConnection, refusal: Refusal) -> None:
        self.metrics.refused(refusal.code.value)
        detail = ErrorDetail(type=refusal.code.error_type, code=refusal.code.value, message=refusal.message)
        with contextlib.suppress(Exception):  # the client may be gone already
            await asyncio.wait_for(ws.send(ErrorEvent(event_id="event_0", error=detail).model_dump_json()), 2.0)
        await ws.close(refusal.close_code, refusal.code.value)

    # ---- plain HTTP ----------------------------------------------------------------------------------------------
    async def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.partition("?")[0]
        if path == REALTIME_PATH:
            if self.shutting_down or self._serving():
                return None  # the WebSocket handshake goes on (while shutting down: refused with an error event)
            why = "the engine is warming up" if self._healthy() else "the engine failed"
            response = connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, f"not ready: {why}; try again later\n")
            response.headers["Retry-After"] = "1"
            return response
        if path == "/health":
            ok = self._healthy()
            return connection.respond(
                HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, "ok\n" if ok else "failed\n"
            )
        if path == "/ready":
            ready = self._ready() and not self.shutting_down
            return connection.respond(
                HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE, "ready\n" if ready else "not ready\n"
            )
        if path == "/metrics":
            try:
                text = await self._exposition()
            except (asyncio.TimeoutError, ConnectionError, EOFError, OSError):
                return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "metrics unavailable\n")
            response = connection.respond(HTTPStatus.OK, text.decode())
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
