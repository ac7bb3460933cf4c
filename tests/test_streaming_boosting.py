"""Per-stream phrase boosting in the StreamingEngine (``StreamOptions.boosting``) gives every stream the tokens, text
and word timestamps of NeMo's cache-aware streaming of that stream alone with the same boosting tree.

The reference is ``nemo_alone`` with the stream's ``BiasingRequestItemConfig`` handled as NeMo 3.0's
``CacheAwareRNNTPipeline`` handles a request's ``biasing_cfg``: the model's decoding is NeMo's label-looping
``greedy_batch`` with ``enable_per_stream_biasing`` (its ``GPUBiasingMultiModel``, CUDA graphs off), the stream's tree
added to the multi-model, its first partial hypothesis ``Hypothesis.empty_with_biasing_cfg``, then the encoder's
``cache_aware_stream_step`` and ``rnnt_decoder_predictions_tensor`` chunk by chunk (``conformer_stream_step``'s steps).
The model is a tiny cache-aware RNN-T with a BPE tokenizer (random weights; NeMo tokenises the phrases with it).
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from conftest import whole_file_features
from nemo.collections.asr.parts.context_biasing import BoostingTreeModelConfig
from nemo.collections.asr.parts.context_biasing.biasing_multi_model import BiasingRequestItemConfig
from omegaconf import open_dict
from test_streaming_engine import Driver, nemo_words

from fastdecode_lab import synthetic as S
from nemo_fastdecode.apps.comparison import as_int_list
from nemo_fastdecode.apps.streaming_reference import nemo_alone
from nemo_fastdecode.graphs import GraphMode
from nemo_fastdecode.streaming import BoostingOptions, StreamingEngine, StreamOptions
from nemo_fastdecode.streaming.boosting import boosting_options_from_nemo

pytestmark = pytest.mark.usefixtures("single_thread")

RATE = 16000
ATT = [16, 1]
WEIGHT = 4.0  # a random model follows its phrases only with a large weight
LENGTHS = [64000, 48000, 30000, 80000, 9997, 41600]
# per stream: its phrases (None: no boosting); streams 0 and 4 share theirs (one built tree), stream 3 has two
PHRASES = [("the quick", "brown"), None, ("shall", "weeneen"), ("brown", "weeneen ack"), ("the quick", "brown"), None]


def bpe_streaming_model(device: str = "cpu") -> torch.nn.Module:
    """A tiny cache-aware RNN-T with a BPE tokenizer (random weights, ~0.3 tokens per frame), its decoding NeMo's
    label-looping greedy_batch with per-stream biasing (no CUDA graphs: NeMo's eager loop is the reference)."""
    model = S.build_synthetic_model("tiny-rnnt-streaming", vocab="bpe", seed=0)
    audio = S.synthetic_audio([2.0, 1.5], seed=7)
    encoded, lengths = S.encode(model, audio, batch_size=2, device="cpu")
    S.calibrate_blank_bias(model, encoded, lengths, 0.3, iterations=4, tolerance=0.05)
    cfg = copy.deepcopy(model.cfg.decoding)
    with open_dict(cfg):
        cfg.strategy = "greedy_batch"
        cfg.greedy.loop_labels = True
        cfg.greedy.use_cuda_graph_decoder = False
        cfg.greedy.enable_per_stream_biasing = True
    model.change_decoding_strategy(cfg, verbose=False)
    model.encoder.set_default_att_context_size(ATT)
    return model.to(device).eval()


def nemo_biasing(phrases) -> BiasingRequestItemConfig | None:
    """NeMo's per-request biasing config of ``phrases`` (NeMo's defaults but the weight)."""
    if phrases is None:
        return None
    tree = BoostingTreeModelConfig(key_phrases_list=list(phrases))
    return BiasingRequestItemConfig(boosting_model_cfg=tree, boosting_model_alpha=WEIGHT)


def options(phrases) -> BoostingOptions | None:
    return None if phrases is None else BoostingOptions(phrases=phrases, weight=WEIGHT)


def reference(model, pcm, phrases) -> tuple[list[int], str, list[dict]]:
    _, hyp, _ = nemo_alone(model, whole_file_features(model, pcm), nemo_biasing(phrases))
    # grown from NeMo's empty biasing hypothesis, the frames are one tensor (else a list of ints): as ints, NeMo's word
    # seconds are Python floats, as for a stream without biasing
    hyp = copy.copy(hyp)
    hyp.timestamp = as_int_list(hyp.timestamp)
    return as_int_list(hyp.y_sequence), hyp.text, nemo_words(model, hyp)


@pytest.fixture(scope="module")
def model():
    return bpe_streaming_model()


@pytest.fixture(scope="module")
def audio() -> list[np.ndarray]:
    signals = S.synthetic_audio([n / RATE for n in LENGTHS], seed=5)
    return [np.round(s[:n] * 32768).astype(np.int16) for s, n in zip(signals, LENGTHS, strict=True)]


@pytest.fixture(scope="module")
def refs(model, audio):
    boosted = [reference(model, pcm, phrases) for pcm, phrases in zip(audio, PHRASES, strict=True)]
    plain = [reference(model, pcm, None) for pcm in audio]
    assert all(ids for ids, _, _ in boosted), "a stream emitted nothing: nothing compared"
    changed = [i for i, phrases in enumerate(PHRASES) if phrases is not None and boosted[i][0] != plain[i][0]]
    assert len(changed) >= 2, "boosting changes no stream's tokens: the comparison could not fail"
    return boosted, plain


class BoostedDriver(Driver):
    """The engine tests' driver (random pushes of streams that come and go), each stream with its own phrases."""

    def _options(self, stream: int) -> StreamOptions:
        return dataclasses.replace(super()._options(stream), boosting=options(PHRASES[stream]))


@pytest.mark.parametrize("seed", [0, 1])
def test_streams_with_their_own_phrases_give_nemo_per_stream_boosting_alone(model, audio, refs, seed):
    boosted, plain = refs
    engine = StreamingEngine(model, num_slots=3, att_context_size=ATT, max_cycle_seconds=0.25)
    driver = BoostedDriver(engine, audio, seed)
    driver.run()
    driver.check(boosted)  # streams without phrases: their plain transcripts (boosted == plain for them)
    assert all(boosted[i] == plain[i] for i, phrases in enumerate(PHRASES) if phrases is None)
    assert driver.refused > 0 and max(driver.batches) > 1  # slots reused, boosted and plain streams stepped together
    decoder = engine.transcriber.decoder
    assert not decoder.boosting.multi_model.model2active.any()  # every tree left with its stream
    assert (decoder.boosting.model_ids == -1).all()


def test_streams_without_phrases_never_touch_the_boosting_path(model, audio, refs):
    """No stream with phrases: no multi-model is built, no fused computer runs; after boosted streams end, plain steps
    run the plain decoder again."""
    boosted, plain = refs
    engine = StreamingEngine(model, num_slots=2, att_context_size=ATT)
    decoder = engine.transcriber.decoder
    calls = []
    fused = decoder._decode_boosted
    decoder._decode_boosted = lambda *args: calls.append(1) or fused(*args)

    def run(stream: int, boosting) -> list[int]:
        engine_id = engine.open(StreamOptions(boosting=boosting))
        engine.push(engine_id, audio[stream].tobytes())
        engine.finish(engine_id)
        finals = []
        while engine.busy:
            finals += [e for e in engine.poll() if e.is_last]
        return finals[0].token_ids

    assert run(1, None) == plain[1][0]
    assert decoder.boosting is None and not calls
    assert run(0, options(PHRASES[0])) == boosted[0][0] and calls
    calls.clear()
    assert run(5, None) == plain[5][0]
    assert not calls


def test_boosting_set_up_front_warms_the_fused_decoder_and_stays_exact(model, audio, refs):
    """``phrase_boosting=True``: the multi-model exists from the start and the decoder's warm-up runs the fused
    computers too (on the dummy slot only); a boosted and a plain stream afterwards are still exact."""
    boosted, plain = refs
    engine = StreamingEngine(model, num_slots=2, att_context_size=ATT, phrase_boosting=True)
    decoder = engine.transcriber.decoder
    assert decoder.boosting is not None and not decoder._boosted_computers
    decoder.warm_up([1, 2], engine.geometry.out_frames, model.encoder._feat_out)
    assert decoder._boosted_computers and not decoder.decoded(decoder.dummy_slot)
    ids = [engine.open(StreamOptions(boosting=options(PHRASES[0]))), engine.open()]
    for engine_id, stream in zip(ids, (0, 1), strict=True):
        engine.push(engine_id, audio[stream].tobytes())
        engine.finish(engine_id)
    finals = {}
    while engine.busy:
        finals.update((e.stream_id, e.token_ids) for e in engine.poll() if e.is_last)
    assert [finals[i] for i in ids] == [boosted[0][0], plain[1][0]]


def test_nemo_configs_convert_and_unsupported_options_are_named():
    cfg = nemo_biasing(("the quick", "brown"))
    assert boosting_options_from_nemo(cfg) == BoostingOptions(phrases=("the quick", "brown"), weight=WEIGHT)
    assert boosting_options_from_nemo({"key_phrases_list": ["a"], "depth_scaling": 1.0}).depth_scaling == 1.0
    for name, value in [
        ("model_path", "tree.nemo"),
        ("key_phrases_file", "phrases.txt"),
        ("use_bpe_dropout", True),
        ("source_lang", "es"),
    ]:
        with pytest.raises(ValueError, match=name):
            boosting_options_from_nemo({"key_phrases_list": ["a"], name: value})
    with pytest.raises(ValueError, match="cache_key"):
        boosting_options_from_nemo(dataclasses.replace(cfg, cache_key="k"))
    with pytest.raises(ValueError, match="key_phrases_list"):
        boosting_options_from_nemo(BiasingRequestItemConfig())
    with pytest.raises(ValueError, match="unknown boosting option"):
        boosting_options_from_nemo({"key_phrases_list": ["a"], "boost": 2})


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"phrases": ()}, ValueError, "empty"),
        ({"phrases": "brown"}, TypeError, "list of strings"),
        ({"phrases": ("a", 3)}, TypeError, r"phrases\[1\]"),
        ({"phrases": ("a", "  ")}, ValueError, r"phrases\[1\]"),
        ({"phrases": ("a",), "weight": float("nan")}, ValueError, "weight"),
        ({"phrases": ("a",), "context_score": "1"}, ValueError, "context_score"),
        ({"phrases": ("a",), "uniform_weights": 1}, TypeError, "uniform_weights"),
    ],
)
def test_bad_boosting_options_are_refused_naming_the_value(kwargs, error, match):
    with pytest.raises(error, match=match):
        BoostingOptions(**kwargs)


