"""fast_beam with n-gram LM and boosting-tree fusion returns NeMo 3.0's malsd_batch hypotheses.

The fusion models are NeMo's own (an ``NGramGPULanguageModel`` from a tiny ARPA file, a ``GPUBoostingTreeModel`` of
a few token phrases: the helpers of ``test_greedy_fusion``); the baseline is NeMo's ``BeamBatchedRNNTInfer`` /
``BeamBatchedTDTInfer`` (``malsd_batch``, no CUDA graphs) with the same models, weights and fusion modes. Every
comparison first checks that the fusion changes the hypotheses (else it could not fail) and that tokens were emitted.
On the CPU our steps run NeMo's floating-point operations: scores are compared exactly, as in ``test_beam_exactness``.
"""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB_SIZE, make_networks, random_encoder_output
from test_beam_chunks import MAX_TIME, assert_same_states, bounds_of, decode_in_chunks, emitted
from test_beam_exactness import as_tuples, fast_beam, nemo_malsd
from test_greedy_fusion import fusion

from fastdecode_lab.fusion_models import write_arpa
from nemo_fastdecode.beam import FastBeamBatchedInfer
from nemo_fastdecode.beam.fusion import BeamFusion, parse_fusion_modes
from nemo_fastdecode.kernels.beam_topk import log_softmax_topk_fused
from nemo_fastdecode.transducer.fusion import FusionModels

pytestmark = pytest.mark.usefixtures("single_thread")

LENGTHS = [24, 1, 17, 9, 24]
# blank shifts at which the fused searches still emit labels (the LM's scores are negative)
BLANK_BIAS = {"rnnt": 0.9, "tdt": -1.0}
# the defaults of NeMo's malsd_batch set-up (RNNTDecoding); NeMo's TDT class defaults to early / no_score
LATE = {"pruning_mode": "late", "blank_lm_score_mode": "lm_weighted_full"}


@pytest.fixture(scope="module")
def arpa_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("lm") / "tiny.arpa"
    write_arpa(path, VOCAB_SIZE)
    return path


def decode(infer, x, lengths, nbest: bool):
    with torch.inference_mode():
        return as_tuples(infer(encoder_output=x, encoded_lengths=lengths)[0], nbest)


def compare(kind, beam_size, models, alphas, nbest=False, **modes):
    """(NeMo's hypotheses without fusion, NeMo's with it, ours with it) on a ragged batch."""
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=BLANK_BIAS[kind])
    x, lengths = random_encoder_output(len(LENGTHS), 24, seed=4, lengths=LENGTHS)
    options = dict(return_best_hypothesis=not nbest)
    fused = dict(fusion_models=models, fusion_models_alpha=alphas, **{**LATE, **modes}, **options)
    plain = decode(nemo_malsd(kind, decoder, joint, beam_size, 3, **options), x, lengths, nbest)
    nemo = decode(nemo_malsd(kind, decoder, joint, beam_size, 3, **fused), x, lengths, nbest)
    ours = decode(fast_beam(kind, decoder, joint, beam_size, 3, **fused), x, lengths, nbest)
    return plain, nemo, ours


def tokens(hyps):
    return [[h[0] for h in row] if isinstance(row, list) else row[0] for row in hyps]


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("beam_size", [2, 4])
@pytest.mark.parametrize("nbest", [False, True], ids=["best", "nbest"])
def test_fusion_matches_malsd_batch(kind, beam_size, nbest, arpa_path):
    """LM and boosting tree together: tokens, timestamps, TDT durations, scores (n-best lists too) equal NeMo's."""
    models, alphas = fusion("both", arpa_path)
    plain, nemo, ours = compare(kind, beam_size, models, alphas, nbest=nbest)
    assert emitted(nemo) > 0, "nothing emitted: nothing compared"
    assert tokens(nemo) != tokens(plain), "the fusion changes nothing here: the comparison could not fail"
    assert ours == nemo


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize(
    "which,pruning_mode,blank_lm_score_mode",
    [
        ("ngram", "late", "lm_weighted_full"),
        ("tree", "late", "lm_weighted_full"),
        ("both", "late", "no_score"),
        ("both", "early", "lm_weighted_full"),
        ("both", "early", "no_score"),
    ],
)
def test_each_model_and_mode_match_malsd_batch(kind, which, pruning_mode, blank_lm_score_mode, arpa_path):
    models, alphas = fusion(which, arpa_path)
    modes = dict(pruning_mode=pruning_mode, blank_lm_score_mode=blank_lm_score_mode)
    plain, nemo, ours = compare(kind, 2, models, alphas, **modes)
    assert emitted(nemo) > 0, "nothing emitted: nothing compared"
    assert tokens(nemo) != tokens(plain), "the fusion changes nothing here: the comparison could not fail"
    assert ours == nemo


