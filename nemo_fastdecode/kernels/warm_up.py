"""Triton's once-per-process set-up, done on a background thread when one of our decoders or the streaming
transcriber is first built on a GPU (while the model loads), instead of in the first decode.

Before its first kernel launch in a process, Triton hashes its own installation (``triton_key``: every compiler
source file and the ~100 MB ``libtriton`` library) to key its on-disk cache, and imports its Gluon front end: a
large part of a second together. Without this thread both land in the first ``transcribe`` call. The thread only warms
what Triton computes once and caches per process (an ``lru_cache`` and module imports); it launches nothing on the
GPU and touches no CUDA state, so it cannot race a graph capture. ``NEMO_FASTDECODE_TRITON_WARM_UP=0`` turns it off.
"""

from __future__ import annotations

import os
import threading

import torch

_thread: threading.Thread | None = None


def _warm_up() -> None:
    try:
        from triton.runtime.cache import triton_key

        triton_key()
        import triton.experimental.gluon  # noqa: F401  (imported by Triton's first kernel launch)
    except Exception:  # a warm-up only: the first launch does the same work, and reports any error itself
        pass


def start_triton_warm_up() -> bool:
    """Start the warm-up thread once per process where Triton will run kernels on a GPU; ``True`` if started now."""
    global _thread
    if _thread is not None or os.environ.get("NEMO_FASTDECODE_TRITON_WARM_UP", "1") == "0":
        return False
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        return False
    _thread = threading.Thread(target=_warm_up, name="nemo-fastdecode-triton-warm-up", daemon=True)
    _thread.start()
    return True


def finish_triton_warm_up() -> None:
    """Wait for the warm-up thread, if one runs: called before the first kernel launch, so that the launch does not
    hash Triton's installation a second time while the thread is at it."""
    if _thread is not None:
        _thread.join()
