"""The background Triton warm-up, started on first need (one of our strategies built, or the streaming engine built
on a GPU; never at import): where it starts, and that it leaves Triton's key cached."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from fastdecode_lab import synthetic
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


def test_importing_the_package_starts_nothing_even_with_a_gpu():
    probe = (
        "import torch; torch.cuda.is_available = lambda: True\n"  # a GPU, as far as the warm-up can tell
        "import nemo_fastdecode\n"
        "from nemo_fastdecode.kernels import warm_up\n"
        "print('thread', warm_up._thread)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "thread None" in done.stdout, done.stdout + done.stderr[-3000:]


def test_building_one_of_our_strategies_starts_it(monkeypatch):
    calls = []
    monkeypatch.setattr(warm_up, "start_triton_warm_up", lambda: calls.append(1) or False)
    model = synthetic.build_synthetic_model("tiny-rnnt")
    calls.clear()  # the model's own decoding (NeMo's strategy) is not ours
    model.change_decoding_strategy(OmegaConf.create({"strategy": "greedy_batch", "greedy": {"max_symbols": 10}}))
    assert calls == []
    model.change_decoding_strategy(OmegaConf.create({"strategy": "fast_greedy", "greedy": {"max_symbols": 10}}))
    assert calls == [1]