@pytest.mark.parametrize("which", ["ngram", "both"])
@pytest.mark.parametrize("blank_lm_score_mode", ["lm_weighted_full", "no_score"])
@pytest.mark.parametrize("beam_size", [1, 4])
def test_fused_topk_kernel_matches_the_torch_step(which, blank_lm_score_mode, beam_size, arpa_path):
    """The late-pruning beam step in one kernel (the interpreter on the CPU) == NeMo's torch ops: the same labels,
    values to float32 rounding; the models' states advanced from several places in the LM."""
    models, alphas = fusion(which, arpa_path)
    beam_fusion = BeamFusion(FusionModels(models, alphas), beam_size, *parse_fusion_modes("late", blank_lm_score_mode))
    rows = 8 * beam_size
    buffers = beam_fusion.allocate(8, torch.device("cpu"), torch.float32)
    g = torch.Generator().manual_seed(beam_size)
    for _ in range(3):  # beams three random labels in: every row scores differently
        beam_fusion.models.advance(buffers)
        for states, candidates in zip(buffers.states, buffers.candidates, strict=True):
            states.copy_(candidates.gather(1, torch.randint(0, VOCAB_SIZE, [rows, 1], generator=g))[:, 0])
    logits = 0.2 * torch.randn([rows, VOCAB_SIZE + 1], generator=g)
    logits[0, -1] = 9.0  # p(blank) past NeMo's clamp (1 - 1e-2)
    want = beam_fusion.top_k(buffers, logits.clone(), VOCAB_SIZE, torch.float32, use_kernel=False)
    got = beam_fusion.top_k(buffers, logits.clone(), VOCAB_SIZE, torch.float32, use_kernel=True)
    assert want[2] is None and got[2] is None
    assert bool((buffers.scores[0] != 0).any()), "the models score nothing: the fusion could not change the step"
    unfused_ids = logits[:, :-1].topk(beam_size, dim=-1).indices
    assert not torch.equal(want[1][:, :beam_size], unfused_ids), "the fusion changes no label: could not fail"
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-5)


def test_fused_topk_kernel_refuses_what_it_cannot_fuse():
    logits, scores = torch.zeros([2, 5]), torch.zeros([2, 4])
    with pytest.raises(ValueError, match=r"fusion_scores must be \[N, V-1\] = \[2, 4\].*\(2, 5\)"):
        log_softmax_topk_fused(logits, 2, torch.zeros([2, 5]), 0.5, True)
    with pytest.raises(ValueError, match="float32 logits and scores.*torch.float16"):
        log_softmax_topk_fused(logits, 2, scores.half(), 0.5, True)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("blank_lm_score_mode", ["lm_weighted_full", "no_score"])
def test_fusion_on_the_beam_step_kernels_matches_malsd_batch(kind, blank_lm_score_mode, arpa_path):
    """Late pruning on the fused top-k and selection kernels (the interpreter on the CPU): NeMo's n-best lists,
    scores to float32 rounding."""
    from test_beam_gpu import assert_same

    models, alphas = fusion("both", arpa_path)
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=BLANK_BIAS[kind])
    x, lengths = random_encoder_output(len(LENGTHS), 24, seed=4, lengths=LENGTHS)
    fused = dict(fusion_models=models, fusion_models_alpha=alphas, return_best_hypothesis=False, **LATE)
    fused["blank_lm_score_mode"] = blank_lm_score_mode
    plain = decode(nemo_malsd(kind, decoder, joint, 4, 3, return_best_hypothesis=False), x, lengths, nbest=True)
    expected = decode(nemo_malsd(kind, decoder, joint, 4, 3, **fused), x, lengths, nbest=True)
    assert emitted(expected) > 0, "nothing emitted: nothing compared"
    assert tokens(expected) != tokens(plain), "the fusion changes nothing here: the comparison could not fail"
    actual = decode(fast_beam(kind, decoder, joint, 4, 3, fused_topk=True, **fused), x, lengths, nbest=True)
    assert_same(actual, expected, exact_scores=False)


