"""The apps' NeMo output: one line per NeMo message, each message once.

Restoring a model and ``change_decoding_strategy`` make NeMo log the same lines again and again (the CUDA-graph
warning once per decoder built, the loss configuration, three data-loader config dumps of a dozen lines each).
:func:`one_line_nemo_messages` puts a filter on NeMo's logger that turns each message into one line (a config dump
that follows a ``...:`` header line, and the source line Python's warnings repeat, are left out) and lets each line
through once. ``NEMO_FASTDECODE_VERBOSE=1`` (:func:`nemo_fastdecode.logs.set_verbose`) shows NeMo's lines whole
and every time. The package's own filter of repeated lines (:func:`nemo_fastdecode.nemo.logs.quiet_repeated_nemo_lines`,
a patch the package's import installs) is attached too. Not applied by ``import nemo_fastdecode``: the apps attach it
when they load a model (:func:`nemo_fastdecode.apps.models.load_model`); ``logging.getLogger("nemo_logger")
.removeFilter(...)`` undoes it.
"""

from __future__ import annotations

import logging
import re

from nemo_fastdecode.logs import verbose
from nemo_fastdecode.nemo.logs import quiet_repeated_nemo_lines

__all__ = ["OneLineOnce", "one_line", "one_line_nemo_messages"]

# "path.py:119: UserWarning: message" -- how NeMo logs a Python warning (its source line follows the message)
_PYTHON_WARNING = re.compile(r"^\S+:\d+: \w*(Warning|Error)\w*: ")


def one_line(message: str) -> str:
    """``message`` on one line: its lines joined up to a line ending in ``:`` (the header of a config dump, dropped
    with what follows), a Python warning's source line left out."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) > 1 and _PYTHON_WARNING.match(lines[0]):
        lines = lines[:-1]  # warnings.formatwarning's source line
    kept = []
    for line in lines:
        if kept and line.endswith(":"):
            break
        kept.append(line)
    return " ".join(kept)


class OneLineOnce(logging.Filter):
    """Rewrites a record's message as :func:`one_line` and drops it when that line was already let through (errors
    always pass; everything passes whole while :func:`nemo_fastdecode.logs.verbose`)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if verbose() or record.levelno >= logging.ERROR:
            return True
        line = one_line(record.getMessage())
        if line in self.seen:
            return False
        self.seen.add(line)
        record.msg, record.args = line, None
        return True


_filter = OneLineOnce()


def one_line_nemo_messages() -> None:
    """Attach :class:`OneLineOnce` (and the package's repeated-line filter) to NeMo's logger; idempotent."""
    quiet_repeated_nemo_lines()
    nemo_logger = logging.getLogger("nemo_logger")
    if _filter not in nemo_logger.filters:
        nemo_logger.addFilter(_filter)
