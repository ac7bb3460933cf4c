"""fast_greedy keeps NeMo's alignments and frame / token / word confidence, equal to NeMo's ``greedy_batch``.

Baselines: NeMo's decoder of the same algorithm (RNN-T frame loop ``loop_labels=False``, RNN-T and TDT label loop),
no CUDA graphs, fp32 on the CPU, on the same encoder outputs. Labels are compared exactly, and so are logits and
confidence of the label loops (the joint's output comes from the same ops). NeMo's frame loop projects each
frame's encoder output on its own (``joint.joint``) where ours projects the batch once: the GEMMs differ in shape,
so there logits and confidence agree to fp32 rounding (bit for bit on the tiny test networks where BLAS rounds
a row alike at any shape, e.g. MKL on AVX2; not MKL on AVX-512).
"""

from __future__ import annotations

import pytest
import torch
from conftest import TDT_DURATIONS, VOCAB_SIZE, make_networks, random_encoder_output
from nemo.collections.asr.parts.submodules.rnnt_greedy_decoding import GreedyBatchedRNNTInfer, GreedyBatchedTDTInfer
from omegaconf import OmegaConf

from fastdecode_lab import synthetic
from nemo_fastdecode.graphs import GraphMode
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer
from nemo_fastdecode.greedy.records import StepRecords

pytestmark = pytest.mark.usefixtures("single_thread")

ALGORITHMS = [("rnnt", False), ("rnnt", True), ("tdt", True)]  # (model kind, loop_labels)
ALGORITHM_IDS = ["rnnt-frame", "rnnt-label", "tdt-label"]
REALISTIC_BIAS = {"rnnt": 0.9, "tdt": 0.5}
LENGTHS = [24, 1, 17, 0, 9, 24]  # ragged, with a zero-length row
# what to keep: NeMo's decoder options
RECORDS = {
    "alignments": {"preserve_alignments": True},
    "confidence": {"preserve_frame_confidence": True, "exclude_blank_from_confidence": True},
    "confidence-with-blanks": {"preserve_frame_confidence": True},
    "both": {"preserve_alignments": True, "preserve_frame_confidence": True, "exclude_blank_from_confidence": True},
}
METHODS = {
    "max_prob": {"name": "max_prob"},
    "max_prob-alpha1": {"name": "max_prob", "alpha": 1.0},
    "tsallis-exp": {"name": "entropy", "entropy_type": "tsallis", "entropy_norm": "exp", "alpha": 0.33},
    "tsallis-lin-alpha1": {"name": "entropy", "entropy_type": "tsallis", "entropy_norm": "lin", "alpha": 1.0},
    "renyi-lin": {"name": "entropy", "entropy_type": "renyi", "entropy_norm": "lin", "alpha": 0.5},
    "renyi-exp": {"name": "entropy", "entropy_type": "renyi", "entropy_norm": "exp", "alpha": 0.25},
    "gibbs-exp": {"name": "entropy", "entropy_type": "gibbs", "entropy_norm": "exp", "alpha": 0.5},
    "gibbs-lin-alpha1": {"name": "entropy", "entropy_type": "gibbs", "entropy_norm": "lin", "alpha": 1.0},
}


def nemo_decoder(kind: str, decoder, joint, max_symbols, loop_labels: bool, **records):
    if kind == "tdt":
        return GreedyBatchedTDTInfer(
            decoder, joint, VOCAB_SIZE, durations=TDT_DURATIONS, max_symbols_per_step=max_symbols,
            use_cuda_graph_decoder=False, include_duration=True, **records,
        )  # fmt: skip
    return GreedyBatchedRNNTInfer(
        decoder, joint, VOCAB_SIZE, max_symbols_per_step=max_symbols, loop_labels=loop_labels,
        use_cuda_graph_decoder=False, **records,
    )  # fmt: skip


def fast_decoder(kind: str, decoder, joint, max_symbols, loop_labels: bool, **options):
    return FastGreedyBatchedInfer(
        decoder, joint, VOCAB_SIZE, max_symbols_per_step=max_symbols,
        durations=TDT_DURATIONS if kind == "tdt" else None, loop_labels=loop_labels, include_duration=kind == "tdt",
        **options,
    )  # fmt: skip


