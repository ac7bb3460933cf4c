"""Run the server with a once-a-second trace of its engine loop: where a chunk's latency goes under load.

python benchmarks/experiments/serve_loop_trace.py trace.txt model=hybrid-17x512-streaming slots=2048 \
    att_context_size=[70,1] network_workers=4

then load it with ``nemo-fastdecode loadtest``. Each line of ``trace.txt`` covers about a second of the engine thread
(main process): its loop turns and cycles, the cycles' mean and longest time, the commands applied (each push counts
one) and how many pushes were applied while a cycle stepped, how long a push took from its arrival at the server
(stamped by the network side) to the engine, the partial and final events, the open streams, their
backlog of feature frames at the start of a cycle and how many of them had a full chunk then; for every chunk
stepped (with or without new text), its latency from the arrival of the audio that completed it to the end of the
cycle that decoded it (that figure does not depend on how often the model emits tokens, unlike the partials'); and
where the engine thread's second went: its CPU time, the wall time applying commands between cycles and applying
pushes while a cycle stepped, and the wall time of the process's garbage collections (every thread waits for them).
"""

from __future__ import annotations

import gc
import sys
import time

import numpy as np

import fastdecode_lab.models  # noqa: F401  (synthetic presets as model names)
from nemo_fastdecode.apps.serve import main
from nemo_fastdecode.serve import engine_loop
from nemo_fastdecode.serve.engine_loop import EngineLoop, Push, PushBatch

HEADER = (
    "time  chunk_ms_p50/p95/max chunks  turns cycles cycle_ms_mean cycle_ms_max  commands pushes_while_stepping "
    "push_lag_ms_p50/p95/max  "
    "events open backlog_mean backlog_max full_chunks  cpu_ms apply_ms stepping_ms gc_ms gc_full\n"
)


