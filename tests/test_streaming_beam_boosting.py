"""Per-stream phrase boosting with beam search in the StreamingEngine (``decoding="beam"``, ``StreamOptions.boosting``)
gives every stream the tokens, text and word timestamps of NeMo's beam search of that stream alone fusing its phrases.

NeMo 3.0's beam search has no per-stream trees (its ``malsd_batch`` computers fuse model-wide models only), so the
reference for a stream with phrases ``P`` and weight ``w`` is ``nemo_alone_beam`` with ``boosting``: NeMo's
``ModifiedALSDBatched{RNNT,TDT}Computer`` fusing ``[LM (if any), GPUBoostingTreeModel of P]`` with weights
``[ngram_lm_alpha, w]`` (as ``RNNTDecoding`` sets ``beam.ngram_lm_model`` and ``beam.boosting_tree`` up), continued
over the stream's chunks alone with ``prev_batched_state``. The engine holds every stream's tree in NeMo's
``GPUBiasingMultiModel``; a tree's scores there equal the tree's own times its weight, bit for bit (checked below), and
blank's scaling sums the weights per stream. The model is the boosting tests' tiny cache-aware RNN-T with a BPE
tokenizer (random weights), and a TDT one like it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import whole_file_features
from test_streaming_beam import BeamDriver, step_in_turn
from test_streaming_boosting import ATT, LENGTHS, RATE, bpe_streaming_model
from test_streaming_engine import nemo_words

from fastdecode_lab import synthetic as S
from fastdecode_lab.fusion_models import write_arpa
from nemo_fastdecode.apps.comparison import as_int_list
from nemo_fastdecode.apps.streaming_reference import nemo_alone_beam
from nemo_fastdecode.graphs import GraphMode
from nemo_fastdecode.streaming import BoostingOptions, StreamingEngine, StreamingTranscriber, StreamOptions
from nemo_fastdecode.streaming.boosting import SlotBoosting

pytestmark = pytest.mark.usefixtures("single_thread")

BEAM, LM_ALPHA = 4, 1.0
TDT_LM_ALPHA = 0.2  # with larger weights the TDT model's beams of some streams end without a label
# scores against NeMo's of one stream alone: the frames of our streaming encoder and of NeMo's, and a batch's GEMMs,
# round differently in the last bit, and a beam's score sums every step's
SCORE_RTOL = 1e-5
# per stream: its phrases and weight (None: no boosting); streams 0 and 4 share their phrases with different weights
# (two trees; blank's scaling differs per stream), stream 3 has two phrases
BOOSTING = [
    BoostingOptions(phrases=("the quick", "brown"), weight=1.0),
    None,
    BoostingOptions(phrases=("shall", "weeneen"), weight=1.5),
    BoostingOptions(phrases=("brown", "weeneen ack"), weight=0.7),
    BoostingOptions(phrases=("the quick", "brown"), weight=1.25),
    None,
]


def bpe_tdt_model(device: str = "cpu") -> torch.nn.Module:
    """A tiny cache-aware TDT with a BPE tokenizer (random weights, ~0.3 tokens per frame)."""
    model = S.build_synthetic_model("tiny-tdt-streaming", vocab="bpe", seed=0)
    audio = S.synthetic_audio([2.0, 1.5], seed=7)
    encoded, lengths = S.encode(model, audio, batch_size=2, device="cpu")
    S.calibrate_blank_bias(model, encoded, lengths, 0.3, iterations=4, tolerance=0.05)
    model.encoder.set_default_att_context_size(ATT)
    return model.to(device).eval()


def beam_reference(model, pcm, boosting, lm_path=None, lm_alpha=LM_ALPHA):
    """NeMo's beam search of the stream alone fusing the LM at ``lm_path`` (if any) and then the stream's tree."""
    lm = {} if lm_path is None else dict(ngram_lm_model=lm_path, ngram_lm_alpha=lm_alpha)
    return nemo_alone_beam(model, whole_file_features(model, pcm), BEAM, boosting=boosting, **lm)


def final_of(model, hyp) -> tuple[list[int], str, list[dict]]:
    if hyp is None:
        return [], "", []
    hyp.text = model.decoding.decode_ids_to_str(as_int_list(hyp.y_sequence))
    return as_int_list(hyp.y_sequence), hyp.text, nemo_words(model, hyp)


@pytest.fixture(scope="module")
def model():
    return bpe_streaming_model()


@pytest.fixture(scope="module")
def lm_path(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("lm") / "tiny.arpa"
    write_arpa(path, vocab_size=int(model.decoding.blank_id), shares=(0.2, 0.1), seed=3)
    return path


@pytest.fixture(scope="module")
def audio() -> list[np.ndarray]:
    signals = S.synthetic_audio([n / RATE for n in LENGTHS], seed=5)
    return [np.round(s[:n] * 32768).astype(np.int16) for s, n in zip(signals, LENGTHS, strict=True)]


def check_setup(boosted: list[list[int]], plain: list[list[int]]) -> None:
    """Tokens to compare, boosting changes some stream's tokens, streams without phrases are their plain search."""
    assert all(boosted), "a stream emitted nothing: nothing compared"
    changed = [i for i, b in enumerate(BOOSTING) if b is not None and boosted[i] != plain[i]]
    assert len(changed) >= 2, "boosting changes no stream's tokens: the comparison could not fail"
    assert all(boosted[i] == plain[i] for i, b in enumerate(BOOSTING) if b is None)