def assert_same_confidence(expected: list, actual: list, exact: bool, where: str) -> None:
    """Confidence values (floats, 0-d or ``[2]`` tensors, lists of them) of the same types, equal or, unless
    ``exact``, equal to fp32 rounding."""
    assert len(actual) == len(expected), where
    for e, a in zip(expected, actual, strict=True):
        assert type(a) is type(e), where
        if isinstance(e, torch.Tensor):
            assert a.dtype == e.dtype and a.shape == e.shape, where
        e, a = torch.as_tensor(e, dtype=torch.float64), torch.as_tensor(a, dtype=torch.float64)
        if exact:
            assert torch.equal(a, e), where
        else:
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6, msg=where)


def assert_same_records(expected, actual, blank: int = VOCAB_SIZE, exact: bool = True) -> None:
    """Alignments, frame confidence and precomputed non-blank confidence equal, row by row; something compared.

    ``exact``: logits and confidence bit for bit (else to fp32 rounding)."""
    assert sum(len(h.y_sequence) for h in actual) > 0, "setup: the decoders should emit labels"
    compared = {"alignments": 0, "blank steps": 0, "frame confidence": 0, "precomputed": 0}
    for row, (e, a) in enumerate(zip(expected, actual, strict=True)):
        assert a.y_sequence.tolist() == e.y_sequence.tolist(), f"row {row}: labels"
        assert (a.alignments is None) == (e.alignments is None), f"row {row}: alignments kept"
        if e.alignments is not None:
            assert len(a.alignments) == len(e.alignments), f"row {row}: frames"
            for frame, (e_steps, a_steps) in enumerate(zip(e.alignments, a.alignments, strict=True)):
                assert len(a_steps) == len(e_steps), f"row {row} frame {frame}: steps"
                for (e_logits, e_label), (a_logits, a_label) in zip(e_steps, a_steps, strict=True):
                    assert torch.equal(a_label, e_label) and a_label.dtype == e_label.dtype
                    assert a_logits.dtype == e_logits.dtype
                    if exact:
                        assert torch.equal(a_logits, e_logits), f"row {row} frame {frame}: logits"
                    else:  # other GEMM shapes: BLAS may order the joint's sums differently
                        torch.testing.assert_close(a_logits, e_logits, rtol=1e-5, atol=1e-5)
                    compared["alignments"] += 1
                    compared["blank steps"] += int(a_label) == blank
        assert (a.frame_confidence is None) == (e.frame_confidence is None), f"row {row}: frame confidence kept"
        if e.frame_confidence is not None:
            assert len(a.frame_confidence) == len(e.frame_confidence), f"row {row}: frames"
            for frame, (e_steps, a_steps) in enumerate(zip(e.frame_confidence, a.frame_confidence, strict=True)):
                assert_same_confidence(e_steps, a_steps, exact, f"row {row} frame {frame}: confidence")
                compared["frame confidence"] += len(e_steps)
        precomputed = e.non_blank_step_confidence_precomputed
        assert (a.non_blank_step_confidence_precomputed is None) == (precomputed is None), f"row {row}"
        if precomputed is not None:
            assert_same_confidence(precomputed, a.non_blank_step_confidence_precomputed, exact, f"row {row}")
            compared["precomputed"] += len(precomputed)
        if e.frame_confidence is not None or precomputed is not None:
            assert_same_confidence(e.non_blank_frame_confidence, a.non_blank_frame_confidence, exact, f"row {row}")
    if expected[0].alignments is not None:
        assert compared["alignments"] > compared["blank steps"] > 0, f"setup: labels and blanks aligned {compared}"
    if expected[0].frame_confidence is not None:
        assert compared["frame confidence"] > 0, "setup: frame confidence kept"
    if expected[0].non_blank_step_confidence_precomputed is not None:
        assert compared["precomputed"] > 0, "setup: non-blank confidence kept"


