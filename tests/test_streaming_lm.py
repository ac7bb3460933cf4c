"""N-gram LM fusion in the StreamingEngine (``ngram_lm_model`` / ``ngram_lm_alpha``) gives every stream the tokens, text
and word timestamps of NeMo's cache-aware streaming of that stream alone with the model's decoding fusing the same LM.

The reference is ``nemo_alone`` with the model's decoding NeMo's label-looping ``greedy_batch`` (CUDA graphs off: its
eager loop) and ``greedy.ngram_lm_model`` / ``greedy.ngram_lm_alpha``: NeMo's ``NGramGPULanguageModel``, its states
carried across chunks in the partial hypotheses' decoding states. With per-stream phrase boosting too, the reference
adds ``greedy.enable_per_stream_biasing`` and each stream's ``BiasingRequestItemConfig``. The model is the boosting
tests' tiny cache-aware RNN-T with a BPE tokenizer (random weights), the LM a tiny random ARPA file over its tokens.

With ``decoding="beam"`` the reference is ``nemo_alone_beam`` fusing the LM: NeMo's ``malsd_batch`` computer with the
LM as NeMo's ``beam.ngram_lm_model`` sets it up, continued over the stream's chunks alone (its beams' LM states in
``prev_batched_state.fusion_states_list``).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import whole_file_features
from omegaconf import open_dict
from test_streaming_beam import BeamDriver, step_in_turn
from test_streaming_boosting import ATT, LENGTHS, PHRASES, RATE, BoostedDriver, bpe_streaming_model, reference
from test_streaming_engine import Driver, nemo_words

from fastdecode_lab import synthetic as S
from fastdecode_lab.fusion_models import write_arpa
from nemo_fastdecode.apps.comparison import as_int_list
from nemo_fastdecode.apps.streaming_reference import nemo_alone_beam
from nemo_fastdecode.graphs import GraphMode
from nemo_fastdecode.serve import ServeConfig, build_engine
from nemo_fastdecode.streaming import StreamingEngine
from nemo_fastdecode.streaming.decoding import SlotDecoder

pytestmark = pytest.mark.usefixtures("single_thread")

LM_ALPHA = 2.0  # a random model follows the LM only with a large weight
BEAM, BEAM_LM_ALPHA = 4, 1.0  # beam search: blank's score grows with the weight too, so a smaller one keeps tokens


def set_decoding(model, lm_path=None, alpha: float = 0.0, per_stream_biasing: bool = False) -> None:
    """The model's decoding: NeMo's eager label-looping greedy_batch, fusing the LM at ``lm_path`` (``None``: none)."""
    cfg = copy.deepcopy(model.cfg.decoding)
    with open_dict(cfg):
        cfg.greedy.ngram_lm_model = None if lm_path is None else str(lm_path)
        cfg.greedy.ngram_lm_alpha = alpha
        cfg.greedy.enable_per_stream_biasing = per_stream_biasing
    model.change_decoding_strategy(cfg, verbose=False)


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


@pytest.fixture(scope="module")
def refs(model, audio, lm_path):
    """NeMo alone per stream: without fusion, with the LM, with the LM and each stream's phrases."""
    set_decoding(model)
    plain = [reference(model, pcm, None) for pcm in audio]
    set_decoding(model, lm_path, LM_ALPHA)
    fused = [reference(model, pcm, None) for pcm in audio]
    set_decoding(model, lm_path, LM_ALPHA, per_stream_biasing=True)
    both = [reference(model, pcm, phrases) for pcm, phrases in zip(audio, PHRASES, strict=True)]
    set_decoding(model)
    assert all(ids for ids, _, _ in fused), "a stream emitted nothing: nothing compared"
    assert sum(fused[i][0] != plain[i][0] for i in range(len(audio))) >= 2, (
        "the LM changes no stream's tokens: the comparison could not fail"
    )
    boosted = [i for i, phrases in enumerate(PHRASES) if phrases is not None]
    assert any(both[i][0] != fused[i][0] for i in boosted), "boosting changes nothing on top of the LM"
    assert all(both[i] == fused[i] for i, phrases in enumerate(PHRASES) if phrases is None)
    return plain, fused, both


