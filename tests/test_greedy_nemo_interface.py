"""FastGreedyBatchedInfer stands in for NeMo's greedy_batch classes: their constructor arguments."""

from __future__ import annotations

import inspect

import pytest
from conftest import TDT_DURATIONS, VOCAB_SIZE, make_networks, random_encoder_output
from nemo.collections.asr.parts.submodules.rnnt_greedy_decoding import GreedyBatchedRNNTInfer, GreedyBatchedTDTInfer
from nemo.collections.asr.parts.utils.asr_confidence_utils import ConfidenceMethodConfig
from omegaconf import OmegaConf
from test_greedy_exactness import REALISTIC_BIAS, assert_same_hypotheses

from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer

NEMO_CLASSES = {"rnnt": GreedyBatchedRNNTInfer, "tdt": GreedyBatchedTDTInfer}


def nemo_arguments(kind: str, decoder, joint, **changes) -> dict:
    """The keyword arguments NeMo's RNNTDecoding passes its greedy_batch class (rnnt_decoding.py), graphs off."""
    arguments = {
        "decoder_model": decoder,
        "joint_model": joint,
        "blank_index": VOCAB_SIZE,
        "max_symbols_per_step": 3,
        "preserve_alignments": False,
        "preserve_frame_confidence": False,
        "exclude_blank_from_confidence": True,
        "confidence_method_cfg": OmegaConf.structured(ConfidenceMethodConfig()),
        "use_cuda_graph_decoder": False,
        "fusion_models": None,
        "fusion_models_alpha": None,
        "enable_per_stream_biasing": False,
    }
    if kind == "tdt":
        arguments.update(durations=TDT_DURATIONS, include_duration=True, include_duration_confidence=False)
    else:
        arguments.update(loop_labels=True)
    return {**arguments, **changes}


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_every_argument_of_nemos_class_is_accepted(kind):
    ours = inspect.signature(FastGreedyBatchedInfer.__init__).parameters
    missing = [name for name in inspect.signature(NEMO_CLASSES[kind].__init__).parameters if name not in ours]
    assert missing == []


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_built_with_nemos_arguments_it_decodes_like_nemo(kind):
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=REALISTIC_BIAS[kind])
    arguments = nemo_arguments(kind, decoder, joint)
    nemo, fast = NEMO_CLASSES[kind](**arguments), FastGreedyBatchedInfer(**arguments)
    assert fast.exclude_blank_from_confidence and fast.max_symbols == 3 and not fast.use_cuda_graph_decoder
    x, lengths = random_encoder_output(4, 20, seed=4)
    expected = nemo(encoder_output=x, encoded_lengths=lengths)[0]
    assert sum(len(h.y_sequence) for h in expected) > 0, "setup: the network should emit labels"
    # NeMo's TDT durations may come from another row of the batch (see test_greedy_exactness)
    assert_same_hypotheses(expected, fast(encoder_output=x, encoded_lengths=lengths)[0])


@pytest.mark.parametrize(
    "kind,changes,records",
    [
        ("rnnt", {"preserve_alignments": True}, {"alignments": True, "confidence": False}),
        ("rnnt", {"preserve_frame_confidence": True}, {"alignments": False, "confidence": True}),
        ("tdt", {"preserve_frame_confidence": True}, {"alignments": False, "confidence": True}),
        (
            "tdt",
            {"preserve_frame_confidence": True, "include_duration_confidence": True},
            {"confidence": True, "duration_confidence": True},
        ),
    ],
)
def test_alignment_and_confidence_arguments_reach_the_computer(kind, changes, records):
    """NeMo's recording arguments are taken as NeMo takes them (their values: tests/test_greedy_records.py)."""
    decoder, joint = make_networks(tdt=kind == "tdt")
    computer = FastGreedyBatchedInfer(**nemo_arguments(kind, decoder, joint, **changes)).computer
    assert {key: getattr(computer.records, key) for key in records} == records


def test_fusion_models_with_the_frame_loop_are_refused_as_nemo_refuses_them():
    decoder, joint = make_networks()
    changes = {"fusion_models": [object()], "fusion_models_alpha": [0.5], "loop_labels": False}
    with pytest.raises(ValueError, match="fusion_models.*loop_labels=True"):
        FastGreedyBatchedInfer(**nemo_arguments("rnnt", decoder, joint, **changes))


def test_arguments_after_max_symbols_are_keywords():
    """NeMo's RNN-T and TDT classes order them differently: a positional call would be ambiguous."""
    decoder, joint = make_networks(tdt=True)
    with pytest.raises(TypeError):
        FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, 3, TDT_DURATIONS)


def test_cuda_graph_switches_keep_use_cuda_graph_decoder():
    """NeMo turns graphs off around training and back on after it; not where the user disallowed them."""
    decoder, joint = make_networks()
    allowed = FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, 3)
    assert allowed.disable_cuda_graphs() and not allowed.computer.use_cuda_graphs
    assert allowed.maybe_enable_cuda_graphs() and allowed.computer.use_cuda_graphs
    disallowed = FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, 3, use_cuda_graph_decoder=False)
    assert not disallowed.maybe_enable_cuda_graphs() and not disallowed.computer.use_cuda_graphs
