"""NeMo's own entry points with our strategies: its scripts, .nemo files and decoding configs, no wrapper.

NeMo's scripts (``tests/fixtures/nemo_examples``, verbatim) run in fresh processes on small saved ``.nemo``
models; nothing in them imports ``nemo_fastdecode``: the start-up hook (``autoload/``) is what makes the strategy
names and options known. Each run with ``fast_greedy`` is compared with the same run with NeMo's ``greedy_batch``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from fastdecode_lab import synthetic
from nemo_fastdecode.nemo import registry

EXAMPLES = Path(__file__).parent / "fixtures" / "nemo_examples"
DURATIONS = [2.5, 1.8, 1.2]


def run_python(args: list[str], cwd: Path, timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    """``python <args>`` in a fresh process (one intra-op thread, as a small CPU job runs best)."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "NEMO_FASTDECODE_VERBOSE": "1", **env}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout
    )


def output_of(done: subprocess.CompletedProcess) -> str:
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny RNN-T and a tiny cache-aware hybrid saved as .nemo, and a manifest of 3 utterances."""
    root = tmp_path_factory.mktemp("nemo_native")
    rnnt = synthetic.build_synthetic_model("tiny-rnnt")
    with open_dict(rnnt.cfg):  # transcribe_speech_parallel.py copies settings from the model's train_ds
        rnnt.cfg.train_ds = {"manifest_filepath": None, "sample_rate": 16000, "batch_size": 2, "shuffle": False}
    rnnt.save_to(str(root / "rnnt.nemo"))
    synthetic.build_synthetic_model("tiny-streaming").save_to(str(root / "streaming.nemo"))
    paths = synthetic.write_wavs(synthetic.synthetic_audio(DURATIONS, seed=4), root / "wavs")
    synthetic.write_manifest(paths, DURATIONS, root / "manifest.json")
    return root


def pred_texts(path: Path) -> dict[str, str]:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {Path(r["audio_filepath"]).name: r["pred_text"] for r in records}


def test_the_start_up_hook_is_installed_and_imports_nothing_heavy(tmp_path):
    probe = (
        "import sys, nemo_fastdecode_autoload as a; print(a.installed(), sorted({'nemo', 'torch'} & set(sys.modules)))"
    )
    done = run_python(["-c", probe], tmp_path)
    assert done.returncode == 0 and done.stdout.split() == ["True", "[]"], output_of(done)
    off = run_python(["-c", probe], tmp_path, NEMO_FASTDECODE_AUTOLOAD="0")
    assert off.stdout.split()[0] == "False", output_of(off)
    assert __import__("nemo_fastdecode_autoload").constants()["PORTABLE_KEY"] == registry.PORTABLE_KEY  # one key


def test_transcribe_speech_takes_our_strategy_and_options_without_plus(saved, tmp_path):
    script = str(EXAMPLES / "transcribe_speech.py")
    common = [f"model_path={saved / 'rnnt.nemo'}", f"dataset_manifest={saved / 'manifest.json'}", "batch_size=2"]
    nemo = run_python(
        [script, *common, f"output_filename={tmp_path / 'nemo.json'}", "rnnt_decoding.strategy=greedy_batch"], tmp_path
    )
    assert nemo.returncode == 0, output_of(nemo)[-3000:]
    ours = run_python(
        [script, *common, f"output_filename={tmp_path / 'ours.json'}", "rnnt_decoding.strategy=fast_greedy",
         "rnnt_decoding.greedy.graph_mode=eager", "rnnt_decoding.greedy.fast_math=false", "rnnt_decoding.greedy.max_symbols=10"],
        tmp_path,
    )  # fmt: skip
    assert ours.returncode == 0, output_of(ours)[-3000:]
    assert "nemo_fastdecode: decoding with graph mode eager (forced)" in output_of(ours)
    expected = pred_texts(tmp_path / "nemo.json")
    assert len(expected) == len(DURATIONS) and any(expected.values())  # something to compare
    assert pred_texts(tmp_path / "ours.json") == expected
    # the offline path from the same config: one more key, the same transcripts
    offline = run_python(
        [script, *common, f"output_filename={tmp_path / 'offline.json'}", "rnnt_decoding.strategy=fast_greedy",
         "rnnt_decoding.greedy.graph_mode=eager", "rnnt_decoding.greedy.offline_batching=true"],
        tmp_path,
    )  # fmt: skip
    assert offline.returncode == 0, output_of(offline)[-3000:]
    assert "transcribe on the offline path: 3 inputs" in output_of(offline)
    assert pred_texts(tmp_path / "offline.json") == expected
    # our options are type-checked by NeMo's own schema, with the key named
    bad = run_python(
        [script, *common, "rnnt_decoding.strategy=fast_greedy", "rnnt_decoding.greedy.fast_math=maybe"], tmp_path
    )
    assert bad.returncode != 0 and "fast_math" in output_of(bad) and "maybe" in output_of(bad)


def test_transcribe_speech_parallel_on_two_cpu_ranks(saved, tmp_path):
    """Lightning's DDP starts the script again in a second process: the hook must work there too."""
    done = run_python(
        [str(EXAMPLES / "transcribe_speech_parallel.py"), f"model={saved / 'rnnt.nemo'}",
         f"predict_ds.manifest_filepath={saved / 'manifest.json'}", "predict_ds.num_workers=0", "predict_ds.batch_size=2",
         f"output_path={tmp_path / 'out'}", "trainer.devices=2", "trainer.accelerator=cpu", "trainer.strategy=ddp",
         "rnnt_decoding.strategy=fast_greedy", "rnnt_decoding.greedy.graph_mode=eager"],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, output_of(done)[-3000:]
    assert output_of(done).count("nemo_fastdecode: decoding with graph mode eager (forced)") == 2  # one per rank
    ours = pred_texts(tmp_path / "out" / "predictions_all.json")
    reference = run_python(
        [str(EXAMPLES / "transcribe_speech.py"), f"model_path={saved / 'rnnt.nemo'}", f"dataset_manifest={saved / 'manifest.json'}",
         f"output_filename={tmp_path / 'nemo.json'}", "rnnt_decoding.strategy=greedy_batch"],
        tmp_path,
    )  # fmt: skip
    assert reference.returncode == 0, output_of(reference)[-3000:]
    expected = pred_texts(tmp_path / "nemo.json")
    assert len(ours) == len(DURATIONS) and any(expected.values()) and ours == expected


def test_cache_aware_streaming_script_with_strategy_fast_greedy(saved, tmp_path):
    script = str(EXAMPLES / "speech_to_text_cache_aware_streaming_infer.py")
    common = ["--asr_model", str(saved / "streaming.nemo"), "--device", "cpu", "--manifest_file", str(saved / "manifest.json"),
              "--batch_size", "3", "--set_decoder", "rnnt"]  # fmt: skip
    texts = {}
    for strategy in ("greedy_batch", "fast_greedy"):
        done = run_python(
            [script, *common, "--strategy", strategy, "--output_path", str(tmp_path / strategy)], tmp_path
        )
        assert done.returncode == 0, output_of(done)[-3000:]
        (output,) = (tmp_path / strategy).glob("*.json")
        texts[strategy] = [json.loads(line)["pred_text"] for line in output.read_text().splitlines()]
        assert ("nemo_fastdecode: decoding with graph mode" in output_of(done)) == (strategy == "fast_greedy")
    assert len(texts["greedy_batch"]) == len(DURATIONS) and any(texts["greedy_batch"])
    assert texts["fast_greedy"] == texts["greedy_batch"]


def test_a_nemo_file_saved_with_fast_greedy_loads_without_and_with_the_plugin(tmp_path):
    model = synthetic.build_synthetic_model("tiny-rnnt")
    model.change_decoding_strategy(
        OmegaConf.create({"strategy": "fast_greedy", "greedy": {"max_symbols": 5, "graph_mode": "eager"}})
    )
    model.save_to(str(tmp_path / "ours.nemo"))
    assert model.cfg.decoding.strategy == "fast_greedy"  # saving leaves the model's own config as it was
    probe = (
        "import sys; from nemo.collections.asr.models import ASRModel; "
        f"m = ASRModel.restore_from({str(tmp_path / 'ours.nemo')!r}); "
        "print(type(m.decoding.decoding).__name__, m.cfg.decoding.strategy, m.decoding.decoding.max_symbols, "
        "'nemo_fastdecode' in sys.modules)"
    )
    without = run_python(["-c", probe], tmp_path, NEMO_FASTDECODE_AUTOLOAD="0")
    assert without.returncode == 0, output_of(without)[-3000:]
    assert without.stdout.split()[-4:] == ["GreedyBatchedRNNTInfer", "greedy_batch", "5", "False"]
    with_plugin = run_python(["-c", probe], tmp_path)
    assert with_plugin.returncode == 0, output_of(with_plugin)[-3000:]
    assert with_plugin.stdout.split()[-4:] == ["FastGreedyBatchedInfer", "fast_greedy", "5", "True"]


def test_strategy_changes_without_importing_the_package_and_without_noise(saved, tmp_path):
    probe = (
        "from nemo.collections.asr.models import ASRModel; from omegaconf import OmegaConf; "
        f"m = ASRModel.restore_from({str(saved / 'rnnt.nemo')!r}); "
        "m.change_decoding_strategy(OmegaConf.create({'strategy': 'fast_greedy', 'greedy': {'max_symbols': 3}})); "
        "[m.change_decoding_strategy(OmegaConf.create({'strategy': s})) for s in ('greedy_batch', 'fast_greedy')]; "
        "print('DECODER', type(m.decoding.decoding).__name__)"
    )
    done = run_python(["-c", probe], tmp_path, NEMO_FASTDECODE_VERBOSE="0")
    assert done.returncode == 0, output_of(done)[-3000:]
    assert "DECODER FastGreedyBatchedInfer" in done.stdout
    assert "OneLogger" not in output_of(done) and "No exporters were provided" not in output_of(done)
    # NeMo logs its loss set-up on every decoding change; once the package is imported, only the first time
    imported_first = run_python(["-c", "import nemo_fastdecode; " + probe], tmp_path, NEMO_FASTDECODE_VERBOSE="0")
    assert "DECODER FastGreedyBatchedInfer" in imported_first.stdout, output_of(imported_first)[-3000:]
    assert output_of(imported_first).count("Using RNNT Loss") == 1


@pytest.mark.parametrize(
    ("decoding", "match"),
    [
        ({"strategy": "fast_greedy", "greddy": {"max_symbols": 3}}, r"fast_greedy key\(s\) \['greddy'\].*did you mean 'greddy' -> 'greedy'"),
        ({"strategy": "fast_greedy", "greedy": {"max_symbols": "five"}}, r"decoding\.greedy\.max_symbols='five' is not valid: expected int"),
        ({"strategy": "fast_greedy", "greedy": {"max_symbols": -1}}, r"decoding\.greedy: max_symbols must be >= 1"),
        ({"strategy": "fast_beam", "beam": {"beam_size": 2, "fused_topk": "sometimes"}}, r"decoding\.beam\.fused_topk='sometimes'"),
    ],
)  # fmt: skip
def test_bad_values_name_the_users_key(decoding, match):
    model = synthetic.build_synthetic_model("tiny-rnnt")
    with pytest.raises(ValueError, match=match):
        model.change_decoding_strategy(OmegaConf.create(decoding))


def test_max_symbols_unset_resolves_as_nemo_does():
    model = synthetic.build_synthetic_model("tiny-rnnt")
    for greedy, expected in (
        ({"max_symbols": None, "max_symbols_per_step": None}, 10),  # NeMo's label loop with graphs allowed: 10
        ({"max_symbols": 0, "max_symbols_per_step": None}, 10),
        ({"max_symbols": None, "max_symbols_per_step": None, "use_cuda_graph_decoder": False}, None),
        ({"max_symbols": None, "max_symbols_per_step": None, "loop_labels": False}, None),
        ({"max_symbols": 0, "max_symbols_per_step": 4}, 4),
    ):
        model.change_decoding_strategy(OmegaConf.create({"strategy": "greedy_batch", "greedy": greedy}))
        nemo = model.decoding.decoding
        nemo_max = getattr(getattr(nemo, "decoding_computer", None), "max_symbols", nemo.max_symbols)
        model.change_decoding_strategy(OmegaConf.create({"strategy": "fast_greedy", "greedy": greedy}))
        assert nemo_max == expected and model.decoding.decoding.computer.max_symbols == expected, greedy
