"""``TokenText`` gives NeMo's ``decode_ids_to_str`` / ``decode_ids_to_tokens`` for any list of ids (char and
sentencepiece BPE vocabularies), from ids seen before and new ones alike."""

from __future__ import annotations

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
