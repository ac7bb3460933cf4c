"""Configs (YAML <-> dataclasses), the transcribe logic and script, and the quick-start notebook (CPU)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from nemo.collections.asr.parts.submodules.rnnt_decoding import RNNTDecodingConfig
from omegaconf import OmegaConf

from fastdecode_lab import synthetic
from nemo_fastdecode.apps import manifests, models, trained_models
from nemo_fastdecode.apps import transcribe as T
from nemo_fastdecode.apps.configs import TranscribeConfig
from nemo_fastdecode.config import GRAPH_MODES, FastGreedyConfig, FastGreedyDecodingConfig
from nemo_fastdecode.graphs import GraphMode
from nemo_fastdecode.nemo import registry

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"


pytestmark = pytest.mark.usefixtures("single_thread")


def compose_transcribe(overrides: list[str] | None = None):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(config_name="transcribe", overrides=overrides or [])


def keys(node) -> set[str]:
    """Dotted paths of every leaf of a config."""
    out = set()
    for key, value in node.items():
        if OmegaConf.is_dict(value) or isinstance(value, dict):
            out |= {f"{key}.{sub}" for sub in keys(value)}
        else:
            out.add(str(key))
    return out


# ----------------------------------------------------------------------------------------------
# configs


def test_decoding_yaml_matches_dataclass():
    yaml = OmegaConf.load(CONFIGS / "decoding" / "fast_greedy.yaml")
    schema = OmegaConf.structured(FastGreedyDecodingConfig)
    merged = OmegaConf.merge(schema, yaml)  # type-checks every value
    assert merged == schema  # the YAML holds exactly the dataclass defaults
    assert keys(yaml) == keys(schema)  # and mirrors every key
    assert merged.strategy == "fast_greedy"
    assert OmegaConf.to_container(merged.greedy) == dataclasses.asdict(FastGreedyConfig())


def test_transcribe_yaml_matches_dataclass():
    cfg = compose_transcribe()
    schema = OmegaConf.structured(TranscribeConfig)
    assert OmegaConf.merge(schema, cfg) == schema
    assert keys(cfg) == keys(schema)
    assert cfg.decoding.strategy == "fast_greedy" and cfg.model == "trained-tdt"
    assert cfg.audio_dir is None and cfg.dataset_manifest is None and cfg.compare_strategies is None


def test_decoding_keys_are_nemo_keys_and_accepted_by_fast_greedy():
    nemo = OmegaConf.structured(RNNTDecodingConfig)
    ours = OmegaConf.structured(FastGreedyDecodingConfig)
    assert set(ours) <= set(nemo), set(ours) - set(nemo)
    assert set(ours.greedy) <= registry.FAST_STRATEGIES["fast_greedy"].options
    assert set(ours.greedy) - {"max_symbols", *registry.FAST_STRATEGIES["fast_greedy"].own_options} <= set(nemo.greedy)
    assert ("auto", *(m.value for m in GraphMode)) == GRAPH_MODES
    for mode in GRAPH_MODES:
        GraphMode.parse(mode)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="graph_mode='fast'.*auto, full_graph"):
        FastGreedyConfig(graph_mode="fast")
    with pytest.raises(ValueError, match="max_symbols must be >= 1 or None or 0 .unset., got -1"):
        FastGreedyConfig(max_symbols=-1)
    assert FastGreedyConfig(max_symbols=0).max_symbols == 0  # unset, as in NeMo: max_symbols_per_step applies
    with pytest.raises(Exception, match="batch_size"):
        T.resolve_config({"batch_size": "many"})
    with pytest.raises(Exception, match="no_such_key"):
        T.resolve_config({"no_such_key": 1})
    # extra NeMo keys in the decoding section pass through (e.g. beam settings)
    cfg = T.resolve_config({"decoding": {"strategy": "beam", "beam": {"beam_size": 4}}})
    assert cfg.decoding.beam.beam_size == 4 and cfg.decoding.greedy.max_symbols == 10


# ----------------------------------------------------------------------------------------------
# the transcribe logic


def run_from_scratch_dir(tmp_path_factory, overrides: list[str] | None = None):
    """A ``scripts/transcribe.py`` run with no inputs (the embedded demo), from a scratch working directory."""
    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("demo"))
    lines: list[str] = []
    try:
        result = T.run(compose_transcribe(overrides), log=lines.append, progress=False)
        output = Path.cwd() / manifests.DEFAULT_OUTPUT_FILENAME
    finally:
        os.chdir(cwd)
    return result, lines, output


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The embedded default run: the shipped trained TDT model on the shipped example utterances."""
    return run_from_scratch_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def synthetic_demo(tmp_path_factory):
    """The demo of a synthetic (random-weight) RNN-T preset: synthetic audio."""
    return run_from_scratch_dir(tmp_path_factory, ["model=tiny-rnnt"])


