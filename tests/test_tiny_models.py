"""``scripts/train_tiny_models.py``: the corpus and its held-out splits, eSpeak NG synthesis, the tokenizer, the
PyTorch transducer losses against NeMo's, and the recipe end to end at a toy scale (resumed, exported, restored,
evaluated)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_transcribe_and_configs import keys

from fastdecode_lab.bpe_tokenizer import write_bpe_tokenizer
from fastdecode_lab.configs import TinyModelsConfig
from fastdecode_lab.tiny_models import corpus, espeak_worker, speech, spoken_numbers
from fastdecode_lab.tiny_models.layout import SPLITS, RecipeLayout
from fastdecode_lab.tiny_models.transducer_loss import install_torch_loss, rnnt_loss, tdt_loss

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("single_thread")


# ----------------------------------------------------------------------------------------------
# configs


def test_train_tiny_models_yaml_matches_dataclass():
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        cfg = compose(config_name="train_tiny_models")
    schema = OmegaConf.structured(TinyModelsConfig)
    assert OmegaConf.merge(schema, cfg) == schema
    assert keys(cfg) == keys(schema)


def test_tiny_models_config_rejects_bad_values():
    with pytest.raises(
        ValueError, match=r"stages=\['fit'\] is not valid; choose from: data, train, export, evaluate, ship"
    ):
        TinyModelsConfig(stages=["fit"])
    with pytest.raises(ValueError, match="models=.*choose from: tdt, streaming_hybrid"):
        TinyModelsConfig(models=["rnnt"])
    with pytest.raises(ValueError, match="loss='numba' is not valid; valid values: torch, nemo"):
        TinyModelsConfig(loss="numba")
    with pytest.raises(ValueError, match="eval_sessions must be >= 0"):
        TinyModelsConfig(eval_session_utterances=0)
    with pytest.raises(ValueError, match="eval_beam_size must be >= 1 or null .no beam rows., got 0"):
        TinyModelsConfig(eval_beam_size=0)
    assert TinyModelsConfig(eval_beam_size=None).eval_beam_size is None


@pytest.mark.parametrize("model", ["tdt", "streaming_hybrid"])
def test_model_configs_follow_nemo_conventions(model):
    cfg = OmegaConf.load(REPO / "configs" / "tiny_models" / f"{model}.yaml").model
    assert cfg.encoder.subsampling_factor == 8 and cfg.tokenizer.type == "bpe"
    assert cfg.aux_ctc.ctc_loss_weight > 0  # NeMo's hybrid models: a CTC head on the encoder
    if model == "tdt":
        assert cfg.loss.loss_name == "tdt" and cfg.decoding.model_type == "tdt"
        assert list(cfg.model_defaults.tdt_durations) == [0, 1, 2, 3, 4]
    else:
        assert [list(c) for c in cfg.encoder.att_context_size] == [[70, 13], [70, 6], [70, 1], [70, 0]]
        assert cfg.encoder.att_context_style == "chunked_limited" and cfg.encoder.conv_context_size == "causal"
        assert cfg.encoder.causal_downsampling and cfg.preprocessor.normalize == "NA"


# ----------------------------------------------------------------------------------------------
# text


def test_spoken_numbers():
    assert spoken_numbers.cardinal(0) == "zero"
    assert spoken_numbers.cardinal(105) == "one hundred and five"
    assert spoken_numbers.cardinal(40_017) == "forty thousand and seventeen"
    assert spoken_numbers.cardinal(1_234_567) == (
        "one million two hundred and thirty four thousand five hundred and sixty seven"
    )
    assert [spoken_numbers.ordinal(n) for n in (1, 2, 3, 12, 21, 30, 100)] == [
        "first",
        "second",
        "third",
        "twelfth",
        "twenty first",
        "thirtieth",
        "one hundredth",
    ]
    assert spoken_numbers.year(1984) == "nineteen eighty four"
    assert spoken_numbers.year(2005) == "two thousand and five"
    assert spoken_numbers.year(1905) == "nineteen oh five"
    assert spoken_numbers.clock_time(7, 30, style=1) == "half past seven"
    assert spoken_numbers.clock_time(11, 45, style=1) == "quarter to twelve"
    assert spoken_numbers.clock_time(9, 5) == "nine oh five"
    assert spoken_numbers.price(1, 1) == "one dollar and one cent"
    assert spoken_numbers.price(12, 50, "pounds") == "twelve pounds and fifty pence"
    assert spoken_numbers.digits("5024") == "five oh two four"
    with pytest.raises(ValueError, match="0..999999999, got -1"):
        spoken_numbers.cardinal(-1)
    with pytest.raises(ValueError, match="string of digits, got '12a'"):
        spoken_numbers.digits("12a")


def test_plural_and_article():
    assert [corpus.plural(w) for w in ("box", "cherry", "day", "knife", "bus stop", "sheep")] == [
        "boxes",
        "cherries",
        "days",
        "knives",
        "bus stops",
        "sheep",
    ]
    assert [corpus.with_article(w) for w in ("apple", "university", "red box", "old car")] == [
        "an apple",
        "a university",
        "a red box",
        "an old car",
    ]


def test_sentences_are_normalised_varied_and_seeded():
    first = list(zip(range(3000), corpus.distinct_sentences(seed=3), strict=False))
    sentences = [s for _, s in first]
    assert len(set(sentences)) == len(sentences) == 3000
    assert all(corpus.is_normalised(s) and corpus.MIN_WORDS <= len(s.split()) <= corpus.MAX_WORDS for s in sentences)
    assert len(corpus.words_of(sentences)) > 1000  # a broad vocabulary
    assert any(re.search(r"\b(twenty|thirty|hundred)\b", s) for s in sentences)  # numbers spelled out
    assert any("'" in s for s in sentences)
    again = [s for _, s in zip(range(3000), corpus.distinct_sentences(seed=3), strict=False)]
    other = [s for _, s in zip(range(3000), corpus.distinct_sentences(seed=4), strict=False)]
    assert again == sentences and other != sentences


def test_held_out_splits_are_disjoint_and_in_domain():
    splits = corpus.make_splits(2000, 50, 100, seed=0)
    assert (len(splits.train), len(splits.dev), len(splits.test)) == (2000, 50, 100)
    train, dev, test = set(splits.train), set(splits.dev), set(splits.test)
    assert len(train) == 2000 and not train & dev and not train & test and not dev & test
    assert corpus.words_of(splits.dev) | corpus.words_of(splits.test) <= corpus.words_of(splits.train)
    assert corpus.make_splits(2000, 50, 100, seed=0) == splits
    with pytest.raises(RuntimeError, match="held-out sentences use training words only"):
        corpus.make_splits(2, 50, 50, seed=0, max_draws=100)


def test_tokenizer_covers_the_corpus(tmp_path):
    import sentencepiece as spm

    splits = corpus.make_splits(3000, 20, 100, seed=1)
    write_bpe_tokenizer(splits.train, tmp_path, vocab_size=128)
    processor = spm.SentencePieceProcessor(model_file=str(tmp_path / "tokenizer.model"))
    assert processor.get_piece_size() == 128
    assert len((tmp_path / "vocab.txt").read_text().splitlines()) == 127  # NeMo's layout: every piece but <unk>
    for sentence in splits.test + splits.train[:200]:
        ids = processor.encode(sentence)
        assert processor.unk_id() not in ids
        assert processor.decode(ids) == sentence


# ----------------------------------------------------------------------------------------------
# speech


def test_voices_exist_and_test_voices_are_held_out():
    pytest.importorskip("espeakng_loader")
    speech.check_voices(speech.TRAIN_VARIANTS + speech.HELD_OUT_VARIANTS)
    assert not set(speech.TRAIN_VARIANTS) & set(speech.HELD_OUT_VARIANTS)
    with pytest.raises(ValueError, match=r"variants not found .*\['no-such-voice'\]"):
        speech.check_voices(["f1", "no-such-voice"])


def test_requests_are_seeded_per_utterance(tmp_path):
    sentences = ["hello there", "how are you", "see you soon"]
    requests = speech.draw_requests(sentences, "train", tmp_path, seed=5)
    assert speech.draw_requests(sentences, "train", tmp_path, seed=5) == requests
    assert speech.draw_requests(sentences[:2], "train", tmp_path, seed=5) == requests[:2]  # one seed per utterance
    assert speech.draw_requests(sentences, "train", tmp_path, seed=6) != requests
    test = speech.draw_requests(sentences * 20, "test", tmp_path, seed=5)
    assert all(r.voice.partition("+")[2] in speech.HELD_OUT_VARIANTS for r in test)
    assert all(r.voice.partition("+")[2] in speech.TRAIN_VARIANTS for r in requests)
    style = speech.SpeakingStyle()
    assert all(style.rate[0] <= r.rate <= style.rate[1] for r in test)


def test_resampling_keeps_rate_and_length():
    seconds = 0.5
    t = np.arange(int(seconds * espeak_worker.ESPEAK_SAMPLE_RATE)) / espeak_worker.ESPEAK_SAMPLE_RATE
    tone = (8000 * np.sin(2 * np.pi * 1000.0 * t)).astype(np.int16)
    out = espeak_worker.resample_to_16k(tone)
    assert out.dtype == np.float32 and len(out) == -(-len(tone) * 320 // 441)
    spectrum = np.abs(np.fft.rfft(out * np.hanning(len(out))))
    assert np.argmax(spectrum) * espeak_worker.SAMPLE_RATE / len(out) == pytest.approx(1000.0, abs=4.0)
    assert np.abs(out[200:-200]).max() == pytest.approx(8000, rel=0.02)


def test_finish_audio_adds_silences_gain_and_seeded_noise():
    speech_part = np.sin(np.linspace(0, 200, 8000)).astype(np.float32)  # power 1/2
    request = {"seed": 1, "gain_db": -6.0, "snr_db": 90.0, "lead_seconds": 0.1, "trail_seconds": 0.2}
    audio = espeak_worker.finish_audio(speech_part, request)
    assert audio.dtype == np.int16 and len(audio) == 8000 + 1600 + 3200
    assert np.abs(audio).max() / 32767 == pytest.approx(10 ** (-6 / 20), rel=0.01)
    noisy = espeak_worker.finish_audio(speech_part, {**request, "snr_db": 30.0})
    expected_std = np.sqrt(0.5 * 10 ** (-6 / 10) / 10**3) * 32767  # the scaled speech's power, 30 dB down
    assert np.std(noisy[:1600]) == pytest.approx(expected_std, rel=0.1)  # light noise in the leading silence
    assert np.array_equal(espeak_worker.finish_audio(speech_part, {**request, "snr_db": 30.0}), noisy)
    assert not np.array_equal(espeak_worker.finish_audio(speech_part, {**request, "snr_db": 30.0, "seed": 2}), noisy)


def test_synthesis_is_deterministic_per_utterance(tmp_path):
    pytest.importorskip("espeakng_loader")
    import soundfile as sf

    requests = speech.draw_requests(["the quick brown fox", "twenty five past seven"], "test", tmp_path / "a", seed=0)
    requests += speech.draw_requests(["hello there"], "train", tmp_path / "a", seed=0)
    requests = [replace(requests[0], voice="en-us+klatt3"), requests[1], replace(requests[2], voice="en-029+f2")]
    durations = speech.synthesize(requests, workers=2, chunk_size=1, log=lambda _: None)
    assert all(0.5 < d < 4.0 for d in durations)
    first = [sf.read(r.path, dtype="int16")[0] for r in requests]
    assert all(sf.info(r.path).samplerate == speech.SAMPLE_RATE for r in requests)
    # the same requests in another order, in one worker, elsewhere: the same samples
    moved = [replace(r, path=str(tmp_path / "b" / f"{i}.wav")) for i, r in enumerate(requests)][::-1]
    (tmp_path / "b").mkdir()
    speech.synthesize(moved, workers=1, log=lambda _: None)
    assert all(np.array_equal(a, sf.read(r.path, dtype="int16")[0]) for a, r in zip(first, moved[::-1], strict=True))
    # a file that exists is kept; a failing request is named
    assert speech.synthesize(requests, workers=1, log=lambda _: None) == durations
    with pytest.raises(RuntimeError, match="(?s)1 utterances could not be synthesised.*no voice 'xx-nope'"):
        speech.synthesize([replace(requests[0], path=str(tmp_path / "c.wav"), voice="xx-nope")], log=lambda _: None)


# ----------------------------------------------------------------------------------------------
# losses


def _lattice(seed: int, num_extra: int = 0):
    generator = torch.Generator().manual_seed(seed)
    batch, frames, labels, vocab = 3, 7, 4, 6
    acts = torch.randn(batch, frames, labels + 1, vocab + 1 + num_extra, generator=generator, requires_grad=True)
    targets = torch.randint(0, vocab, (batch, labels), generator=generator)
    return acts, targets, torch.tensor([7, 5, 6]), torch.tensor([4, 2, 3]), vocab


def test_rnnt_loss_equals_nemo():
    from nemo.collections.asr.parts.numba.rnnt_loss import RNNTLossNumba

    acts, labels, act_lens, label_lens, blank = _lattice(0)
    ref = RNNTLossNumba(blank=blank, reduction="none")(acts, labels, act_lens, label_lens)
    ours = rnnt_loss(acts, labels, act_lens, label_lens, blank)
    assert torch.allclose(ours, ref, atol=1e-5) and ref.min() > 1.0
    (ref_grad,) = torch.autograd.grad(ref.sum(), acts)
    (grad,) = torch.autograd.grad(ours.sum(), acts)
    assert torch.allclose(grad, ref_grad, atol=1e-5) and ref_grad.abs().max() > 0.1


@pytest.mark.parametrize("sigma", [0.0, 0.05])
def test_tdt_loss_equals_nemo(monkeypatch, sigma):
    from nemo.collections.asr.losses.rnnt_pytorch import TDTLossPytorch

    durations = [0, 1, 2, 3, 4]
    acts, labels, act_lens, label_lens, blank = _lattice(1, num_extra=len(durations))
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)  # NeMo's reference says .cuda()
    reference = TDTLossPytorch(blank=blank, durations=durations, reduction="none", sigma=sigma)
    ref = reference(acts=acts, labels=labels, act_lens=act_lens, label_lens=label_lens)
    ours = tdt_loss(acts, labels, act_lens, label_lens, blank, durations, sigma)
    assert torch.allclose(ours, ref, atol=1e-4) and ref.min() > 1.0
    (ref_grad,) = torch.autograd.grad(ref.sum(), acts)
    (grad,) = torch.autograd.grad(ours.sum(), acts)
    assert torch.allclose(grad, ref_grad, atol=1e-5) and ref_grad.abs().max() > 0.1


def test_torch_loss_rejects_what_it_does_not_implement():
    from nemo.collections.asr.losses.rnnt import RNNTLoss

    loss = RNNTLoss(num_classes=6, loss_name="tdt", loss_kwargs={"durations": [0, 1, 2]})
    with pytest.raises(ValueError, match=r"loss.fastemit_lambda=0.005 is not supported.*set it to 0"):
        install_torch_loss(loss, {"loss_name": "tdt", "tdt_kwargs": {"durations": [0, 1, 2], "fastemit_lambda": 5e-3}})
    with pytest.raises(ValueError, match="loss_name='graph_rnnt' has no PyTorch version here; valid: tdt, default"):
        install_torch_loss(loss, {"loss_name": "graph_rnnt"})
    with pytest.raises(ValueError, match=r"durations must be distinct and include 0 and 1, got \[1, 2\]"):
        acts, labels, act_lens, label_lens, blank = _lattice(0, num_extra=2)
        tdt_loss(acts, labels, act_lens, label_lens, blank, [1, 2])


# ----------------------------------------------------------------------------------------------
# the recipe at a toy scale


@pytest.fixture(scope="module")
def toy_recipe(tmp_path_factory):
    """Both models trained for 2 steps on 12 utterances, resumed for 2 more, exported and evaluated."""
    pytest.importorskip("espeakng_loader")
    from fastdecode_lab.tiny_models.recipe import run

    torch.set_num_threads(1)
    lines: list[str] = []
    cfg = {
        "output_dir": str(tmp_path_factory.mktemp("tiny_models")),
        "num_train": 12,
        "num_dev": 2,
        "num_test": 3,
        "synthesis_workers": 2,
        "voices": {"engines": []},  # eSpeak NG only: CI has no festival (tests/test_tiny_voices.py tests the others)
        "vocab_size": 64,
        "batch_size": 4,
        "num_workers": 0,
        "max_steps": 2,
        "max_time": None,
        "val_check_interval": 2,
        "log_every_n_steps": 1,
        "eval_batch_size": 4,
        "eval_streaming_utterances": 2,
        "eval_sessions": 1,
        "eval_session_utterances": 3,
        "model_overrides": {
            "encoder": {"n_layers": 1, "d_model": 16, "n_heads": 2, "subsampling_conv_channels": 8},
            "model_defaults": {"pred_hidden": 16, "joint_hidden": 16},
        },
    }
    run({**cfg, "stages": ["data", "train"]}, log=lines.append)
    layout = run({**cfg, "stages": ["data", "train", "export"]}, log=lines.append)  # all done: nothing to redo
    run({**cfg, "max_steps": 4, "stages": ["train", "evaluate"]}, log=lines.append)  # two steps more
    return layout, lines


@pytest.mark.slow
def test_recipe_writes_data_and_tokenizer(toy_recipe):
    layout, lines = toy_recipe
    entries = {s: [json.loads(line) for line in layout.manifest(s).read_text().splitlines()] for s in SPLITS}
    assert [len(entries[s]) for s in ("train", "dev", "test")] == [12, 2, 3]
    for split, split_entries in entries.items():
        assert [e["text"] for e in split_entries] == layout.corpus(split).read_text().splitlines()
        assert all((layout.manifest(split).parent / e["audio_filepath"]).is_file() for e in split_entries)
    assert {e["voice"].partition("+")[2] for e in entries["test"]} <= set(speech.HELD_OUT_VARIANTS)
    assert (layout.tokenizer_dir / "tokenizer.model").is_file()
    assert any("tokenizer: " in line and "up to date" in line for line in lines)  # the second data stage redid nothing
    assert any("Synthesising" in line for line in lines) and sum("Synthesising" in line for line in lines) == 1


@pytest.mark.slow
def test_recipe_resumes_training_from_the_checkpoint(toy_recipe):
    layout, lines = toy_recipe
    for model in ("tdt", "streaming_hybrid"):
        assert any(line.startswith(f"{model}: ") and "from scratch" in line for line in lines)
        assert any(line.startswith(f"{model}: ") and "resuming from" in line for line in lines)
        assert any(line.startswith(f"{model}: step 4 after") for line in lines)
        assert any(line.startswith(f"{model}: already trained") for line in lines)  # the second run
        state = torch.load(layout.last_checkpoint(model), map_location="cpu", weights_only=False)
        assert state["global_step"] == 4
        assert json.loads(layout.trained_marker(model).read_text()) == {
            "global_step": 4,
            "max_steps": 4,
            "max_time": None,
        }


#: the first word of the evaluation rows that decode with nemo_fastdecode
OURS = ("fast_greedy", "fast_beam", "StreamingEngine")


@pytest.mark.slow
def test_exported_models_restore_transcribe_and_are_evaluated(toy_recipe):
    from fastdecode_lab.tiny_models.training import restore

    layout, _ = toy_recipe
    first = json.loads(layout.manifest("test").read_text().splitlines()[0])
    test_audio = [str(layout.manifest("test").parent / first["audio_filepath"])]
    beam = ["malsd_batch (beam 4)", "fast_beam (beam 4)"]
    rnnt_greedy = [f"{s} ({a} loop)" for s, a in [("greedy_batch", "frame"), ("greedy_batch", "label")]]
    rnnt_greedy += [f"fast_greedy ({a} loop)" for a in ("label", "frame")]
    sides = ("NeMo streaming", "StreamingEngine", "NeMo streaming script")
    streamed = [f"{side} [70, {r}]" for r in (13, 6, 1, 0) for side in sides]
    for model, cls, decodings in (
        ("tdt", "EncDecHybridRNNTCTCBPEModel", ["greedy_batch (label loop)", "fast_greedy (label loop)", *beam, "ctc"]),
        ("streaming_hybrid", "EncDecHybridRNNTCTCBPEModel", [*rnnt_greedy, *beam, "ctc", *streamed]),
    ):
        restored = restore(layout.nemo(model))
        assert type(restored).__name__ == cls
        assert restored.cfg.train_ds.manifest_filepath is None  # no paths of this machine in the model
        hyps = restored.transcribe(test_audio, batch_size=1, verbose=False)
        assert isinstance(hyps[0].text, str)
        report = json.loads(layout.evaluation(model).read_text())
        assert [r["decoding"] for r in report["results"]] == decodings
        assert all(r["wer"] >= 0 for r in report["results"]) and report["test_utterances"] == 3
        # each of our rows names NeMo's row before it and has its token ids (fp32)
        names = [r["decoding"] for r in report["results"]]
        ours = [(i, r) for i, r in enumerate(report["results"]) if r["decoding"].split(" ")[0] in OURS]
        assert len(ours) == (3 + 4 if model == "streaming_hybrid" else 2)
        for i, r in ours:
            assert r["reference"] in names[:i] and r["differing"] == 0, r
        assert report["environment"]["torch"] == torch.__version__
        # one session: the three test utterances joined, each followed by 1.2 s of silence
        sessions = report["sessions"]
        test_entries = [json.loads(line) for line in layout.manifest("test").read_text().splitlines()]
        texts, durations = [e["text"] for e in test_entries], [e["duration"] for e in test_entries]
        assert sessions["sessions"] == 1 and sessions["seconds"] == pytest.approx(sum(durations) + 3 * 1.2, abs=0.1)
        session_rows = ["offline"] + [f"{side} [70, {r}]" for r in (13, 6, 1, 0) for side in sides[:2]]
        assert [r["decoding"] for r in sessions["rows"]] == (
            session_rows if model == "streaming_hybrid" else ["offline"]
        )
        assert all(r["examples"][0]["ref"] == " ".join(texts) for r in sessions["rows"])
        assert all(r["differing"] == 0 for r in sessions["rows"] if r["decoding"].startswith("StreamingEngine"))


@pytest.mark.slow
def test_export_stage_saves_the_last_checkpoint(toy_recipe):
    from fastdecode_lab.tiny_models.recipe import run
    from fastdecode_lab.tiny_models.training import restore

    layout, _ = toy_recipe
    layout.nemo("tdt").unlink()
    lines: list[str] = []
    run({"output_dir": str(layout.root), "stages": ["export"], "models": ["tdt"]}, log=lines.append)
    assert any(line.startswith("tdt: saved ") for line in lines)
    weights = torch.load(layout.last_checkpoint("tdt"), map_location="cpu", weights_only=False)["state_dict"]
    restored = restore(layout.nemo("tdt")).state_dict()
    assert weights.keys() == restored.keys()
    assert all(torch.equal(weights[k], restored[k]) for k in weights)


def test_sessions_join_consecutive_utterances_with_a_pause_after_each():
    from fastdecode_lab.tiny_models.evaluation import joined_sessions

    pcm = [np.full(n, i + 1, dtype=np.int16) for i, n in enumerate((100, 200, 300, 400, 500))]
    audio, references = joined_sessions(pcm, ["a", "b", "c", "d", "e"], per_session=2, pause_seconds=0.01)
    assert references == ["a b", "c d"]  # the fifth utterance makes no full session
    assert [a.size for a in audio] == [100 + 200 + 2 * 160, 300 + 400 + 2 * 160]
    first = audio[0]
    assert (first[:100] == 1).all() and (first[100:260] == 0).all() and (first[260:460] == 2).all()
    assert (first[460:] == 0).all()
    with pytest.raises(ValueError, match="per_session must be >= 1"):
        joined_sessions(pcm, list("abcde"), per_session=0, pause_seconds=1.0)


def test_examples_are_taken_in_turn_from_each_split_that_exists(tmp_path):
    from fastdecode_lab.tiny_models.recipe import pick_examples

    layout = RecipeLayout.at(tmp_path)
    layout.manifest("test").parent.mkdir(parents=True)
    for split, count in (("test", 3), ("test_flite", 1)):
        lines = [json.dumps({"audio_filepath": f"{split}_{i}.wav", "text": f"{split} {i}"}) for i in range(count)]
        layout.manifest(split).write_text("\n".join(lines) + "\n")
    log: list[str] = []
    picked = pick_examples(layout, ["test", "test_festival_voices", "test_flite"], 4, log.append)
    assert [(split, entry["text"]) for split, entry in picked] == [
        ("test", "test 0"),
        ("test_flite", "test_flite 0"),
        ("test", "test 1"),
        ("test", "test 2"),
    ]
    assert any("test_festival_voices" in line for line in log)  # the missing split is named, not silently dropped
    assert [split for split, _ in pick_examples(layout, ["test_flite", "test"], 2)] == ["test_flite", "test"]
    with pytest.raises(FileNotFoundError, match="test_festival_voices"):
        pick_examples(layout, ["test_festival_voices"], 2)


@pytest.mark.slow
def test_ship_stage_copies_models_evaluations_and_examples(toy_recipe, tmp_path):
    from fastdecode_lab.tiny_models.recipe import run
    from nemo_fastdecode.apps import trained_models

    layout, _ = toy_recipe
    lines: list[str] = []
    target = tmp_path / "assets"
    run({"output_dir": str(layout.root), "stages": ["ship"], "ship_dir": str(target), "num_examples": 2}, lines.append)
    for name, model in trained_models.TRAINED_MODELS.items():
        assert trained_models.trained_model_path(name, target).read_bytes() == layout.nemo(model).read_bytes()
        assert (target / f"{name}_eval.json").read_text() == layout.evaluation(model).read_text()
    test_entries = [json.loads(line) for line in layout.manifest("test").read_text().splitlines()]
    examples = trained_models.example_entries(target / "examples" / "manifest.jsonl")
    assert [e["text"] for e in examples] == [e["text"] for e in test_entries[:2]]
    for example, entry in zip(examples, test_entries, strict=False):
        source = layout.manifest("test").parent / entry["audio_filepath"]
        assert Path(example["audio_filepath"]).read_bytes() == source.read_bytes()
    assert any("examples: 2 test utterances" in line for line in lines)
    statistics = json.loads((target / "emission_statistics.json").read_text())
    assert set(statistics) == {"rnnt", "tdt"} and all(s["utterances"] == len(test_entries) for s in statistics.values())