def decode_both(kind, loop_labels, max_symbols, records, lengths=LENGTHS, seed=3, **options):
    decoder, joint = make_networks(tdt=kind == "tdt", seed=seed, blank_bias=REALISTIC_BIAS[kind])
    x, lengths = random_encoder_output(len(lengths), max(lengths), seed=4, lengths=lengths)
    expected = nemo_decoder(kind, decoder, joint, max_symbols, loop_labels, **records)
    actual = fast_decoder(kind, decoder, joint, max_symbols, loop_labels, **records, **options)
    return (
        expected(encoder_output=x, encoded_lengths=lengths)[0],
        actual(encoder_output=x, encoded_lengths=lengths)[0],
    )


# ----- the bare decoding module -----------------------------------------------------------------------------
@pytest.mark.parametrize("records", RECORDS.values(), ids=RECORDS.keys())
@pytest.mark.parametrize("max_symbols", [1, 3, 10])
@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=ALGORITHM_IDS)
def test_records_match_nemo(kind, loop_labels, max_symbols, records):
    expected, actual = decode_both(kind, loop_labels, max_symbols, records)
    assert_same_records(expected, actual)
    assert actual[LENGTHS.index(0)].alignments in (None, [])


@pytest.mark.parametrize("method", METHODS.values(), ids=METHODS.keys())
@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=ALGORITHM_IDS)
def test_confidence_methods_match_nemo(kind, loop_labels, method):
    records = {"preserve_frame_confidence": True, "confidence_method_cfg": method}
    if kind == "tdt":
        records["include_duration_confidence"] = True
    expected, actual = decode_both(kind, loop_labels, 3, records)
    assert_same_records(expected, actual)


@pytest.mark.parametrize("exclude_blank", [True, False])
@pytest.mark.parametrize("looks_per_iteration", [1, 2], ids=["1-look", "2-looks"])
@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_one_level_label_loop_records_like_nemo(kind, looks_per_iteration, exclude_blank):
    """The label loop of the graph modes (K looks per iteration, no inner loop) records every look as NeMo does."""
    records = {"preserve_alignments": True, "preserve_frame_confidence": True}
    records["exclude_blank_from_confidence"] = exclude_blank
    expected, actual = decode_both(kind, True, 3, records, looks_per_iteration=looks_per_iteration)
    assert_same_records(expected, actual)


@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=ALGORITHM_IDS)
def test_fused_step_kernels_record_like_nemo(kind, loop_labels):
    """The Triton select / emit kernels (CUDA's default path; here in the interpreter) leave the same records."""
    records = {"preserve_alignments": True, "preserve_frame_confidence": True}
    if kind == "tdt":
        records["include_duration_confidence"] = True
    expected, actual = decode_both(kind, loop_labels, 3, records, lengths=[9, 4, 0, 7], fused_kernels=True)
    assert_same_records(expected, actual)


@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=ALGORITHM_IDS)
def test_unbounded_symbols_regrow_the_records(kind, loop_labels, monkeypatch):
    """With max_symbols=None and storage far too small, the batch runs again with more room; records included."""
    from conftest import GREEDY_UNBOUNDED_SAFE

    from nemo_fastdecode.greedy.base import GreedyComputerBase

    monkeypatch.setattr(GreedyComputerBase, "_capacity", lambda self, t: max(t, 1) * self._symbols_per_frame // 16 + 1)
    seed, bias = GREEDY_UNBOUNDED_SAFE[kind]
    decoder, joint = make_networks(tdt=kind == "tdt", seed=seed, blank_bias=bias)
    x, lengths = random_encoder_output(len(LENGTHS), max(LENGTHS), seed=4, lengths=LENGTHS)
    records = {"preserve_alignments": True, "preserve_frame_confidence": True}
    expected = nemo_decoder(kind, decoder, joint, None, loop_labels, **records)(
        encoder_output=x, encoded_lengths=lengths
    )
    decode = fast_decoder(kind, decoder, joint, None, loop_labels, **records)
    actual = decode(encoder_output=x, encoded_lengths=lengths)[0]
    assert decode.computer._symbols_per_frame > 2, "setup: storage should have grown"
    assert_same_records(expected[0], actual)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_partial_hypotheses_keep_records_like_nemo(kind):
    """Chunk by chunk (as NeMo's streaming pipelines decode): the merged hypotheses' records equal NeMo's."""
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=REALISTIC_BIAS[kind])
    x, _ = random_encoder_output(3, 24, seed=4, lengths=[24, 24, 24])
    for records in ({"preserve_frame_confidence": True, "exclude_blank_from_confidence": True}, RECORDS["both"]):
        nemo = nemo_decoder(kind, decoder, joint, 2, True, **records)
        fast = fast_decoder(kind, decoder, joint, 2, True, **records)
        nemo_hyps = fast_hyps = None
        for start in range(0, 24, 8):
            chunk = x[:, :, start : start + 8].contiguous()
            chunk_lengths = torch.tensor([8, 8 if start < 16 else 5, 8])
            nemo_hyps = nemo(encoder_output=chunk, encoded_lengths=chunk_lengths, partial_hypotheses=nemo_hyps)[0]
            fast_hyps = fast(encoder_output=chunk, encoded_lengths=chunk_lengths, partial_hypotheses=fast_hyps)[0]
        assert_same_records(nemo_hyps, fast_hyps)


