"""Text of token ids exactly as the model's NeMo decoding object gives it, without its per-token host cost.

NeMo's ``decode_ids_to_str(ids)`` is ``decode_tokens_to_str(decode_ids_to_tokens(ids))`` (an aggregate tokenizer
aside), and ``decode_ids_to_tokens`` maps each id on its own (a tokenizer piece; the character of a label, or nothing
for ids past the labels): so the pieces of a list are the pieces of its ids, one after the other. Each id's pieces are
looked up once here, into a table indexed by id: the pieces of an id array are one numpy gather (no Python loop over
its tokens) when each of its ids is one piece, as with every sentencepiece and character vocabulary. The text of a list
is then one ``decode_tokens_to_str`` call. Events call it for every stream that grew in a cycle.

A partial event extends text built before: :meth:`TokenText.continued` appends each new id's *continuation surface*
(its text after other text: a sentencepiece piece with ``▁`` as a space, a character as itself) to the text so far,
so an event costs its new tokens, not the whole segment. That is NeMo's text exactly once the text so far is not
empty (sentencepiece strips a space only ahead of the first text) and neither side of the join is a byte piece
(``<0x..>``: bytes merge into characters across pieces); each id's surface is taken from the decoder itself and the
rule is checked on random lists of the vocabulary once, else every text is decoded whole.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from nemo.collections.common.tokenizers.aggregate_tokenizer import AggregateTokenizer

__all__ = ["TokenText"]

_TABLE_LIMIT = 1 << 20  # ids tabled; larger ones (no vocabulary has them) are looked up one by one
_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # sentencepiece's byte-fallback pieces
_JOIN_CHECKS = 64  # random id lists on which continued text is compared with whole decoding, once


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
        # per id: its continuation surface, or None where it cannot be appended (byte pieces, several pieces)
        self._surface: dict[int, str | None] = {}
        self._anchor: tuple[list[str], str, str] | None = None  # a plain piece, its text, its continuation
        self._joins: bool | None = None  # continuation checked on random lists (None: not yet)

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

    def continued(
        self, texts: Sequence[str], befores: Sequence[list[int]], ids: np.ndarray, sizes: Sequence[int]
    ) -> list[str]:
        """The text of each ``befores[i] + run_i`` (the runs: ``ids``, ``[M]`` integers, cut by ``sizes``), given
        ``texts[i]``, the text of ``befores[i]``: ``decoding.decode_ids_to_str(befores[i] + run_i)`` for every ``i``.

        Where the join is exact (see the module docstring) the new ids' surfaces are appended to ``texts[i]``; else
        (an empty text so far, byte pieces, a vocabulary that failed the check) the whole list is decoded."""
        if not any(befores):  # nothing before: the runs' own texts
            return self.texts(ids, sizes)
        ends = np.cumsum(sizes).tolist()
        listed, out = ids.tolist(), []
        for text, before, start, end in zip(texts, befores, [0, *ends[:-1]], ends, strict=True):
            run = listed[start:end]
            if not run:
                out.append(text)
                continue
            surfaces = [self._continuation(token) for token in run] if text and self._joining() else None
            if surfaces is None or None in surfaces or self._continuation(before[-1]) is None:
                out.append(self.text(before + run))
            else:
                out.append(text + "".join(surfaces))
        return out

    def _continuation(self, token: int) -> str | None:
        """The id's text after other text, or ``None`` where appending it is not exact: the text of ``[a, token,
        a]`` between those of ``[a]`` and ``a``'s own continuation, for a plain one-piece id ``a``."""
        if token in self._surface:
            return self._surface[token]
        pieces = self.pieces([token])
        anchor = self._anchor_piece()
        surface = None
        if anchor is not None and len(pieces) == 1 and not _BYTE_PIECE.fullmatch(pieces[0]):
            first, after = anchor[1], anchor[2]
            sandwich = self.decoding.decode_tokens_to_str([*anchor[0], pieces[0], *anchor[0]])
            if sandwich.startswith(first) and sandwich.endswith(after) and len(sandwich) >= len(first) + len(after):
                surface = sandwich[len(first) : len(sandwich) - len(after)]
        self._surface[token] = surface
        return surface

    def _anchor_piece(self) -> tuple[list[str], str, str] | None:
        """The first id whose text is one plain word character: its pieces, its text and its continuation."""
        if self._anchor is None:
            for token in range(min(self._vocabulary(), 4096)):
                pieces = self.pieces([token])
                text = self.decoding.decode_tokens_to_str(pieces)
                if len(pieces) == 1 and text.isalnum() and not _BYTE_PIECE.fullmatch(pieces[0]):
                    twice = self.decoding.decode_tokens_to_str(pieces * 2)
                    if twice.startswith(text):
                        self._anchor = (pieces, text, twice[len(text) :])
                        break
        return self._anchor

    def _joining(self) -> bool:
        """Whether continued text equals whole decoding on random lists of this vocabulary (checked once)."""
        if self._joins is None:
            rng = np.random.default_rng(0)
            vocabulary = self._vocabulary()
            self._joins = self._per_id and vocabulary > 0 and self._anchor_piece() is not None
            for _ in range(_JOIN_CHECKS if self._joins else 0):
                ids = rng.integers(0, vocabulary, size=int(rng.integers(2, 24))).tolist()
                cut = int(rng.integers(1, len(ids)))
                text = self.text(ids[:cut])
                surfaces = [self._continuation(token) for token in ids[cut - 1 :]]
                if text and None not in surfaces and text + "".join(surfaces[1:]) != self.text(ids):
                    self._joins = False
        return self._joins

    def _vocabulary(self) -> int:
        """Ids of real tokens: below the blank (RNN-T, TDT), 0 where the decoding names no blank."""
        return int(getattr(self.decoding, "blank_id", 0) or 0)

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