def test_a_refused_boosting_leaves_the_engine_as_it_was(model):
    """A model without a tokenizer cannot tokenise phrases: open refuses before taking a slot."""
    char_model = S.build_synthetic_model("tiny-rnnt-streaming", seed=0)
    engine = StreamingEngine(char_model, num_slots=1, att_context_size=ATT)
    with pytest.raises(ValueError, match="tokenizer"):
        engine.open(StreamOptions(boosting=options(PHRASES[0])))
    assert engine.open_streams == []
    assert engine.open() == 0  # the slot is still free


@pytest.mark.gpu
def test_boosting_on_the_gpu_with_cuda_graphs_gives_nemo_per_stream_boosting_alone(audio, exact_fp32):
    """On CUDA, as in production: CUDA graphs per bucket (warmed up), the multi-model's Triton advance inside the fused
    decoder's graph; against NeMo's per-stream biasing of each stream alone on the same GPU (its eager loop)."""
    model = bpe_streaming_model("cuda")
    boosted = [reference(model, pcm, phrases) for pcm, phrases in zip(audio, PHRASES, strict=True)]
    engine = StreamingEngine(model, num_slots=3, att_context_size=ATT, use_cuda_graphs=True, phrase_boosting=True)
    engine.warm_up()  # captures the fused decoder's graphs too
    assert engine.transcriber.decoder._boosted_computers
    driver = BoostedDriver(engine, audio, seed=2)
    driver.run()
    driver.check(boosted)
    fused = engine.transcriber.decoder._boosted_computers.values()
    assert fused and all(c.graph_mode not in (None, GraphMode.EAGER) for c in fused)  # the fused loop ran as a graph
