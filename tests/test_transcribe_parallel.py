"""``scripts/transcribe_parallel.py``: two CPU processes (Lightning DDP over gloo) give exactly the single-process
manifest, and a rerun after a failure redoes only the unfinished shards; the shard plan and outputs on their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_transcribe_and_configs import keys

from nemo_fastdecode.tools import synthetic
from nemo_fastdecode.tools.configs import ParallelTranscribeConfig
from nemo_fastdecode.tools.parallel.shards import ShardOutputs, plan_shards

REPO = Path(__file__).resolve().parents[1]


def test_transcribe_parallel_yaml_matches_dataclass():
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        cfg = compose(config_name="transcribe_parallel")
    schema = OmegaConf.structured(ParallelTranscribeConfig)
    assert OmegaConf.merge(schema, cfg) == schema
    assert keys(cfg) == keys(schema)
    assert cfg.decoding.strategy == "fast_greedy" and cfg.strategy == "ddp"


def test_plan_shards_partitions_the_inputs_and_balances_their_lengths():
    durations = [5.0, 1.0, 1.0, 3.0, 2.0, 2.0, 4.0, 0.5]
    shards = plan_shards(durations, 3)
    assert sorted(i for shard in shards for i in shard) == list(range(len(durations)))
    loads = [sum(durations[i] for i in shard) for shard in shards]
    assert max(loads) - min(loads) <= max(durations) / 2
    assert all(shard == sorted(shard) for shard in shards)
    assert plan_shards(durations, 3) == shards  # the same plan in every process
    assert [len(s) for s in plan_shards([1.0, 2.0], 4)].count(0) == 2  # more shards than inputs: some are empty
    with pytest.raises(ValueError, match="num_shards must be >= 1, got 0"):
        plan_shards(durations, 0)


def test_shard_outputs_merge_in_input_order_and_name_what_is_missing(tmp_path):
    outputs = ShardOutputs(tmp_path / "work")
    shards = [[0, 3], [1, 2], []]
    outputs.write(1, [1, 2], [{"pred_text": "b"}, {"pred_text": "c"}])
    with pytest.raises(FileNotFoundError, match="shard 0 \\(2 inputs\\) has no output"):
        outputs.merge(shards)
    outputs.write(0, [0, 3], [{"pred_text": "a"}, {"pred_text": "d"}])
    assert [r["pred_text"] for r in outputs.merge(shards)] == ["a", "b", "c", "d"]
    with pytest.raises(ValueError, match="the inputs or the shard count changed"):
        outputs.merge([[0, 1], [2, 3], []])
    assert not list((tmp_path / "work").glob(".*.tmp"))  # written by rename: no temporary file is left


def _run(args: list[str], cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_two_cpu_processes_give_the_single_process_manifest_and_resume_after_a_failure(tmp_path):
    audio = synthetic.synthetic_audio([1.0, 2.5, 0.7, 3.0, 1.6, 2.2, 0.4], seed=3)
    paths = synthetic.write_wavs(audio, tmp_path / "wavs", prefix="u")
    manifest = tmp_path / "in.jsonl"
    manifest.write_text(
        "".join(json.dumps({"audio_filepath": str(p), "text": f"t{i}"}) + "\n" for i, p in enumerate(paths))
    )
    single, parallel, work = tmp_path / "single.jsonl", tmp_path / "parallel.jsonl", tmp_path / "shards"
    _run(["scripts/transcribe.py", f"dataset_manifest={manifest}", f"output_filename={single}",
          "compare_strategies=false"], REPO)  # fmt: skip
    command = ["scripts/transcribe_parallel.py", f"dataset_manifest={manifest}", "accelerator=cpu", "devices=2",
               f"output_filename={parallel}", f"work_dir={work}"]  # fmt: skip
    out = _run(command, REPO)
    assert "7 input(s) in 8 shard(s) over 2 process(es) (0 shard(s) from an earlier run)" in out
    want = single.read_text()
    assert sum(bool(json.loads(line)["pred_text"]) for line in want.splitlines()) >= 5  # transcripts to compare
    assert parallel.read_text() == want

    # a rank that died: one shard never finished (its temporary file left behind), the others done
    shard_files = sorted(work.glob("shard_*.jsonl"))
    lost = shard_files[2]
    (work / f".{lost.name}.12345.tmp").write_text('{"pred_text": "half"')
    lost.unlink()
    kept = {p: p.stat().st_mtime_ns for p in shard_files if p != lost}
    parallel.unlink()
    out = _run(command, REPO)
    assert f"({len(kept)} shard(s) from an earlier run)" in out
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # finished shards are not redone
    assert lost.is_file() and parallel.read_text() == want  # nothing lost, nothing twice