class BeamBoostedDriver(BeamDriver):
    """The beam engine tests' driver (random pushes of streams that come and go), each stream with its own phrases."""

    def _options(self, stream: int) -> StreamOptions:
        return dataclasses.replace(super()._options(stream), boosting=BOOSTING[stream])


@pytest.mark.parametrize("with_lm", [False, True], ids=["boosting", "lm+boosting"])
def test_beam_streams_with_their_own_phrases_give_nemo_beam_search_fusing_them_alone(model, audio, lm_path, with_lm):
    """Streams pushed at random and interleaved through fewer slots (slots reused; boosted and plain streams, trees of
    different weights, stepped together): each stream's final tokens, text and words are NeMo's beam search of it alone
    fusing its phrases (after the LM where there is one); streams without phrases never run the boosted search."""
    lm = lm_path if with_lm else None
    refs = [final_of(model, beam_reference(model, pcm, b, lm)) for pcm, b in zip(audio, BOOSTING, strict=True)]
    plain = [final_of(model, beam_reference(model, pcm, None, lm))[0] for pcm in audio]
    check_setup([ids for ids, _, _ in refs], plain)
    lm_args = dict(ngram_lm_model=lm_path, ngram_lm_alpha=LM_ALPHA) if with_lm else {}
    engine = StreamingEngine(
        model, num_slots=3, att_context_size=ATT, max_cycle_seconds=0.25, decoding="beam", beam_size=BEAM, **lm_args
    )
    decoder = engine.transcriber.decoder
    boosted_rows = []
    driver = BeamBoostedDriver(engine, audio, seed=0)
    search = decoder._search

    def spy(slots, *args):
        if args[-1]:  # a boosted search: its slots must all have trees
            boosted_rows.append(all(decoder.boosting.model_ids[s] >= 0 for s in slots))
        return search(slots, *args)

    decoder._search = spy
    driver.run()
    driver.check(refs)
    assert driver.refused > 0 and max(driver.batches) > 1  # slots reused, streams stepped together
    assert boosted_rows and all(boosted_rows)
    fusion = decoder._boosted_computer.fusion.models
    assert len(fusion) == (2 if with_lm else 1) and fusion.per_row is decoder.boosting.multi_model
    assert not decoder.boosting.multi_model.model2active.any()  # every tree left with its stream
    assert (decoder.boosting.model_ids == -1).all() and (decoder.boosting.weights == 0).all()


