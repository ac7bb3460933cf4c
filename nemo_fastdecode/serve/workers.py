"""Network worker processes: N processes serve the WebSockets of one port; the main process keeps the engine.

With ``network_workers: N`` (N >= 1) the main process runs the engine thread (and owns the GPU) and N worker
processes (``spawn``: the main process has CUDA) each run an asyncio loop with a
:class:`~nemo_fastdecode.serve.listener.Listener` on the same host and port (``SO_REUSEPORT``: the kernel spreads new
connections over them). Workers do all the protocol work (handshake, key, validation, base64, sessions, JSON,
sending), so it no longer shares one interpreter lock with the engine thread.

Between a worker and the main process: one pipe, batched both ways. A worker's connections submit commands to an
:class:`EngineProxy`, which sends everything submitted in one turn of the worker's event loop as one message; the main
process reads every worker's pipe in one thread and queues each batch for the engine loop with one queue operation.
Each engine cycle's deliveries go to one sender thread, which sends each worker one message with its connections'
deliveries. Connection ids carry the worker's incarnation in their high bits, so ids are unique across workers and
restarts, and deliveries find their worker.

Shared state: the slot counts (one cell per worker, summed under the array's lock: the capacity is global) and two
flags the main process keeps up to date (ready: the engine is warm and every worker listens; healthy: the engine
runs). ``/metrics`` on any worker asks the main process, which answers with its own metrics (the engine's) and the
sum of the workers' (each sends a snapshot every half second and with each scrape).

A worker that dies does not take anything else down: the main process drops its connections' items (their slots free
at once), zeroes its slot count, logs it and starts a new one in its place. Workers ignore SIGINT and SIGTERM: the
main process shuts them down (its own SIGTERM: each worker stops listening, its connections get the finals of their
audio, then it exits); a worker whose main process is gone closes its connections and exits.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import gc
import itertools
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric

from nemo_fastdecode.serve.admission import Admission
from nemo_fastdecode.serve.config import ServeConfig
from nemo_fastdecode.serve.engine_loop import Command, Delivery, DropRange, EngineLoop, batched
from nemo_fastdecode.serve.listener import Listener
from nemo_fastdecode.serve.metrics import ServerMetrics
from nemo_fastdecode.streaming import EndpointingOptions

__all__ = ["EngineProxy", "WorkerPool", "WorkerSpec", "worker_main"]

log = logging.getLogger(__name__)

#: a connection id is ``incarnation << ID_BITS | the worker's own count``
ID_BITS = 32
#: seconds between a worker's metric snapshots
_SNAPSHOT_SECONDS = 0.5
#: seconds a worker's ``/metrics`` waits for the main process
_SCRAPE_TIMEOUT = 5.0
#: messages read from one worker's pipe before the others get their turn
_READ_BURST = 64

#: a metric family as plain data: ``(name, documentation, type, unit, [(sample name, labels, value), ...])``
Family = tuple[str, str, str, str, list[tuple[str, dict[str, str], float]]]


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What a worker process needs to serve: its place, the config, the port and the facts of the engine."""

    index: int
    incarnation: int
    config: ServeConfig
    port: int
    model_name: str
    rate: int
    segmenting: bool
    vad: EndpointingOptions | None
    boosting: bool


# ---- the main process ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Worker:
    index: int
    incarnation: int
    process: multiprocessing.process.BaseProcess
    conn: multiprocessing.connection.Connection
    listening: bool = False


