"""fast_greedy with n-gram LM and boosting-tree fusion returns NeMo 3.0's label-looping ``greedy_batch`` hypotheses.

The fusion models are NeMo's own (``NGramGPULanguageModel`` from a tiny random ARPA file,
``GPUBoostingTreeModel`` from a few token phrases); the baseline is NeMo's label loop without CUDA graphs with the
same models and weights. Every comparison first checks that the fusion changes the hypotheses (else it could not
fail) and that tokens were emitted.
"""

from __future__ import annotations

import pytest
import torch
from conftest import TDT_DURATIONS, VOCAB_SIZE, make_networks, random_encoder_output
from nemo.collections.asr.parts.context_biasing import GPUBoostingTreeModel
from nemo.collections.asr.parts.context_biasing.context_graph_universal import ContextGraph
from nemo.collections.asr.parts.submodules.ngram_lm import NGramGPULanguageModel
from nemo.collections.asr.parts.submodules.rnnt_greedy_decoding import GreedyBatchedRNNTInfer, GreedyBatchedTDTInfer

from fastdecode_lab.fusion_models import write_arpa
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer

BLANK_BIAS = {"rnnt": 0.9, "tdt": 0.5}  # about 0.3 labels per frame
LM_ALPHA, TREE_ALPHA = 0.8, 1.0
SCORE_RTOL = 1e-5


@pytest.fixture(scope="module")
def arpa_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("lm") / "tiny.arpa"
    write_arpa(path, VOCAB_SIZE)
    return path


def ngram_lm(arpa_path) -> NGramGPULanguageModel:
    return NGramGPULanguageModel.from_file(lm_path=arpa_path, vocab_size=VOCAB_SIZE)


def boosting_tree(phrases=((3, 5, 7), (1, 1, 4), (9, 2))) -> GPUBoostingTreeModel:
    """NeMo's boosting tree of token phrases (what ``from_config`` builds after tokenising key phrases)."""
    graph = ContextGraph(context_score=1.0, depth_scaling=2.0)
    graph.build(token_ids=[list(p) for p in phrases], phrases=[str(p) for p in phrases], scores=[0.0] * len(phrases))
    return GPUBoostingTreeModel.from_context_graph(context_graph=graph, vocab_size=VOCAB_SIZE, final_eos_score=1.0)


def fusion(which: str, arpa_path) -> tuple[list, list[float]]:
    models, alphas = [], []
    if which in ("ngram", "both"):
        models.append(ngram_lm(arpa_path))
        alphas.append(LM_ALPHA)
    if which in ("tree", "both"):
        models.append(boosting_tree())
        alphas.append(TREE_ALPHA)
    return models, alphas


def nemo_decoder(kind: str, decoder, joint, max_symbols, models=None, alphas=None):
    """NeMo's greedy_batch label loop without CUDA graphs (its eager ``torch_impl``)."""
    common = dict(max_symbols_per_step=max_symbols, use_cuda_graph_decoder=False)
    fused = dict(fusion_models=models, fusion_models_alpha=alphas) if models else {}
    if kind == "tdt":
        return GreedyBatchedTDTInfer(
            decoder, joint, VOCAB_SIZE, durations=TDT_DURATIONS, include_duration=True, **common, **fused
        )
    return GreedyBatchedRNNTInfer(decoder, joint, VOCAB_SIZE, loop_labels=True, **common, **fused)


def our_decoder(kind: str, decoder, joint, max_symbols, models=None, alphas=None, **options):
    return FastGreedyBatchedInfer(
        decoder,
        joint,
        VOCAB_SIZE,
        max_symbols_per_step=max_symbols,
        durations=TDT_DURATIONS if kind == "tdt" else None,
        include_duration=kind == "tdt",
        fusion_models=models,
        fusion_models_alpha=alphas,
        **options,
    )


def decode(infer, x, lengths, partial=None):
    with torch.inference_mode():
        return infer(encoder_output=x, encoded_lengths=lengths, partial_hypotheses=partial)[0]


def tokens(hyps) -> list[list[int]]:
    return [h.y_sequence.tolist() for h in hyps]