class FusionStatesAfterEachChunk:
    """A computer that keeps a copy of the fusion states it returns after each chunk: NeMo's TDT search continues
    the list of the state it was given and replaces its entries, so the states it returned earlier change later."""

    def __init__(self, computer):
        self.computer, self.fusion_states = computer, []

    def __call__(self, **kwargs):
        hyps, state = self.computer(**kwargs)
        self.fusion_states.append([s.clone() for s in state.fusion_states_list])
        return hyps, state


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("beam_size", [2, 4])
def test_fusion_continues_chunk_by_chunk(kind, beam_size, arpa_path):
    """Chunk by chunk the beams carry their fusion states: NeMo's hypotheses and states (fusion states included)."""
    models, alphas = fusion("both", arpa_path)
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=BLANK_BIAS[kind])
    x, _ = random_encoder_output(3, MAX_TIME, seed=4)
    lengths = torch.full([3], MAX_TIME)
    bounds = bounds_of("uneven")
    fused = dict(fusion_models=models, fusion_models_alpha=alphas, **LATE)
    plain, _ = decode_in_chunks(nemo_malsd(kind, decoder, joint, beam_size, 3).decoding_computer, x, lengths, bounds)
    nemo_computer = FusionStatesAfterEachChunk(
        nemo_malsd(kind, decoder, joint, beam_size, 3, **fused).decoding_computer
    )
    expected, expected_states = decode_in_chunks(nemo_computer, x, lengths, bounds)
    ours_computer = FusionStatesAfterEachChunk(fast_beam(kind, decoder, joint, beam_size, 3, **fused).decoding_computer)
    actual, actual_states = decode_in_chunks(ours_computer, x, lengths, bounds)
    ours_fusion_states, nemo_fusion_states = ours_computer.fusion_states, nemo_computer.fusion_states
    assert emitted(expected) > 0, "nothing emitted: nothing compared"
    assert tokens(expected) != tokens(plain), "the fusion changes nothing here: the comparison could not fail"
    assert actual == expected
    assert_same_states(actual_states, expected_states)
    assert len(ours_fusion_states) == len(nemo_fusion_states) == len(bounds) - 1
    for chunk, (ours, nemo) in enumerate(zip(ours_fusion_states, nemo_fusion_states, strict=True)):
        assert len(ours) == len(nemo) == 2
        for got, want in zip(ours, nemo, strict=True):
            assert torch.equal(got.reshape(-1), want.reshape(-1)), f"chunk {chunk}: fusion states"


def test_unsupported_fusion_settings_fail_clearly(arpa_path):
    decoder, joint = make_networks(seed=3)
    models, alphas = fusion("ngram", arpa_path)
    with pytest.raises(ValueError, match=r"pruning_mode='sooner': valid are \['early', 'late'\]"):
        fast_beam("rnnt", decoder, joint, 2, 3, fusion_models=models, fusion_models_alpha=alphas, pruning_mode="sooner")
    with pytest.raises(ValueError, match=r"blank_lm_score_mode='sometimes': valid are"):
        fast_beam("rnnt", decoder, joint, 2, 3, fusion_models=models, fusion_models_alpha=alphas,
                  blank_lm_score_mode="sometimes")  # fmt: skip
    with pytest.raises(ValueError, match="one weight per fusion model"):
        fast_beam("rnnt", decoder, joint, 2, 3, fusion_models=models, fusion_models_alpha=[1.0, 2.0], **LATE)
    small_decoder, small_joint = make_networks(seed=3, vocab_size=VOCAB_SIZE - 2)
    with pytest.raises(ValueError, match="vocabulary of 12 labels, the decoder 10"):
        FastBeamBatchedInfer(
            small_decoder, small_joint, VOCAB_SIZE - 2, 2, fusion_models=models, fusion_models_alpha=alphas, **LATE
        )


def test_states_with_and_without_fusion(arpa_path):
    """A fused stream cannot continue without fusion; a stream decoded without fusion continues after <BOS> (NeMo)."""
    models, alphas = fusion("ngram", arpa_path)
    decoder, joint = make_networks(seed=3, blank_bias=BLANK_BIAS["rnnt"])
    x, lengths = random_encoder_output(2, 6, seed=4, lengths=[6, 6])
    x = x.transpose(1, 2)
    fused = dict(fusion_models=models, fusion_models_alpha=alphas, **LATE)
    plain_computer = fast_beam("rnnt", decoder, joint, 2, 3).decoding_computer
    fused_computer = fast_beam("rnnt", decoder, joint, 2, 3, **fused).decoding_computer
    nemo_computer = nemo_malsd("rnnt", decoder, joint, 2, 3, **fused).decoding_computer
    with torch.no_grad():
        _, fused_state = fused_computer(x=x, out_len=lengths)
        with pytest.raises(ValueError, match="fusion states, and this search fuses no models"):
            plain_computer(x=x, out_len=lengths, prev_batched_state=fused_state)
        _, plain_state = plain_computer(x=x, out_len=lengths)
        ours, ours_state = fused_computer(x=x, out_len=lengths, prev_batched_state=plain_state)
        nemo, nemo_state = nemo_computer(x=x, out_len=lengths, prev_batched_state=plain_state)
    assert torch.equal(ours.scores, nemo.scores)
    assert torch.equal(ours_state.fusion_states_list[0], nemo_state.fusion_states_list[0])