@pytest.mark.parametrize("with_lm", [False, True], ids=["boosting", "lm+boosting"])
def test_tdt_beam_streams_with_their_own_phrases_give_nemo_alone(audio, tmp_path, with_lm):
    """TDT (beams jumping past a chunk's end), each stream with its own phrases (or none), stepped in turn through two
    slots of the transcriber (padded to buckets, warmed up with boosting set up): every stream's best beam (tokens,
    timestamps, durations) equals NeMo's TDT computer fusing its tree (after the LM), continued alone; its score to
    float32 rounding (the streaming encoder's frames and a batch's GEMMs round differently in the last bit from NeMo's
    of one stream; the batched searches compare scores bit for bit below)."""
    model = bpe_tdt_model()
    lm = None
    if with_lm:
        lm = tmp_path / "tdt.arpa"
        write_arpa(lm, vocab_size=int(model.decoding.blank_id), shares=(0.2, 0.1), seed=3)

    def best(hyp):
        return as_int_list(hyp.y_sequence), as_int_list(hyp.timestamp), as_int_list(hyp.token_duration)

    nemo = [beam_reference(model, pcm, b, lm, TDT_LM_ALPHA) for pcm, b in zip(audio, BOOSTING, strict=True)]
    expected = [best(hyp) for hyp in nemo]
    plain = [as_int_list(beam_reference(model, pcm, None, lm, TDT_LM_ALPHA).y_sequence) for pcm in audio]
    check_setup([e[0] for e in expected], plain)
    lm_args = dict(ngram_lm_model=lm, ngram_lm_alpha=TDT_LM_ALPHA) if with_lm else {}
    transcriber = StreamingTranscriber(
        model, 2, att_context_size=ATT, decoding="beam", beam_size=BEAM, pad_to_bucket=True, phrase_boosting=True,
        **lm_args,
    )  # fmt: skip
    assert transcriber.warm_up().decoder_seconds > 0
    feats = [whole_file_features(model, pcm) for pcm in audio]
    got = step_in_turn(transcriber, feats, list(range(len(audio))), seed=4, boosting=BOOSTING)
    assert [best(got[i]) for i in range(len(audio))] == expected
    scores = [got[i].score for i in range(len(audio))]
    assert scores == pytest.approx([float(hyp.score) for hyp in nemo], rel=SCORE_RTOL, abs=SCORE_RTOL)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
