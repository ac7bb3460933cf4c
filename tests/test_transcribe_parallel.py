"""``scripts/transcribe_parallel.py``: two CPU processes (Lightning DDP over gloo) and two Ray actors give exactly the
single-process manifest; after a rank is killed mid-run, or a shard is lost, a rerun redoes only the unfinished shards;
the shard plan, the shard outputs and the backends' checks on their own."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_transcribe_and_configs import keys

from fastdecode_lab import synthetic
from nemo_fastdecode.apps.configs import ParallelTranscribeConfig
from nemo_fastdecode.apps.parallel import transcribe_parallel
from nemo_fastdecode.apps.parallel.job import Throughput, WorkerTime
from nemo_fastdecode.apps.parallel.ray_run import _actor_count, _use_gpu, import_ray
from nemo_fastdecode.apps.parallel.shards import ShardOutputs, plan_shards
from nemo_fastdecode.apps.transcribe import resolve_config

REPO = Path(__file__).resolve().parents[1]
DURATIONS = [1.0, 2.5, 0.7, 3.0, 1.6, 2.2, 0.4]  # 7 inputs: in 8 shards (2 workers x 4), one input each


def test_transcribe_parallel_yaml_matches_dataclass():
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        cfg = compose(config_name="transcribe_parallel")
    schema = OmegaConf.structured(ParallelTranscribeConfig)
    assert OmegaConf.merge(schema, cfg) == schema
    assert keys(cfg) == keys(schema)
    assert cfg.decoding.strategy == "fast_greedy" and cfg.backend == "lightning" and cfg.strategy == "ddp"


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


def test_a_work_folder_refuses_another_jobs_plan(tmp_path):
    outputs = ShardOutputs(tmp_path / "work")
    names = ["a.wav", "b.wav", "c.wav"]
    outputs.check_plan(names, [[0, 2], [1]])
    outputs.check_plan(names, [[0, 2], [1]])  # the same job again (a rerun, or another rank): accepted
    with pytest.raises(ValueError, match="another job \\(2 shards; this job plans 3\\)"):
        outputs.check_plan(names, [[0], [1], [2]])
    with pytest.raises(ValueError, match="another job \\(other input durations\\)"):
        outputs.check_plan(names, [[0], [1, 2]])
    with pytest.raises(ValueError, match="another job \\(other inputs\\)"):
        outputs.check_plan(["a.wav", "b.wav", "d.wav"], [[0, 2], [1]])


def test_throughput_spans_the_workers_and_skips_idle_ones():
    busy = WorkerTime("rank 0", load_seconds=2.0)
    busy.add(100.0, 104.0, audio_seconds=40.0)
    busy.add(104.0, 110.0, audio_seconds=60.0)
    other = WorkerTime("rank 1")
    other.add(101.0, 108.0, audio_seconds=70.0)
    idle = WorkerTime.from_list("rank 2", WorkerTime("x", load_seconds=1.5).as_list())
    throughput = Throughput.of([busy, other, idle], wall_seconds=20.0)
    assert (throughput.audio_seconds, throughput.transcribe_seconds) == (170.0, 10.0)
    assert throughput.rtfx == 17.0 and idle.load_seconds == 1.5 and idle.shards == 0
    lines = throughput.lines()
    assert "RTFx 17.0" in lines[0] and "20.00 s wall in all (RTFx 8.5)" in lines[0]
    assert lines[1] == "  rank 0: model 2.00 s, 2 shard(s), 100.0 s of audio in 10.00 s (RTFx 10.0)"
    assert lines[3] == "  rank 2: model 1.50 s, 0 shard(s), 0.0 s of audio in 0.00 s (RTFx -)"


def test_an_unknown_backend_and_ray_settings_are_refused(tmp_path):
    cfg = resolve_config({"dataset_manifest": "in.jsonl", "backend": "spark"}, ParallelTranscribeConfig)
    with pytest.raises(ValueError, match="backend='spark'; valid backends: lightning, ray"):
        transcribe_parallel(cfg)
    with pytest.raises(ValueError, match="accelerator='tpu' with backend=ray; valid: auto, gpu, cpu"):
        _use_gpu("tpu", {"CPU": 2.0})
    with pytest.raises(ValueError, match="accelerator=gpu but the Ray cluster has no GPU"):
        _use_gpu("gpu", {"CPU": 2.0})
    assert _use_gpu("auto", {"CPU": 8.0, "GPU": 2.0}) and not _use_gpu("auto", {"CPU": 8.0})
    assert _actor_count(None, True, {"CPU": 8.0, "GPU": 2.0}) == 2 and _actor_count(None, False, {"CPU": 3.0}) == 3
    with pytest.raises(ValueError, match="ray_actors=3, but the Ray cluster has 2 GPU\\(s\\)"):
        _actor_count(3, True, {"CPU": 8.0, "GPU": 2.0})


def test_the_ray_backend_names_the_install_command_where_ray_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match='pip install "ray\\[data\\]"'):
        import_ray()


# ---------------------------------------------------------------- whole jobs (slow: processes, models, a Ray cluster)


@pytest.fixture(scope="module")
def job_inputs(tmp_path_factory) -> tuple[Path, str]:
    """A manifest of 7 synthetic utterances and ``scripts/transcribe.py``'s output manifest of it (the reference)."""
    folder = tmp_path_factory.mktemp("parallel_inputs")
    paths = synthetic.write_wavs(synthetic.synthetic_audio(DURATIONS, seed=3), folder / "wavs", prefix="u")
    manifest = folder / "in.jsonl"
    manifest.write_text(
        "".join(json.dumps({"audio_filepath": str(p), "text": f"t{i}"}) + "\n" for i, p in enumerate(paths))
    )
    single = folder / "single.jsonl"
    # the parallel script's default model (a synthetic preset; scripts/transcribe.py's is the shipped trained one)
    _run(["scripts/transcribe.py", "model=tiny-rnnt", f"dataset_manifest={manifest}", f"output_filename={single}",
          "compare_strategies=false"])  # fmt: skip
    want = single.read_text()
    records = [json.loads(line) for line in want.splitlines()]
    assert [r["audio_filepath"] for r in records] == [str(p) for p in paths]
    assert sum(bool(r["pred_text"]) for r in records) >= 5  # transcripts to compare
    return manifest, want


