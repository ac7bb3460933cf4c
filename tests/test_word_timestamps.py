"""``WordTimestamps`` equals NeMo's word timestamps (``compute_rnnt_timestamps`` + ``process_timestamp_outputs``) on
slices of random hypotheses, for a character and a sentencepiece BPE vocabulary."""

from __future__ import annotations

import copy

import pytest
import torch
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis
from nemo.collections.asr.parts.utils.timestamp_utils import process_timestamp_outputs

from fastdecode_lab import synthetic
from nemo_fastdecode.streaming.token_text import TokenText
from nemo_fastdecode.streaming.word_timestamps import WordTimestamps

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


def test_character_tdt_labels_that_nemo_spells_as_nothing_still_get_words():
    """NeMo's character TDT decoding drops its last len(durations) labels from text, and its own word timestamps
    fail on them; ours give the words of NeMo's text."""
    model = synthetic.build_synthetic_model("tiny-tdt-streaming", seed=0, vocab="char")
    dropped = model.decoding.blank_id - len(model.cfg.model_defaults.tdt_durations)
    assert model.decoding.decode_ids_to_tokens([dropped]) == []  # the premise: NeMo spells it as nothing
    hyp = random_hypothesis(model, 60, seed=5)
    hyp.token_duration = torch.randint(0, 5, (60,), generator=torch.Generator().manual_seed(6))
    assert bool((hyp.y_sequence >= dropped).any()) and bool((hyp.y_sequence < dropped).any())
    with pytest.raises(IndexError):
        nemo_words(model, hyp)
    got = WordTimestamps(TokenText(model.decoding), SUBSAMPLING, STRIDE)(hyp, 0, 60)
    assert got
    assert " ".join(w["word"] for w in got) == " ".join(
        model.decoding.decode_ids_to_str(hyp.y_sequence.tolist()).split()
    )
    kept = hyp.y_sequence < dropped  # without those labels, NeMo's words are ours
    clean = Hypothesis(score=0.0, y_sequence=hyp.y_sequence[kept], timestamp=hyp.timestamp[kept], dec_state=None)
    clean.token_duration = hyp.token_duration[kept]
    assert WordTimestamps(TokenText(model.decoding), SUBSAMPLING, STRIDE)(clean, 0, int(kept.sum())) == nemo_words(
        model, clean
    )


def test_offsets_deep_copy_as_copy_deepcopy_does():
    """NeMo deep-copies the per-token offsets and then rewrites both copies: the direct copy is equal and shares no
    dict or list with the original (values other than ints and lists of ids take the generic copy)."""
    from nemo_fastdecode.streaming.word_timestamps import _Offsets

    plain = [{"char": [5], "start_offset": 3, "end_offset": 4}, {"char": [7, 8], "start_offset": 4, "end_offset": 6}]
    for offsets in (plain, plain + [{"char": [9], "start_offset": torch.tensor(6), "end_offset": 7}]):
        copied = copy.deepcopy(_Offsets(offsets))
        assert type(copied) is list and copied == copy.deepcopy(offsets)
        for mine, theirs in zip(copied, offsets, strict=True):
            assert mine is not theirs and mine["char"] is not theirs["char"]