@pytest.mark.parametrize("with_lm", [False, True], ids=["boosting", "lm+boosting"])
@pytest.mark.parametrize("pruning", ["late", "early"])
def test_the_search_fusing_the_multi_model_is_nemos_fusing_the_tree_bit_for_bit(kind, with_lm, pruning, tmp_path):
    """One batch, chunk by chunk, every row naming its own copy of one tree in the multi-model (rows' ids differ):
    the hypotheses (tokens, timestamps, durations, scores) and every state field between chunks, the fusion states
    included, equal NeMo's computer fusing that tree model-wide (after the LM) on the same batch, bit for bit (NeMo's
    ``lm_weighted_full`` blank scoring; ``late`` pruning, the streaming engine's, and ``early``)."""
    from nemo.collections.asr.parts.submodules.rnnt_beam_decoding import BeamBatchedRNNTInfer
    from nemo.collections.asr.parts.submodules.tdt_beam_decoding import BeamBatchedTDTInfer
    from test_beam_chunks import assert_same_states, bounds_of, decode_in_chunks

    from nemo_fastdecode.beam.malsd import MALSDBeamComputer
    from nemo_fastdecode.transducer.fusion import FusionModels

    model = bpe_streaming_model() if kind == "rnnt" else bpe_tdt_model()
    blank = int(model.decoding.blank_id)
    durations = list(model.cfg.decoding.durations) if kind == "tdt" else None
    (encoded,), _ = S.encode(model, S.synthetic_audio([3.0, 2.2, 1.4], seed=11), batch_size=3, device="cpu")
    encoded = encoded.detach().clone()
    lengths = torch.full([3], encoded.shape[-1])  # NeMo's RNN-T search decodes a finished row's padding: none here
    options = BOOSTING[2]
    boosting = SlotBoosting(model, 3, blank, torch.device("cpu"))
    for slot in range(3):
        boosting.attach(slot, options)
    ids, weights = boosting.model_ids[:3], boosting.weights[:3]
    assert len(set(ids.tolist())) == 3
    models, alphas = [], []
    if with_lm:
        from nemo.collections.asr.parts.submodules.ngram_lm import NGramGPULanguageModel

        path = tmp_path / "lm.arpa"
        write_arpa(path, vocab_size=blank, shares=(0.2, 0.1), seed=3)
        models, alphas = [NGramGPULanguageModel.from_file(lm_path=path, vocab_size=blank)], [0.3]
    fusion = FusionModels(models, alphas, per_row=boosting.multi_model)
    ours = MALSDBeamComputer(
        model.decoder, model.joint, blank, BEAM, max_symbols=10, durations=durations, use_cuda_graphs=False,
        fusion=fusion, pruning_mode=pruning,
    )  # fmt: skip

    def search(x, out_len, prev_batched_state):
        return ours.search_chunk(x, out_len, prev_batched_state, ids, weights)

    common = dict(
        beam_size=BEAM, max_symbols_per_step=10, allow_cuda_graphs=False, pruning_mode=pruning,
        blank_lm_score_mode="lm_weighted_full", fusion_models=[*models, boosting.tree(options)],
        fusion_models_alpha=[*alphas, options.weight],
    )  # fmt: skip
    if durations:
        nemo = BeamBatchedTDTInfer(model.decoder, model.joint, durations, blank, **common).decoding_computer
    else:
        nemo = BeamBatchedRNNTInfer(model.decoder, model.joint, blank, **common).decoding_computer
    bounds = bounds_of("uneven", encoded.shape[-1])
    nemo_fusion_states = []  # copies: NeMo's TDT computer writes a chunk's fusion states into the list of the
    # prev_batched_state it was given, so the states it returned earlier show the latest ones

    def nemo_search(**kwargs):
        hyps, state = nemo(**kwargs)
        nemo_fusion_states.append([t.clone() for t in state.fusion_states_list])
        return hyps, state

    expected, expected_states = decode_in_chunks(nemo_search, encoded, lengths, bounds)
    plain, _ = decode_in_chunks(
        BeamBatchedRNNTInfer(
            model.decoder, model.joint, blank, beam_size=BEAM, allow_cuda_graphs=False
        ).decoding_computer
        if not durations
        else BeamBatchedTDTInfer(model.decoder, model.joint, durations, blank, beam_size=BEAM).decoding_computer,
        encoded,
        lengths,
        bounds,
    )
    assert all(hyp[0] for hyp in expected), "a row emitted nothing: nothing compared"
    assert [h[0] for h in expected] != [h[0] for h in plain], "the tree changes nothing here"
    actual, actual_states = decode_in_chunks(search, encoded, lengths, bounds)
    assert actual == expected
    assert_same_states(actual_states, expected_states)
    for chunk, (got, want) in enumerate(zip(actual_states, nemo_fusion_states, strict=True)):
        assert len(got.fusion_states_list) == len(want) == len(models) + 1
        for ours_states, nemo_states in zip(got.fusion_states_list, want, strict=True):
            assert torch.equal(ours_states.view(-1), nemo_states.view(-1)), f"chunk {chunk}"


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")]),
    ],
)
def test_a_tree_in_the_multi_model_scores_as_the_tree_times_its_weight(model, device):
    """Every state of every tree: the multi-model's scores for a row naming the tree equal NeMo's
    ``GPUBoostingTreeModel.advance`` of the same phrases times the weight (as NeMo's beam search weighs it), bit for
    bit, and the next states are the same (the multi-model's states are each tree's own); a row without a tree
    scores 0. On CUDA both are NeMo's Triton kernels."""
    model = model.to(device)
    try:
        boosting = SlotBoosting(model, 4, int(model.decoding.blank_id), torch.device(device))
        options = [b for b in BOOSTING if b is not None]
        for slot, b in enumerate(options):
            boosting.attach(slot, b)
        multi = boosting.multi_model
        for slot, b in enumerate(options):
            tree = boosting.tree(b).to(device)
            states = torch.arange(tree.num_states, device=device)
            ids = boosting.model_ids[slot].expand(tree.num_states).contiguous()
            with torch.no_grad():
                scores, next_states = multi.advance(states=states, model_ids=ids)
                tree_scores, tree_next = tree.advance(states=states)
            assert torch.equal(scores, tree_scores.to(torch.float32) * b.weight), b
            assert torch.equal(next_states, tree_next), b
            assert scores.abs().sum() > 0
        none = torch.full([3], -1, dtype=torch.long, device=device)
        with torch.no_grad():
            scores, _ = multi.advance(states=multi.get_init_states(3, bos=True), model_ids=none)
        assert not scores.any()
    finally:
        model.to("cpu")


