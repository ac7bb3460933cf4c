"""Token log-probabilities of greedy streams (``StreamOptions(token_logprobs=True)``): the final events carry one per
token, each the model's log-probability of that token at the step that chose it (the argmax there), and asking for
them changes no token."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tiny_streaming_model

from fastdecode_lab import synthetic as S
from nemo_fastdecode.streaming import StreamingEngine, StreamOptions
from nemo_fastdecode.streaming.token_logprobs import TokenLogprobs

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def model():
    return tiny_streaming_model()


@pytest.fixture(scope="module")
def pcm() -> np.ndarray:
    return np.round(S.synthetic_audio([1.9, 2.6], seed=11)[1] * 32768).astype(np.int16)  # the tiny model says words


def finals(engine: StreamingEngine, ids: list[int], pcm: np.ndarray) -> list:
    """Each stream's last event, the same audio pushed to all of them in 100 ms pieces."""
    for start in range(0, len(pcm), 1600):
        for stream_id in ids:
            engine.push(stream_id, pcm[start : start + 1600])
        engine.poll()
    for stream_id in ids:
        engine.finish(stream_id)
    last = {}
    while len(last) < len(ids):
        last.update({e.stream_id: e for e in engine.poll() if e.is_last})
    return [last[i] for i in ids]


def test_final_events_carry_each_tokens_logprob_the_argmax_of_its_step(model, pcm, monkeypatch):
    check_logprobs(StreamingEngine(model, 2), pcm, monkeypatch, tolerance=1e-5)


@pytest.mark.gpu
def test_token_logprobs_on_the_gpu_with_cuda_graphs(pcm, monkeypatch, exact_fp32):
    """On CUDA as in production: the step replayed from its CUDA graphs, the scoring pass after it."""
    model = tiny_streaming_model().cuda().eval()
    engine = StreamingEngine(model, 2, use_cuda_graphs=True)
    engine.warm_up()
    check_logprobs(engine, pcm, monkeypatch, tolerance=1e-4)


def check_logprobs(engine: StreamingEngine, pcm: np.ndarray, monkeypatch, tolerance: float) -> None:
    """One stream asks, one does not, the same audio: the same tokens; the asking stream's final carries one
    log-probability per token, each its step's argmax (within ``tolerance``: the scoring pass's arithmetic)."""
    steps = []  # each scored step of the one asking stream: (labels, the log-probabilities over the labels)
    distributions = TokenLogprobs.distributions

    def recorded(self, state, encoded, labels, frames):
        out = distributions(self, state, encoded, labels, frames)
        steps.append((labels.clone(), out.clone()))
        return out

    monkeypatch.setattr(TokenLogprobs, "distributions", recorded)
    asking, plain = (engine.open(StreamOptions(token_logprobs=flag)) for flag in (True, False))
    with_logprobs, without = finals(engine, [asking, plain], pcm)
    assert with_logprobs.token_ids  # something to compare
    assert with_logprobs.token_ids == without.token_ids  # asking changes no token
    assert without.logprobs is None
    pieces, values = zip(*with_logprobs.logprobs, strict=True)
    assert len(values) == len(with_logprobs.token_ids)
    assert all(np.isfinite(values)) and max(values) <= 0.0
    assert "".join(pieces).strip() == with_logprobs.text.strip()  # the pieces spell the text
    # one asking stream: every scored column is one of its tokens, each the argmax of its step's distribution
    labels = np.concatenate([label[0].cpu().numpy() for label, _ in steps])
    chosen = np.concatenate([dist[0].gather(1, label[0][:, None])[:, 0].cpu().numpy() for label, dist in steps])
    best = np.concatenate([dist[0].max(dim=1).values.cpu().numpy() for _, dist in steps])
    assert labels.tolist() == with_logprobs.token_ids
    np.testing.assert_allclose(chosen, values, rtol=0, atol=0)
    assert (chosen >= best - tolerance).all(), "a token was not the most likely label of its step: misaligned"


def test_token_logprobs_need_greedy_decoding(model):
    engine = StreamingEngine(model, 1, decoding="beam", beam_size=2)
    with pytest.raises(ValueError, match="token_logprobs needs greedy decoding; this engine decodes with 'beam'"):
        engine.open(StreamOptions(token_logprobs=True))
    assert engine.open_streams == []