def test_without_records_the_loops_record_nothing(monkeypatch):
    """The default decode keeps no step records and runs no recording op; its hypotheses carry none, as NeMo's."""

    def refuse(*args, **kwargs):
        raise AssertionError("a step was recorded without alignments or confidence")

    monkeypatch.setattr(StepRecords, "add_", refuse)
    monkeypatch.setattr(StepRecords, "__init__", refuse)
    for kind, loop_labels in ALGORITHMS:
        expected, actual = decode_both(kind, loop_labels, 3, {})
        assert sum(len(h.y_sequence) for h in actual) > 0
        for hyp in (*expected, *actual):
            assert hyp.alignments is None and hyp.frame_confidence is None
            assert hyp.non_blank_step_confidence_precomputed is None


def test_lookahead_frames_with_records_is_refused():
    decoder, joint = make_networks()
    with pytest.raises(ValueError, match="lookahead_frames=4 does not keep alignments or confidence"):
        fast_decoder("rnnt", decoder, joint, 3, True, fast_math=True, lookahead_frames=4, preserve_alignments=True)


@pytest.mark.gpu
@pytest.mark.usefixtures("exact_fp32")
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "torch"])
@pytest.mark.parametrize("mode", ["full_graph", "no_while_graph"])
@pytest.mark.parametrize("records", [RECORDS["both"], RECORDS["confidence-with-blanks"]], ids=["both", "blanks"])
@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=ALGORITHM_IDS)
def test_graph_modes_record_like_nemo_on_gpu(kind, loop_labels, records, mode, fused):
    """Records written inside captured graphs (WHILE nodes, or phase graphs) equal NeMo's eager decoder on CUDA.

    The graphs are sized by the first batch and replayed for a smaller one (rows past the batch stay empty). On
    CUDA the joint's GEMMs may round differently for other shapes (graph buffers, the fused joint), so logits and
    confidence are compared to fp32 rounding; labels exactly."""
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=REALISTIC_BIAS[kind])
    decoder, joint = decoder.cuda(), joint.cuda()
    records = {**records, "confidence_method_cfg": METHODS["renyi-exp"]}
    if kind == "tdt":
        records["include_duration_confidence"] = True
    decode = fast_decoder(kind, decoder, joint, 3, loop_labels, graph_mode=mode, fused_kernels=fused, **records)
    nemo = nemo_decoder(kind, decoder, joint, 3, loop_labels, **records)
    for batch_lengths, seed in ((LENGTHS, 4), (LENGTHS, 5), ([13, 0, 20, 2], 6)):
        x, lengths = random_encoder_output(len(batch_lengths), 24, seed=seed, lengths=batch_lengths, device="cuda")
        expected = nemo(encoder_output=x, encoded_lengths=lengths)[0]
        assert_same_records(expected, decode(encoder_output=x, encoded_lengths=lengths)[0], exact=False)
    assert decode.computer.graph_mode is not GraphMode.EAGER


