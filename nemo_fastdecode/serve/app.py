"""The server: one engine thread owns the GPU; one asyncio event loop owns every WebSocket, or, with
``network_workers: N``, N worker processes share the port and the sockets (:mod:`~nemo_fastdecode.serve.workers`).

Routes (one port): ``/v1/realtime`` (WebSocket, the transcription protocol), ``/health`` (200 while the engine loop
runs), ``/ready`` (200 once the engine is warm and every worker listens, 503 before and while shutting down),
``/metrics`` (Prometheus). The port answers while the engine warms up (a WebSocket upgrade then gets HTTP 503) and
while a shutdown drains the open connections (a new WebSocket then gets ``server_shutting_down`` and 1001).

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
import dataclasses
import logging
import signal
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from nemo_fastdecode.serve.admission import Admission
from nemo_fastdecode.serve.config import ServeConfig
from nemo_fastdecode.serve.connection import Connection
from nemo_fastdecode.serve.engine_loop import Delivery, EngineLoop
from nemo_fastdecode.serve.listener import REALTIME_PATH, Listener
from nemo_fastdecode.serve.look_aheads import ALL, LookAheads, engine_order
from nemo_fastdecode.serve.metrics import ServerMetrics
from nemo_fastdecode.serve.workers import WorkerPool
from nemo_fastdecode.streaming import StreamEvent, StreamingEngine
from nemo_fastdecode.streaming.transcriber import set_att_context_size

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

__all__ = ["REALTIME_PATH", "RealtimeServer", "build_engine", "build_engines"]

log = logging.getLogger(__name__)


def build_engine(model: ASRModel, config: ServeConfig) -> StreamingEngine:
    """The streaming engine ``config`` asks for, on the model's device (no idle timeout: connections time out; Silero
    VAD with ``config.vad``, for the streams of sessions that ask for ``server_vad``)."""
    return StreamingEngine(model, config.engine)


def build_engines(model: ASRModel, config: ServeConfig) -> list[StreamingEngine]:
    """One engine per look-ahead ``config.look_aheads`` offers, shortest look-ahead first (one engine, as
    :func:`build_engine`, without it). The encoder's default look-ahead is left at the one a session without ``delay``
    gets (``att_context_size``; else the encoder's default if offered, else the shortest), which is how
    :class:`RealtimeServer` finds it."""
    if config.look_aheads is None:
        return [build_engine(model, config)]
    encoder = model.encoder
    default = config.att_context_size or list(encoder.att_context_size)
    engines = config.engines
    if config.look_aheads == ALL:
        offered = engine_order(encoder.att_context_size_all)
        engines = [dataclasses.replace(config.engine, att_context_size=size) for size in offered]
    sizes = [list(engine.att_context_size) for engine in engines]
    if config.att_context_size is not None and list(config.att_context_size) not in sizes:
        raise ValueError(f"att_context_size={list(config.att_context_size)} is not one of look_aheads: {sizes}")
    built = [StreamingEngine(model, engine) for engine in engines]
    set_att_context_size(encoder, default if list(default) in sizes else sizes[0])
    return built


class RealtimeServer:
    """A WebSocket server of the OpenAI Realtime transcription protocol over one :class:`StreamingEngine`, or one per
    look-ahead that sessions choose with ``transcription.delay`` (:mod:`~nemo_fastdecode.serve.look_aheads`).

    Args:
        engine: the engine (its ``num_slots`` bounds the connections served at once), or the engines of one model at
            distinct look-aheads, shortest first (:func:`build_engines`), each with its own slots; a session without
            ``delay`` gets the engine at the encoder's default look-ahead (the first if none is).
        config: address, limits, timeouts, API key, network workers (``config.slots`` is taken from the engine).
        model_name: reported in sessions.
        endpointer: the engine loop's endpointing hook; with it, sessions may ask for ``server_vad``. Without it,
            they may when the engine runs Silero VAD (``EndpointingOptions(vad=True)``: ``build_engine`` with
            ``config.vad``).
        warm_up: warm the engine up (CUDA graphs) before ``/ready`` says so.

    With ``config.network_workers`` 0 the sockets are served on the loop that runs :meth:`start`
    (:attr:`connections`); with N >= 1 by N worker processes (:attr:`workers`), this process keeping the engine.
    The workers are started with ``spawn``, which imports the script that started the server again: a script needs
    the ``if __name__ == "__main__":`` guard around its start (``nemo-fastdecode serve`` has it).
    """

    def __init__(
        self,
        engine: StreamingEngine | Sequence[StreamingEngine],
        config: ServeConfig,
        *,
        model_name: str = "nemo-fastdecode",
        endpointer: Callable[[list[StreamEvent]], Iterable[int]] | None = None,
        warm_up: bool = True,
    ):
        self.config, self.model_name, self._warm_up = config, model_name, warm_up
        engines = [engine] if isinstance(engine, StreamingEngine) else list(engine)
        engine = engines[0]
        self.look_aheads = LookAheads.of(
            [e.geometry.att_context_size for e in engines], engine.model.encoder.att_context_size
        )
        if len(engines) > 1 and config.network_workers:
            raise ValueError("an engine per look-ahead needs network_workers: 0")
        self.metrics = ServerMetrics(engine.device)
        self.engine_loop = EngineLoop(engines, self._from_engine, self.metrics, endpointer=endpointer)
        self.rate = engine.front.settings.sample_rate
        vad = engine.endpointing if engine.endpointing.vad else None
        segmenting = endpointer is not None or vad is not None
        boosting = getattr(engine.model, "tokenizer", None) is not None  # phrase boosting builds trees of its tokens
        self.workers: WorkerPool | None = None
        self.listener: Listener | None = None
        if config.network_workers:
            self.workers = WorkerPool(
                self.engine_loop, config, self.metrics, model_name=model_name, rate=self.rate, segmenting=segmenting,
                vad=vad, boosting=boosting,
            )  # fmt: skip
            self.admission = Admission(engine.num_slots, config.api_key, shared=(self.workers.counts, 0))
        else:
            names = [self.look_aheads.describe(i) for i in range(len(engines))]
            self.admission = Admission([e.num_slots for e in engines], config.api_key, names=names)
            self.listener = Listener(
                self.engine_loop,
                config,
                self.metrics,
                self.admission,
                rate=self.rate,
                model_name=model_name,
                segmenting=segmenting,
                vad=vad,
                boosting=boosting,
                healthy=lambda: self.engine_loop.failed is None,
                ready=lambda: self.ready,
                serving=lambda: self.engine_loop.ready.is_set() and self.engine_loop.failed is None,
                exposition=self._exposition,
                look_aheads=self.look_aheads,
            )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._switch_interval: float | None = None  # Python's, while the server has its own
        self.shutting_down = False

    @property
    def connections(self) -> dict[int, Connection]:
        """The open connections of this process (none with network workers: theirs live in the workers)."""
        return self.listener.connections if self.listener is not None else {}

    # ---- lifetime ------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the engine thread (it warms up) and listen (or start the network workers); returns once bound
        (``/ready`` follows the warm-up and, with workers, every worker listening)."""
        self._loop = asyncio.get_running_loop()
        if self.config.gil_switch_interval_ms is not None:  # process-wide: restored by shutdown()
            self._switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(self.config.gil_switch_interval_ms / 1000)
        self.engine_loop.start(warm_up=self._warm_up)
        if self.workers is not None:
            self.workers.start()
        else:
            await self.listener.listen()

    @property
    def port(self) -> int:
        """The bound port (``config.port`` 0 picks a free one)."""
        if self.workers is not None:
            assert self.workers.port is not None, "start() first"
            return self.workers.port
        return self.listener.port

    @property
    def ready(self) -> bool:
        ready = self.engine_loop.ready.is_set() and self.engine_loop.failed is None and not self.shutting_down
        return ready and (self.workers is None or self.workers.listening)

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Until the engine is warm and every network worker listens (raises ``TimeoutError`` after ``timeout`` s,
        ``RuntimeError`` if the engine failed or a worker could not start)."""
        loop = asyncio.get_running_loop()
        start = time.monotonic()
        await asyncio.wait_for(loop.run_in_executor(None, self.engine_loop.ready.wait), timeout)
        if self.engine_loop.failed is not None:
            raise RuntimeError("the engine failed while warming up") from self.engine_loop.failed
        while self.workers is not None and not (self.workers.listening and self.workers.ready):
            if self.workers.failure is not None:
                raise RuntimeError(f"{self.workers.failure} (its log says why)")
            if timeout is not None and time.monotonic() - start > timeout:
                raise TimeoutError(f"the network workers did not all listen within {timeout} s")
            await asyncio.sleep(0.05)

    async def shutdown(self, timeout: float | None = None) -> None:
        """Graceful: stop listening; every open connection gets the final of the audio it sent, then close 1001."""
        if self.shutting_down:
            return
        self.shutting_down = True
        timeout = self.config.shutdown_timeout_seconds if timeout is None else timeout
        loop = asyncio.get_running_loop()
        if self.workers is not None:
            await loop.run_in_executor(None, self.workers.shutdown, timeout)
        else:
            await self.listener.close(timeout)
        await loop.run_in_executor(None, self.engine_loop.stop, 10.0)
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

    def _from_engine(self, deliveries: list[Delivery]) -> None:
        """From the engine thread: hand the batch to the event loop, or to the workers' sender (never waits)."""
        if self.workers is not None:
            self.workers.deliver(deliveries)
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
            self._loop.call_soon_threadsafe(self.listener.route, deliveries)

    async def _exposition(self) -> bytes:
        return self.metrics.exposition()
