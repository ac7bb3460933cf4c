"""``TokenText`` gives NeMo's ``decode_ids_to_str`` / ``decode_ids_to_tokens`` for any list of ids (char and
sentencepiece BPE vocabularies), from ids seen before and new ones alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nemo_fastdecode.streaming.token_text import TokenText
from nemo_fastdecode.tools import synthetic


@pytest.fixture(scope="module", params=["char", "bpe"])
def decoding(request):
    return synthetic.build_synthetic_model("tiny-streaming", seed=0, vocab=request.param).decoding


def test_text_and_pieces_equal_nemos_for_random_id_lists(decoding):
    text = TokenText(decoding)
    g = torch.Generator().manual_seed(0)
    blank = decoding.blank_id
    compared = 0
    for length in (0, 1, 1, 2, 5, 17, 60, 200, 17, 1):
        ids = torch.randint(0, blank, (length,), generator=g).tolist()  # every id but the blank
        assert text.pieces(ids) == decoding.decode_ids_to_tokens(ids), ids
        assert text.text(ids) == decoding.decode_ids_to_str(ids), ids
        compared += len(decoding.decode_ids_to_str(ids))
    assert compared > 100  # text to compare
    assert text.text([]) == decoding.decode_ids_to_str([]) == ""


def test_id_arrays_give_what_lists_give(decoding):
    """Events pass rows of the token storage as numpy arrays: the table lookup equals NeMo's per-list answer, for ids
    seen before and new ones, one id and many, runs of many lists at once, and (characters) ids past the vocabulary, looked up one by one."""
    text = TokenText(decoding)
    g = torch.Generator().manual_seed(1)
    blank = decoding.blank_id
    compared = 0
    for length in (1, 3, 40, 1, 200, 0, 7):
        ids = torch.randint(0, blank, (length,), generator=g).numpy()
        assert text.pieces(ids) == decoding.decode_ids_to_tokens(ids.tolist()), ids
        assert text.text(ids) == decoding.decode_ids_to_str(ids.tolist()), ids
        compared += len(text.text(ids))
    assert compared > 100
    runs = [torch.randint(0, blank, (length,), generator=g).numpy() for length in (3, 0, 1, 50, 1, 9)]
    expected = [decoding.decode_ids_to_str(run.tolist()) for run in runs]
    assert text.texts(np.concatenate(runs), [len(run) for run in runs]) == expected
    assert text.texts(np.zeros(0, dtype=np.int64), []) == []
    if not hasattr(decoding, "tokenizer"):  # a character vocabulary maps ids past its labels to no piece
        beyond = np.array([0, blank - 1, blank + 5, 2**40], dtype=np.int64)
        assert text.pieces(beyond) == decoding.decode_ids_to_tokens(beyond.tolist())
        assert text.texts(beyond, [1, 3]) == [decoding.decode_ids_to_str([0]), decoding.decode_ids_to_str(beyond[1:])]