def _run(
    args: list[str], *, expect_success: bool = True, env: dict[str, str] | None = None, path: tuple[Path, ...] = ()
) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(map(str, (*path, REPO)))}
    done = subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if expect_success:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def _lightning_command(script: Path, manifest: Path, output: Path, work: Path) -> list[str]:
    return [str(script), f"dataset_manifest={manifest}", "accelerator=cpu", "devices=2", f"output_filename={output}",
            f"work_dir={work}"]  # fmt: skip


def _shard_times(work: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in work.glob("shard_*.jsonl")}


# Loaded first in every process of a run (``sitecustomize``): records each torch.distributed collective, the devices
# of the tensors it is given, the rank's own device and the innermost caller outside torch, Lightning and this file.
_COLLECTIVE_TRACER = """
import json, os, traceback
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

OUT = os.path.join(os.environ["TRACE_COLLECTIVES"], f"{os.getpid()}.jsonl")
LIBRARIES = ("/torch/", "/lightning/", "/lightning_fabric/", __file__)

def traced(name, real):
    def collective(*args, **kwargs):
        tensors = [a for a in (*args, *kwargs.values()) if hasattr(a, "device")]
        tensors += [t for a in (*args, *kwargs.values()) if isinstance(a, (list, tuple)) for t in a if hasattr(t, "device")]
        callers = [f for f in traceback.extract_stack()[:-1] if not any(lib in f.filename for lib in LIBRARIES)]
        caller = f"{callers[-1].filename}:{callers[-1].lineno}" if callers else None
        with open(OUT, "a") as f:
            record = {"op": name, "devices": sorted({str(t.device) for t in tensors}), "caller": caller,
                      "rank": int(os.environ.get("LOCAL_RANK", "0"))}
            f.write(json.dumps(record) + "\\n")
        return real(*args, **kwargs)
    return collective

for name in ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce", "reduce_scatter", "gather",
             "scatter"):
    if hasattr(c10d, name):
        wrapper = traced(name, getattr(c10d, name))
        setattr(c10d, name, wrapper)
        setattr(dist, name, wrapper)
"""


