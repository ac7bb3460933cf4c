"""``transcription.delay`` as the encoder's look-ahead: one engine per look-ahead the server offers.

A cache-aware FastConformer trained with several ``att_context_size`` values (``[left, lookahead]`` in encoder
frames) can stream at any of them; a longer look-ahead waits for more audio before each chunk's text and is usually
more accurate. The server offers the look-aheads of ``look_aheads`` (one by default: ``att_context_size``), each on a
:class:`~nemo_fastdecode.streaming.StreamingEngine` of its own (its own slots and caches, exact: each stream is NeMo's
streaming at its engine's look-ahead). A session's ``delay`` (one of :data:`~.protocol.DELAYS`, shortest first) picks
one with :meth:`LookAheads.engine_of`: the names spread evenly over the offered look-aheads, shortest to longest
(``minimal`` the shortest, ``xhigh`` the longest; with fewer look-aheads than names neighbouring names share one); an
unset delay gets the server's default look-ahead.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from nemo_fastdecode.serve.protocol import DELAYS

__all__ = ["ALL", "LookAheads", "delay_index", "engine_order"]

#: ``look_aheads=all``: every look-ahead the encoder was trained with
ALL = "all"


def delay_index(delay: int, offered: int) -> int:
    """The look-ahead (``0``: the shortest of ``offered``) that the ``delay``-th name of :data:`DELAYS` gets: the names
    spread evenly over the look-aheads, rounded half up (``minimal`` -> ``0``, ``xhigh`` -> ``offered - 1``)."""
    if offered < 1 or not 0 <= delay < len(DELAYS):
        raise ValueError(f"delay index {delay} of {len(DELAYS)} over {offered} look-aheads")
    return math.floor(delay * (offered - 1) / (len(DELAYS) - 1) + 0.5)


@dataclasses.dataclass(frozen=True)
class LookAheads:
    """The look-aheads a server offers, one engine each, shortest look-ahead first, and the default's index.

    Attributes:
        sizes: each engine's ``(left, lookahead)``, in engine order (by look-ahead, then left context).
        default: the engine of a session that sets no delay.
    """

    sizes: tuple[tuple[int, int], ...]
    default: int = 0

    def __post_init__(self) -> None:
        if not self.sizes or not 0 <= self.default < len(self.sizes):
            raise ValueError(f"look-aheads {self.sizes} with default {self.default}")
        if list(self.sizes) != sorted(set(self.sizes), key=_order):
            raise ValueError(f"look-aheads {self.sizes} must be distinct, shortest look-ahead first")

    @classmethod
    def of(cls, sizes: Sequence[Sequence[int]], default: Sequence[int] | None = None) -> LookAheads:
        """The engines' look-aheads (in engine order); ``default``: the one of a session without delay (``None`` or
        not offered: the first)."""
        pairs = tuple((int(s[0]), int(s[1])) for s in sizes)
        wanted = None if default is None else (int(default[0]), int(default[1]))
        return cls(pairs, pairs.index(wanted) if wanted in pairs else 0)

    def engine_of(self, delay: str | None) -> int:
        """The engine a session with ``delay`` (one of :data:`DELAYS`, or ``None``: the default) streams on."""
        if delay is None:
            return self.default
        return delay_index(DELAYS.index(delay), len(self.sizes))

    def describe(self, engine: int) -> str:
        """An engine as messages name it: its ``att_context_size`` and the delays that get it."""
        names = [name for name in DELAYS if self.engine_of(name) == engine]
        return f"look-ahead att_context_size={list(self.sizes[engine])} (delay {', '.join(names) or 'unset'})"


def engine_order(sizes: Sequence[Sequence[int]]) -> list[list[int]]:
    """``sizes`` as engines are built: distinct, shortest look-ahead first (then shortest left context)."""
    return [list(s) for s in sorted({(int(s[0]), int(s[1])) for s in sizes}, key=_order)]


def _order(size: tuple[int, int]) -> tuple[int, int]:
    return size[1], size[0]
