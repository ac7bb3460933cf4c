"""The end-to-end ``model.transcribe`` benchmark: its config mirrors the dataclass, and a CPU smoke run fills in
every row with the work it did."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_fastdecode.tools.configs import TranscribeBenchmarkConfig
from nemo_fastdecode.tools.transcribe_benchmark import benchmark_transcribe, write_transcribe_reports

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_yaml_mirrors_the_dataclass():
    yaml = OmegaConf.load(CONFIGS / "bench_transcribe.yaml")
    schema = OmegaConf.structured(TranscribeBenchmarkConfig)
    assert OmegaConf.merge(schema, yaml) == schema
    assert set(yaml.keys()) == set(schema.keys())


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
    )
    assert [r.name for r in report.rows] == ["nemo", "fast_greedy+offline"]
    nemo, ours = report.rows
    assert nemo.tokens > 0 and report.emissions.tokens_per_frame > 0  # something was decoded
    assert ours.identical_to_nemo == 1.0  # fp32 on the CPU: the same tokens
    assert all(r.stages["encoder"] > 0 and r.stages["decoder"] > 0 for r in report.rows)
    markdown = write_transcribe_reports([report], "test", str(tmp_path / "r.json"), str(tmp_path / "r.md"))
    assert "fast_greedy+offline" in markdown and (tmp_path / "r.json").exists()
    with pytest.raises(ValueError, match="valid rows"):
        benchmark_transcribe("tiny-rnnt", 1.0, rows=["nope"], device="cpu")