@pytest.mark.slow
def test_two_cpu_processes_give_the_single_process_manifest(job_inputs, tmp_path):
    manifest, want = job_inputs
    output = tmp_path / "parallel.jsonl"
    command = _lightning_command(REPO / "scripts/transcribe_parallel.py", manifest, output, tmp_path / "work")
    out, trace = _traced_run(command, tmp_path)
    assert "7 input(s) in 8 shard(s) over 2 lightning worker(s) (0 shard(s) from an earlier run)" in out
    assert "Throughput: 11.4 s of audio in " in out and "  rank 1: model " in out
    assert output.read_text() == want
    _check_collectives(trace, ranks=2, device=lambda rank: "cpu")


def _traced_run(command: list[str], tmp_path: Path) -> tuple[str, Path]:
    """Run ``command`` with every process's collectives recorded under ``tmp_path / "collectives"``."""
    trace, site = tmp_path / "collectives", tmp_path / "site"
    trace.mkdir()
    site.mkdir()
    (site / "sitecustomize.py").write_text(_COLLECTIVE_TRACER)
    return _run(command, env={"TRACE_COLLECTIVES": str(trace)}, path=(site,)).stdout, trace


def _check_collectives(trace: Path, ranks: int, device) -> None:
    """Every collective of every rank on ``device(rank)`` (what NCCL requires on GPUs, where a CPU tensor fails with
    "No backend type associated with device type cpu"), and none from the model's own code (NeMo's encoder
    all-reduces lengths whenever a process group exists; ranks encode their own audio, and a model built on the CPU
    first would all-reduce a CPU tensor)."""
    calls = [json.loads(line) for f in trace.glob("*.jsonl") for line in f.read_text().splitlines()]
    assert {c["rank"] for c in calls} == set(range(ranks))  # every rank traced
    assert any(c["op"] == "all_gather" for c in calls)  # the ranks' times, gathered
    assert all(set(c["devices"]) <= {device(c["rank"])} for c in calls), calls
    ours = REPO / "nemo_fastdecode" / "apps" / "parallel" / "lightning_run.py"
    callers = {c["caller"] for c in calls}
    assert all(c is None or c.startswith(f"{ours}:") for c in callers), sorted(map(str, callers))


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_gpu_ranks_give_the_one_gpu_manifest_with_collectives_on_their_gpus(job_inputs, tmp_path):
    manifest, _ = job_inputs
    outputs = {}
    for devices in (1, 2):
        folder = tmp_path / f"gpus{devices}"
        folder.mkdir()
        command = [str(REPO / "scripts/transcribe_parallel.py"), f"dataset_manifest={manifest}", "accelerator=gpu",
                   f"devices={devices}", f"output_filename={folder / 'out.jsonl'}", f"work_dir={folder / 'work'}"]  # fmt: skip
        out, trace = _traced_run(command, folder)
        assert f"over {devices} lightning worker(s)" in out
        if devices > 1:  # one device: Lightning's single-device strategy, no process group
            _check_collectives(trace, ranks=devices, device=lambda rank: f"cuda:{rank}")
        outputs[devices] = (folder / "out.jsonl").read_text()
    assert outputs[1].count("\n") == len(DURATIONS)
    assert outputs[2] == outputs[1]  # same order, same text


# Runs scripts/transcribe_parallel.py (as __main__, without runpy, which would put the script's path in sys.argv[0]:
# Lightning starts the other ranks with sys.argv). In rank 1, a process of its own, the second shard's write starts
# and the process is killed (SIGKILL) half way through it.
_KILL_RANK_1 = """
import os, signal
from nemo_fastdecode.apps.parallel.shards import ShardOutputs

write, written = ShardOutputs.write, []

def write_or_die(self, shard, indices, records):
    if os.environ.get("LOCAL_RANK") == "1" and written:
        final = self.path(shard)
        final.with_name(f".{final.name}.{os.getpid()}.tmp").write_text('{"pred_text": "hal')
        os.kill(os.getpid(), signal.SIGKILL)
    written.append(shard)
    return write(self, shard, indices, records)

ShardOutputs.write = write_or_die
with open(SCRIPT, encoding="utf-8") as f:
    exec(compile(f.read(), SCRIPT, "exec"), {"__name__": "__main__", "__file__": SCRIPT})
"""


