"""Patch: NeMo's set-up lines that repeat on every decoding change are shown once.

NeMo logs its loss configuration ("Using RNNT Loss ...") again on every ``change_decoding_strategy``, which a tool
that switches strategies prints dozens of times. :func:`quiet_repeated_nemo_lines` attaches a filter to NeMo's
logger (``nemo_logger``; a filter on the logger survives NeMo's verbosity changes) that lets each distinct such
message through once, and every line while :func:`nemo_fastdecode.logs.verbose` (``set_verbose(True)`` or
``NEMO_FASTDECODE_VERBOSE=1``). Idempotent: the filter is one marked object, attached once;
``logging.getLogger("nemo_logger").removeFilter(NEMO_FILTER)`` undoes it.
"""

from __future__ import annotations

import logging

from nemo_fastdecode import logs

__all__ = ["NEMO_FILTER", "logger_targets", "quiet_repeated_nemo_lines"]

# NeMo lines that repeat on every decoding change; each distinct message is shown once
_REPEATED_NEMO_LINES = ("Using RNNT Loss",)
_NEMO_LOGGER = "nemo_logger"


class FirstOccurrenceOnly(logging.Filter):
    """Drops a record whose message (one of ``prefixes``) was already let through, unless verbose."""

    _nemo_fastdecode = True  # installed by one of our patches (nemo_fastdecode.nemo.patches.MARK)

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes, self.seen = prefixes, set()

    def filter(self, record: logging.LogRecord) -> bool:
        if logs.verbose():
            return True
        message = record.getMessage()
        if not message.startswith(self.prefixes):
            return True
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


NEMO_FILTER = FirstOccurrenceOnly(_REPEATED_NEMO_LINES)


def quiet_repeated_nemo_lines() -> None:
    """Attach :data:`NEMO_FILTER` to NeMo's logger (idempotent)."""
    nemo_logger = logging.getLogger(_NEMO_LOGGER)
    if NEMO_FILTER not in nemo_logger.filters:
        nemo_logger.addFilter(NEMO_FILTER)


def logger_targets() -> dict[str, object]:
    """Our filters on NeMo's logger (one, :data:`NEMO_FILTER`, once installed)."""
    ours = [f for f in logging.getLogger(_NEMO_LOGGER).filters if isinstance(f, FirstOccurrenceOnly)]
    return {f"nemo_logger.filters[{i}]": f for i, f in enumerate(ours)}
