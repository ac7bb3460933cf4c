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
    """Counts the connections that hold a slot; checks the key.

    Args:
        slots: connections served at once (the engine's slots: each connection streams one item at a time).
        api_key: the key clients must send; ``None``: no key.
        shared: with network worker processes, ``(counts, index)``: a ``multiprocessing.Array`` of ints, one count
            per worker, and this worker's cell; the slots are taken across all of them (under the array's lock).
            ``None``: one process, a plain count.

    Without ``shared`` not thread-safe: the event loop's thread calls it.
    """

    def __init__(self, slots: int, api_key: str | None = None, shared: tuple[Any, int] | None = None):
        self.slots, self._api_key, self._shared = slots, api_key, shared
        self._admitted = 0

    @property
    def admitted(self) -> int:
        """Slots taken now (every worker's, with ``shared``)."""
        if self._shared is None:
            return self._admitted
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

    def admit(self) -> Refusal | None:
        """Take a slot, or the capacity refusal when all are taken (then nothing is taken)."""
        if self._shared is None:
            if self._admitted >= self.slots:
                return self._full()
            self._admitted += 1
            return None
        counts, index = self._shared
        with counts.get_lock():
            if sum(counts[:]) >= self.slots:
                return self._full()
            counts[index] += 1
        return None

    def release(self) -> None:
        """Give back the slot :meth:`admit` took."""
        if self._shared is None:
            if self._admitted <= 0:
                raise RuntimeError("release() without a matching admit()")
            self._admitted -= 1
            return
        counts, index = self._shared
        with counts.get_lock():
            if counts[index] <= 0:
                raise RuntimeError("release() without a matching admit()")
            counts[index] -= 1

    def _full(self) -> Refusal:
        return Refusal(
            ErrorCode.SERVER_AT_CAPACITY,
            f"the server is at capacity: all {self.slots} stream slots are in use; try again later",
            CloseCode.TRY_AGAIN_LATER,
        )
