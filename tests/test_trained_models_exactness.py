"""The shipped trained models on the shipped example utterances (held-out sentences and voices): NeMo's decoding and
ours give the same token ids, and transcribe the examples well. Offline: NeMo's ``greedy_batch`` against
``fast_greedy``, NeMo's ``malsd_batch`` (beam 4; TDT's variant for the TDT model) against ``fast_beam``. Streaming:
NeMo's cache-aware streaming of each file alone (the whole file's features) against the ``StreamingEngine``, at two
look-aheads of the streaming model (the recipe's evaluation covers all four on the test split)."""

from __future__ import annotations

import pytest

from fastdecode_lab.tiny_models.evaluation import offline_rows, streaming_rows
from nemo_fastdecode.apps import models, trained_models

pytestmark = pytest.mark.usefixtures("single_thread")

#: most word errors on the examples (the models' held-out WER is about 5%)
MAX_WER = 0.15


@pytest.fixture(scope="module")
def entries() -> list[dict]:
    return trained_models.example_entries()


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


def test_streaming_engine_equals_nemo_streaming(entries):
    model = models.load_model("trained-streaming")
    default = list(model.encoder.att_context_size)
    contexts = [[70, 13], [70, 1]]  # [70, 0] steps one encoder frame at a time: many times slower on a CPU
    rows = streaming_rows(model, entries, batch_size=4, contexts=contexts)  # 4 slots, 6 files: streams wait for one
    sides = ("NeMo streaming", "StreamingEngine", "NeMo streaming script")
    assert [r.decoding for r in rows] == [f"{side} {c}" for c in contexts for side in sides]
    for nemo, ours, script in zip(rows[::3], rows[1::3], rows[2::3], strict=True):
        assert nemo.tokens > 0 and nemo.utterances == len(entries)  # there is something to compare
        assert ours.reference == nemo.decoding and ours.differing == 0, ours.decoding
        assert ours.wer == nemo.wer <= MAX_WER, (nemo.decoding, nemo.examples)
        assert script.reference == nemo.decoding and script.differing is not None and script.wer <= MAX_WER
    assert list(model.encoder.att_context_size) == default  # restored
