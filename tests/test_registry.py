"""fast_greedy through NeMo's usual paths (change_decoding_strategy, transcribe, hybrid models) and its errors."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB_SIZE, calibrated_model, make_networks, random_encoder_output, transcribe
from omegaconf import OmegaConf

from fastdecode_lab import synthetic
from nemo_fastdecode import valid_strategies
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer


def decoding_config(strategy: str, **greedy):
    return OmegaConf.create({"strategy": strategy, "greedy": {"max_symbols": 10, **greedy}})


@pytest.fixture(scope="module")
def audio():
    return synthetic.synthetic_audio([2.5, 1.0, 3.2], seed=1)


@pytest.mark.parametrize("preset", ["tiny-rnnt"])  # TDT, hybrid, BPE, streaming: tests/test_registry_models.py
def test_change_decoding_strategy_and_transcribe_match_greedy_batch(preset, audio):
    model = calibrated_model(preset, audio)
    base = OmegaConf.create({})
    kwargs = {"decoder_type": "rnnt"} if preset == "tiny-hybrid" else {}
    model.change_decoding_strategy(
        decoding_config("greedy_batch", loop_labels=False, use_cuda_graph_decoder=False), **kwargs
    )
    # NeMo 3.0 cannot make timestamps for char TDT models (IndexError in decode_ids_to_tokens, greedy_batch too)
    timestamps = preset != "tiny-tdt"
    expected = transcribe(model, audio, timestamps=timestamps)
    model.change_decoding_strategy(OmegaConf.merge(base, decoding_config("fast_greedy")), **kwargs)
    assert isinstance(model.decoding.decoding, FastGreedyBatchedInfer)
    assert model.cfg.decoding.strategy == "fast_greedy"
    actual = transcribe(model, audio, timestamps=timestamps)
    assert sum(len(h.y_sequence) for h in actual) > 0, "setup: the calibrated model should emit tokens"
    for e, a in zip(expected, actual, strict=True):
        assert a.text == e.text
        assert a.y_sequence.tolist() == list(map(int, e.y_sequence))
        if timestamps:
            assert a.timestamp["char"] == e.timestamp["char"] and a.timestamp["word"] == e.timestamp["word"]


def test_model_built_with_fast_greedy_in_its_config(audio):
    config = synthetic.make_synthetic_config("tiny-rnnt")
    config.decoding = decoding_config("fast_greedy", loop_labels=False)
    from nemo.collections.asr.models import EncDecRNNTModel

    model = EncDecRNNTModel(cfg=config).eval()
    assert isinstance(model.decoding.decoding, FastGreedyBatchedInfer)
    assert not model.decoding.decoding.loop_labels


def test_nemo_strategies_unchanged(audio):
    model = synthetic.build_synthetic_model("tiny-rnnt")
    model.change_decoding_strategy(decoding_config("greedy_batch"))
    assert type(model.decoding.decoding).__name__ == "GreedyBatchedRNNTInfer"
    assert "fast_greedy" in valid_strategies() and "greedy_batch" in valid_strategies()


def test_unknown_strategy_lists_valid_ones():
    model = synthetic.build_synthetic_model("tiny-rnnt")
    with pytest.raises(
        ValueError, match=r"'fastest_greedy'.*fast_greedy.*greedy_batch|'fastest_greedy'.*greedy_batch.*fast_greedy"
    ):
        model.change_decoding_strategy(decoding_config("fastest_greedy"))


@pytest.mark.parametrize(
    "greedy,error,match",
    [
        ({"max_symbolz": 3}, ValueError, r"max_symbolz.*valid options"),
        ({"graph_mode": "turbo"}, ValueError, r"'turbo'.*full_graph.*no_while_graph.*eager"),
        (
            {"ngram_lm_model": "/no/such/lm.nemo"},
            ValueError,
            r"decoding.greedy.ngram_lm_model='/no/such/lm.nemo'.*no such file",
        ),
        (
            {"ngram_lm_model": "/no/such/lm.nemo", "loop_labels": False},
            ValueError,
            r"decoding.greedy.ngram_lm_model needs decoding.greedy.loop_labels=true",
        ),
    ],
)
def test_unsupported_options_fail_clearly(greedy, error, match):
    model = synthetic.build_synthetic_model("tiny-rnnt")
    with pytest.raises(error, match=match):
        model.change_decoding_strategy(decoding_config("fast_greedy", **greedy))


@pytest.mark.parametrize(
    "top,greedy,expected",
    [
        ({"preserve_alignments": True}, {}, {"alignments": True, "confidence": False}),
        ({}, {"preserve_alignments": True}, {"alignments": True, "confidence": False}),
        (
            {"confidence_cfg": {"preserve_word_confidence": True, "method_cfg": {"name": "max_prob"}}},
            {},
            {"alignments": False, "confidence": True, "exclude_blank": True, "method": "max_prob"},
        ),
        (
            {},
            {"preserve_frame_confidence": True, "confidence_method_cfg": {"name": "max_prob"}},
            {"alignments": False, "confidence": True, "exclude_blank": True, "method": "max_prob"},
        ),
        (
            {"confidence_cfg": {"preserve_frame_confidence": True, "exclude_blank": False}},
            {},
            {"alignments": False, "confidence": True, "exclude_blank": False, "method": "entropy"},
        ),
    ],
)
def test_alignments_and_confidence_options_reach_the_computer(top, greedy, expected):
    """NeMo's keys (top level, greedy section, confidence_cfg) as NeMo resolves them for greedy_batch."""
    model = synthetic.build_synthetic_model("tiny-rnnt")
    model.change_decoding_strategy(OmegaConf.merge(decoding_config("fast_greedy", **greedy), top))
    records = model.decoding.decoding.computer.records
    assert {key: getattr(records, key) for key in ("alignments", "confidence")} == {
        key: expected[key] for key in ("alignments", "confidence")
    }
    if records.confidence:
        assert records.exclude_blank == expected["exclude_blank"]
        assert records.confidence_method_cfg.name == expected["method"]