def test_embedded_demo_transcribes_the_examples_with_the_trained_model(demo):
    result, lines, output = demo
    text = "\n".join(lines)
    assert result.demo and "RANDOM, UNTRAINED WEIGHTS" not in text
    examples = trained_models.example_entries()
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert records == result.records and len(records) == len(examples) > 0
    for record, example in zip(records, examples, strict=True):
        assert record["text"] == example["text"] and record["pred_text"]
        assert f"reference:  {record['text']}" in text and f"hypothesis: {record['pred_text']}" in text
    # the trained model transcribes held-out voices: a few words wrong at most
    assert result.wer is not None and result.wer <= 0.1
    assert f"WER {100 * result.wer:.2f}% over {len(records)} utterance(s)" in text
    # TDT: NeMo's label loop, then ours; identical on real speech
    assert [row.name for row in result.comparison] == ["greedy_batch (label loop)", "fast_greedy (label loop)"]
    assert result.comparison[0].tokens > 0 and all(row.identical for row in result.comparison)
    assert result.model.cfg.decoding.strategy == "fast_greedy"


def test_embedded_demo_of_a_synthetic_model(synthetic_demo):
    result, lines, output = synthetic_demo
    text = "\n".join(lines)
    assert result.demo and result.wer is None
    assert "RANDOM, UNTRAINED WEIGHTS" in text and "gibberish" in text
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert records == result.records and len(records) == len(models.DEMO_DURATIONS)
    for record in records:
        assert isinstance(record["pred_text"], str) and record["pred_text"] in text
    assert sum(len(r["pred_text"]) for r in records) > 0
    # comparison: NeMo's frame and label loops, then ours; all identical to the reference
    names = [row.name for row in result.comparison]
    assert names[:2] == ["greedy_batch (frame loop)", "greedy_batch (label loop)"]
    assert any(name.startswith("fast_greedy") for name in names)
    assert all(row.identical for row in result.comparison)
    assert len({row.tokens for row in result.comparison}) == 1 and result.comparison[0].tokens > 0
    assert all(row.seconds > 0 for row in result.comparison)
    assert "identical" in text and "fast_greedy (label loop)" in text
    # the model is left with the user's strategy
    assert result.model.cfg.decoding.strategy == "fast_greedy"


def test_trained_model_names(tmp_path):
    assert trained_models.trained_model_path("trained-tdt").is_file()
    with pytest.raises(
        ValueError, match="unknown trained model 'trained-xl'; valid names: trained-tdt, trained-stream"
    ):
        trained_models.trained_model_path("trained-xl")
    with pytest.raises(FileNotFoundError, match="trained model 'trained-tdt' is missing.*train_tiny_models.py"):
        trained_models.trained_model_path("trained-tdt", tmp_path)


@pytest.fixture(scope="module")
def audio_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    durations = [2.4, 1.6]
    paths = synthetic.write_wavs(synthetic.synthetic_audio(durations, seed=3), root / "wavs")
    (root / "wavs" / "notes.txt").write_text("not audio")
    return root, paths, durations


def test_audio_dir_with_timestamps(audio_inputs):
    root, paths, _ = audio_inputs
    result = T.run(
        {"model": "tiny-rnnt", "audio_dir": str(root / "wavs"), "timestamps": True, "batch_size": 1},
        log=lambda line: None,
        progress=False,
    )
    assert result.output_path == root / "wavs_transcribed.jsonl" and result.comparison is None
    records = [json.loads(line) for line in result.output_path.read_text().splitlines()]
    assert [r["audio_filepath"] for r in records] == [str(p.resolve()) for p in paths]
    for record in records:
        assert "pred_text" in record and "timestep" not in record
        assert {"word", "char", "segment"} <= set(record)
        assert len(record["char"]) == len(record["pred_text"])
        for item in record["word"] + record["char"]:
            assert 0 <= item["start_offset"] <= item["end_offset"] and item["start"] <= item["end"]


