"""NeMo's decoders capture their CUDA graphs with the garbage collector paused (:mod:`nemo_fastdecode.nemo.captures`).

The GPU side (a dropped NeMo decoder collected while another NeMo decoder captures) is in
``tests/test_capture_gc_gpu.py``.
"""

from __future__ import annotations

import gc

import pytest

import nemo_fastdecode  # noqa: F401  (installs the guard)
from nemo_fastdecode.nemo.captures import collector_paused, guard_nemo_captures, nemo_capturing_classes


def test_every_capturing_computer_is_guarded_once():
    classes = nemo_capturing_classes()
    assert len(classes) == 4
    wrapped = [cls.__dict__["_graph_reinitialize"] for cls in classes]
    assert all(getattr(method, "_nemo_fastdecode_collector_paused", False) for method in wrapped)
    guard_nemo_captures()  # idempotent: no second wrapper
    assert [cls.__dict__["_graph_reinitialize"] for cls in classes] == wrapped
    assert all(not getattr(m.__wrapped__, "_nemo_fastdecode_collector_paused", False) for m in wrapped)


def test_the_collector_is_paused_during_the_call_and_restored_after():
    seen = []

    def capture(value):
        seen.append(gc.isenabled())
        if value < 0:
            raise ValueError(value)
        return value

    paused = collector_paused(capture)
    assert collector_paused(paused) is paused
    assert gc.isenabled()
    assert paused(3) == 3
    with pytest.raises(ValueError):
        paused(-1)
    assert seen == [False, False] and gc.isenabled()
