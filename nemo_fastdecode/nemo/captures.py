"""NeMo's decoders capture their CUDA graphs with the cyclic garbage collector paused, as ours do.

NeMo 3.0's label-looping greedy and ``malsd_batch`` computers capture with ``torch.cuda.graph``, which in recent
PyTorch neither collects garbage first nor pauses the collector. Decoders -- NeMo's and ours -- hold reference cycles,
so a dropped one (after ``change_decoding_strategy``, or a tool that builds a decoder per call) is freed at whatever
allocation triggers the collector, possibly inside such a capture. Destroying its CUDA graphs there is illegal: the
capture fails, and NeMo's fallback to graphs without WHILE nodes then fails on the stream still capturing ("Capture
must end on the same stream it began on"), or a later graph's destructor aborts the process. Importing
``nemo_fastdecode`` wraps each computer's ``_graph_reinitialize`` (warm-up and every capture, fallback included) in
:func:`~nemo_fastdecode.graphs.capture.garbage_collection_paused`.

Patch :func:`guard_nemo_captures`; idempotent (a wrapper is marked and never wrapped again); assigning each
wrapper's ``__wrapped__`` back to its class undoes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from nemo_fastdecode.graphs.capture import garbage_collection_paused

__all__ = ["capture_targets", "guard_nemo_captures", "nemo_capturing_classes"]

_MARK = "_nemo_fastdecode_collector_paused"


def nemo_capturing_classes() -> list[type]:
    """NeMo's decoding computers whose ``_graph_reinitialize`` captures CUDA graphs."""
    from nemo.collections.asr.parts.submodules.rnnt_malsd_batched_computer import ModifiedALSDBatchedRNNTComputer
    from nemo.collections.asr.parts.submodules.tdt_malsd_batched_computer import ModifiedALSDBatchedTDTComputer
    from nemo.collections.asr.parts.submodules.transducer_decoding.rnnt_label_looping import (
        GreedyBatchedRNNTLabelLoopingComputer,
    )
    from nemo.collections.asr.parts.submodules.transducer_decoding.tdt_label_looping import (
        GreedyBatchedTDTLabelLoopingComputer,
    )

    return [
        GreedyBatchedRNNTLabelLoopingComputer,
        GreedyBatchedTDTLabelLoopingComputer,
        ModifiedALSDBatchedRNNTComputer,
        ModifiedALSDBatchedTDTComputer,
    ]


def collector_paused(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` run with the cyclic garbage collector paused (marked, so that wrapping twice is a no-op)."""
    if getattr(method, _MARK, False):
        return method

    @functools.wraps(method)
    def paused(*args: Any, **kwargs: Any) -> Any:
        with garbage_collection_paused():
            return method(*args, **kwargs)

    setattr(paused, _MARK, True)
    paused._nemo_fastdecode = True  # installed by one of our patches (nemo_fastdecode.nemo.patches.MARK)
    return paused


def guard_nemo_captures() -> None:
    """Pause the collector while NeMo's computers capture (idempotent)."""
    for cls in nemo_capturing_classes():
        cls._graph_reinitialize = collector_paused(cls.__dict__["_graph_reinitialize"])


def capture_targets() -> dict[str, object]:
    """Each capturing computer's ``_graph_reinitialize``."""
    return {
        f"{cls.__name__}._graph_reinitialize": cls.__dict__["_graph_reinitialize"] for cls in nemo_capturing_classes()
    }
