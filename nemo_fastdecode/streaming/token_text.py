"""Text of token ids exactly as the model's NeMo decoding object gives it, without its per-token host cost.

NeMo's ``decode_ids_to_str(ids)`` is ``decode_tokens_to_str(decode_ids_to_tokens(ids))`` (an aggregate tokenizer
aside), and ``decode_ids_to_tokens`` maps each id on its own (a tokenizer piece; the character of a label, or nothing
for ids past the labels): so the pieces of a list are the pieces of its ids, one after the other. Each id's pieces are
looked up once here; the text of a list is then one ``decode_tokens_to_str`` call. Events call it for every stream
that grew in a cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nemo.collections.common.tokenizers.aggregate_tokenizer import AggregateTokenizer

__all__ = ["TokenText"]


class TokenText:
    """``decode_ids_to_str`` / ``decode_ids_to_tokens`` of a NeMo decoding object (``model.decoding``), remembered
    per id."""

    def __init__(self, decoding: Any):
        self.decoding = decoding
        self._per_id = not isinstance(getattr(decoding, "tokenizer", None), AggregateTokenizer)
        self._pieces: dict[int, list[str]] = {}
        self._single: dict[int, str] = {}  # the text of one id alone (NeMo's timestamps ask for every token's)

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """``decoding.decode_ids_to_tokens(ids)``."""
        if not self._per_id:
            return self.decoding.decode_ids_to_tokens(list(ids))
        out: list[str] = []
        for token in ids:
            found = self._pieces.get(token)
            if found is None:
                found = self._pieces[token] = self.decoding.decode_ids_to_tokens([token])
            out += found
        return out

    def text(self, ids: Sequence[int]) -> str:
        """``decoding.decode_ids_to_str(ids)``."""
        if not self._per_id:
            return self.decoding.decode_ids_to_str(list(ids))
        if len(ids) == 1:
            (token,) = ids
            found = self._single.get(token)
            if found is None:
                found = self._single[token] = self.decoding.decode_tokens_to_str(self.pieces(ids))
            return found
        return self.decoding.decode_tokens_to_str(self.pieces(ids))
