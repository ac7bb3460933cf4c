"""fast_greedy in every NeMo path that builds a transducer decoding, for TDT, hybrid and BPE models.

Constructor, ``change_decoding_strategy`` + ``transcribe`` (with timestamps where NeMo 3.0 makes them) and
cache-aware ``conformer_stream_step`` driven as NeMo's streaming script does, each against NeMo's
``greedy_batch`` (no CUDA graphs) on the same model.
"""

from __future__ import annotations

import pytest
import torch
from nemo.collections.asr.parts.utils.streaming_utils import CacheAwareStreamingAudioBuffer
from omegaconf import OmegaConf, open_dict

from fastdecode_lab import synthetic
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer

pytestmark = pytest.mark.usefixtures("single_thread")

DURATIONS = [2.5, 1.0, 3.2]
STREAM_DURATIONS = [2.2, 0.9, 1.6]  # a batch of streams of different lengths


def decoding_config(model, strategy: str, **greedy):
    """The model's own decoding config (TDT durations, ...) with the strategy and greedy options replaced."""
    base = OmegaConf.to_container(model.cfg.decoding)
    overrides = {"strategy": strategy, "greedy": {"max_symbols": 10, "use_cuda_graph_decoder": False, **greedy}}
    return OmegaConf.merge(base, overrides)


@pytest.fixture(scope="module")
def audio():
    return synthetic.synthetic_audio(DURATIONS, seed=1)


@pytest.fixture(scope="module")
def models():
    """Calibrated models shared by this module's tests, one per (preset, vocab, seed)."""
    return {}


def calibrated(models: dict, preset: str, vocab: str, audio, *, seed: int = 0, rate: float = 0.3):
    key = (preset, vocab, seed)
    if key not in models:
        model = synthetic.build_synthetic_model(preset, vocab=vocab, seed=seed)
        encoded, lengths = synthetic.encode(model, audio, batch_size=len(audio), device="cpu")
        synthetic.calibrate_blank_bias(model, encoded, lengths, rate, iterations=6, tolerance=0.05)
        models[key] = model
    return models[key]


def transcribe(model, audio, batch_size, timestamps):
    hyps = model.transcribe(audio, batch_size=batch_size, verbose=False, timestamps=timestamps)
    model.eval()  # NeMo 3.0's transcribe leaves modules in train mode
    return hyps[0] if isinstance(hyps, tuple) else hyps


def assert_same_hypotheses(expected, actual, timestamps: bool, tdt: bool):
    assert sum(len(h.y_sequence) for h in actual) > 0, "setup: the calibrated model should emit tokens"
    for e, a in zip(expected, actual, strict=True):
        assert a.text == e.text
        assert list(map(int, a.y_sequence)) == list(map(int, e.y_sequence))
        assert a.score == pytest.approx(e.score, rel=1e-5, abs=1e-5)
        if tdt and e.token_duration is not None:  # with timestamps
            assert list(map(int, a.token_duration)) == list(map(int, e.token_duration))
        if timestamps:
            for kind in ("timestep", "char", "word", "segment"):
                assert a.timestamp[kind] == e.timestamp[kind], kind


# (preset, vocab, timestamps, decoder_type). Char TDT: NeMo 3.0 itself crashes making its timestamps
# (IndexError in decode_ids_to_tokens, greedy_batch too), so it runs without them.
MODEL_CASES = [
    ("tiny-tdt", "char", False, None),
    ("tiny-tdt", "bpe", True, None),
    ("tiny-hybrid", "char", True, "rnnt"),
    ("tiny-hybrid", "bpe", True, "rnnt"),
    ("tiny-rnnt", "bpe", True, None),
]


@pytest.mark.parametrize("preset,vocab,timestamps,decoder_type", MODEL_CASES, ids=lambda v: str(v))
def test_change_decoding_strategy_and_transcribe_match_greedy_batch(
    preset, vocab, timestamps, decoder_type, audio, models
):
    model = calibrated(models, preset, vocab, audio)
    tdt = preset == "tiny-tdt"
    kwargs = {"decoder_type": decoder_type} if decoder_type else {}
    # NeMo 3.0's greedy_batch TDT records a token's duration from the wrong frame when another utterance
    # of the batch is still skipping blanks (tdt_label_looping.py, inner loop overwrites `durations` for
    # every row); at batch size 1 it is right, and fast_greedy must not depend on the batch anyway
    baseline_batch = 1 if tdt else 2
    model.change_decoding_strategy(decoding_config(model, "greedy_batch", loop_labels=True), **kwargs)
    expected = transcribe(model, audio, baseline_batch, timestamps)
    model.change_decoding_strategy(decoding_config(model, "fast_greedy"), **kwargs)
    assert isinstance(model.decoding.decoding, FastGreedyBatchedInfer)
    assert model.cfg.decoding.strategy == "fast_greedy"
    for batch_size in {baseline_batch, 2}:
        assert_same_hypotheses(expected, transcribe(model, audio, batch_size, timestamps), timestamps, tdt)


