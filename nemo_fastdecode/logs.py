"""The package's logging: one line per graph-mode choice, NeMo's repeated set-up lines quieted, a verbose switch.

Our messages go to the ``nemo_fastdecode`` logger. NeMo logs its loss configuration ("Using RNNT Loss ...")
again on every ``change_decoding_strategy``; by default only its first occurrence is shown. ``set_verbose(True)``
(or ``NEMO_FASTDECODE_VERBOSE=1`` in the environment) shows every NeMo line and our debug lines (each graph
capture, with the batch and length it was sized for).
"""

from __future__ import annotations

import logging
import os

__all__ = ["logger", "set_verbose", "verbose"]

logger = logging.getLogger("nemo_fastdecode")

# NeMo lines that repeat on every decoding change; each distinct message is shown once
_REPEATED_NEMO_LINES = ("Using RNNT Loss",)


class _FirstOccurrenceOnly(logging.Filter):
    """Drops a record whose message (one of ``prefixes``) was already let through."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes, self.seen = prefixes, set()

    def filter(self, record: logging.LogRecord) -> bool:
        if _verbose:
            return True
        message = record.getMessage()
        if not message.startswith(self.prefixes):
            return True
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


_verbose = os.environ.get("NEMO_FASTDECODE_VERBOSE", "0") not in ("", "0", "false", "False")
_filter = _FirstOccurrenceOnly(_REPEATED_NEMO_LINES)
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


def quiet_repeated_nemo_lines() -> None:
    """Attach the first-occurrence filter to NeMo's logger (idempotent; it survives NeMo's verbosity changes)."""
    nemo_logger = logging.getLogger("nemo_logger")
    if _filter not in nemo_logger.filters:
        nemo_logger.addFilter(_filter)


set_verbose(_verbose)