def assert_same(ours, nemo, durations: bool = False) -> None:
    """Tokens, frames, scores (and TDT durations if ``durations``).

    NeMo's TDT loop records, for a row that found its label before others, the duration of a later look (it
    overwrites ``durations`` for every row), so TDT durations are compared on single utterances only.
    """
    assert sum(len(h.y_sequence) for h in nemo) > 0, "nothing emitted: nothing compared"
    for row, (a, b) in enumerate(zip(ours, nemo, strict=True)):
        assert a.y_sequence.tolist() == b.y_sequence.tolist(), f"row {row}: tokens"
        assert torch.as_tensor(a.timestamp).tolist() == torch.as_tensor(b.timestamp).tolist(), f"row {row}: frames"
        if durations:
            assert torch.as_tensor(a.token_duration).tolist() == torch.as_tensor(b.token_duration).tolist()
        assert float(a.score) == pytest.approx(float(b.score), rel=SCORE_RTOL, abs=1e-5), f"row {row}: score"


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("which", ["ngram", "tree", "both"])
@pytest.mark.parametrize("looks_per_iteration", [0, 1])
def test_fusion_equals_nemo_label_loop(kind, which, looks_per_iteration, arpa_path, single_thread):
    decoder, joint = make_networks(tdt=kind == "tdt", seed=1, blank_bias=BLANK_BIAS[kind])
    x, lengths = random_encoder_output(6, 24, seed=3)
    models, alphas = fusion(which, arpa_path)
    nemo = decode(nemo_decoder(kind, decoder, joint, 10, models, alphas), x, lengths)
    plain = decode(nemo_decoder(kind, decoder, joint, 10), x, lengths)
    assert tokens(nemo) != tokens(plain), "the fusion changes nothing here: the comparison could not fail"
    ours = our_decoder(kind, decoder, joint, 10, models, alphas, looks_per_iteration=looks_per_iteration)
    assert_same(decode(ours, x, lengths), nemo)
    if kind == "tdt":
        nemo_infer = nemo_decoder(kind, decoder, joint, 10, models, alphas)
        for row in range(x.shape[0]):
            one = x[row : row + 1, :, : lengths[row]], lengths[row : row + 1]
            assert_same(decode(ours, *one), decode(nemo_infer, *one), durations=True)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_fusion_few_symbols_per_frame_and_zero_length_rows(kind, arpa_path, single_thread):
    """max_symbols=2 forces blanks after the fused labels; empty and one-frame rows stay as NeMo leaves them."""
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=BLANK_BIAS[kind] - 1.0)
    x, lengths = random_encoder_output(6, 24, seed=4, lengths=[24, 1, 17, 0, 9, 24])
    models, alphas = fusion("both", arpa_path)
    nemo = decode(nemo_decoder(kind, decoder, joint, 2, models, alphas), x, lengths)
    ours = decode(our_decoder(kind, decoder, joint, 2, models, alphas), x, lengths)
    assert len(ours[3].y_sequence) == 0
    assert_same(ours, nemo)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_fusion_continues_chunk_by_chunk(kind, arpa_path, single_thread):
    """Hypotheses carried between chunks keep the fusion states: chunked decoding equals NeMo's, chunk by chunk."""
    decoder, joint = make_networks(tdt=kind == "tdt", seed=1, blank_bias=BLANK_BIAS[kind])
    x, lengths = random_encoder_output(3, 20, seed=4, lengths=[20, 20, 20])
    models, alphas = fusion("both", arpa_path)
    nemo_infer = nemo_decoder(kind, decoder, joint, 10, models, alphas)
    our_infer = our_decoder(kind, decoder, joint, 10, models, alphas)
    nemo_hyps = our_hyps = None
    for start in (0, 8, 14):
        end = 20 if start == 14 else {0: 8, 8: 14}[start]
        chunk, chunk_lengths = x[:, :, start:end], torch.full([3], end - start)
        nemo_hyps = decode(nemo_infer, chunk, chunk_lengths, nemo_hyps)
        our_hyps = decode(our_infer, chunk, chunk_lengths, our_hyps)
        assert_same(our_hyps, nemo_hyps)
    assert all(len(h.dec_state.fusion_state_list) == 2 for h in our_hyps)


def test_fusion_refused_where_nemo_refuses_or_unsupported(arpa_path):
    decoder, joint = make_networks()
    models, alphas = fusion("ngram", arpa_path)
    with pytest.raises(ValueError, match="loop_labels=True"):
        our_decoder("rnnt", decoder, joint, 10, models, alphas, loop_labels=False)
    with pytest.raises(ValueError, match="one weight per fusion model"):
        our_decoder("rnnt", decoder, joint, 10, models, [])
    with pytest.raises(ValueError, match="preserve_alignments"):
        our_decoder("rnnt", decoder, joint, 10, models, alphas, preserve_alignments=True)
    small_decoder, small_joint = make_networks(vocab_size=VOCAB_SIZE - 2)
    with pytest.raises(ValueError, match=f"vocabulary of {VOCAB_SIZE} labels"):
        FastGreedyBatchedInfer(
            small_decoder, small_joint, VOCAB_SIZE - 2, 10, fusion_models=models, fusion_models_alpha=alphas
        )


def test_state_without_fusion_is_refused_by_a_fusing_decoder(arpa_path):
    """A stream decoded without fusion cannot silently continue with it (and vice versa)."""
    decoder, joint = make_networks(seed=1, blank_bias=BLANK_BIAS["rnnt"])
    x, lengths = random_encoder_output(2, 10, seed=4)
    models, alphas = fusion("ngram", arpa_path)
    plain = decode(our_decoder("rnnt", decoder, joint, 10), x, lengths)
    fused = decode(our_decoder("rnnt", decoder, joint, 10, models, alphas), x, lengths)
    with pytest.raises(ValueError, match="fusion model states"):
        decode(our_decoder("rnnt", decoder, joint, 10, models, alphas), x, lengths, plain)
    with pytest.raises(ValueError, match="fuses no models"):
        decode(our_decoder("rnnt", decoder, joint, 10), x, lengths, fused)


