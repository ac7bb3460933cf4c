"""The package's logging: one line per graph-mode choice, and a verbose switch.

Our messages go to the ``nemo_fastdecode`` logger. ``set_verbose(True)`` (or ``NEMO_FASTDECODE_VERBOSE=1`` in the
environment) shows our debug lines (each graph capture, with the batch and length it was sized for) and every NeMo
line: NeMo's set-up lines that repeat on every decoding change are otherwise shown once
(:mod:`nemo_fastdecode.nemo.logs`, the filter on NeMo's logger).
"""

from __future__ import annotations

import logging
import os

__all__ = ["logger", "set_verbose", "verbose"]

logger = logging.getLogger("nemo_fastdecode")

_verbose = os.environ.get("NEMO_FASTDECODE_VERBOSE", "0") not in ("", "0", "false", "False")
_stderr = logging.StreamHandler()
_stderr.setFormatter(logging.Formatter("%(message)s"))


def verbose() -> bool:
    """Whether every NeMo line and our debug lines are shown."""
    return _verbose


def set_verbose(enabled: bool) -> None:
    """Show every NeMo set-up line and our info and debug lines (``True``), or only first occurrences (``False``).

    Verbose output goes to stderr when the application has not set up logging itself.
    """
    global _verbose
    _verbose = bool(enabled)
    logger.setLevel(logging.DEBUG if _verbose else logging.NOTSET)
    if _verbose and not logger.handlers and not logging.getLogger().handlers:
        logger.addHandler(_stderr)
        logger.propagate = False
    elif not _verbose and _stderr in logger.handlers:
        logger.removeHandler(_stderr)
        logger.propagate = True


set_verbose(_verbose)
