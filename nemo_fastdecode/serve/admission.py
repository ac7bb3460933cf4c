"""Who gets a stream: the API key (before any audio is read) and the slot count (one slot per connection).

A refused connection is still upgraded to a WebSocket, so that the client (a browser too) reads why: one ``error``
event naming the reason, then the close code (1008 for the key, 1013 for capacity).
"""

from __future__ import annotations

import dataclasses
import hmac
from collections.abc import Mapping, Sequence
from typing import Any

from nemo_fastdecode.serve.protocol import CloseCode, ErrorCode

__all__ = ["Admission", "Refusal", "SUBPROTOCOL_KEY_PREFIX", "offered_api_key"]

#: the subprotocol a browser sends its key in (it cannot set headers on a WebSocket): ``openai-insecure-api-key.<key>``
SUBPROTOCOL_KEY_PREFIX = "openai-insecure-api-key."


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why a connection is not served: the ``error`` event's code and message, and the close code."""

    code: ErrorCode
    message: str
    close_code: CloseCode


def offered_api_key(headers: Mapping[str, str], subprotocols: Sequence[str]) -> str | None:
    """The key a client sent: ``Authorization: Bearer <key>``, else a subprotocol ``openai-insecure-api-key.<key>``."""
    authorization = headers.get("Authorization")
    if authorization is not None:
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() == "bearer" and key.strip():
            return key.strip()
    for protocol in subprotocols:
        if protocol.startswith(SUBPROTOCOL_KEY_PREFIX):
            return protocol[len(SUBPROTOCOL_KEY_PREFIX) :]
    return None


class Admission:
    """Counts the connections that hold a slot, per engine; checks the key.

    Args:
        slots: connections served at once (the engine's slots: each connection streams one item at a time); with an
            engine per look-ahead, a list: each engine's slots (a connection holds a slot of the engine of its
            session's ``delay``, see :meth:`move`).
        api_key: the key clients must send; ``None``: no key.
        shared: with network worker processes (one engine), ``(counts, index)``: a ``multiprocessing.Array`` of ints,
            one count per worker, and this worker's cell; the slots are taken across all of them (under the array's
            lock). ``None``: one process, a plain count per engine.
        names: each engine as a capacity refusal names it (with more than one engine).

    Without ``shared`` not thread-safe: the event loop's thread calls it.
    """

    def __init__(
        self,
        slots: int | Sequence[int],
        api_key: str | None = None,
        shared: tuple[Any, int] | None = None,
        names: Sequence[str] | None = None,
    ):
        self.engine_slots = [slots] if isinstance(slots, int) else list(slots)
        if shared is not None and len(self.engine_slots) != 1:
            raise ValueError("network workers share the slots of one engine")
        self.slots = sum(self.engine_slots)
        self._api_key, self._shared = api_key, shared
        self._names = list(names) if names is not None else None
        self._admitted = [0] * len(self.engine_slots)

    @property
    def admitted(self) -> int:
        """Slots taken now, of every engine (every worker's, with ``shared``)."""
        if self._shared is None:
            return sum(self._admitted)
        return sum(self._shared[0][:])

    def check_key(self, headers: Mapping[str, str], subprotocols: Sequence[str]) -> Refusal | None:
        """``None`` when no key is needed or the right one was sent (compared in constant time)."""
        if self._api_key is None:
            return None
        offered = offered_api_key(headers, subprotocols)
        if offered is not None and hmac.compare_digest(offered.encode(), self._api_key.encode()):
            return None
        why = "no API key was sent" if offered is None else "the API key is not valid"
        return Refusal(
            ErrorCode.INVALID_API_KEY,
            f"{why}; send 'Authorization: Bearer <key>' or the WebSocket subprotocol '{SUBPROTOCOL_KEY_PREFIX}<key>'",
            CloseCode.POLICY,
        )

    def admit(self, engine: int = 0) -> Refusal | None:
        """Take a slot of ``engine``, or the capacity refusal when all are taken (then nothing is taken)."""
        if self._shared is None:
            if self._admitted[engine] >= self.engine_slots[engine]:
                return self._full(engine)
            self._admitted[engine] += 1
            return None
        counts, index = self._shared
        with counts.get_lock():
            if sum(counts[:]) >= self.slots:
                return self._full(engine)
            counts[index] += 1
        return None

    def release(self, engine: int = 0) -> None:
        """Give back a slot of ``engine`` that :meth:`admit` took."""
        if self._shared is None:
            if self._admitted[engine] <= 0:
                raise RuntimeError("release() without a matching admit()")
            self._admitted[engine] -= 1
            return
        counts, index = self._shared
        with counts.get_lock():
            if counts[index] <= 0:
                raise RuntimeError("release() without a matching admit()")
            counts[index] -= 1

    def _full(self, engine: int) -> Refusal:
        if self._names is None or len(self.engine_slots) == 1:
            what = f"all {self.slots} stream slots are in use"
        else:
            what = f"all {self.engine_slots[engine]} stream slots of the {self._names[engine]} are in use"
        return Refusal(
            ErrorCode.SERVER_AT_CAPACITY,
            f"the server is at capacity: {what}; try again later",
            CloseCode.TRY_AGAIN_LATER,
        )