# ----- through NeMo's model API -------------------------------------------------------------------------------
CONFIDENCE_CASES = {
    # (confidence_cfg, preserve_alignments)
    "tsallis-exp-mean": ({"exclude_blank": True, "aggregation": "mean", "method_cfg": METHODS["tsallis-exp"]}, False),
    "renyi-lin-min-blanks": ({"exclude_blank": False, "aggregation": "min", "method_cfg": METHODS["renyi-lin"]}, False),
    "gibbs-exp-prod-aligned": ({"exclude_blank": False, "aggregation": "prod", "method_cfg": METHODS["gibbs-exp"]}, True),
    "max-prob-min-aligned": ({"exclude_blank": True, "aggregation": "min", "method_cfg": METHODS["max_prob"]}, True),
}  # fmt: skip
MODEL_ALGORITHMS = [("tiny-rnnt", False), ("tiny-rnnt", True), ("tiny-tdt", True)]


@pytest.fixture(scope="module")
def audio():
    return synthetic.synthetic_audio([2.5, 1.0, 3.2], seed=1)


@pytest.fixture(scope="module")
def bpe_models(audio):
    models = {}
    for preset in ("tiny-rnnt", "tiny-tdt"):
        model = synthetic.build_synthetic_model(preset, vocab="bpe", seed=0)
        encoded, lengths = synthetic.encode(model, audio, batch_size=len(audio), device="cpu")
        # a few tokens per utterance are enough here (a closer calibration costs seconds)
        synthetic.calibrate_blank_bias(model, encoded, lengths, 0.3, iterations=2, tolerance=0.1, max_symbols=10)
        models[preset] = model
    return models


def confidence_decoding(model, strategy: str, loop_labels: bool, confidence_cfg: dict, alignments: bool):
    cfg = OmegaConf.to_container(model.cfg.decoding)
    cfg["strategy"] = strategy
    cfg["greedy"] = {"max_symbols": 10, "loop_labels": loop_labels, "use_cuda_graph_decoder": False}
    cfg["preserve_alignments"] = alignments
    cfg["confidence_cfg"] = {"preserve_word_confidence": True, **confidence_cfg}
    if model.decoding._is_tdt:
        cfg["confidence_cfg"]["tdt_include_duration"] = True
    return OmegaConf.create(cfg)


def transcribe_hypotheses(model, audio):
    hyps = model.transcribe(audio, batch_size=2, verbose=False, return_hypotheses=True)
    model.eval()  # NeMo 3.0's transcribe leaves modules in train mode
    return hyps[0] if isinstance(hyps, tuple) else hyps


@pytest.mark.parametrize("case", CONFIDENCE_CASES.values(), ids=CONFIDENCE_CASES.keys())
@pytest.mark.parametrize("preset,loop_labels", MODEL_ALGORITHMS, ids=ALGORITHM_IDS)
def test_transcribe_confidence_matches_greedy_batch(preset, loop_labels, case, bpe_models, audio):
    confidence_cfg, alignments = case
    if preset == "tiny-tdt" and not (alignments or confidence_cfg["exclude_blank"]):
        pytest.skip("NeMo 3.0's TDT compute_confidence reads alignments when blanks count (greedy_batch fails too)")
    model = bpe_models[preset]
    model.change_decoding_strategy(confidence_decoding(model, "greedy_batch", loop_labels, confidence_cfg, alignments))
    expected = transcribe_hypotheses(model, audio)
    model.change_decoding_strategy(confidence_decoding(model, "fast_greedy", loop_labels, confidence_cfg, alignments))
    assert isinstance(model.decoding.decoding, FastGreedyBatchedInfer)
    actual = transcribe_hypotheses(model, audio)
    exact = loop_labels  # see the module doc
    assert_same_records(expected, actual, model.decoding.blank_id, exact)
    assert sum(len(h.word_confidence) for h in actual) > 0, "setup: words with confidence"
    for row, (e, a) in enumerate(zip(expected, actual, strict=True)):
        assert a.text == e.text
        assert_same_confidence(e.token_confidence, a.token_confidence, exact, f"row {row}: token confidence")
        assert_same_confidence(e.word_confidence, a.word_confidence, exact, f"row {row}: word confidence")
