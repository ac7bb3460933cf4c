"""NeMo's word timestamps of a stream's tokens, computed by NeMo's own code at a fraction of its host cost.

The words of an event come from ``RNNTDecoding.compute_rnnt_timestamps(hyp, "word")`` then
``process_timestamp_outputs``, as NeMo's ``transcribe`` and streaming pipeline compute them. Two of that code's costs
grow with things an event does not need, and are taken away here without changing what it returns:

- it deep-copies its per-token offsets, and a hypothesis' ``y_sequence`` / ``timestamp`` tensors put one 0-d tensor
  in each: the part passed in holds plain ints instead;
- a BPE decoding's ``tokenizer_type`` rebuilds the whole vocabulary on every call, and every token is decoded on its
  own, twice: NeMo's method runs with ``self`` a view of the model's decoding object that reads ``tokenizer_type``
  once and takes token text from :class:`~nemo_fastdecode.streaming.token_text.TokenText` (each id's pieces
  remembered);
- it deep-copies its per-token offsets (``{"char": [id], "start_offset": s, "end_offset": e}`` each) with
  ``copy.deepcopy``, which walks every dict and list generically: the view's ``_compute_offsets`` returns NeMo's
  offsets in a list whose deep copy is built directly (new dicts, new lists, the same immutable values), the copy
  ``deepcopy`` would make.
"""

from __future__ import annotations

import copy
from typing import Any

from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis
from nemo.collections.asr.parts.utils.timestamp_utils import process_timestamp_outputs

from nemo_fastdecode.streaming.token_text import TokenText

__all__ = ["WordTimestamps"]


class _DecodingView:
    """The model's decoding object, with its ``tokenizer_type`` read once and the text of token ids remembered
    (:class:`~nemo_fastdecode.streaming.token_text.TokenText`); every other attribute is the object's."""

    def __init__(self, text: TokenText):
        self._decoding, self._text = text.decoding, text
        self.tokenizer_type = text.decoding.tokenizer_type
        self.blank_id = text.decoding.blank_id  # read for every token
        self._token_pieces: dict[int, list[str]] = {}

    def decode_ids_to_tokens(self, ids: list[int]) -> list[str]:
        # NeMo's character TDT decoding maps its last len(durations) labels to no piece at all (it counts the
        # duration outputs against the labels), and its own word timestamps then fail with an IndexError: such an
        # id is an empty piece here, so the words come out, spelled as NeMo's text spells them (without it)
        out: list[str] = []
        for token in ids:
            found = self._token_pieces.get(token)
            if found is None:
                found = self._token_pieces[token] = self._text.pieces([token]) or [""]
            out += found
        return out

    def decode_ids_to_str(self, ids: list[int]) -> str:
        return self._text.text(ids)

    def _compute_offsets(self, hypothesis: Hypothesis, blank_id: int, *args: Any) -> list[dict[str, Any]]:
        return _Offsets(self._decoding._compute_offsets(hypothesis, blank_id, *args))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._decoding, name)


class _Offsets(list):
    """NeMo's per-token offsets, deep-copied directly: their values are ints and lists of the token ids, which
    :class:`WordTimestamps` passes as ints (anything else takes the generic copy)."""

    def __deepcopy__(self, memo: dict) -> list:
        copied = []
        for entry in self:
            fresh = entry.copy()
            for key, value in entry.items():
                kind = type(value)
                if kind is list:
                    fresh[key] = value.copy()
                elif kind not in _ATOMS:
                    return copy.deepcopy(list(self), memo)
            copied.append(fresh)
        return copied


_ATOMS = (int, float, str, bool)


class WordTimestamps:
    """Word timestamps of slices of hypotheses, as NeMo computes them for a whole one.

    Args:
        text: the model's decoding object's token text (``TokenText(model.decoding)``).
        subsampling_factor: the encoder's; ``window_stride``: the preprocessor's, in seconds.
    """

    def __init__(self, text: TokenText, subsampling_factor: int, window_stride: float):
        self._decoding = _DecodingView(text)
        self._compute = type(text.decoding).compute_rnnt_timestamps
        self.subsampling_factor, self.window_stride = subsampling_factor, window_stride

    def __call__(self, hyp: Hypothesis, first: int, stop: int) -> list[dict[str, Any]]:
        """Words of the hypothesis' tokens ``first .. stop - 1``: dicts with ``word``, ``start_offset`` /
        ``end_offset`` (encoder frames from the stream's start) and ``start`` / ``end`` (seconds)."""
        part = copy.copy(hyp)  # NeMo replaces the timestamp field by a dict
        part.y_sequence, part.timestamp = hyp.y_sequence[first:stop].tolist(), hyp.timestamp[first:stop].tolist()
        part.dec_state = None
        if hyp.token_duration is not None and len(hyp.token_duration):
            part.token_duration = hyp.token_duration[first:stop].tolist()
        part = self._compute(self._decoding, part, "word")
        (part,) = process_timestamp_outputs([part], self.subsampling_factor, self.window_stride)
        return part.timestamp["word"]
