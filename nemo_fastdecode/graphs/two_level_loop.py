"""Run ``before; while outer: start; while inner: step; end`` eagerly, as phase graphs, or as one graph.

The frame loop has this shape (frames x symbols), and so can the label loop (labels x blank frames,
``looks_per_iteration=0``); beam search and the default label loop are the one-level case
``before; while flag: body`` (:meth:`LoopPhases.one_level`, no inner loop and no host read of an inner
flag). Capture, warm-up and the WHILE-node plumbing live here once. The algorithm owns the state: its phases
read and write pre-allocated tensors in place and keep the loop flags (0-d bool tensors) up to date.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from nemo_fastdecode.graphs.capture import capturing, garbage_collection_paused, keep_if_capturing, release_kept
from nemo_fastdecode.graphs.cuda_api import CudaPythonError
from nemo_fastdecode.graphs.modes import GraphMode

logger = logging.getLogger("nemo_fastdecode")

WARMUP_ROUNDS = 1  # one eager round creates the lazily made cuBLAS/cuDNN handles and workspaces; more cost time


@dataclass
class LoopPhases:
    """The four phases of a two-level loop and the flags that steer it (``inner_*``/``outer_end`` may be absent)."""

    before_loop: Callable[[], None]
    outer_start: Callable[[], None]
    inner_step: Callable[[], None] | None
    outer_end: Callable[[], None] | None
    outer_flag: torch.Tensor  # 0-d bool: run the outer body again
    inner_flag: torch.Tensor | None  # 0-d bool: run the inner body again

    @classmethod
    def one_level(cls, before_loop: Callable[[], None], body: Callable[[], None], flag: torch.Tensor) -> LoopPhases:
        """``before_loop(); while flag: body()``."""
        return cls(before_loop, body, None, None, flag, None)

    def present(self) -> dict[str, Callable[[], None]]:
        """The phases that exist, by name, in execution order (warm-up, capture and the loop structure)."""
        phases = {
            "before_loop": self.before_loop,
            "outer_start": self.outer_start,
            "inner_step": self.inner_step,
            "outer_end": self.outer_end,
        }
        return {name: phase for name, phase in phases.items() if phase is not None}


class TwoLevelLoop:
    """Executes :class:`LoopPhases` in a :class:`GraphMode`; graphs are captured on first run."""

    def __init__(self, phases: LoopPhases, mode: GraphMode):
        self.phases = phases
        self.mode = mode
        self._full_graph: torch.cuda.CUDAGraph | None = None
        self._phase_graphs: dict[str, torch.cuda.CUDAGraph] | None = None
        # the memory of the WHILE bodies' temporaries; it lives as long as the full graph (see _capture_full)
        self._body_pool: torch.cuda.MemPool | None = None

    def __del__(self) -> None:
        # collected inside someone else's capture (a dropped decoder's reference cycle): free the graphs later
        keep_if_capturing(self._full_graph, self._body_pool, *(self._phase_graphs or {}).values())

    def run(self) -> None:
        """Run the whole loop once (capturing first if needed)."""
        if self.mode is GraphMode.EAGER:
            self._run_eager()
            return
        if self._full_graph is None and self._phase_graphs is None:
            self._capture()
        if self._full_graph is not None:
            self._full_graph.replay()
        else:
            self._run({name: graph.replay for name, graph in self._phase_graphs.items()})

    def _run_eager(self) -> None:
        self._run(self.phases.present())

    def _run(self, phases: dict[str, Callable[[], None]]) -> None:
        """The loop structure over phase callables (eager phases or graph replays), by phase name."""
        inner, end = phases.get("inner_step"), phases.get("outer_end")
        phases["before_loop"]()
        while self.phases.outer_flag.item():
            phases["outer_start"]()
            if inner is not None:
                while self.phases.inner_flag.item():
                    inner()
            if end is not None:
                end()

    def _capture(self) -> None:
        release_kept()
        with garbage_collection_paused():
            self._capture_all()

    def _capture_all(self) -> None:
        device = self.phases.outer_flag.device
        # capture on a side stream: the legacy default stream cannot be captured
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_ROUNDS):
                for phase in self.phases.present().values():
                    phase()
        torch.cuda.current_stream(device).wait_stream(stream)
        if self.mode is GraphMode.FULL_GRAPH:
            try:
                self._full_graph = self._capture_full(stream)
                return
            except (CudaPythonError, RuntimeError) as error:
                logger.warning("nemo_fastdecode: WHILE-node capture failed (%s); using no_while_graph", error)
                self.mode = GraphMode.NO_WHILE_GRAPH
                torch.cuda.synchronize(device)
        self._phase_graphs = {name: self._capture_one(stream, phase) for name, phase in self.phases.present().items()}

    @staticmethod
    def _capture_one(stream: torch.cuda.Stream, phase: Callable[[], None]) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        with capturing(graph, stream):
            phase()
        return graph

    def _capture_full(self, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
        from nemo_fastdecode.graphs.cuda_api import set_condition_kernel
        from nemo_fastdecode.graphs.while_loop import captured_while_loop

        p = self.phases
        device = p.outer_flag.device
        set_condition_kernel(device.index)  # NVRTC + module load must happen outside the capture
        # The WHILE bodies are captured on their own streams (cudaStreamBeginCaptureToGraph), each with a capture
        # id of its own: PyTorch's allocator routes only the graph's own capture id to the graph's private pool, so
        # the bodies' temporaries (joint logits, LSTM outputs, workspaces) would come from the ordinary pool, be
        # "freed" when the capture ends, and be handed out again or released by the next capture's empty_cache()
        # while the graph still reads and writes them (illegal memory access, or silent corruption). They go to a
        # pool of their own that lives as long as the graph. The main capture's pool is registered first and
        # keeps the capture stream's allocations; everything else this thread allocates meanwhile goes here.
        if not (hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")):
            raise RuntimeError("this PyTorch has no torch.cuda.MemPool / use_mem_pool for the WHILE bodies' memory")
        body_pool = torch.cuda.MemPool()
        graph = torch.cuda.CUDAGraph()
        with capturing(graph, stream):
            p.before_loop()
            with torch.cuda.use_mem_pool(body_pool, device), captured_while_loop(p.outer_flag):
                p.outer_start()
                if p.inner_step is not None:
                    with captured_while_loop(p.inner_flag):
                        p.inner_step()
                if p.outer_end is not None:
                    p.outer_end()
        self._body_pool = body_pool
        return graph