def test_manifest_via_hydra_overrides(audio_inputs, tmp_path):
    root, paths, durations = audio_inputs
    manifest = tmp_path / "test.jsonl"
    entries = [
        {"audio_filepath": os.path.relpath(paths[0], tmp_path), "text": "first", "duration": durations[0]},
        {"audio_filepath": str(paths[1]), "text": "second", "speaker": 7},
    ]
    manifest.write_text("\n".join(json.dumps(e) for e in entries) + "\n\n")
    cfg = compose_transcribe(
        [
            "model=tiny-rnnt",
            f"dataset_manifest={manifest}",
            "decoding.greedy.loop_labels=false",
            "compare_strategies=true",
        ]
    )
    result = T.run(cfg, log=lambda line: None, progress=False)
    assert result.output_path == tmp_path / "test_transcribed.jsonl"
    records = [json.loads(line) for line in result.output_path.read_text().splitlines()]
    assert len(records) == 2
    for entry, record in zip(entries, records, strict=True):
        assert {k: record[k] for k in entry} == entry  # input fields kept as they were
        assert isinstance(record["pred_text"], str) and "word" not in record
    assert all(row.identical for row in result.comparison)
    # the same audio through NeMo's greedy_batch gives the same text
    baseline = T.run(
        {
            "model": "tiny-rnnt",
            "dataset_manifest": str(manifest),
            "decoding": {"strategy": "greedy_batch"},
            "output_filename": str(tmp_path / "b.jsonl"),
        },
        log=lambda line: None,
        progress=False,
    )
    assert [r["pred_text"] for r in baseline.records] == [r["pred_text"] for r in records]


def test_the_comparison_times_beam_rows_for_fast_beam(demo):
    model = demo[0].model
    audio = manifests.load_audio([e["audio_filepath"] for e in trained_models.example_entries()[:2]], 16000)
    rows = T.compare_strategies(model, audio, decoding={"strategy": "fast_beam", "beam": {"beam_size": 2}}, repeats=1)
    assert [row.name for row in rows] == ["malsd_batch", "fast_beam"]
    assert rows[0].tokens > 0 and rows[1].tokens == rows[0].tokens and rows[1].identical
    assert (
        T.comparison_kind({"strategy": "fast_beam"}) == "beam" and T.comparison_kind({"strategy": "beam"}) == "greedy"
    )
    assert model.cfg.decoding.strategy == "fast_greedy"  # the model's decoding is restored