class WorkerPool:
    """The main process's side of the network workers: spawns them, carries commands in and deliveries out.

    Args:
        engine_loop: the engine loop (started by the caller).
        config: the server's config (``config.network_workers`` workers, ``config.port``: 0 picks a free port).
        metrics: the main process's metrics (the engine's).
        model_name, rate, segmenting, vad, boosting: what the workers' connections need to know of the engine.
        restart: start a new worker in place of one that died (not while shutting down).
    """

    def __init__(
        self,
        engine_loop: EngineLoop,
        config: ServeConfig,
        metrics: ServerMetrics,
        *,
        model_name: str,
        rate: int,
        segmenting: bool,
        vad: EndpointingOptions | None,
        boosting: bool = True,
        restart: bool = True,
    ):
        self.engine_loop, self.config, self.metrics = engine_loop, config, metrics
        self._facts = {
            "model_name": model_name,
            "rate": rate,
            "segmenting": segmenting,
            "vad": vad,
            "boosting": boosting,
        }
        self.restart = restart
        self._context = multiprocessing.get_context("spawn")
        self.size = config.network_workers
        #: connections holding a slot, one cell per worker (the workers' Admission sums them under the lock)
        self.counts = self._context.Array("i", self.size)
        #: ``[ready, healthy, serving]`` (serving: the engine is warm and has not failed), written by this process only
        self.flags = self._context.Array("b", 3, lock=False)
        self._workers: dict[int, _Worker] = {}  # by index
        self._lock = threading.Lock()  # _workers: the reader thread replaces dead ones, the sender reads them
        self._incarnations = itertools.count(1)
        self._outbox: queue.SimpleQueue[list[Delivery] | tuple[int, tuple] | None] = queue.SimpleQueue()
        self._snapshots: dict[int, list[Family]] = {}  # by incarnation
        self._retired: list[Family] = []  # counters and histograms of workers that ended
        self._threads: list[threading.Thread] = []
        self._placeholder: socket.socket | None = None
        self.port: int | None = None
        self.shutting_down = False
        self._stopped = False
        self.deaths = 0
        #: why the pool cannot become ready (a worker died before it listened); ``None`` while it can
        self.failure: str | None = None

    # ---- lifetime ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Reserve the port, spawn the workers, start the reader and sender threads (returns at once)."""
        self._placeholder = _reserve_port(self.config.host, self.config.port)
        self.port = self._placeholder.getsockname()[1]
        # workers ignore SIGTERM: a process that exits without shutdown() must not leave them (nor wait for them)
        atexit.register(self.close)
        for index in range(self.size):
            self._spawn(index)
        for target, name in ((self._read, "network-workers-in"), (self._send, "network-workers-out")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    @property
    def listening(self) -> bool:
        """Every worker is up and listening."""
        with self._lock:
            return len(self._workers) == self.size and all(w.listening for w in self._workers.values())

    @property
    def ready(self) -> bool:
        """What the workers' ``/ready`` says: the engine is warm and every worker listens."""
        return bool(self.flags[0])

    @property
    def pids(self) -> dict[int, int]:
        """The live workers' process ids by incarnation (a connection's id ``>> ID_BITS``)."""
        with self._lock:
            return {w.incarnation: w.process.pid for w in self._workers.values()}

    @property
    def alive(self) -> int:
        """Worker processes running now."""
        with self._lock:
            return sum(w.process.is_alive() for w in self._workers.values())

    def deliver(self, deliveries: list[Delivery]) -> None:
        """From the engine thread: a cycle's deliveries, for the sender thread to split by worker (never waits)."""
        self._outbox.put(deliveries)

    def shutdown(self, timeout: float) -> None:
        """Graceful (blocking): every worker stops listening, its connections get their finals (the engine still
        runs: stop it after this), then it exits; workers still running ``timeout + 10`` s later are killed."""
        self.shutting_down = True
        self.flags[0] = 0
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            self._outbox.put((worker.incarnation, ("shutdown", timeout)))
        deadline = time.monotonic() + timeout + 10.0
        for worker in workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                log.warning("network worker %d did not exit in time; killing it", worker.index)
                worker.process.kill()
                worker.process.join(5.0)
        self.close()

    def close(self) -> None:
        """Stop the threads, kill any worker left, free the port."""
        atexit.unregister(self.close)
        self._stopped = True
        self._outbox.put(None)
        for thread in self._threads:
            thread.join(5.0)
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(5.0)
            worker.conn.close()
        if self._placeholder is not None:
            self._placeholder.close()
            self._placeholder = None

    def _spawn(self, index: int) -> None:
        parent, child = self._context.Pipe(duplex=True)
        incarnation = next(self._incarnations)
        spec = WorkerSpec(index, incarnation, self.config, self.port, **self._facts)
        process = self._context.Process(
            target=worker_main,
            args=(spec, child, self.counts, self.flags),
            name=f"nemo-fastdecode-network-{index}",
            daemon=True,
        )
        with self.counts.get_lock():
            self.counts[index] = 0
        process.start()
        child.close()  # the worker's end lives in the worker: its exit is the end of this pipe
        with self._lock:
            self._workers[index] = _Worker(index, incarnation, process, parent)

    # ---- the reader thread ---------------------------------------------------------------------------------------
    def _read(self) -> None:
        while not self._stopped:
            with self._lock:
                by_conn = {w.conn: w for w in self._workers.values()}
            try:
                ready = multiprocessing.connection.wait(list(by_conn), timeout=0.2)
            except OSError:  # a pipe closed under us (close()): look again
                ready = []
            for conn in ready:
                worker = by_conn[conn]
                try:
                    for _ in range(_READ_BURST):
                        self._receive(worker, conn.recv())
                        if not conn.poll():
                            break
                except (EOFError, OSError):
                    self._ended(worker)
            self._update_flags()

    def _receive(self, worker: _Worker, message: tuple[str, Any]) -> None:
        kind, payload = message
        if kind == "commands":
            self.engine_loop.submit_many(payload)
        elif kind == "metrics":
            self._snapshots[worker.incarnation] = payload
        elif kind == "scrape":
            request, snapshot = payload
            self._snapshots[worker.incarnation] = snapshot
            self._outbox.put((worker.incarnation, ("exposition", (request, self.exposition()))))
        elif kind == "listening":
            worker.listening = True
            log.info("network worker %d (pid %d) listens", worker.index, worker.process.pid)
            self._update_flags()

    def _ended(self, worker: _Worker) -> None:
        """A worker's pipe closed: it exited (shutdown) or died. Its connections' items go, its slots free."""
        with self._lock:
            if self._workers.get(worker.index) is worker:
                del self._workers[worker.index]
        worker.conn.close()
        first = worker.incarnation << ID_BITS
        self.engine_loop.submit(DropRange(first, first + (1 << ID_BITS)))
        with self.counts.get_lock():
            self.counts[worker.index] = 0
        if not self.shutting_down:  # shutdown() reaps them itself (two threads must not wait for one process)
            worker.process.join(5.0)
        snapshot = self._snapshots.pop(worker.incarnation, [])
        self._retired = _plain(_merge(self._retired + [f for f in snapshot if f[2] != "gauge"]))
        if self.shutting_down or self._stopped:
            log.info("network worker %d exited", worker.index)
            return
        self.deaths += 1
        restart = self.restart and worker.listening  # one that never came up would only fail again
        log.error(
            "network worker %d (pid %s) died (exit code %s)%s; its connections' items were dropped; %s",
            worker.index,
            worker.process.pid,
            worker.process.exitcode,
            "" if worker.listening else " before it listened",
            "starting a new one" if restart else "not replaced: the server is not ready",
        )
        if not worker.listening:
            self.failure = (
                f"network worker {worker.index} exited with code {worker.process.exitcode} before it listened"
            )
        if restart:
            self._spawn(worker.index)

    def _update_flags(self) -> None:
        healthy = self.engine_loop.failed is None
        ready = self.engine_loop.ready.is_set() and healthy and not self.shutting_down and self.listening
        self.flags[0], self.flags[1] = int(ready), int(healthy)
        self.flags[2] = int(self.engine_loop.ready.is_set() and healthy)

    # ---- the sender thread ---------------------------------------------------------------------------------------
    def _send(self) -> None:
        while True:
            entries = [self._outbox.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    entries.append(self._outbox.get_nowait())
            batches: dict[int, list[Delivery]] = {}
            messages: list[tuple[int, tuple]] = []
            for entry in entries:
                if isinstance(entry, list):
                    for delivery in entry:
                        batches.setdefault(delivery.key[0] >> ID_BITS, []).append(delivery)
                elif entry is not None:
                    messages.append(entry)
            with self._lock:
                by_incarnation = {w.incarnation: w for w in self._workers.values()}
            for incarnation, batch in batches.items():
                messages.insert(0, (incarnation, ("deliveries", batch)))
            for incarnation, message in messages:
                worker = by_incarnation.get(incarnation)
                if worker is None:  # it ended: its connections are gone
                    continue
                with contextlib.suppress(OSError, ValueError):  # it is dying: the reader thread sees it end
                    worker.conn.send(message)
            if None in entries:
                return

    # ---- metrics -------------------------------------------------------------------------------------------------
    def exposition(self) -> bytes:
        """The Prometheus text of the whole server: this process's metrics plus every worker's, summed."""
        families = _plain(self.metrics.registry.collect())
        for snapshot in list(self._snapshots.values()):
            families += snapshot
        return generate_latest(_Families(_merge(families + self._retired)))


def _reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound (not listening) to ``host:port`` with ``SO_REUSEPORT``: it holds the port (port 0: picks one)
    for the workers, which bind it too; only listening sockets get connections. A port something listens on already
    (another server, with ``SO_REUSEPORT`` too) is refused as one process would refuse it, rather than shared."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)  # EADDRINUSE where anything listens
        address = (address[0], probe.getsockname()[1], *address[2:])
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


class _Families:
    """A collector of given metric families (``generate_latest`` takes anything with ``collect``)."""

    def __init__(self, families: list[Metric]):
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def _plain(families) -> list[Family]:
    """Metric families as plain data (pickled between processes)."""
    return [
        (m.name, m.documentation, m.type, m.unit, [(s.name, dict(s.labels), float(s.value)) for s in m.samples])
        for m in families
    ]


def _merge(families: list[Family]) -> list[Metric]:
    """Families of the same name summed sample by sample (counters, histograms, gauges of connections); a
    ``_created`` time is the earliest."""
    merged: dict[str, tuple[str, str, str, dict[tuple, float]]] = {}
    for name, documentation, kind, unit, samples in families:
        values = merged.setdefault(name, (documentation, kind, unit, {}))[3]
        for sample, labels, value in samples:
            key = (sample, tuple(sorted(labels.items())))
            if key not in values:
                values[key] = value
            elif sample.endswith("_created"):
                values[key] = min(values[key], value)
            else:
                values[key] += value
    out = []
    for name, (documentation, kind, unit, values) in merged.items():
        metric = Metric(name, documentation, kind, unit)
        for (sample, labels), value in values.items():
            metric.add_sample(sample, dict(labels), value)
        out.append(metric)
    return out


# ---- a worker process ------------------------------------------------------------------------------------------------
class EngineProxy:
    """A worker's engine port: what its connections submit goes to the main process in batches, one message per turn
    of its event loop and at most one every ``interval`` seconds (the cost of a message across processes, and of
    reading it in the main process, is paid per batch, not per command), its runs of pushes in columns
    (:class:`~nemo_fastdecode.serve.engine_loop.PushBatch`)."""

    def __init__(self, send: Callable[[tuple[str, Any]], None], interval: float = 0.0):
        self._send, self._pending, self._interval = send, [], interval
        self._loop = asyncio.get_running_loop()
        self._last = -math.inf

    def submit(self, command: Command) -> None:
        if not self._pending:  # after the callbacks ready now (the rest of this turn's commands), or a little later
            wait = self._last + self._interval - self._loop.time()
            if wait > 0:
                self._loop.call_later(wait, self.flush)
            else:
                self._loop.call_soon(self.flush)
        self._pending.append(command)

    def flush(self) -> None:
        if self._pending:
            self._last = self._loop.time()
            batch, self._pending = self._pending, []
            self._send(("commands", batched(batch)))


class _NetworkWorker:
    def __init__(self, spec: WorkerSpec, conn: multiprocessing.connection.Connection, counts: Any, flags: Any):
        self.spec, self.conn, self.counts, self.flags = spec, conn, counts, flags
        self._scrapes = itertools.count()
        self._waiting: dict[int, asyncio.Future] = {}

    async def run(self) -> None:
        spec = self.spec
        self.loop = asyncio.get_running_loop()
        self.stop: asyncio.Future[float] = self.loop.create_future()
        self.metrics = ServerMetrics()
        self.proxy = EngineProxy(self._post, spec.config.network_batch_ms / 1000)
        self.listener = Listener(
            self.proxy,
            spec.config,
            self.metrics,
            Admission(spec.config.slots, spec.config.api_key, shared=(self.counts, spec.index)),
            rate=spec.rate,
            model_name=spec.model_name,
            segmenting=spec.segmenting,
            vad=spec.vad,
            boosting=spec.boosting,
            healthy=lambda: bool(self.flags[1]),
            ready=lambda: bool(self.flags[0]),
            serving=lambda: bool(self.flags[2]),
            exposition=self._scrape,
            first_id=spec.incarnation << ID_BITS,
        )
        threading.Thread(target=self._read, name="from-main", daemon=True).start()
        await self.listener.listen(spec.port, reuse_port=True)
        self._post(("listening", None))
        publisher = asyncio.create_task(self._publish())
        timeout = await self.stop
        await self.listener.close(timeout)
        self.proxy.flush()  # the last connections' drops
        publisher.cancel()
        self._post(("metrics", _plain(self.metrics.registry.collect())))
        self.conn.close()

    def _post(self, message: tuple[str, Any]) -> None:
        """To the main process (only this loop's thread sends: messages never interleave)."""
        with contextlib.suppress(OSError, ValueError):  # the main process is gone: the reader thread ends this worker
            self.conn.send(message)

    def _read(self) -> None:
        """The pipe from the main process, in a thread of its own (its reads wait); messages go to the loop."""
        try:
            while True:
                message = self.conn.recv()
                self.loop.call_soon_threadsafe(self._dispatch, message)
        except (EOFError, OSError):
            with contextlib.suppress(RuntimeError):  # the loop closed already
                self.loop.call_soon_threadsafe(self._end, 0.0)

    def _dispatch(self, message: tuple[str, Any]) -> None:
        kind, payload = message
        if kind == "deliveries":
            self.listener.route(payload)
        elif kind == "exposition":
            request, text = payload
            future = self._waiting.pop(request, None)
            if future is not None and not future.done():
                future.set_result(text)
        elif kind == "shutdown":
            self._end(payload)

    def _end(self, timeout: float) -> None:
        if not self.stop.done():
            self.stop.set_result(timeout)

    async def _scrape(self) -> bytes:
        request = next(self._scrapes)
        future = self._waiting[request] = self.loop.create_future()
        self._post(("scrape", (request, _plain(self.metrics.registry.collect()))))
        try:
            return await asyncio.wait_for(future, _SCRAPE_TIMEOUT)
        finally:
            self._waiting.pop(request, None)

    async def _publish(self) -> None:
        while True:
            await asyncio.sleep(_SNAPSHOT_SECONDS)
            self._post(("metrics", _plain(self.metrics.registry.collect())))


def worker_main(spec: WorkerSpec, conn: multiprocessing.connection.Connection, counts: Any, flags: Any) -> None:
    """A network worker process's entry point (``spawn``): serve until the main process says stop or is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process shuts workers down (Ctrl-C reaches the group)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("websockets.server").setLevel(logging.WARNING)
    if spec.config.gil_switch_interval_ms is not None:  # the pipe's reader thread waits less for the loop's turn
        sys.setswitchinterval(spec.config.gil_switch_interval_ms / 1000)
    gc.freeze()  # the imports' objects (NeMo's, torch's): a full collection no longer walks them (see EngineLoop)
    code = 0
    try:
        asyncio.run(_NetworkWorker(spec, conn, counts, flags).run())
    except BaseException:
        log.exception("network worker %d failed", spec.index)
        code = 1
    # everything is sent: skip the interpreter's exit handlers (the imported libraries' take seconds)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
