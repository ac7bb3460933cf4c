"""Dropped decoders freed by Python's cyclic collector inside another decoder's CUDA-graph capture.

Decoders (NeMo's and ours) hold reference cycles, so a dropped one is freed at whatever allocation triggers the
collector. NeMo's decoders capture with ``torch.cuda.graph``, which no longer collects garbage first and does not
pause the collector: a dropped decoder's graphs destroyed there fail NeMo's capture, and NeMo's fallback then fails on
the stream still capturing ("Capture must end on the same stream it began on"; the synthetic trained-like
calibration of a BPE preset hit this on every load). NeMo's captures now run with the collector paused
(:mod:`nemo_fastdecode.nemo.captures`); ours did already, and our graphs collected inside someone else's capture
are kept until our next one (:func:`~nemo_fastdecode.graphs.capture.keep_if_capturing`). Here the collector runs at
every allocation to make it certain.

Marked ``gpu``: skipped on machines without CUDA (CI); run on a GPU host with ``pytest -m gpu``.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import pytest
from conftest import make_networks, random_encoder_output
from test_greedy_exactness import REALISTIC_BIAS, assert_same_hypotheses, baseline, ours

from fastdecode_lab import synthetic
from fastdecode_lab.models import demo_audio
from fastdecode_lab.synthetic.trained_like import _stats

pytestmark = pytest.mark.gpu


@contextlib.contextmanager
def collector_at_every_allocation() -> Iterator[None]:
    threshold = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)


def test_calibration_rounds_free_their_decoders_graphs_outside_captures():
    """Each calibration round builds NeMo's CUDA-graph decoder and drops it; the next round's capture must not free
    the last (the path that failed)."""
    model = synthetic.build_synthetic_model("tiny-rnnt", device="cuda")
    encoded, lengths = synthetic.encode(model, demo_audio(0), batch_size=3, device="cuda")  # lists of batches
    batches = list(zip(encoded, lengths, strict=True))
    gc.collect()
    with collector_at_every_allocation():
        rounds = [_stats(model, batches, max_symbols=10) for _ in range(3)]
    assert rounds[0].tokens > 0, "setup: the model should emit tokens"
    assert all(r.tokens == rounds[0].tokens for r in rounds)


def test_a_dropped_fast_greedy_freed_inside_nemos_capture_leaves_it_intact():
    decoder, joint = make_networks(seed=21, blank_bias=REALISTIC_BIAS["rnnt"])
    decoder, joint = decoder.cuda(), joint.cuda()
    x, lengths = random_encoder_output(4, 30, seed=22, lengths=[30, 12, 1, 25], device="cuda")
    expected = baseline("rnnt", decoder, joint, 10, loop_labels=True)(encoder_output=x, encoded_lengths=lengths)[0]
    assert sum(len(h.y_sequence) for h in expected) > 0, "setup: the networks should emit tokens"
    gc.collect()
    fast = ours("rnnt", decoder, joint, 10)
    fast(encoder_output=x, encoded_lengths=lengths)  # captures its graphs
    assert fast.computer.graph_mode is not None
    del fast  # a reference cycle holding CUDA graphs, for the collector to free
    with collector_at_every_allocation():
        nemo = baseline("rnnt", decoder, joint, 10, loop_labels=True, use_cuda_graph_decoder=True)
        actual = nemo(encoder_output=x, encoded_lengths=lengths)[0]
    assert nemo.decoding_computer.cuda_graphs_mode is not None
    assert_same_hypotheses(expected, actual)


def test_a_dropped_nemo_decoder_freed_inside_another_nemo_capture_leaves_it_intact():
    """NeMo's own decoders: one dropped after capturing, the next one's capture runs with the collector paused
    (:mod:`nemo_fastdecode.nemo.captures`)."""
    decoder, joint = make_networks(tdt=True, seed=23, blank_bias=REALISTIC_BIAS["tdt"])
    decoder, joint = decoder.cuda(), joint.cuda()
    x, lengths = random_encoder_output(4, 30, seed=24, lengths=[30, 12, 1, 25], device="cuda")
    expected = baseline("tdt", decoder, joint, 10)(encoder_output=x, encoded_lengths=lengths)[0]
    assert sum(len(h.y_sequence) for h in expected) > 0, "setup: the networks should emit tokens"
    gc.collect()
    first = baseline("tdt", decoder, joint, 10, use_cuda_graph_decoder=True)
    first(encoder_output=x, encoded_lengths=lengths)  # captures its graphs
    del first  # a reference cycle holding CUDA graphs
    with collector_at_every_allocation():
        second = baseline("tdt", decoder, joint, 10, use_cuda_graph_decoder=True)
        actual = second(encoder_output=x, encoded_lengths=lengths)[0]
    assert second.decoding_computer.cuda_graphs_mode is not None
    assert [list(map(int, h.y_sequence)) for h in actual] == [list(map(int, h.y_sequence)) for h in expected]