def test_strategy_config_fuses_as_malsd_batch(tmp_path):
    """``decoding.beam.ngram_lm_model`` / ``ngram_lm_alpha`` and ``boosting_tree`` with ``strategy: fast_beam``: NeMo's
    set-up loads the models, our search applies them; the hypotheses are malsd_batch's with the same section."""
    from omegaconf import OmegaConf

    from fastdecode_lab import synthetic

    model = synthetic.build_synthetic_model("tiny-rnnt", seed=0)
    vocab_size = model.decoding.blank_id
    arpa = tmp_path / "lm.arpa"
    write_arpa(arpa, vocab_size=vocab_size, seed=2)
    x = torch.randn(3, model.cfg.joint.jointnet.encoder_hidden, 30, generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([30, 17, 4])

    def hyps(strategy: str, **beam):
        section = {"beam_size": 2, "max_symbols": 3, "allow_cuda_graphs": False, **beam}
        model.change_decoding_strategy(OmegaConf.create({"strategy": strategy, "beam": section}), verbose=False)
        return decode(model.decoding.decoding, x, lengths, nbest=False)

    fused = {"ngram_lm_model": str(arpa), "ngram_lm_alpha": 2.0}
    nemo = hyps("malsd_batch", **fused)
    assert tokens(nemo) != tokens(hyps("malsd_batch")), "the fusion changes nothing here: the comparison could not fail"
    ours = hyps("fast_beam", **fused)
    assert model.decoding.decoding.decoding_computer.fusion_models_alpha == [2.0]
    assert ours == nemo


def test_fusion_needs_an_existing_lm_file():
    from omegaconf import OmegaConf

    from fastdecode_lab import synthetic

    model = synthetic.build_synthetic_model("tiny-rnnt")
    config = OmegaConf.create({"strategy": "fast_beam", "beam": {"beam_size": 2, "ngram_lm_model": "/no/such/lm"}})
    with pytest.raises(ValueError, match=r"decoding.beam.ngram_lm_model='/no/such/lm'.*no such file"):
        model.change_decoding_strategy(config)


@pytest.mark.gpu
@pytest.mark.usefixtures("exact_fp32")
@pytest.mark.parametrize("mode", ["full_graph", "no_while_graph", "eager"])
@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("pruning_mode", ["late", "early"])
def test_fusion_every_graph_mode_matches_malsd_batch_on_gpu(mode, kind, pruning_mode, arpa_path):
    """On CUDA, captured or not (NeMo's Triton LM and tree are capturable), fused searches are NeMo's eager ones."""
    models, alphas = fusion("both", arpa_path)
    assert all(model.compatible_with_cuda_graphs() for model in models), "setup: NeMo's Triton fusion kernels"
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=BLANK_BIAS[kind])
    decoder, joint = decoder.cuda(), joint.cuda()
    x, lengths = random_encoder_output(len(LENGTHS), 24, seed=4, lengths=LENGTHS, device="cuda")
    fused = dict(fusion_models=models, fusion_models_alpha=alphas, return_best_hypothesis=False, **LATE)
    fused["pruning_mode"] = pruning_mode
    expected = decode(nemo_malsd(kind, decoder, joint, 4, 3, **fused), x, lengths, nbest=True)
    assert emitted(expected) > 0, "nothing emitted: nothing compared"
    from test_beam_gpu import assert_same

    # torch's top-k and selection: NeMo's bits; the beam-step kernels (the default on CUDA): its float32 rounding
    for fused_topk in (False, None):
        ours = fast_beam(kind, decoder, joint, 4, 3, graph_mode=mode, fused_topk=fused_topk, **fused)
        for _ in range(2):  # the second call replays the captured graphs
            assert_same(decode(ours, x, lengths, nbest=True), expected, exact_scores=fused_topk is False)