def test_clear_errors(tmp_path, demo, monkeypatch):
    with pytest.raises(FileNotFoundError, match="audio_dir .*does not exist"):
        T.run({"audio_dir": str(tmp_path / "missing")}, log=lambda line: None)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("")
    with pytest.raises(ValueError, match=r"contains no audio files \(\.wav, \.flac\)"):
        T.run({"audio_dir": str(tmp_path / "empty")}, log=lambda line: None)
    manifest = tmp_path / "bad.jsonl"
    manifest.write_text(json.dumps({"audio_filepath": "x.wav"}).replace("audio_filepath", "path") + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: entry has no 'audio_filepath' \(keys: path\)"):
        T.run({"dataset_manifest": str(manifest)}, log=lambda line: None)
    manifest.write_text('{"audio_filepath": "missing.wav"}\n')
    with pytest.raises(FileNotFoundError, match="bad.jsonl:1: audio_filepath 'missing.wav' not found"):
        manifests.read_inputs(dataset_manifest=manifest, strict=True)
    with pytest.raises(ValueError, match="has no usable entries; .*bad.jsonl:1: audio_filepath 'missing.wav' not"):
        manifests.read_inputs(dataset_manifest=manifest, log=lambda line: None)
    manifest.write_text("not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: not valid JSON"):
        manifests.read_inputs(dataset_manifest=manifest, strict=True)
    with pytest.raises(FileNotFoundError, match="dataset_manifest .*does not exist"):
        manifests.read_inputs(dataset_manifest=tmp_path / "none.jsonl")
    with pytest.raises(ValueError, match="not both"):
        T.run({"audio_dir": str(tmp_path), "dataset_manifest": str(manifest)}, log=lambda line: None)
    with pytest.raises(
        ValueError, match="Unknown transducer decoding strategy 'fastest'; valid strategies: .*fast_greedy"
    ):
        T.run({"decoding": {"strategy": "fastest"}}, log=lambda line: None)
    # NeMo + the registry reject it too when it reaches the model
    with pytest.raises(ValueError, match="valid strategies: .*greedy_batch.*fast_greedy"):
        models.apply_decoding(demo[0].model, {"strategy": "fastest"})
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        T.resolve_config({"batch_size": 0})
    with pytest.raises(FileNotFoundError, match="checkpoint '.*nope.nemo' does not exist"):
        models.load_model(str(tmp_path / "nope.nemo"))

    from nemo.collections.asr.models import ASRModel

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(ASRModel, "from_pretrained", offline)
    with pytest.raises(RuntimeError, match=r"could not load pretrained model 'nvidia/some-model'.*tiny-rnnt"):
        models.load_model("nvidia/some-model")


def test_script_end_to_end(audio_inputs, tmp_path):
    """``python scripts/transcribe.py`` with Hydra overrides, in a fresh process."""
    root, paths, _ = audio_inputs
    out = tmp_path / "out" / "script.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(ROOT / "scripts" / "transcribe.py"), "model=tiny-rnnt", f"audio_dir={root / 'wavs'}"]
    command += [f"output_filename={out}", "batch_size=2", "decoding.greedy.max_symbols=5"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "RANDOM, UNTRAINED WEIGHTS" in done.stdout and "fast_greedy" in done.stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == len(paths) and all("pred_text" in r for r in records)
    assert not (tmp_path / "outputs").exists()  # no Hydra run folders


def test_unreadable_files_are_reported_and_the_others_transcribed(audio_inputs, tmp_path):
    """A corrupt, a stereo and an empty file: each is named with its reason, the rest are transcribed, exit 1."""
    import numpy as np
    import soundfile as sf

    root, paths, _ = audio_inputs
    folder = tmp_path / "mixed"
    folder.mkdir()
    for path in paths:
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "corrupt.wav").write_bytes(b"RIFF\x00\x01not really a wave file" * 10)
    sf.write(folder / "stereo.wav", np.zeros((8000, 2), dtype=np.float32), 16000)
    sf.write(folder / "empty.wav", np.zeros(0, dtype=np.float32), 16000)
    out = tmp_path / "mixed.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(ROOT / "scripts" / "transcribe.py"), "model=tiny-rnnt", f"audio_dir={folder}"]
    done = subprocess.run(
        [*command, f"output_filename={out}", "batch_size=2"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "3 of 5 file(s) could not be transcribed" in done.stdout
    assert re.search(r"corrupt\.wav: cannot be decoded as audio \(\w+", done.stdout)
    assert "stereo.wav: has 2 channels; the model takes mono audio" in done.stdout
    assert "empty.wav: has no samples" in done.stdout
    records = {Path(r["audio_filepath"]).name: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == {p.name for p in paths} | {"corrupt.wav", "stereo.wav", "empty.wav"}
    for path in paths:
        assert isinstance(records[path.name]["pred_text"], str) and "error" not in records[path.name]
    assert records["empty.wav"]["pred_text"] is None and records["empty.wav"]["error"] == "it has no samples"


def test_bad_manifest_lines_are_named_and_skipped_and_resampled_files_named(audio_inputs, tmp_path):
    """A missing file, a line that is not JSON and one without ``audio_filepath``: each named with its line number
    and reason and skipped, the others transcribed (exit 1 as for unreadable files); an 8 kHz file is named as
    resampled to the model's 16 kHz."""
    import soundfile as sf

    root, paths, _ = audio_inputs
    slow = tmp_path / "slow.wav"
    data, rate = sf.read(paths[0], dtype="float32")
    sf.write(slow, data[::2], rate // 2)
    manifest = tmp_path / "mixed.jsonl"
    lines = [
        json.dumps({"audio_filepath": str(paths[0]), "text": "a"}),
        json.dumps({"audio_filepath": "missing.wav"}),
        "{not json",
        json.dumps({"path": "x.wav"}),
        json.dumps({"audio_filepath": "slow.wav"}),
    ]
    manifest.write_text("\n".join(lines) + "\n")
    logged: list[str] = []
    skipped: list[tuple[str, str]] = []
    utterances = manifests.read_inputs(dataset_manifest=manifest, log=logged.append, skipped=skipped)
    assert [u.audio_path.name for u in utterances] == [paths[0].name, "slow.wav"]
    assert [where.rsplit(":", 1)[1] for where, _ in skipped] == ["2", "3", "4"]
    assert "audio_filepath 'missing.wav' not found" in skipped[0][1] and "not valid JSON" in skipped[1][1]
    assert "no 'audio_filepath'" in skipped[2][1]
    assert any("mixed.jsonl:2" in line and "missing.wav" in line for line in logged)
    note = manifests.resampling_note([paths[0], slow], 16000)
    assert note == "Resampled 1 of 2 file(s) to the model's 16000 Hz: slow.wav (8000 Hz)"
    assert manifests.resampling_note([paths[0]], 16000) is None
    audio = manifests.load_audio([slow], 16000, log=logged.append)
    assert logged[-1] == note.replace("1 of 2", "1 of 1") and abs(len(audio[0]) - len(data)) <= 2

    out = tmp_path / "out.jsonl"
    logged.clear()
    result = T.run(
        {"model": "tiny-rnnt", "dataset_manifest": str(manifest), "output_filename": str(out)},
        log=logged.append, progress=False,
    )  # fmt: skip
    text = "\n".join(logged)
    assert "3 manifest line(s) skipped" in text and "mixed.jsonl:3: not valid JSON" in text
    assert "Resampled 1 of 2 file(s) to the model's 16000 Hz: slow.wav (8000 Hz)" in text
    assert len(result.records) == 2 and all(isinstance(r["pred_text"], str) for r in result.records)
    assert len(result.failed) == 3  # the script exits 1, as for unreadable files


def test_the_scripts_help_and_misspelled_keys(tmp_path):
    """``--help`` lists each option with its description; a misspelled key is named with the closest valid key,
    without a traceback (before Hydra runs)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    script = str(ROOT / "scripts" / "transcribe.py")
    done = subprocess.run(
        [sys.executable, script, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "  batch_size=32\n      utterances per batch." in done.stdout and "model=trained-tdt" in done.stdout
    assert "== Config groups ==" not in done.stdout
    done = subprocess.run(
        [sys.executable, script, "batch_sise=4"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "unknown option 'batch_sise'; did you mean 'batch_size'?" in done.stderr
    assert "Valid options: model, audio_dir" in done.stderr


def test_the_scripts_docstrings_name_the_defaults():
    """The demo ``scripts/transcribe.py`` runs is the shipped trained model, not a random-weight one."""
    import ast

    from nemo_fastdecode.apps.configs import ParallelTranscribeConfig

    def doc(name: str) -> str:
        return ast.get_docstring(ast.parse((ROOT / "scripts" / f"{name}.py").read_text())) or ""

    assert TranscribeConfig.model in doc("transcribe") and "synthetic (random-weight) model and audio" not in doc(
        "transcribe"
    )
    assert f"defaults to ``{ParallelTranscribeConfig.model}``" in doc("transcribe_parallel")


# ----------------------------------------------------------------------------------------------
# the notebook


def test_quickstart_notebook_runs(tmp_path, monkeypatch):
    notebook = json.loads(NOTEBOOK.read_text())
    cells = notebook["cells"]
    code = [cell for cell in cells if cell["cell_type"] == "code"]
    assert code and all(not cell["outputs"] and cell["execution_count"] is None for cell in code), "clear outputs"
    assert any(".nemo" in "".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__main__"}
    threads = torch.get_num_threads()
    try:
        for i, cell in enumerate(code):
            exec(compile("".join(cell["source"]), f"{NOTEBOOK.name}[code cell {i}]", "exec"), namespace)
    finally:
        torch.set_num_threads(threads)
    assert namespace["identical"] is True and namespace["baseline"][0].y_sequence.numel() > 0
    assert namespace["wer"] <= 0.1  # the trained model on held-out voices
    assert namespace["model"].cfg.decoding.strategy == "fast_greedy"
    assert namespace["with_timestamps"].timestamp["word"]
    assert all(row.identical for row in namespace["rows"])