def test_boosting_starts_after_bos_and_leaves_with_the_stream(model, audio):
    """A slot's tree states start after ``<BOS>`` for all its beams when its boosting is set (a stream opens, or its
    boosting changes mid-stream); a stream without phrases in the same engine stays on the plain search."""
    engine = StreamingEngine(model, num_slots=2, att_context_size=ATT, decoding="beam", beam_size=BEAM)
    decoder = engine.transcriber.decoder
    assert decoder.boosting is None  # set up by the first stream with phrases
    first = engine.open(StreamOptions(boosting=BOOSTING[0]))
    engine.push(first, audio[0][:16000].tobytes())
    for _ in range(50):
        engine.poll()
        if engine.decoded_seconds(first) > 0.5:
            break
    bos = int(decoder.boosting.multi_model.get_init_states(1, bos=True)[0])
    beams = decoder.tree_states[:BEAM]
    assert decoder.decoded(0) and (beams != bos).any()  # the beams moved in the tree
    with torch.inference_mode():
        decoder.set_boosting(0, BOOSTING[2])
    assert (decoder.tree_states[:BEAM] == bos).all()
    assert float(decoder.boosting.weights[0]) == BOOSTING[2].weight
    engine.close(first)
    assert int(decoder.boosting.model_ids[0]) == -1


def test_beam_refuses_boosting_it_cannot_run_as_greedy_does(audio):
    """A model without a tokenizer cannot tokenise phrases: with beam search too, open refuses (the same error as
    greedy decoding) before taking a slot."""
    char_model = S.build_synthetic_model("tiny-rnnt-streaming", seed=0)
    messages = []
    for decoding in ("greedy", "beam"):
        engine = StreamingEngine(char_model, num_slots=1, att_context_size=ATT, decoding=decoding)
        with pytest.raises(ValueError, match="tokenizer") as error:
            engine.open(StreamOptions(boosting=BOOSTING[0]))
        messages.append(str(error.value))
        assert engine.open_streams == []
        assert engine.open() == 0  # the slot is still free
    assert messages[0] == messages[1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("with_lm", [False, True], ids=["boosting", "lm+boosting"])
def test_beam_boosting_on_cuda_with_graphs_gives_nemo_alone(audio, lm_path, with_lm, exact_fp32):
    """On the GPU, with CUDA graphs (warmed up, boosting set up front): the boosted search fuses the multi-model's Triton
    advance on the torch top-k; against NeMo's beam search fusing each stream's tree on the same GPU."""
    model = bpe_streaming_model("cuda")
    lm = lm_path if with_lm else None
    refs = [final_of(model, beam_reference(model, pcm, b, lm)) for pcm, b in zip(audio, BOOSTING, strict=True)]
    assert all(ids for ids, _, _ in refs)
    lm_args = dict(ngram_lm_model=lm_path, ngram_lm_alpha=LM_ALPHA) if with_lm else {}
    engine = StreamingEngine(
        model, num_slots=3, att_context_size=ATT, max_cycle_seconds=0.25, decoding="beam", beam_size=BEAM,
        phrase_boosting=True, **lm_args,
    )  # fmt: skip
    engine.warm_up()
    driver = BeamBoostedDriver(engine, audio, seed=2)
    driver.run()
    mismatched = [s for s, (ids, _, _) in enumerate(refs) if driver.finals[s].token_ids != ids]
    assert not mismatched, f"streams {mismatched} differ from NeMo's beam search fusing their trees on this GPU"
    boosted = engine.transcriber.decoder._boosted_computer
    assert boosted.graph_mode not in (None, GraphMode.EAGER)  # the boosted search ran as CUDA graphs
