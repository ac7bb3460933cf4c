"""Text of token ids exactly as the model's NeMo decoding object gives it, without its per-token host cost.

NeMo's ``decode_ids_to_str(ids)`` is ``decode_tokens_to_str(decode_ids_to_tokens(ids))`` (an aggregate tokenizer
aside), and ``decode_ids_to_tokens`` maps each id on its own (a tokenizer piece; the character of a label, or nothing
for ids past the labels): so the pieces of a list are the pieces of its ids, one after the other. Each id's pieces are
looked up once here, into a table indexed by id: the pieces of an id array are one numpy gather (no Python loop over
its tokens) when each of its ids is one piece, as with every sentencepiece and character vocabulary. The text of a list
is then one ``decode_tokens_to_str`` call. Events call it for every stream that grew in a cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from nemo.collections.common.tokenizers.aggregate_tokenizer import AggregateTokenizer

__all__ = ["TokenText"]

_TABLE_LIMIT = 1 << 20  # ids tabled; larger ones (no vocabulary has them) are looked up one by one


class TokenText:
    """``decode_ids_to_str`` / ``decode_ids_to_tokens`` of a NeMo decoding object (``model.decoding``), remembered
    per id."""

    def __init__(self, decoding: Any):
        self.decoding = decoding
        self._per_id = not isinstance(getattr(decoding, "tokenizer", None), AggregateTokenizer)
        self._pieces: dict[int, list[str]] = {}
        self._single: dict[int, str] = {}  # the text of one id alone (NeMo's timestamps ask for every token's)
        # per id: looked up yet, whether it is exactly one piece, and that piece (grown to the largest id seen)
        self._known = np.zeros(0, dtype=bool)
        self._one_piece = np.zeros(0, dtype=bool)
        self._piece = np.empty(0, dtype=object)

    def pieces(self, ids: Sequence[int] | np.ndarray) -> list[str]:
        """``decoding.decode_ids_to_tokens(ids)``; ``ids`` a sequence of ints or a 1-D integer array."""
        if not self._per_id:
            return self.decoding.decode_ids_to_tokens(_as_list(ids))
        if isinstance(ids, np.ndarray) and self._tabled(ids):
            return self._piece[ids].tolist()
        out: list[str] = []
        for token in _as_list(ids):
            found = self._pieces.get(token)
            if found is None:
                found = self._pieces[token] = self.decoding.decode_ids_to_tokens([token])
            out += found
        return out

    def text(self, ids: Sequence[int] | np.ndarray) -> str:
        """``decoding.decode_ids_to_str(ids)``; ``ids`` a sequence of ints or a 1-D integer array."""
        if not self._per_id:
            return self.decoding.decode_ids_to_str(_as_list(ids))
        if len(ids) == 1:
            token = int(ids[0])
            found = self._single.get(token)
            if found is None:
                found = self._single[token] = self.decoding.decode_tokens_to_str(self.pieces([token]))
            return found
        return self.decoding.decode_tokens_to_str(self.pieces(ids))

    def texts(self, ids: np.ndarray, sizes: Sequence[int]) -> list[str]:
        """The text of each run of ``ids`` (``[M]`` integers) cut into consecutive runs of ``sizes`` (summing to
        ``M``): ``[decoding.decode_ids_to_str(run) for run in runs]``, with one table lookup for all their ids."""
        ends = np.cumsum(sizes).tolist()
        spans = list(zip([0, *ends][: len(ends)], ends, strict=True))
        if self._per_id and self._tabled(ids):
            pieces, decode = self._piece[ids].tolist(), self.decoding.decode_tokens_to_str
            return [decode(pieces[start:end]) for start, end in spans]
        listed = ids.tolist()
        return [self.text(listed[start:end]) for start, end in spans]

    def _tabled(self, ids: np.ndarray) -> bool:
        """Whether every one of ``ids`` is one piece, in the table (looking up the ids not seen yet)."""
        if ids.size == 0 or ids.min() < 0 or ids.max() >= _TABLE_LIMIT:
            return False
        self._learn(ids)
        return bool(self._one_piece[ids].all())

    def _learn(self, ids: np.ndarray) -> None:
        """Fill the table for the ids (``>= 0``) not looked up yet."""
        if int(ids.max()) >= self._known.size:
            size = max(int(ids.max()) + 1, 2 * self._known.size)
            grown = size - self._known.size
            self._known = np.concatenate([self._known, np.zeros(grown, dtype=bool)])
            self._one_piece = np.concatenate([self._one_piece, np.zeros(grown, dtype=bool)])
            self._piece = np.concatenate([self._piece, np.empty(grown, dtype=object)])
        new = ids[~self._known[ids]]
        for token in np.unique(new).tolist() if new.size else ():
            found = self._pieces.get(token)
            if found is None:
                found = self._pieces[token] = self.decoding.decode_ids_to_tokens([token])
            self._known[token] = True
            if len(found) == 1:
                self._one_piece[token], self._piece[token] = True, found[0]


def _as_list(ids: Sequence[int] | np.ndarray) -> list[int]:
    return ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
