"""The server's main process under N real-time clients, on any machine: the device's work stubbed, its time modelled.

python benchmarks/experiments/serve_engine_sim.py --clients 1000 2000 --seconds 10 --stagger 5 --tick-ms 2
python benchmarks/experiments/serve_engine_sim.py --real-engine --model hybrid-17x512-streaming --att 70 1 --dtype bfloat16

What runs for real: the server's :class:`EngineLoop` in its own thread with a :class:`StreamingEngine` (inbox, feed
policy, chunk schedule, feature queue and decoder bookkeeping, events, deliveries), and the main process's side of
the network workers as :class:`WorkerPool` has it (the thread reading every worker's pipe, the thread pickling each
cycle's deliveries to them). In place of the network workers, ``--workers`` feeder processes send their clients'
80 ms PCM16 messages on their real-time due dates, one message per ``--tick-ms`` (a worker sends one per turn of its
event loop, so this sets the message rate the main process reads), each client's commit after its audio.

What is modelled: the device. The front end's kernels, the feature queue's copies and the transcriber's step are
stubbed (one token per stream per step, so every stepped chunk has a partial); a step queued at ``t`` occupies a
device queue until ``max(t, busy) + fixed + per_stream * streams``, and the cycle's first device read (the token
counts) sleeps until then, as a CUDA synchronisation releases the GIL and waits. Defaults follow the H100's bf16
17 x 512 hybrid step (all 2,048 streams about 30 ms). ``--real-engine`` runs the real engine on GPU 0 instead (every client
plays the same synthetic speech): the main process's limits, without the load generator's and the network workers'
processes competing for its cores as in a load test on one host.

Reported per client count: chunk latency (a push's due date -> the partial of the chunk it completed, built; the
server's own ``chunk_latency`` measure) p50 / p95 / p99 and its p95 per second of the run (streams open over the
first ``--stagger`` seconds and end over the last ones), final latency after the commit, cycles and their mean
time, the modelled device's busy share and each main-process thread's CPU share. Absolute figures depend on this
host's CPU and on the feeders sharing it; compare engine-loop changes side by side on one machine, over several runs.
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import engine_cycle_breakdown as breakdown  # noqa: E402  (its stub of the device work)

import fastdecode_lab.models  # noqa: F401  (synthetic presets as model names)
from fastdecode_lab import synthetic  # noqa: E402
from nemo_fastdecode.apps.models import load_model  # noqa: E402
from nemo_fastdecode.serve.engine_loop import EngineLoop, Finish, PushBatch  # noqa: E402
from nemo_fastdecode.serve.metrics import ServerMetrics  # noqa: E402
from nemo_fastdecode.serve.workers import ID_BITS, WorkerPool, _Worker  # noqa: E402
from nemo_fastdecode.streaming import StreamingEngine, StreamOptions  # noqa: E402

MESSAGE_SECONDS = 0.08
RATE = 16000


class DeviceModel:
    """A device queue: each step keeps it busy for ``fixed + per_stream * streams`` seconds after the previous one."""

    def __init__(self, fixed: float, per_stream: float):
        self.fixed, self.per_stream = fixed, per_stream
        self.busy_until = 0.0
        self.busy_seconds = 0.0

    def queue_step(self, streams: int) -> None:
        seconds = self.fixed + self.per_stream * streams
        self.busy_until = max(time.perf_counter(), self.busy_until) + seconds
        self.busy_seconds += seconds

    def wait(self) -> None:
        left = self.busy_until - time.perf_counter()
        if left > 0:
            time.sleep(left)  # releases the GIL, as a device synchronisation does


def stub_engine(engine: StreamingEngine, blank: int, device: DeviceModel) -> None:
    breakdown.stub_device_work(engine, blank)
    queue_write, queue_read, frames = engine.queue.write, engine.queue.read, engine.queue.frames
    features = frames.shape[2]

    def write(slots, starts, counts, packed):  # the index work on the host; the scatter is a device launch
        engine.queue.frames = frames[:1, :1]
        try:
            queue_write(slots, starts, counts, torch.zeros(features, 0).expand(features, int(counts.sum())))
        except (RuntimeError, IndexError):
            pass
        finally:
            engine.queue.frames = frames

    def read(slots, starts, lengths):
        engine.queue.frames = frames[:1, :1]
        try:
            queue_read(slots, starts, lengths)
        except (RuntimeError, IndexError):
            pass
        finally:
            engine.queue.frames = frames
        return torch.empty(len(slots), features, int(lengths.max()))

    engine.queue.write, engine.queue.read = write, read
    step, decoder = engine.transcriber.step, engine.transcriber.decoder
    counts = decoder.token_counts

    def modelled_step(slot_ids, batch, lengths=None):
        step(slot_ids, batch, lengths)
        device.queue_step(len(slot_ids))

    def modelled_counts(slots):
        device.wait()
        return counts(slots)

    engine.transcriber.step = modelled_step
    decoder.token_counts = modelled_counts


def run_point(model, clients: int, args: argparse.Namespace, clip: bytes) -> dict:
    device = DeviceModel(args.gpu_fixed_ms / 1e3, args.gpu_per_stream_us / 1e6)
    on_gpu = args.real_engine and torch.cuda.is_available()
    engine = StreamingEngine(
        model, clients, att_context_size=args.att, dtype=getattr(torch, args.dtype), use_cuda_graphs=on_gpu
    )
    if args.real_engine:
        engine.warm_up()
    else:
        stub_engine(engine, int(model.decoding.blank_id), device)
    pool = _PoolSide(args.workers)
    loop = EngineLoop(engine, pool.deliver, ServerMetrics())
    pool.engine_loop = _Unpacking(loop)
    chunk_latencies: list[float] = []
    chunk_clocks: list[float] = []
    final_latencies: list[float] = []
    observe, deliver = loop._observe_chunk_latency, loop._deliver

    def observed(item, event, clock):  # as the server's histogram takes it, every value kept
        observe(item, event, clock)
        if item.arrivals:
            chunk_latencies.append(clock - item.arrivals[0][1])
            chunk_clocks.append(clock)

    def delivered(deliveries):
        now = time.monotonic()
        for delivery in deliveries:
            if delivery.event is not None and delivery.event.is_last:
                final_latencies.append(now - loop._finished.pop(delivery.key))
        deliver(deliveries)

    loop._observe_chunk_latency, loop._deliver, loop._finished = observed, delivered, {}
    apply = loop._apply

    def applied(command):
        if isinstance(command, Finish):
            loop._finished[command.key] = command.received
        return apply(command)

    loop._apply = applied
    loop.start(warm_up=False)
    loop.ready.wait()
    offsets = np.random.default_rng(1).uniform(0, args.stagger, clients)
    messages = round(args.seconds / MESSAGE_SECONDS)
    context = multiprocessing.get_context("spawn")
    for index in range(args.workers):
        mine = np.arange(index, clients, args.workers)
        parent, child = context.Pipe(duplex=True)
        process = context.Process(
            target=_feed,
            args=(child, index + 1, mine, offsets[mine], messages, args.tick_ms / 1e3, clip),
            daemon=True,
        )
        process.start()
        child.close()
        pool.add(index, index + 1, process, parent)
    for worker in pool._workers.values():  # every feeder up (they import this script) before the clock starts
        worker.conn.recv()
    start = time.monotonic() + 0.5
    for worker in pool._workers.values():
        worker.conn.send(start)
    pool.start()
    clocks = {t.name: time.pthread_getcpuclockid(t.ident) for t in [loop._thread, *pool._threads]}
    cpu_start = {name: time.clock_gettime(c) for name, c in clocks.items()}
    deadline = start + args.stagger + args.seconds + 60
    while len(final_latencies) < clients and time.monotonic() < deadline:
        time.sleep(0.2)
    seconds = time.monotonic() - start
    cpu = {name: round((time.clock_gettime(c) - cpu_start[name]) / seconds, 2) for name, c in clocks.items()}
    pool.close()
    loop.stop(timeout=10)
    ms = np.asarray(chunk_latencies) * 1e3
    # by the second of the run (streams open over the first `stagger` seconds, end over the last ones)
    second = (np.asarray(chunk_clocks) - start).astype(np.int64)
    by_second = (
        [
            round(float(np.percentile(ms[second == k], 95)), 1) if (second == k).any() else None
            for k in range(int(second.max()) + 1)
        ]
        if ms.size
        else []
    )
    fin = np.asarray(final_latencies or [np.nan]) * 1e3
    return {
        "clients": clients,
        "chunk_ms": np.percentile(ms, [50, 95, 99]).round(1).tolist() if ms.size else None,
        "partials": int(ms.size),
        "final_ms": np.nanpercentile(fin, [50, 95]).round(1).tolist(),
        "finals": len(final_latencies),
        "cycles": loop.cycles,
        "cycle_ms_mean": round(seconds / max(loop.cycles, 1) * 1e3, 1),
        "device_busy": None if args.real_engine else round(device.busy_seconds / seconds, 2),
        "seconds": round(seconds, 1),
        "cpu_share": cpu,
        "chunk_ms_p95_by_second": by_second,
    }


class _PoolSide(WorkerPool):
    """The main process's side of :class:`WorkerPool` (its reader and sender threads, as they are) over feeder
    processes instead of network workers."""

    def __init__(self, size: int):  # what _read, _receive, _send and close use
        self.size, self.restart, self.shutting_down, self._stopped = size, False, False, False
        self._workers, self._lock, self._snapshots, self._retired = {}, threading.Lock(), {}, []
        self._outbox, self._threads, self._placeholder = queue.SimpleQueue(), [], None
        self.flags = [0, 0]

    def add(self, index: int, incarnation: int, process, conn) -> None:
        self._workers[index] = _Worker(index, incarnation, process, conn, listening=True)

    def start(self) -> None:
        for target, name in ((self._read, "network-workers-in"), (self._send, "network-workers-out")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _ended(self, worker) -> None:
        with self._lock:
            self._workers.pop(worker.index, None)


class _Unpacking:
    """The engine loop as the reader thread sees it: a feeder's plain command tuples become the server's commands
    (the feeders import no torch, so they cannot pickle the classes themselves)."""

    def __init__(self, loop: EngineLoop):
        self.loop, self.ready, self.failed = loop, loop.ready, None
        self.options = StreamOptions()

    def submit_many(self, entries: list) -> None:
        commands: list = []
        for entry in entries:
            if entry[0] == "push":
                _, keys, received, offsets, audio = entry
                n = len(received)
                commands.append(
                    PushBatch(keys, received, offsets, audio, [self.options], np.zeros(n, np.int64), np.zeros(n, bool))
                )
            else:
                commands.append(Finish(entry[1], entry[2]))
        self.loop.submit_many(commands)

    def submit(self, command) -> None:
        self.loop.submit(command)


def _feed(
    conn, incarnation: int, clients: np.ndarray, offsets: np.ndarray, messages: int, tick: float, clip: bytes
) -> None:
    """A feeder process (a network worker's part): its clients' messages on their real-time due dates (each client
    plays ``clip``), one message to the main process per tick; the deliveries read and dropped."""
    conn.send("ready")
    first = conn.recv() + offsets
    size = round(MESSAGE_SECONDS * RATE) * 2
    keys = np.stack([(incarnation << ID_BITS) | clients, np.zeros_like(clients)], axis=1).astype(np.int64)
    sent = np.zeros(len(clients), dtype=np.int64)
    while (sent < messages).any():
        now = time.monotonic()
        due = np.flatnonzero((sent < messages) & (first + (sent + 1) * MESSAGE_SECONDS <= now))
        if due.size:
            arrived = first[due] + (sent[due] + 1) * MESSAGE_SECONDS
            sent[due] += 1
            n = due.size
            audio = b"".join(clip[(k - 1) * size : k * size] for k in sent[due].tolist())
            entries: list = [("push", keys[due], arrived, np.arange(n + 1, dtype=np.int64) * size, audio)]
            entries += [("finish", tuple(keys[c].tolist()), now) for c in due[sent[due] == messages].tolist()]
            conn.send(("commands", entries))
        while conn.poll():
            conn.recv_bytes()
        time.sleep(tick)
    end = time.monotonic() + 120
    while time.monotonic() < end:  # read the deliveries until the main process is done
        try:
            if conn.poll(0.5):
                conn.recv_bytes()
        except (EOFError, OSError):
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[500, 1000, 2000])
    parser.add_argument("--seconds", type=float, default=12.0, help="audio per client")
    parser.add_argument("--stagger", type=float, default=5.0, help="starts uniform in [0, stagger) s")
    parser.add_argument("--workers", type=int, default=4, help="network workers: a push batch each per tick")
    parser.add_argument("--tick-ms", type=float, default=5.0, help="the network-in thread's period")
    parser.add_argument("--gpu-fixed-ms", type=float, default=4.0, help="the modelled device's step: fixed time")
    parser.add_argument("--gpu-per-stream-us", type=float, default=12.0, help="and time per stream stepped")
    parser.add_argument("--real-engine", action="store_true", help="the real engine (on GPU 0 if there is one)")
    parser.add_argument("--model", default="tiny-streaming", help="a cache-aware synthetic preset or .nemo path")
    parser.add_argument("--att", type=int, nargs=2, default=[16, 1], help="att_context_size [left, lookahead]")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    on_gpu = args.real_engine and torch.cuda.is_available()
    if not on_gpu:
        torch.set_num_threads(1)
    model = load_model(args.model, device=torch.device("cuda" if on_gpu else "cpu"), vocab="bpe")
    (speech,) = synthetic.synthetic_audio([args.seconds + 1.0], seed=3)
    clip = np.clip(np.round(np.asarray(speech) * 32768), -32768, 32767).astype(np.int16).tobytes()
    for clients in args.clients:
        print(run_point(model, clients, args, clip), flush=True)


if __name__ == "__main__":
    main()