def test_tdt_model_built_with_fast_greedy_in_its_config(audio, models):
    reference = calibrated(models, "tiny-tdt", "char", audio)
    config = synthetic.make_synthetic_config("tiny-tdt")
    with open_dict(config):
        config.decoding = decoding_config(reference, "fast_greedy")
    from nemo.collections.asr.models import EncDecRNNTModel

    model = EncDecRNNTModel(cfg=config).eval()
    assert isinstance(model.decoding.decoding, FastGreedyBatchedInfer)
    assert model.decoding.decoding.computer is not None
    model.load_state_dict(reference.state_dict())
    reference.change_decoding_strategy(decoding_config(reference, "greedy_batch", loop_labels=True))
    expected = transcribe(reference, audio, 1, timestamps=False)
    assert_same_hypotheses(expected, transcribe(model, audio, 1, timestamps=False), timestamps=False, tdt=True)


# ---- cache-aware streaming through NeMo's conformer_stream_step --------------------------------------------


@pytest.fixture(scope="module")
def streaming_model(models):
    # the random streaming model emits one token over and over at 0.3 tokens per frame; seed 1 at 0.6 varies
    audio = synthetic.synthetic_audio(STREAM_DURATIONS, seed=3)
    return calibrated(models, "tiny-streaming", "char", audio, seed=1, rate=0.6)


def stream_with_nemo(model, audio):
    """NeMo's speech_to_text_cache_aware_streaming_infer.py loop: per step, every stream's partial hypothesis."""
    buffer = CacheAwareStreamingAudioBuffer(model=model)
    for signal in audio:
        buffer.append_audio(signal)
    channel, time, channel_len = model.encoder.get_initial_cache_state(batch_size=len(audio))
    drop = model.encoder.streaming_cfg.drop_extra_pre_encoded
    hyps, pred, steps = None, None, []
    with torch.inference_mode():
        for step, (chunk, chunk_len) in enumerate(buffer):
            pred, texts, channel, time, channel_len, hyps = model.conformer_stream_step(
                processed_signal=chunk,
                processed_signal_length=chunk_len,
                cache_last_channel=channel,
                cache_last_time=time,
                cache_last_channel_len=channel_len,
                keep_all_outputs=buffer.is_buffer_empty(),
                previous_hypotheses=hyps,
                previous_pred_out=pred,
                drop_extra_pre_encoded=0 if step == 0 else drop,
                return_transcription=True,
            )
            steps.append([(h.text, list(map(int, h.y_sequence)), h.score) for h in texts])
    return steps


def test_conformer_stream_step_matches_greedy_batch(streaming_model):
    # label looping: NeMo's frame-looping greedy_batch does not take previous_hypotheses (NotImplementedError)
    model = streaming_model
    audio = synthetic.synthetic_audio(STREAM_DURATIONS, seed=3)
    model.change_decoding_strategy(decoding_config(model, "greedy_batch", loop_labels=True), decoder_type="rnnt")
    expected = stream_with_nemo(model, audio)
    model.change_decoding_strategy(decoding_config(model, "fast_greedy", loop_labels=True), decoder_type="rnnt")
    assert isinstance(model.decoding.decoding, FastGreedyBatchedInfer)
    actual = stream_with_nemo(model, audio)
    # setup: several chunks, and tokens emitted after the first one (so previous_hypotheses are continued)
    assert len(expected) > 2
    assert any(len(final[1]) > len(first[1]) for first, final in zip(expected[0], expected[-1], strict=True))
    assert len({token for _, tokens, _ in expected[-1] for token in tokens}) > 1, "setup: more than one token"
    assert len(actual) == len(expected)
    for step_expected, step_actual in zip(expected, actual, strict=True):
        for (e_text, e_tokens, e_score), (a_text, a_tokens, a_score) in zip(step_expected, step_actual, strict=True):
            assert (a_text, a_tokens) == (e_text, e_tokens)
            assert a_score == pytest.approx(e_score, rel=1e-5, abs=1e-5)
