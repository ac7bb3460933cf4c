"""Options objects passed whole: a decoding section is parsed once, into the options dataclass the decoder classes
are built from; the rule that fusion needs the label loop lives in :mod:`nemo_fastdecode.config`."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from fastdecode_lab import synthetic
from nemo_fastdecode import config
from nemo_fastdecode.beam.infer import FastBeamBatchedInfer
from nemo_fastdecode.config import FastBeamConfig, FastGreedyConfig, LabelLoopOnly, options_from_section
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer
from nemo_fastdecode.nemo import registry


def test_fusion_needs_the_label_loop_in_the_options_dataclass():
    with pytest.raises(LabelLoopOnly, match=r"^ngram_lm_model needs loop_labels=True"):
        FastGreedyConfig(loop_labels=False, ngram_lm_model="lm.arpa")
    tree = {"key_phrases_list": ["hello"]}
    with pytest.raises(ValueError, match=r"decoding.greedy.ngram_lm_model / decoding.greedy.boosting_tree needs "):
        options_from_section(
            FastGreedyConfig, {"loop_labels": False, "ngram_lm_model": "lm", "boosting_tree": tree}, "decoding.greedy"
        )
    assert options_from_section(FastGreedyConfig, {"ngram_lm_model": "lm.arpa"}).loop_labels
    assert config.fusion_keys({"boosting_tree": {"key_phrases_list": []}}) == []


@pytest.fixture(scope="module")
def model():
    return synthetic.build_synthetic_model("tiny-rnnt")


def test_a_section_is_parsed_once_and_passed_whole(model, monkeypatch):
    calls = []

    def counting(*args, **kwargs):
        calls.append(args[0])
        return options_from_section(*args, **kwargs)

    monkeypatch.setattr(registry, "options_from_section", counting)
    greedy = {"max_symbols_per_step": 7, "graph_mode": "eager", "fast_math": False, "offline_batching": True}
    model.change_decoding_strategy(OmegaConf.create({"strategy": "fast_greedy", "greedy": greedy}))
    infer = model.decoding.decoding
    assert calls == [FastGreedyConfig]
    assert isinstance(infer, FastGreedyBatchedInfer) and isinstance(infer.options, FastGreedyConfig)
    assert infer.options.graph_mode == "eager" and infer.offline_batching
    assert infer.computer.max_symbols == 7  # NeMo's max_symbols_per_step, resolved once, by the decoder
    calls.clear()
    model.change_decoding_strategy(OmegaConf.create({"strategy": "fast_beam", "beam": {"beam_size": 2}}))
    assert calls == [FastBeamConfig]
    assert model.decoding.decoding.options == FastBeamConfig(beam_size=2)


def test_from_options_builds_what_the_keywords_build(model):
    networks = {"decoder_model": model.decoder, "joint_model": model.joint, "blank_index": model.decoder.blank_idx}
    options = FastGreedyConfig(graph_mode="eager", loop_labels=False, use_cuda_graph_decoder=False)
    built = FastGreedyBatchedInfer.from_options(options, **networks)
    plain = FastGreedyBatchedInfer(**networks, graph_mode="eager", loop_labels=False, use_cuda_graph_decoder=False)
    assert built.options is options and plain.options is None
    assert type(built.computer) is type(plain.computer) and built.computer.max_symbols == plain.computer.max_symbols
    beam = FastBeamBatchedInfer.from_options(FastBeamConfig(beam_size=3, max_symbols=None), **networks)
    assert beam.beam_size == 3 and beam.computer.max_symbols == 10  # None: as malsd_batch, 10 with graphs allowed
