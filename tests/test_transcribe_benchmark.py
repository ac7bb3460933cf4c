"""The end-to-end ``model.transcribe`` benchmark: its config mirrors the dataclass, and CPU runs of tiny models fill
in every row with the work it did: NeMo's sorted rows and batch sweep, ours, beam rows, failed and skipped rows."""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from fastdecode_lab.benchmarks import transcribe as transcribe_benchmark
from fastdecode_lab.benchmarks.transcribe import (
    ROWS,
    RowSpec,
    SyntheticSet,
    benchmark_transcribe,
    first_call_in_new_process,
    write_transcribe_reports,
)
from fastdecode_lab.configs import BenchmarkConfig, TranscribeBenchmarkConfig
from nemo_fastdecode.offline import enable_fast_transcribe

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize(
    ("name", "config"), [("bench_transcribe.yaml", TranscribeBenchmarkConfig), ("benchmark.yaml", BenchmarkConfig)]
)
def test_yaml_mirrors_the_dataclass_and_calibrations_accept_trained(name, config):
    yaml = OmegaConf.load(CONFIGS / name)
    schema = OmegaConf.structured(config)
    assert OmegaConf.merge(schema, yaml) == schema
    assert set(yaml.keys()) == set(schema.keys())
    assert "trained" in yaml.calibrations
    # as the scripts build it, with a command-line override
    merged = OmegaConf.merge(schema, yaml, OmegaConf.from_dotlist(["calibrations=[0.2,trained]"]))
    assert config(**OmegaConf.to_container(merged)).calibrations == [0.2, "trained"]
    for bad in (["fast"], [0], []):
        with pytest.raises(ValueError, match="trained"):
            config(calibrations=bad)


def test_the_benchmark_config_refuses_no_new_processes():
    with pytest.raises(ValueError, match="new_processes must be >= 1, got 0"):
        TranscribeBenchmarkConfig(new_processes=0)


def test_the_benchmark_config_refuses_bad_precisions_and_batch_sizes():
    with pytest.raises(ValueError, match="precisions=.*bf16_weights"):
        TranscribeBenchmarkConfig(precisions=["bf16"])
    with pytest.raises(ValueError, match="nemo_batch_sizes must be batch sizes >= 1"):
        TranscribeBenchmarkConfig(nemo_batch_sizes=[])


