"""``WordTimestamps`` equals NeMo's word timestamps (``compute_rnnt_timestamps`` + ``process_timestamp_outputs``) on
slices of random hypotheses, for a character and a sentencepiece BPE vocabulary."""

from __future__ import annotations

import copy

import pytest
import torch
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis
from nemo.collections.asr.parts.utils.timestamp_utils import process_timestamp_outputs

from nemo_fastdecode.streaming.token_text import TokenText
from nemo_fastdecode.streaming.word_timestamps import WordTimestamps
from nemo_fastdecode.tools import synthetic

SUBSAMPLING, STRIDE = 8, 0.01


@pytest.fixture(scope="module", params=["char", "bpe"])
def model(request):
    return synthetic.build_synthetic_model("tiny-streaming", seed=0, vocab=request.param)


def nemo_words(model, hyp: Hypothesis) -> list[dict]:
    """NeMo's words of a whole hypothesis (tensors, as its decoders return them)."""
    hyp = model.decoding.compute_rnnt_timestamps(copy.copy(hyp), "word")
    (hyp,) = process_timestamp_outputs([hyp], SUBSAMPLING, STRIDE)
    return hyp.timestamp["word"]


def random_hypothesis(model, length: int, seed: int) -> Hypothesis:
    g = torch.Generator().manual_seed(seed)
    blank = model.decoding.blank_id
    labels = torch.randint(0, blank, (length,), generator=g)  # every id but the blank
    frames = torch.sort(torch.randint(0, 4 * length + 1, (length,), generator=g)).values
    return Hypothesis(score=0.0, y_sequence=labels, timestamp=frames, dec_state=torch.zeros(3))


def test_words_of_slices_equal_nemos_words_of_the_same_tokens(model):
    words = WordTimestamps(TokenText(model.decoding), SUBSAMPLING, STRIDE)
    compared = 0
    for seed, length in enumerate((1, 2, 7, 40, 120)):
        hyp = random_hypothesis(model, length, seed)
        for first, stop in ((0, length), (0, length // 2), (length // 3, length)):
            if stop <= first:
                continue
            part = Hypothesis(
                score=0.0, y_sequence=hyp.y_sequence[first:stop], timestamp=hyp.timestamp[first:stop], dec_state=None
            )
            want = nemo_words(model, part)
            assert want, (seed, first, stop)  # something to compare
            assert words(hyp, first, stop) == want, (seed, first, stop)
            compared += len(want)
        assert isinstance(hyp.timestamp, torch.Tensor) and hyp.dec_state is not None  # the input is left as it was
    assert compared > 20


def test_repeated_calls_give_the_same_words(model):
    """The remembered token texts change nothing across calls and hypotheses."""
    words = WordTimestamps(TokenText(model.decoding), SUBSAMPLING, STRIDE)
    hyps = [random_hypothesis(model, 30, seed) for seed in (11, 12)]
    first = [words(h, 0, 30) for h in hyps]
    assert all(first)
    assert [words(h, 0, 30) for h in hyps] == first
    assert first == [nemo_words(model, h) for h in hyps]
