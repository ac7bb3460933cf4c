"""The end-to-end ``model.transcribe`` benchmark: its config mirrors the dataclass, and a CPU smoke run fills in
every row with the work it did."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from fastdecode_lab.benchmarks.transcribe import (
    SyntheticSet,
    benchmark_transcribe,
    first_call_in_new_process,
    write_transcribe_reports,
)
from fastdecode_lab.configs import BenchmarkConfig, TranscribeBenchmarkConfig

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


@pytest.mark.slow
def test_cpu_smoke_run_reports_every_row(tmp_path, single_thread):
    report = benchmark_transcribe(
        "tiny-rnnt",
        6.0,
        batch_size=4,
        repeats=1,
        rows=["nemo", "fast_greedy+offline"],
        device="cpu",
        log=lambda _: None,
        first_call_new_process=True,
        new_processes=2,
    )
    assert [r.name for r in report.rows] == ["nemo", "fast_greedy+offline"]
    nemo, ours = report.rows
    # our row's first call again in two child processes (same model and files made there); NeMo's row has none
    assert nemo.first_call_new_process_seconds is None and nemo.first_call_new_process_samples == []
    assert len(ours.first_call_new_process_samples) == 2 and min(ours.first_call_new_process_samples) > 0
    samples = sorted(ours.first_call_new_process_samples)
    assert ours.first_call_new_process_seconds == pytest.approx((samples[0] + samples[1]) / 2)
    assert nemo.tokens > 0 and report.emissions.tokens_per_frame > 0  # something was decoded
    assert ours.identical_to_nemo == 1.0  # fp32 on the CPU: the same tokens
    assert all(r.stages["encoder"] > 0 and r.stages["decoder"] > 0 for r in report.rows)
    markdown = write_transcribe_reports([report], "test", str(tmp_path / "r.json"), str(tmp_path / "r.md"))
    assert "fast_greedy+offline" in markdown and (tmp_path / "r.json").exists()
    assert "2 processes" in markdown  # the spread of the new-process first calls
    with pytest.raises(ValueError, match="valid rows"):
        benchmark_transcribe("tiny-rnnt", 1.0, rows=["nope"], device="cpu")
    with pytest.raises(ValueError, match="new_processes must be >= 1"):
        benchmark_transcribe("tiny-rnnt", 1.0, device="cpu", first_call_new_process=True, new_processes=0)


@pytest.mark.slow
def test_trained_calibration_reports_emissions_next_to_the_trained_ones(tmp_path, single_thread):
    report = benchmark_transcribe(
        "tiny-rnnt", 20.0, batch_size=4, repeats=1, calibration="trained", rows=["nemo", "fast_greedy"],
        device="cpu", log=lambda _: None,
    )  # fmt: skip
    assert report.calibration == "trained" and report.trained_emissions is not None
    assert report.rows[0].tokens > 0 and report.rows[1].identical_to_nemo == 1.0
    # calibrated on the first two batches, measured on the whole set: bursts near the trained model's
    assert report.emissions.tokens_per_emitting_frame < 1.5 * report.trained_emissions.tokens_per_emitting_frame
    markdown = write_transcribe_reports([report], "test", str(tmp_path / "r.json"), str(tmp_path / "r.md"))
    assert "calibration trained" in markdown and "Trained model of the same kind" in markdown
    with pytest.raises(ValueError, match="calibration 'fast' is not valid"):
        benchmark_transcribe("tiny-rnnt", 1.0, calibration="fast", device="cpu")


@pytest.mark.slow
def test_a_failing_new_process_call_says_why():
    bad = SyntheticSet("no-such-preset", 1.0, 2, 0.3, False, 10, 0)
    with pytest.raises(RuntimeError, match=r"(?s)new-process first call of fast_greedy failed.*no-such-preset"):
        first_call_in_new_process(bad, "fast_greedy", "cpu")