def test_streams_with_an_ngram_lm_give_nemo_lm_fusion_alone(model, audio, lm_path, refs):
    """Streams pushed at random and interleaved (slots reused) each get NeMo's LM-fused streaming of it alone."""
    _, fused, _ = refs
    engine = StreamingEngine(
        model,
        num_slots=3,
        att_context_size=ATT,
        max_cycle_seconds=0.25,
        ngram_lm_model=lm_path,
        ngram_lm_alpha=LM_ALPHA,
    )
    decoder = engine.transcriber.decoder
    assert decoder.lm is not None and all(c.fusion is not None for c in decoder.computers.values())
    driver = Driver(engine, audio, seed=0)
    driver.run()
    driver.check(fused)
    assert driver.refused > 0 and max(driver.batches) > 1  # slots reused, streams stepped together
    assert decoder.boosting is None  # no stream boosted: the LM-only decoder ran every step
    # a stream opening in a used slot starts after <BOS>, as NeMo's first chunk does
    bos = int(decoder.lm.get_init_states(1, bos=True)[0])
    engine.open()  # the slot is emptied before anything reads it through the transcriber
    assert int(engine.transcriber.decoder.lm_states[0]) == bos


@pytest.mark.parametrize("phrase_boosting", [False, True])
def test_an_ngram_lm_with_per_stream_boosting_gives_nemo_both_alone(model, audio, lm_path, refs, phrase_boosting):
    """The LM and each stream's own phrases together: NeMo's decoding with ``ngram_lm_model`` and
    ``enable_per_stream_biasing``; streams without phrases get the LM alone (boosting set up lazily or at once)."""
    _, _, both = refs
    engine = StreamingEngine(
        model,
        num_slots=3,
        att_context_size=ATT,
        max_cycle_seconds=0.25,
        phrase_boosting=phrase_boosting,
        ngram_lm_model=lm_path,
        ngram_lm_alpha=LM_ALPHA,
    )
    driver = BoostedDriver(engine, audio, seed=1)
    driver.run()
    driver.check(both)
    decoder = engine.transcriber.decoder
    assert decoder._boosted_computers and all(len(c.fusion) == 2 for c in decoder._boosted_computers.values())
    assert not decoder.boosting.multi_model.model2active.any()  # every tree left with its stream


def beam_reference(model, pcm, lm_path=None) -> tuple[list[int], str, list[dict]]:
    """NeMo's ``malsd_batch`` computer continued over the stream's chunks alone, fusing the LM at ``lm_path``."""
    lm = {} if lm_path is None else dict(ngram_lm_model=lm_path, ngram_lm_alpha=BEAM_LM_ALPHA)
    hyp = nemo_alone_beam(model, whole_file_features(model, pcm), BEAM, **lm)
    if hyp is None:
        return [], "", []
    hyp.text = model.decoding.decode_ids_to_str(as_int_list(hyp.y_sequence))
    return as_int_list(hyp.y_sequence), hyp.text, nemo_words(model, hyp)