@pytest.mark.parametrize("loop_labels", [True, False])
def test_per_stream_biasing_of_nemos_streaming_yamls(loop_labels):
    """NeMo's streaming pipeline YAMLs (asr_streaming_inference/*_rnnt.yaml) set enable_per_stream_biasing: true:
    the decoding computer gets NeMo's biasing multi-model (label looping); frame looping refuses it, as NeMo does."""
    from nemo.collections.asr.parts.context_biasing import BoostingTreeModelConfig
    from nemo.collections.asr.parts.context_biasing.biasing_multi_model import GPUBiasingMultiModel

    streaming_yaml_greedy = {
        "use_cuda_graph_decoder": False,
        "enable_per_stream_biasing": True,
        "preserve_frame_confidence": False,
        "ngram_lm_model": None,
        "boosting_tree": OmegaConf.to_container(OmegaConf.structured(BoostingTreeModelConfig())),
        "boosting_tree_alpha": 0.0,
        "loop_labels": loop_labels,
    }
    model = synthetic.build_synthetic_model("tiny-rnnt")
    if not loop_labels:
        with pytest.raises(ValueError, match="enable_per_stream_biasing=True needs loop_labels=True"):
            model.change_decoding_strategy(decoding_config("fast_greedy", **streaming_yaml_greedy))
        return
    model.change_decoding_strategy(decoding_config("fast_greedy", **streaming_yaml_greedy))
    computer = model.decoding.decoding.decoding_computer
    assert computer.per_stream_biasing_enabled and isinstance(computer.biasing_multi_model, GPUBiasingMultiModel)
    assert computer.biasing_multi_model.vocab_size == model.decoding.blank_id and computer.fusion_models == []


def test_tdt_frame_looping_is_rejected():
    model = synthetic.build_synthetic_model("tiny-tdt")
    with pytest.raises(ValueError, match="loop_labels=False.*RNN-T only"):
        model.change_decoding_strategy(decoding_config("fast_greedy", loop_labels=False))


def test_fused_kernels_option_reaches_the_computer_and_fails_clearly_without_triton(monkeypatch):
    model = synthetic.build_synthetic_model("tiny-rnnt")
    model.change_decoding_strategy(decoding_config("fast_greedy", fused_kernels=True))
    computer = model.decoding.decoding.computer
    assert computer.fused_kernels is True
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    encoder_output = torch.randn([2, 5, model.cfg.encoder.d_model])
    with pytest.raises(ValueError, match="fused_kernels=True needs a CUDA device or TRITON_INTERPRET=1, got cpu"):
        computer(encoder_output, torch.tensor([5, 3]))


@pytest.mark.parametrize("value", [None, True, False])
def test_exact_predictor_option_reaches_the_computer(value):
    """Opt-in: only ``true`` builds the exact predictor; the default (``false``) and ``null`` keep NeMo's modules."""
    model = synthetic.build_synthetic_model("tiny-rnnt")  # (a TDT model needs its own decoding section's durations)
    section = decoding_config("fast_greedy") if value is None else decoding_config("fast_greedy", exact_predictor=value)
    model.change_decoding_strategy(section)
    computer = model.decoding.decoding.computer
    assert (computer.exact_predictor is not None) == (value is True)  # the tiny model's LSTM is covered


def test_forcing_a_graph_mode_on_cpu_is_an_error():
    decoder, joint = make_networks()
    decode = FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, max_symbols_per_step=3, graph_mode="full_graph")
    x, lengths = random_encoder_output(2, 5)
    with pytest.raises(ValueError, match="full_graph.*needs a CUDA device"):
        decode(encoder_output=x, encoded_lengths=lengths)


@pytest.mark.parametrize(
    "make_input,match",
    [
        (lambda x, n: (x.long(), n), "must be a float tensor"),
        (lambda x, n: (x, n.float()), "must be an integer tensor"),
        (lambda x, n: (x, n[:1]), r"encoded_lengths must be \[B\]=\[2\]"),
        (lambda x, n: (x, n + 10), r"in \[0, T=5\]"),
        (lambda x, n: (x, n - 10), r"in \[0, T=5\]"),
    ],
)
def test_bad_inputs_name_the_problem(make_input, match):
    decoder, joint = make_networks()
    decode = FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, max_symbols_per_step=3)
    x, lengths = random_encoder_output(2, 5, lengths=[5, 3])
    bad_x, bad_lengths = make_input(x, lengths)
    with pytest.raises((ValueError, TypeError), match=match):
        decode.forward(encoder_output=bad_x, encoded_lengths=bad_lengths)


def test_partial_hypotheses_from_another_strategy_are_rejected():
    from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis

    decoder, joint = make_networks()
    decode = FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, max_symbols_per_step=3)
    x, lengths = random_encoder_output(1, 5, lengths=[5])
    foreign = Hypothesis(score=0.0, y_sequence=[], dec_state=(torch.zeros(1), torch.zeros(1)))
    with pytest.raises(ValueError, match="can only continue from hypotheses it produced"):
        decode(encoder_output=x, encoded_lengths=lengths, partial_hypotheses=[foreign])