def _enable_or_fail(model, options):
    """``enable_fast_transcribe``, except that ``threads=7`` installs a ``transcribe`` that raises as NeMo's does on a
    bf16 model (the failed-row path without a GPU)."""
    if options.threads != 7:
        return enable_fast_transcribe(model, options)

    def transcribe(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 must have the same dtype")

    model.transcribe = transcribe  # an instance attribute: disable_fast_transcribe removes it


@pytest.mark.slow
def test_cpu_run_of_the_leaderboard_rows(tmp_path, single_thread, monkeypatch):
    monkeypatch.setitem(ROWS, "raises", RowSpec("fast_greedy", offline={"threads": 7}))
    monkeypatch.setitem(ROWS, "unknown_option", RowSpec("fast_greedy", offline={"no_such_option": True}))
    monkeypatch.setattr(transcribe_benchmark, "enable_fast_transcribe", _enable_or_fail)
    names = ["nemo", "nemo_sorted_b128", "nemo_sorted_best", "fast_greedy+offline", "raises", "unknown_option"]
    report = benchmark_transcribe(
        "tiny-rnnt", 12.0, batch_size=2, repeats=1, rows=names, nemo_batch_sizes=[1, 2, 4], device="cpu",
        log=lambda _: None, first_call_new_process=True, new_processes=1,
    )  # fmt: skip
    rows = {r.name: r for r in report.rows}
    assert [r.name for r in report.rows] == names and report.utterances == 3
    assert {r.precision for r in report.rows} == {"fp32"}
    # the failed and skipped rows say why, and the rows after them ran
    assert rows["raises"].error == "RuntimeError: mat1 and mat2 must have the same dtype"
    assert rows["unknown_option"].error.startswith("skipped:") and "no_such_option" in rows["unknown_option"].error
    ran = [r for r in report.rows if r.ok]
    assert [r.name for r in ran] == names[:4] and all(r.tokens > 0 and r.stages["data"] > 0 for r in ran)
    assert all(r.stages["encoder"] > 0 and r.stages["decoder"] > 0 for r in ran)
    # sorted NeMo rows, results put back in input order: NeMo's own tokens in fp32; ours too
    assert all(r.identical_to_nemo == 1.0 and r.reference == "nemo (fp32)" for r in ran)
    assert rows["nemo_sorted_b128"].batch_size == 128 and rows["nemo_sorted_b128"].longest_first
    best = rows["nemo_sorted_best"]
    assert sorted(best.sweep_seconds) == [1, 2, 4]
    assert best.sweep_seconds[best.batch_size] == min(best.sweep_seconds.values()) == best.seconds
    # only our fastest row timed its first call in a new process
    ours = rows["fast_greedy+offline"]
    assert len(ours.first_call_new_process_samples) == 1 and ours.first_call_new_process_seconds > 0
    assert all(not r.first_call_new_process_samples for r in report.rows if r is not ours)
    markdown = write_transcribe_reports([report], "test", str(tmp_path / "r.json"), str(tmp_path / "r.md"))
    assert "mat1 and mat2 must have the same dtype" in markdown and "1 process" in markdown
    assert f"ours at best fast_greedy+offline (fp32) RTFx {ours.rtfx:,.0f}" in markdown
    nemo_best = min((r for r in ran if not r.ours), key=lambda r: r.seconds)
    assert f"{nemo_best.seconds / ours.seconds:.2f}x NeMo at best** ({nemo_best.name}" in markdown
    assert json.loads((tmp_path / "r.json").read_text())["reports"][0]["rows"][4]["error"].startswith("RuntimeError")
    with pytest.raises(ValueError, match="rows=.*nope.*choose one or more of"):
        benchmark_transcribe("tiny-rnnt", 1.0, rows=["nope"], device="cpu")
    with pytest.raises(ValueError, match="new_processes must be >= 1"):
        benchmark_transcribe("tiny-rnnt", 1.0, device="cpu", first_call_new_process=True, new_processes=0)


@pytest.mark.slow
def test_trained_calibration_reports_emissions_next_to_the_trained_ones(tmp_path, single_thread):
    rows = ["nemo", "fast_greedy", "nemo_beam_sorted_best", "fast_beam+offline"]
    report = benchmark_transcribe(
        "tiny-rnnt", 20.0, batch_size=4, repeats=1, calibration="trained", rows=rows, nemo_batch_sizes=[4],
        device="cpu", log=lambda _: None,
    )  # fmt: skip
    assert report.calibration == "trained" and report.trained_emissions is not None
    assert report.rows[0].tokens > 0 and report.rows[1].identical_to_nemo == 1.0
    # beam rows are compared with NeMo's beam search, greedy ones with NeMo's greedy decoder
    assert [r.reference for r in report.rows] == ["nemo (fp32)"] * 2 + ["nemo_beam_sorted_best (fp32)"] * 2
    assert report.rows[3].identical_to_nemo == 1.0 and report.emissions_row == "nemo row, fp32"
    # calibrated on the first two batches, measured on the whole set: bursts near the trained model's
    assert report.emissions.tokens_per_emitting_frame < 1.5 * report.trained_emissions.tokens_per_emitting_frame
    markdown = write_transcribe_reports([report], "test", str(tmp_path / "r.json"), str(tmp_path / "r.md"))
    assert "calibration trained" in markdown and "Trained model of the same kind" in markdown
    assert "**greedy: ours at best fast_greedy" in markdown and "**beam: ours at best fast_beam+offline" in markdown
    with pytest.raises(ValueError, match="calibration 'fast' is not valid"):
        benchmark_transcribe("tiny-rnnt", 1.0, calibration="fast", device="cpu")


@pytest.mark.slow
def test_a_failing_new_process_call_says_why():
    bad = SyntheticSet("no-such-preset", 1.0, 2, 0.3, False, 10, 0)
    with pytest.raises(RuntimeError, match=r"(?s)new-process first call of fast_greedy failed.*no-such-preset"):
        first_call_in_new_process(bad, "fast_greedy", "fp32", "cpu")