@pytest.mark.slow
def test_a_rank_killed_mid_run_loses_nothing_on_the_rerun(job_inputs, tmp_path):
    manifest, want = job_inputs
    output, work = tmp_path / "parallel.jsonl", tmp_path / "work"
    crashing = tmp_path / "transcribe_parallel_kill_rank_1.py"
    crashing.write_text(f"SCRIPT = {str(REPO / 'scripts/transcribe_parallel.py')!r}\n{_KILL_RANK_1}")
    crashed = _run(_lightning_command(crashing, manifest, output, work), expect_success=False)
    assert crashed.returncode != 0 and not output.exists()
    finished = _shard_times(work)
    # rank 1 owns shards 1, 3, 5 (7 is empty): it wrote shard 1 and died writing shard 3, leaving a partial temp file
    assert work / "shard_00001.jsonl" in finished
    assert work / "shard_00003.jsonl" not in finished and work / "shard_00005.jsonl" not in finished
    assert list(work.glob(".shard_00003.jsonl.*.tmp"))
    rerun = _run(_lightning_command(REPO / "scripts/transcribe_parallel.py", manifest, output, work)).stdout
    assert f"({len(finished)} shard(s) from an earlier run)" in rerun
    assert {p: t for p, t in _shard_times(work).items() if p in finished} == finished  # finished shards not redone
    assert len(_shard_times(work)) == 7
    records = [json.loads(line) for line in output.read_text().splitlines()]
    inputs = [json.loads(line)["audio_filepath"] for line in manifest.read_text().splitlines()]
    assert [r["audio_filepath"] for r in records] == inputs  # every input once, in input order
    assert output.read_text() == want


@contextlib.contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    """Raise ``TimeoutError`` in the main thread after ``seconds`` (Ray waits in Python loops, so the alarm is seen)."""

    def expire(signum, frame):
        raise TimeoutError(f"more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs for this module; its workers import this checkout."""
    ray = pytest.importorskip("ray", reason='the Ray backend needs Ray Data: pip install "ray[data]"')
    with _time_limit(120):
        ray.init(
            num_cpus=2, num_gpus=0, include_dashboard=False, object_store_memory=100 * 2**20, log_to_driver=False,
            logging_level="warning",
            runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}},
        )  # fmt: skip
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_actors_give_the_single_process_manifest_and_redo_only_a_lost_shard(ray_cluster, job_inputs, tmp_path):
    manifest, want = job_inputs
    output, work = tmp_path / "ray.jsonl", tmp_path / "work"
    cfg = resolve_config(
        {"dataset_manifest": str(manifest), "backend": "ray", "accelerator": "cpu", "output_filename": str(output),
         "work_dir": str(work)},
        ParallelTranscribeConfig,
    )  # fmt: skip
    lines: list[str] = []
    with _time_limit(300):
        result = transcribe_parallel(cfg, log=lines.append)
    summary = next(line for line in lines if " input(s) in " in line)
    assert "7 input(s) in 8 shard(s) over 2 ray worker(s) (0 shard(s) from an earlier run)" in summary
    workers = result.throughput.workers
    assert len(workers) == 2 and sum(w.shards for w in workers) == 7  # both actors took shards, every shard once
    assert result.throughput.audio_seconds == pytest.approx(sum(DURATIONS), abs=0.01)
    assert output.read_text() == want

    lost = work / "shard_00004.jsonl"
    lost.unlink()
    kept = _shard_times(work)
    output.unlink()
    with _time_limit(300):
        result = transcribe_parallel(cfg, log=lines.append)
    assert result.shards_reused == 6 and sum(w.shards for w in result.throughput.workers) == 1
    assert _shard_times(work) == {**kept, lost: lost.stat().st_mtime_ns}  # only the lost shard was written
    assert output.read_text() == want
    assert ray_cluster.is_initialized()  # the job used this process's cluster and left it running