def test_beam_search_streams_with_an_ngram_lm_give_nemo_beam_lm_fusion_alone(model, audio, lm_path):
    """``decoding="beam"`` with the LM: streams pushed at random and interleaved (slots reused) each get NeMo's beam
    search fusing the LM, its beams' LM states continued over the stream's chunks alone."""
    plain = [beam_reference(model, pcm) for pcm in audio]
    fused = [beam_reference(model, pcm, lm_path) for pcm in audio]
    assert all(ids for ids, _, _ in fused), "a stream emitted nothing: nothing compared"
    assert sum(f[0] != p[0] for f, p in zip(fused, plain, strict=True)) >= 2, (
        "the LM changes no stream's tokens: the comparison could not fail"
    )
    engine = StreamingEngine(
        model,
        num_slots=3,
        att_context_size=ATT,
        max_cycle_seconds=0.25,
        decoding="beam",
        beam_size=BEAM,
        ngram_lm_model=lm_path,
        ngram_lm_alpha=BEAM_LM_ALPHA,
    )
    decoder = engine.transcriber.decoder
    assert decoder.lm is not None and decoder.computer.fusion is not None
    driver = BeamDriver(engine, audio, seed=0)
    driver.run()
    driver.check(fused)
    assert driver.refused > 0 and max(driver.batches) > 1  # slots reused, streams stepped together
    assert decoder._fusion_states is not None and len(decoder._fusion_states) == 1


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")]),
    ],
)
def test_tdt_beam_search_with_an_ngram_lm_gives_nemo_alone(audio, tmp_path, device):
    """TDT (beams jumping past a chunk's end) with the LM: streams stepped in turn through two slots of the
    transcriber, each slot reused; every stream's best beam (tokens, timestamps, durations) equals NeMo's TDT computer
    fusing the LM, continued over that stream's chunks alone (on CUDA: with CUDA graphs, warmed up, and NeMo's LM
    kernel, against NeMo's computer on the same GPU)."""
    from conftest import tiny_streaming_model

    from nemo_fastdecode.streaming import StreamingTranscriber

    model = tiny_streaming_model("tiny-tdt-streaming").to(device)
    model.encoder.set_default_att_context_size(ATT)
    path = tmp_path / "tdt.arpa"
    write_arpa(path, vocab_size=int(model.decoding.blank_id), shares=(0.2, 0.1), seed=3)
    alpha = 0.5
    feats = [whole_file_features(model, pcm) for pcm in audio]

    def best(hyp):
        return as_int_list(hyp.y_sequence), as_int_list(hyp.timestamp), as_int_list(hyp.token_duration)

    plain = [best(nemo_alone_beam(model, f, BEAM)) for f in feats]
    expected = [best(nemo_alone_beam(model, f, BEAM, ngram_lm_model=path, ngram_lm_alpha=alpha)) for f in feats]
    assert all(e[0] for e in expected), "a stream emitted nothing: nothing compared"
    assert sum(e[0] != p[0] for e, p in zip(expected, plain, strict=True)) >= 2, "the LM changes nothing here"
    # padded to the batch-size buckets and warmed up on the dummy slot, as with CUDA graphs
    transcriber = StreamingTranscriber(
        model, 2, att_context_size=ATT, decoding="beam", beam_size=BEAM, pad_to_bucket=True,
        ngram_lm_model=path, ngram_lm_alpha=alpha,
    )  # fmt: skip
    assert transcriber.warm_up().decoder_seconds > 0
    got = step_in_turn(transcriber, feats, list(range(len(audio))), seed=4)
    assert [best(got[i]) for i in range(len(audio))] == expected


def test_lm_settings_the_engine_cannot_run_are_refused_by_name(model, lm_path, tmp_path):
    with pytest.raises(ValueError, match=r"ngram_lm_alpha=0\.5 needs ngram_lm_model"):
        StreamingEngine(model, num_slots=1, ngram_lm_alpha=0.5)
    for alpha in (0.0, -1.0, float("nan")):
        with pytest.raises(
            ValueError, match=r"ngram_lm_alpha=.* with ngram_lm_model=.*valid weights are finite and > 0"
        ):
            StreamingEngine(model, num_slots=1, ngram_lm_model=lm_path, ngram_lm_alpha=alpha)
    missing = tmp_path / "missing.arpa"
    with pytest.raises(ValueError, match=rf"ngram_lm_model='{missing}': no such file"):
        StreamingEngine(model, num_slots=1, ngram_lm_model=missing, ngram_lm_alpha=1.0)
    with pytest.raises(ValueError, match=r"needs the label-looping decoder \(loop_labels=True\)"):
        SlotDecoder(model, 1, loop_labels=False, ngram_lm_model=lm_path, ngram_lm_alpha=1.0)
    with pytest.raises(ValueError, match="ngram_lm_alpha must be a number"):
        StreamingEngine(model, num_slots=1, ngram_lm_model=lm_path, ngram_lm_alpha="1")
    with pytest.raises(ValueError, match=r"ngram_lm_alpha=0\.0 with ngram_lm_model=.*valid weights"):
        StreamingEngine(model, num_slots=1, decoding="beam", ngram_lm_model=lm_path, ngram_lm_alpha=0.0)
    # the server's settings are checked the same way, before any model loads
    with pytest.raises(ValueError, match=r"ngram_lm_alpha=1\.0 needs ngram_lm_model"):
        ServeConfig(ngram_lm_alpha=1.0)


