"""The shipped trained models on the shipped example utterances (held-out sentences and voices): NeMo's decoding and
ours give the same token ids, and transcribe the examples well. Offline: NeMo's ``greedy_batch`` against
``fast_greedy``, NeMo's ``malsd_batch`` (beam 4; TDT's variant for the TDT model) against ``fast_beam``. Streaming:
NeMo's cache-aware streaming (its streaming script's batched ``conformer_stream_step`` loop, and each file alone)
against the ``StreamingEngine``, at every look-ahead of the streaming model."""

from __future__ import annotations

import pytest

from nemo_fastdecode.tools import models, trained_models
from nemo_fastdecode.tools.streaming_reference import reference_transcript
from nemo_fastdecode.tools.tiny_models.evaluation import (
    engine_decoded,
    nemo_streaming,
    offline_rows,
    read_pcm16,
    streaming_rows,
)

pytestmark = pytest.mark.usefixtures("single_thread")

#: most word errors on the examples (the models' held-out WER is about 5%)
MAX_WER = 0.15


@pytest.fixture(scope="module")
def entries() -> list[dict]:
    return trained_models.example_entries()


@pytest.fixture(scope="module")
def streaming_model():
    return models.load_model("trained-streaming")


@pytest.mark.parametrize("name", ["trained-tdt", "trained-streaming"])
def test_offline_greedy_and_beam_equal_nemo(name, entries):
    model = models.load_model(name)
    strategy = model.cfg.decoding.strategy
    rows = {r.decoding: r for r in offline_rows(model, entries, batch_size=4, beam_size=4)}
    pairs = [("greedy_batch (label loop)", "fast_greedy (label loop)"), ("malsd_batch (beam 4)", "fast_beam (beam 4)")]
    if name == "trained-streaming":  # RNN-T: the frame loops too, against NeMo's frame loop
        pairs = [("greedy_batch (frame loop)", f) for f in ("fast_greedy (label loop)", "fast_greedy (frame loop)")]
        pairs += [("malsd_batch (beam 4)", "fast_beam (beam 4)")]
    for nemo, ours in pairs:
        assert rows[nemo].tokens > 0 and rows[nemo].utterances == len(entries)  # there is something to compare
        assert rows[ours].reference == nemo and rows[ours].differing == 0, ours
        assert rows[ours].tokens == rows[nemo].tokens and rows[ours].wer == rows[nemo].wer
        assert rows[nemo].wer <= MAX_WER, (nemo, rows[nemo].examples)
    assert rows["ctc"].differing is None and rows["ctc"].tokens is None  # a hybrid: its CTC head, WER only
    assert model.cfg.decoding.strategy == strategy  # the model's decoding is restored


def test_streaming_engine_equals_nemo_streaming_at_every_look_ahead(streaming_model, entries):
    model = streaming_model
    default = list(model.encoder.att_context_size)
    rows = streaming_rows(model, entries, batch_size=4)
    contexts = [list(c) for c in model.encoder.att_context_size_all]
    assert [r.decoding for r in rows] == [
        f"{side} {c}" for c in contexts for side in ("NeMo streaming", "StreamingEngine")
    ]
    for nemo, ours in zip(rows[::2], rows[1::2], strict=True):
        assert nemo.tokens > 0 and nemo.utterances == len(entries)
        assert ours.reference == nemo.decoding and ours.differing == 0, ours.decoding
        assert ours.wer == nemo.wer <= MAX_WER, (nemo.decoding, nemo.examples)
    assert list(model.encoder.att_context_size) == default  # restored


def test_streaming_engine_equals_nemo_streaming_of_each_file_alone(streaming_model, entries):
    model = streaming_model
    default, context = list(model.encoder.att_context_size), [70, 1]
    paths = [e["audio_filepath"] for e in entries]
    pcm = read_pcm16(paths)
    alone = [reference_transcript(model, samples, context) for samples in pcm]
    assert all(r.token_ids for r in alone)
    ours = engine_decoded(model, pcm, context, num_slots=3)  # fewer slots than files: streams start as slots free up
    assert ours.token_ids == [r.token_ids for r in alone]
    assert ours.texts == [r.text for r in alone]
    batched = nemo_streaming(model, paths, batch_size=len(paths))  # at the look-ahead reference_transcript set
    assert batched.token_ids == ours.token_ids
    model.encoder.set_default_att_context_size(default)