class LoopTrace:
    """Wraps three methods of :class:`EngineLoop` (``_turn``, ``_apply``, ``_cycle``) and the module's ``_note_pushed``
    (every push that reached an engine stream, one by one or in a network batch) to gather the figures."""

    def __init__(self, path: str):
        self.out = open(path, "w", buffering=1)  # noqa: SIM115 (open for the server's life)
        self.out.write(HEADER)
        self.stepped: list[np.ndarray] = []
        self._reset(time.monotonic())
        self.cpu: float | None = None  # the first line's start is on another thread: its CPU time is not known

    def _reset(self, now: float) -> None:
        self.lags: list[float] = []
        self.chunks: list[float] = []
        self.cycles: list[float] = []
        self.backlogs: list[tuple[float, float, int]] = []
        self.turns = self.commands = self.stepping_pushes = self.events = 0
        self.apply_seconds = self.stepping_seconds = self.gc_seconds = 0.0
        self.full_collections = 0
        self.cpu = time.thread_time()  # of the engine thread: _reset runs on it (after the first)
        self.last = now

    def install(self) -> None:
        turn, apply, cycle = EngineLoop._turn, EngineLoop._apply, EngineLoop._cycle
        while_stepping = EngineLoop._push_while_stepping
        note_pushed = engine_loop._note_pushed
        trace = self
        loops: list[EngineLoop] = []

        def traced_turn(loop: EngineLoop):
            trace.turns += 1
            loops[:] = [loop]
            return turn(loop)

        def traced_apply(loop: EngineLoop, command):
            if not isinstance(command, Push | PushBatch):  # pushes are counted where they reach the engine
                trace.commands += 1
            start = time.perf_counter()
            try:
                return apply(loop, command)
            finally:
                trace.apply_seconds += time.perf_counter() - start

        def traced_while_stepping(loop: EngineLoop) -> None:
            start = time.perf_counter()
            while_stepping(loop)
            trace.stepping_seconds += time.perf_counter() - start

        collecting = [0.0]

        def on_gc(phase: str, info: dict) -> None:
            if phase == "start":
                collecting[0] = time.perf_counter()
            else:
                trace.gc_seconds += time.perf_counter() - collecting[0]
                trace.full_collections += info["generation"] == 2

        gc.callbacks.append(on_gc)

        def traced_note_pushed(item, nbytes: int, received: float) -> None:
            trace.commands += 1
            trace.stepping_pushes += bool(loops and loops[0].engine._stepping)
            trace.lags.append(time.monotonic() - received)
            note_pushed(item, nbytes, received)

        def traced_cycle(loop: EngineLoop):
            trace.before_cycle(loop)
            start = time.perf_counter()
            deliveries = cycle(loop)
            trace.cycles.append(time.perf_counter() - start)
            trace.events += len(deliveries)
            trace.after_cycle(loop, time.monotonic())
            return deliveries

        EngineLoop._turn, EngineLoop._apply, EngineLoop._cycle = traced_turn, traced_apply, traced_cycle
        EngineLoop._push_while_stepping = traced_while_stepping
        engine_loop._note_pushed = traced_note_pushed

    def before_cycle(self, loop: EngineLoop) -> None:
        engine = loop.engine
        schedule = engine.schedule
        if not getattr(schedule, "_traced", False):  # remember which slots each cycle steps
            advance = schedule.advance

            def traced_advance(slots: np.ndarray, lengths: np.ndarray) -> None:
                advance(slots, lengths)
                # (slot, its stepped frames): a cycle may step a stream more than once
                self.stepped.append(np.stack([slots, schedule.stepped[slots]]))

            schedule.advance, schedule._traced = traced_advance, True
        self.stepped = []
        live = np.flatnonzero(engine.streams.live)
        if live.size:
            backlog = schedule.backlog[live]
            full, _ = schedule.next_chunks(live)
            self.backlogs.append((float(backlog.mean()), float(backlog.max()), int(full.size)))

    def after_cycle(self, loop: EngineLoop, clock: float) -> None:
        engine = loop.engine
        hop, rate = engine.front.settings.hop, engine.front.settings.sample_rate
        stepped = np.concatenate(self.stepped, axis=1) if self.stepped else np.zeros((2, 0), dtype=np.int64)
        for slot, frames in stepped.T.tolist():  # the arrival that completed each stepped chunk's audio
            item = loop._item_of.get(int(engine.streams.stream_of[slot]))
            if item is None:
                continue
            end = frames * hop * item.rate // rate
            received = next((t for samples, t in item.arrivals if samples >= end), None)
            if received is not None:
                self.chunks.append(clock - received)
        if clock - self.last >= 1.0:
            self.write(clock, len(engine.streams.slot_of))

    def write(self, now: float, open_streams: int) -> None:
        def quantiles(values: list[float]) -> str:
            ms = np.asarray(values or [0.0]) * 1e3
            return f"{np.percentile(ms, 50):.0f}/{np.percentile(ms, 95):.0f}/{ms.max():.0f}"

        cycles = np.asarray(self.cycles or [0.0]) * 1e3
        backlogs = np.asarray(self.backlogs or [(0.0, 0.0, 0)])
        self.out.write(
            f"{now:.1f}  {quantiles(self.chunks)} {len(self.chunks)}  {self.turns} {len(self.cycles)} "
            f"{cycles.mean():.1f} {cycles.max():.1f}  {self.commands} {self.stepping_pushes} {quantiles(self.lags)}  "
            f"{self.events} "
            f"{open_streams} {backlogs[:, 0].mean():.1f} {backlogs[:, 1].max():.0f} {backlogs[:, 2].mean():.0f}  "
            f"{'-' if self.cpu is None else f'{(time.thread_time() - self.cpu) * 1e3:.0f}'} "
            f"{self.apply_seconds * 1e3:.0f} "
            f"{self.stepping_seconds * 1e3:.0f} {self.gc_seconds * 1e3:.0f} {self.full_collections}\n"
        )
        self._reset(now)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    LoopTrace(sys.argv[1]).install()
    raise SystemExit(main(sys.argv[2:]))