@pytest.mark.parametrize("preset", ["tiny-rnnt"])  # TDT: the computer-level tests above
def test_strategy_config_fuses_as_greedy_batch(preset, tmp_path, single_thread):
    """``decoding.greedy.ngram_lm_model`` / ``ngram_lm_alpha`` with ``strategy: fast_greedy``: NeMo's set-up loads the
    LM, our decoder applies it; the hypotheses are greedy_batch's with the same section."""
    from omegaconf import OmegaConf

    from fastdecode_lab import synthetic

    model = synthetic.build_synthetic_model(preset, seed=0)
    vocab_size = model.decoding.blank_id
    arpa = tmp_path / "lm.arpa"
    write_arpa(arpa, vocab_size=vocab_size, seed=2)
    x = torch.randn(3, model.cfg.joint.jointnet.encoder_hidden, 30, generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([30, 17, 4])

    def hyps(strategy: str, **greedy):
        section = {"max_symbols": 10, "use_cuda_graph_decoder": False, **greedy}
        model.change_decoding_strategy(OmegaConf.create({"strategy": strategy, "greedy": section}), verbose=False)
        return decode(model.decoding.decoding, x, lengths)

    fused = {"ngram_lm_model": str(arpa), "ngram_lm_alpha": 2.0}
    nemo = hyps("greedy_batch", **fused)
    assert tokens(nemo) != tokens(hyps("greedy_batch")), (
        "the fusion changes nothing here: the comparison could not fail"
    )
    ours = hyps("fast_greedy", **fused)
    assert model.decoding.decoding.decoding_computer.has_fusion_models()
    assert_same(ours, nemo)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("looks_per_iteration", [0, 1])
def test_per_row_boosting_equals_nemo_per_stream_biasing(kind, looks_per_iteration, single_thread):
    """NeMo's per-stream biasing (``enable_per_stream_biasing``: its ``GPUBiasingMultiModel``, one tree per row by id,
    ``-1`` none): our label loop with the same multi-model as ``FusionModels.per_row`` gives NeMo's label-looping
    computer's tokens, frames and scores for rows with different trees, no tree, and zero frames."""
    from nemo.collections.asr.parts.utils.rnnt_utils import batched_hyps_to_hypotheses

    from nemo_fastdecode.greedy.label_loop import LabelLoopGreedy
    from nemo_fastdecode.transducer.fusion import FusionModels

    decoder, joint = make_networks(tdt=kind == "tdt", seed=1, blank_bias=BLANK_BIAS[kind])
    x, lengths = random_encoder_output(5, 24, seed=3, lengths=[24, 20, 0, 24, 13])
    x = x.transpose(1, 2).contiguous()  # [B, T, D]
    nemo_kwargs = dict(use_cuda_graph_decoder=False, enable_per_stream_biasing=True, max_symbols_per_step=10)
    if kind == "tdt":
        infer = GreedyBatchedTDTInfer(decoder, joint, VOCAB_SIZE, durations=TDT_DURATIONS, **nemo_kwargs)
    else:
        infer = GreedyBatchedRNNTInfer(decoder, joint, VOCAB_SIZE, loop_labels=True, **nemo_kwargs)
    computer = infer.decoding_computer
    multi = computer.biasing_multi_model
    first = multi.add_model(boosting_tree(), alpha=2.0)
    second = multi.add_model(boosting_tree(((4, 4, 6), (2, 8))), alpha=3.5)
    ids = torch.tensor([first, -1, first, second, second])
    with torch.inference_mode():
        plain_hyps, _ = computer(x=x, out_len=lengths, multi_biasing_ids=torch.full([5], -1))
        nemo_hyps, _ = computer(x=x, out_len=lengths, multi_biasing_ids=ids)
    nemo, plain = (
        batched_hyps_to_hypotheses(nemo_hyps, batch_size=5),
        batched_hyps_to_hypotheses(plain_hyps, batch_size=5),
    )
    changed = [row for row in range(5) if tokens(nemo)[row] != tokens(plain)[row]]
    assert 1 not in changed and {0, 3} & set(changed), "boosting changes nothing here: the comparison could not fail"
    ours = LabelLoopGreedy(
        decoder, joint, VOCAB_SIZE, 10, durations=TDT_DURATIONS if kind == "tdt" else None, use_cuda_graphs=False,
        looks_per_iteration=looks_per_iteration, fusion=FusionModels([], [], per_row=multi),
    )  # fmt: skip
    state = ours.initial_state(5, x.device, x.dtype)
    _, emitted = ours.decode_with_state(x, lengths, state, ids)
    assert_same(emitted.to_hypotheses(), nemo)