def test_the_server_setting_reaches_the_engine(model, lm_path):
    config = ServeConfig(slots=1, ngram_lm_model=str(lm_path), ngram_lm_alpha=LM_ALPHA, att_context_size=ATT)
    decoder = build_engine(model, config).transcriber.decoder
    assert decoder.lm is not None and decoder.lm_alpha == LM_ALPHA
    config = ServeConfig(
        slots=1, decoding="beam", ngram_lm_model=str(lm_path), ngram_lm_alpha=BEAM_LM_ALPHA, att_context_size=ATT
    )
    decoder = build_engine(model, config).transcriber.decoder
    assert decoder.lm is not None and decoder.computer.fusion.models.alphas == [BEAM_LM_ALPHA]


def test_hypotheses_carry_the_lm_state_nemo_continues_from(model, audio, lm_path):
    """A slot's hypothesis holds NeMo's decoding state item with the LM's state (``fusion_state_list``)."""
    engine = StreamingEngine(model, num_slots=1, att_context_size=ATT, ngram_lm_model=lm_path, ngram_lm_alpha=LM_ALPHA)
    stream = engine.open()
    engine.push(stream, audio[4].tobytes())
    engine.finish(stream)
    while engine.busy:
        engine.poll()
    decoder = engine.transcriber.decoder
    with torch.inference_mode():
        (hyp,) = decoder.hypotheses([0])
    assert hyp is not None and len(hyp.dec_state.fusion_state_list) == 1
    assert int(hyp.dec_state.fusion_state_list[0]) == int(decoder.lm_states[0])


@pytest.mark.gpu
@pytest.mark.parametrize("phrase_boosting", [False, True])
def test_lm_on_the_gpu_with_cuda_graphs_gives_nemo_lm_fusion_alone(audio, lm_path, exact_fp32, phrase_boosting):
    """On CUDA, as in production: CUDA graphs per bucket (warmed up, the step around the loop captured), NeMo's Triton
    LM advance inside the fused decoder's graph; against NeMo's LM fusion of each stream alone on the same GPU (its
    eager loop), with each stream's phrases where ``phrase_boosting``."""
    model = bpe_streaming_model("cuda")
    set_decoding(model, lm_path, LM_ALPHA, per_stream_biasing=phrase_boosting)
    phrases = PHRASES if phrase_boosting else [None] * len(PHRASES)
    refs = [reference(model, pcm, p) for pcm, p in zip(audio, phrases, strict=True)]
    engine = StreamingEngine(
        model,
        num_slots=3,
        att_context_size=ATT,
        use_cuda_graphs=True,
        phrase_boosting=phrase_boosting,
        ngram_lm_model=lm_path,
        ngram_lm_alpha=LM_ALPHA,
    )
    engine.warm_up()
    decoder = engine.transcriber.decoder
    assert decoder.captured_batch_sizes  # the plain step, LM included, replays graphs around the fused loop
    driver = (BoostedDriver if phrase_boosting else Driver)(engine, audio, seed=2)
    driver.run()
    driver.check(refs)
    computers = [*decoder.computers.values(), *decoder._boosted_computers.values()]
    assert all(c.graph_mode not in (None, GraphMode.EAGER) for c in computers if c.fusion is not None)
