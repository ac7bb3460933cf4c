"""``TokenText`` gives NeMo's ``decode_ids_to_str`` / ``decode_ids_to_tokens`` for any list of ids (char and
sentencepiece BPE vocabularies), from ids seen before and new ones alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastdecode_lab import synthetic
from nemo_fastdecode.streaming.token_text import TokenText


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


def test_continued_text_is_the_whole_lists_text(decoding):
    """A partial event extends the text said before by its new ids' surfaces: the result is NeMo's text of the whole
    list, for any split (nothing before, one id before, the text so far empty), and the join is really used."""
    text = TokenText(decoding)
    g = np.random.default_rng(2)
    blank = decoding.blank_id
    cases = []
    for _ in range(60):
        ids = g.integers(0, blank, size=int(g.integers(1, 30))).tolist()
        cut = int(g.integers(0, len(ids)))
        cases.append((ids[:cut], ids[cut:]))
    cases += [([], [3, 4]), ([5], []), ([5], [6])]
    befores = [before for before, _ in cases]
    news = [new for _, new in cases]
    got = text.continued(
        [text.text(before) for before in befores],
        befores,
        np.array(sum(news, []), dtype=np.int64),
        [len(new) for new in news],
    )
    expected = [decoding.decode_ids_to_str(before + new) for before, new in cases]
    assert sum(map(len, expected)) > 200  # text to compare
    assert got == expected
    assert text._joining()  # appended, not decoded whole
    assert text.continued([], [], np.zeros(0, dtype=np.int64), []) == []


def test_continued_text_decodes_whole_where_a_join_is_not_exact(decoding):
    """Ids whose surface cannot be appended (id 4 taken as such here, e.g. a byte piece) on either side of the join,
    and an empty text so far (sentencepiece strips a space ahead of the first text): the whole list is decoded. The
    texts so far passed are wrong on purpose: a join would show them."""
    text = TokenText(decoding)
    assert text._joining()
    text._surface[4] = None
    cases = [([1, 2], [4]), ([4], [1]), ([1], [2, 4, 3]), ([1], [2])]
    got = text.continued(
        ["wrong", "wrong", "wrong", ""],
        [before for before, _ in cases],
        np.array([4, 1, 2, 4, 3, 2], dtype=np.int64),
        [1, 1, 3, 1],
    )
    assert got == [decoding.decode_ids_to_str(before + new) for before, new in cases]
    assert text.continued(["wrong"], [[1]], np.array([2], dtype=np.int64), [1]) == ["wrong" + text._continuation(2)]
