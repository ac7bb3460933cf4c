"""The background Triton warm-up started at import: where it starts, and that it leaves Triton's key cached."""

from __future__ import annotations

import pytest
import torch

from nemo_fastdecode.kernels import warm_up


@pytest.fixture
def fresh_state(monkeypatch):
    monkeypatch.setattr(warm_up, "_thread", None)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("NEMO_FASTDECODE_TRITON_WARM_UP", raising=False)


def test_no_warm_up_without_a_gpu_or_when_turned_off(fresh_state, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not warm_up.start_triton_warm_up() and warm_up._thread is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("NEMO_FASTDECODE_TRITON_WARM_UP", "0")
    assert not warm_up.start_triton_warm_up()
    monkeypatch.setenv("NEMO_FASTDECODE_TRITON_WARM_UP", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter needs no compiler cache key
    assert not warm_up.start_triton_warm_up() and warm_up._thread is None
    warm_up.finish_triton_warm_up()  # nothing to wait for


def test_warm_up_runs_once_and_caches_the_triton_key(fresh_state, monkeypatch):
    from triton.runtime.cache import triton_key

    triton_key.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert warm_up.start_triton_warm_up()
    assert not warm_up.start_triton_warm_up()  # once per process
    warm_up.finish_triton_warm_up()
    assert not warm_up._thread.is_alive()
    assert triton_key.cache_info().currsize == 1  # the first kernel launch finds it computed
