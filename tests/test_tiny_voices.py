"""Other synthesisers for the tiny models: the augmentation's transforms, the splits (Flite and held-out voices never
in training), pause-joined examples, and a smoke test per installed engine (skipped where it is not installed; set
``FASTDECODE_SYNTHESISERS`` to the folder of ``scripts/pack_synthesisers.sh`` to test the packed copy)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fastdecode_lab.tiny_models import augment as aug
from fastdecode_lab.tiny_models import corpus, voices
from fastdecode_lab.tiny_models.layout import RecipeLayout

SR = 16000
PACKED = os.environ.get("FASTDECODE_SYNTHESISERS")


def _sine(hz: float, seconds: float = 1.0, amplitude: float = 0.5) -> np.ndarray:
    return (amplitude * np.sin(2 * np.pi * hz * np.arange(int(seconds * SR)) / SR)).astype(np.float32)


def _peak_hz(x: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.argmax(spectrum) * SR / x.size)


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.asarray(x, dtype=np.float64) ** 2)))


# ---- augmentation ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("snr_db", [0.0, 10.0, 30.0])
@pytest.mark.parametrize("exponent", [0.0, 1.0])
def test_noise_is_added_at_the_snr(snr_db, exponent):
    speech = _sine(300.0, 2.0)
    noisy = aug.add_noise(speech, snr_db, np.random.default_rng(0), exponent, reference=speech)
    measured = 10 * np.log10(
        np.mean(speech.astype(np.float64) ** 2) / np.mean((noisy - speech).astype(np.float64) ** 2)
    )
    assert measured == pytest.approx(snr_db, abs=0.1)


def test_8k_round_trip_removes_content_above_4k_and_keeps_length():
    x = _sine(1000.0) + _sine(6000.0)
    y = aug.round_trip(x, SR)
    assert y.size == x.size
    spectrum = np.abs(np.fft.rfft(y[1000:-1000] * np.hanning(y.size - 2000)))
    hz = np.fft.rfftfreq(y.size - 2000, 1 / SR)
    assert spectrum[hz > 4100].max() < 1e-3 * spectrum.max()
    assert _rms(y[1000:-1000]) == pytest.approx(_rms(_sine(1000.0)), rel=0.02)  # the 1 kHz tone stays


def test_telephone_band_keeps_the_voice_band_only():
    assert _rms(aug.band_pass(_sine(1000.0), SR)[2000:-2000]) == pytest.approx(_rms(_sine(1000.0)), rel=0.02)
    for hz in (80.0, 6000.0):
        assert _rms(aug.band_pass(_sine(hz), SR)[2000:-2000]) < 0.02 * _rms(_sine(hz))


@pytest.mark.parametrize("factor", [0.85, 0.9, 1.1, 1.15])
def test_speed_changes_length_by_the_factor_and_pitch_with_it(factor):
    x = _sine(500.0, 2.0)
    y = aug.speed(x, factor)
    assert abs(y.size - x.size / factor) <= 1
    assert _peak_hz(y) == pytest.approx(500.0 * factor, abs=2.0)


@pytest.mark.parametrize("semitones", [-3.0, 2.0, 12.0])
def test_pitch_shift_keeps_length_and_moves_the_frequency(semitones):
    y = aug.pitch_shift(_sine(440.0, 1.5), semitones)
    assert y.size == int(1.5 * SR)
    assert _peak_hz(y[2000:-2000]) == pytest.approx(440.0 * 2 ** (semitones / 12), rel=0.01)


def test_time_stretch_keeps_the_frequency():
    y = aug.time_stretch(_sine(440.0, 1.0), 0.8)
    assert abs(y.size - SR / 0.8) <= 1 and _peak_hz(y[2000:-2000]) == pytest.approx(440.0, abs=2.0)


@pytest.mark.parametrize("gain_db", [-20.0, -6.0, 3.0])
def test_level_change_scales_rms(gain_db):
    x = _sine(300.0)
    assert 20 * np.log10(_rms(aug.set_level(x, gain_db)) / _rms(x)) == pytest.approx(gain_db, abs=1e-4)


def test_room_impulse_response_decays_at_rt60_and_reverb_keeps_length_and_peak():
    rir = aug.room_impulse_response(0.5, SR, np.random.default_rng(0), direct_to_reverberant_db=0.0)
    assert rir[0] == 1.0 and rir.size == SR // 2
    tail = rir[1:]
    assert np.sum(tail**2) == pytest.approx(1.0, rel=1e-6)  # 0 dB: as much reverberant energy as direct
    early, late = _rms(tail[: SR // 20]), _rms(tail[-SR // 20 :])
    assert 20 * np.log10(early / late) > 40  # ~54 dB from the first to the last 50 ms of a 0.5 s RT60
    x = _sine(300.0)
    wet = aug.reverberate(x, rir)
    assert wet.size == x.size and np.abs(wet).max() == pytest.approx(np.abs(x).max(), rel=1e-5)


def test_augment_is_seeded_per_example_and_reports_its_steps():
    x = np.random.default_rng(1).standard_normal(SR).astype(np.float32) * 0.1
    a, applied = aug.augment(x, SR, seed=7)
    b, again = aug.augment(x, SR, seed=7)
    assert np.array_equal(a, b) and applied == again
    assert not np.array_equal(a, aug.augment(x, SR, seed=8)[0])
    assert np.abs(a).max() == pytest.approx(10 ** (applied["level_db"] / 20), rel=1e-4)
    everything = aug.AugmentConfig(speed_p=1, pitch_p=1, reverb_p=1, telephone_p=1, noise_p=1)
    _, steps = aug.augment(x, SR, seed=7, config=everything)
    assert {"speed", "pitch_semitones", "rt60", "snr_db", "level_db"} <= steps.keys() and steps[
        "channel"
    ] == "telephone"
    nothing = aug.AugmentConfig(speed_p=0, pitch_p=0, reverb_p=0, telephone_p=0, narrowband_p=0, noise_p=0)
    plain, steps = aug.augment(x, SR, seed=7, config=nothing)
    assert steps.keys() == {"level_db"} and plain.size == x.size


# ---- splits and examples -----------------------------------------------------------------------------------------
CONFIG = voices.VoicesConfig(
    train_voices={"festival": ["kal_diphone", "cmu_us_slt_arctic_hts"]},
    held_out_voices={"festival": ["ked_diphone"]},
    eval_only={"flite": list(voices.ENGINE_VOICES["flite"])},
    num_train=40,
    num_test=10,
)


def test_defaults_train_festival_and_hold_out_flite():
    default = voices.VoicesConfig()
    voices.check_config(default)
    assert voices.training_splits(default) == ["train_espeak", "train_festival"]
    assert voices.evaluation_splits(default) == [
        "test_espeak_sentences",
        "test_festival_sentences",
        "test_festival_voices",
        "test_flite",
    ]
    assert voices.training_splits(replace(default, engines=["flite"])) == []


def test_splits_keep_flite_and_held_out_voices_and_sentences_out_of_training(tmp_path):
    splits = corpus.make_splits(60, 5, 20, seed=0)
    plan = voices.plan_splits(CONFIG, splits.train, splits.test, tmp_path)
    assert list(plan) == [*voices.training_splits(CONFIG), *voices.evaluation_splits(CONFIG)]
    assert voices.training_splits(CONFIG) == ["train_festival"]
    trained = [u for split in voices.training_splits(CONFIG) for r in plan[split] for u in r.utterances]
    assert {u.engine for u in trained} == {"festival"}
    assert {u.voice for u in trained} == {"kal_diphone", "cmu_us_slt_arctic_hts"}
    assert {u.text for u in trained} <= set(splits.train)
    assert any(len(r.utterances) > 1 for r in plan["train_festival"]) and all(r.augment for r in plan["train_festival"])
    for split in voices.evaluation_splits(CONFIG):
        assert all(len(r.utterances) == 1 and not r.augment for r in plan[split])
        assert {u.text for r in plan[split] for u in r.utterances} <= set(splits.test)
    assert {r.utterances[0].voice for r in plan["test_festival_voices"]} == {"ked_diphone"}
    assert {r.utterances[0].engine for r in plan["test_flite"]} == {"flite"}
    paths = [r.path for split in plan.values() for r in split]
    assert len(set(paths)) == len(paths)
    assert plan == voices.plan_splits(CONFIG, splits.train, splits.test, tmp_path)  # seeded


def test_config_refuses_flite_in_training_and_voices_both_trained_and_held_out():
    with pytest.raises(ValueError, match=r"\['flite'\] are evaluation-only engines"):
        voices.check_config(replace(CONFIG, train_voices={"flite": ["slt"]}))
    with pytest.raises(ValueError, match=r"festival: voices \['kal_diphone'\] are both trained and held out"):
        voices.check_config(replace(CONFIG, held_out_voices={"festival": ["kal_diphone"]}))
    with pytest.raises(ValueError, match="festival has no voices .'rab_diphone'."):
        voices.check_config(replace(CONFIG, train_voices={"festival": ["rab_diphone"]}))
    with pytest.raises(ValueError, match=r"\['en-us\+m6'\] use eSpeak variants of the test split"):
        voices.check_config(replace(CONFIG, train_voices={"espeak": ["en-us+m3", "en-us+m6"]}))
    with pytest.raises(ValueError, match="unknown engine 'mbrola'"):
        voices.check_config(replace(CONFIG, eval_only={"mbrola": ["us1"]}))


def test_join_utterances_puts_the_pauses_between():
    parts = [np.ones(1000, np.float32), np.ones(500, np.float32) * 3, np.ones(200, np.float32)]
    joined = voices.join_utterances(parts, [0.1, 0.25])
    assert joined.size == 1000 + 1600 + 500 + 4000 + 200
    assert np.all(joined[1000:2600] == 0) and np.all(joined[3100:7100] == 0)
    assert np.abs(joined).max() == 0.5  # each part at the same peak
    with pytest.raises(ValueError, match="3 parts need 2 pauses, got 1"):
        voices.join_utterances(parts, [0.1])


def test_example_is_cut_at_its_longest_and_names_what_it_holds():
    utterances = tuple(voices.Utterance("festival", "kal_diphone", f"sentence {w}") for w in ("one", "two", "three"))
    request = voices.ExampleRequest("x.wav", utterances, (0.5, 0.5), seed=3, augment=False)
    speeches = [np.ones(8 * SR, np.float32) * 0.1] * 3
    audio, entry = voices.make_example(request, replace(CONFIG, max_example_seconds=18.0), speeches)
    assert entry["text"] == "sentence one sentence two" and entry["utterances"] == 2 and entry["pauses"] == [0.5]
    assert 16.5 * SR + 0.2 * SR <= audio.size <= 16.5 * SR + 0.6 * SR
    _, alone = voices.make_example(request, replace(CONFIG, max_example_seconds=1.0), speeches)
    assert alone["text"] == "sentence one"  # at least one utterance, however long


def test_training_reads_every_synthesisers_training_manifest(tmp_path):
    pytest.importorskip("nemo")
    from fastdecode_lab.tiny_models.recipe import resolve_config
    from fastdecode_lab.tiny_models.training import model_config

    layout = RecipeLayout.at(tmp_path)
    cfg = resolve_config({"voices": {"engines": ["festival"], "train_voices": {"festival": ["kal_diphone"]}}})
    train_ds = model_config("tdt", cfg, layout).train_ds
    assert list(train_ds.manifest_filepath) == [str(layout.manifest("train")), str(layout.manifest("train_festival"))]
    espeak_only = resolve_config({"voices": {"engines": []}})
    assert list(model_config("tdt", espeak_only, layout).train_ds.manifest_filepath) == [str(layout.manifest("train"))]
    assert voices.evaluation_splits(espeak_only.voices) == []


# ---- the engines -------------------------------------------------------------------------------------------------
def _need(engine: str) -> None:
    if engine == "espeak":
        pytest.importorskip("espeakng_loader")
    elif voices.executable(engine, PACKED) is None:
        where = (
            f"in FASTDECODE_SYNTHESISERS={PACKED}" if PACKED else "on PATH (apt-get install festival flite festvox-*)"
        )
        pytest.skip(f"{engine} is not installed {where}")


@pytest.mark.parametrize("engine", ["espeak", "festival", "flite"])
def test_each_engine_speaks_every_voice(engine):
    _need(engine)
    if engine == "festival":
        installed = Path(PACKED, "root/usr/share/festival/voices") if PACKED else Path("/usr/share/festival/voices")
        names = {p.name for p in installed.glob("*/*")}
        missing = [v for v in voices.ENGINE_VOICES[engine] if v not in names]
        if missing:
            pytest.skip(f"festival voices {missing} are not installed")
    names = voices.ESPEAK_EXAMPLE_VOICES if engine == "espeak" else voices.ENGINE_VOICES[engine]
    utterances = [voices.Utterance(engine, v, "call me at half past ten") for v in names]
    audio = voices.speak([*utterances, replace(utterances[0], stretch=1.5)], PACKED)
    for a in audio:
        assert a.dtype == np.float32 and 0.8 * SR < a.size < 5 * SR and np.abs(a).max() > 0.01
    assert audio[-1].size > 1.3 * audio[0].size  # Duration_Stretch / duration_stretch slow it down
    assert np.array_equal(voices.speak(utterances[:1], PACKED)[0], audio[0])  # deterministic


def test_synthesize_splits_writes_examples_and_manifests_once(tmp_path):
    _need("festival")
    _need("flite")
    config = replace(
        CONFIG,
        train_voices={"festival": ["kal_diphone"]},
        num_train=2,
        num_test=2,
        synthesisers_dir=PACKED,
        eval_only={"flite": ["kal16", "slt"]},
    )
    train = ["the cat sat on the mat", "what time is it", "see you on monday", "thank you very much"]
    plan = voices.plan_splits(config, train, ["where is the station", "how are you today"], tmp_path)
    layout = RecipeLayout.at(tmp_path)
    manifests = voices.synthesize_splits(plan, config, layout.manifest, workers=1, log=lambda _: None)
    assert set(manifests) == set(plan)
    for split, path in manifests.items():
        entries = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(entries) == 2 and all((path.parent / e["audio_filepath"]).is_file() for e in entries)
        assert all(e["duration"] > 0.5 for e in entries)
        if split.startswith("train_"):
            assert all(e["augment"] for e in entries)
    lines: list[str] = []
    voices.synthesize_splits(plan, config, layout.manifest, workers=1, log=lines.append)
    assert not any("Synthesising" in line for line in lines)  # all there: nothing to redo


def test_synthesis_stopped_part_way_carries_on_from_the_chunks_it_finished(tmp_path):
    _need("espeak")
    config = replace(
        CONFIG,
        engines=["espeak"],
        train_voices={"espeak": ["en-us+m3", "en+f2"]},
        held_out_voices={},
        eval_only={},
        num_train=3,
        num_test=0,
    )
    train = ["the cat sat on the mat", "what time is it", "see you on monday", "thank you very much"]
    plan = voices.plan_splits(config, train, [], tmp_path)
    layout = RecipeLayout.at(tmp_path)
    kwargs = {"workers": 1, "chunk_size": 1}
    first = voices.synthesize_splits(plan, config, layout.manifest, log=lambda _: None, **kwargs)
    written = {split: path.read_text() for split, path in first.items()}
    assert written["train_espeak"].count("\n") == 3
    # stopped after the first chunk: the manifests were never written and the journal's last line was cut short
    journal = layout.manifest("train_espeak").with_name(voices.PROGRESS_JOURNAL)
    lines = journal.read_text().splitlines(keepends=True)
    assert len(lines) == 3
    for path in first.values():
        path.unlink()
    journal.write_text(lines[0] + lines[1][: len(lines[1]) // 2])
    kept, redone = json.loads(lines[0])["path"], {json.loads(line)["path"] for line in lines[1:]}
    stamps = {p: os.stat(journal.parent / p).st_mtime_ns for p in {kept, *redone}}
    log: list[str] = []
    again = voices.synthesize_splits(plan, config, layout.manifest, log=log.append, **kwargs)
    assert any("Synthesising 2 multi-engine examples (1 already there)" in line for line in log), log
    assert {split: path.read_text() for split, path in again.items()} == written  # the same examples, the same manifest
    assert os.stat(journal.parent / kept).st_mtime_ns == stamps[kept]  # the finished chunk was not synthesised again
    assert all(os.stat(journal.parent / p).st_mtime_ns > stamps[p] for p in redone)
    log.clear()
    voices.synthesize_splits(plan, config, layout.manifest, log=log.append, **kwargs)
    assert not any("Synthesising" in line for line in log)


@pytest.mark.skipif(not PACKED, reason="FASTDECODE_SYNTHESISERS does not name a packed folder")
def test_packed_synthesisers_run_in_a_clean_environment(tmp_path):
    _need("festival")
    _need("flite")
    wav = tmp_path / "flite.wav"
    subprocess.run([f"{PACKED}/bin/flite", "-voice", "rms", "-t", "hello", "-o", str(wav)], env={}, check=True)
    script = tmp_path / "speak.scm"
    script.write_text(f'(voice_ked_diphone)\n(utt.save.wave (SynthText "hello") "{tmp_path}/festival.wav" \'riff)\n')
    subprocess.run([f"{PACKED}/bin/festival", "-b", str(script)], env={}, check=True)
    assert wav.stat().st_size > 1000 and (tmp_path / "festival.wav").stat().st_size > 1000


def test_split_wers_report_each_voice_apart(tmp_path, monkeypatch):
    from fastdecode_lab.tiny_models import evaluation

    entries = [
        {"audio_filepath": "a.wav", "text": "one two three four", "voice": "awb"},
        {"audio_filepath": "b.wav", "text": "five six", "voice": "kal"},
        {"audio_filepath": "c.wav", "text": "seven eight", "voice": "awb"},
    ]
    manifest = tmp_path / "test_flite.jsonl"
    manifest.write_text("".join(json.dumps(e) + "\n" for e in entries))
    hypotheses = {"a.wav": "one two three four", "b.wav": "five sex", "c.wav": "seven eight"}
    monkeypatch.setattr(
        evaluation,
        "transcribed",
        lambda model, name, paths, batch_size: evaluation.Decoded(
            name, [hypotheses[os.path.basename(p)] for p in paths], None, 0.0
        ),
    )
    row = evaluation.split_wers(None, {"test_flite": manifest}, batch_size=2)["test_flite"]
    assert row["wer"] == pytest.approx(1 / 8)
    assert row["by_voice"] == {"awb": 0.0, "kal": 0.5}
    single = tmp_path / "test_one.jsonl"
    single.write_text(json.dumps(entries[0]) + "\n")
    assert "by_voice" not in evaluation.split_wers(None, {"one": single}, batch_size=2)["one"]  # one voice: no split
