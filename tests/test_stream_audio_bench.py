"""benchmarks/stream_audio_bench.py: configs, the PCM clock's arrivals, and the smoke run (CPU): ours against NeMo's
CacheAwareRNNTPipeline on the same audio, every number of the report present and the transcripts checked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fastdecode_lab.benchmarks import stream_audio as bench
from fastdecode_lab.benchmarks.stream_audio.engine_clock import plan_pcm_streams
from fastdecode_lab.benchmarks.stream_audio.report import HOW_MEASURED
from fastdecode_lab.configs import StreamAudioBenchConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

pytestmark = pytest.mark.usefixtures("single_thread")


def compose_config(name: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(config_name=name)


def test_yaml_mirrors_the_dataclass_and_the_gpu_presets():
    cfg = compose_config("stream_audio_bench")
    schema = OmegaConf.structured(StreamAudioBenchConfig)
    assert OmegaConf.merge(schema, cfg) == schema and set(cfg) == set(schema)  # the YAML holds the defaults
    for name, preset in [
        ("stream_audio_bench_hybrid_17x512", "hybrid-17x512-streaming"),
        ("stream_audio_bench_rnnt_0.6b", "rnnt-0.6b-streaming"),
    ]:
        preset_cfg = bench.resolve_config(compose_config(name))
        assert preset_cfg.model == preset and list(preset_cfg.att_context_size) == [70, 1]
        assert list(preset_cfg.stream_counts) == [64, 256, 1024, 2048, 5000]
    with pytest.raises(ValueError, match="compute_dtype='float16'"):
        bench.resolve_config({"nemo": {"compute_dtype": "float16"}})


def test_a_chunk_arrives_with_the_push_that_completes_its_last_frame():
    def complete(samples: np.ndarray) -> np.ndarray:  # frames of 160 samples that read 199 samples ahead
        return np.maximum((samples - 199) // 160 + 1, 0)

    pcm = np.zeros(16000, dtype=np.int16)  # 1 s in 0.32 s pushes: 5120, 10240, 15360, 16000 samples
    (stream,) = plan_pcm_streams([pcm], 1, 0.32, 0.0, complete, 16000)
    assert stream.pushes == 4 and stream.end == 1.0
    assert stream.chunk_arrival(int(complete(np.array([5120]))[0])) == pytest.approx(0.32)  # the first push's frames
    assert stream.chunk_arrival(int(complete(np.array([5120]))[0]) + 1) == pytest.approx(0.64)  # one more: the next
    assert stream.chunk_arrival(10**6) == pytest.approx(1.0)  # what only the end completes comes with the last push


def test_smoke_run_measures_both_sides_on_the_same_audio(tmp_path):
    cfg = {"output_dir": str(tmp_path), "num_files": 3, "stream_counts": [2, 3], "cycle_repeats": 2, "tag": "cpu"}
    result = bench.run(cfg, log=lambda _: None, command="pytest smoke")
    assert [c.num_streams for c in result.counts] == [2, 3]
    for count in result.counts:
        assert not count.errors
        assert count.ours.chunks > count.num_streams and count.ours.latency_p95_ms > 0 and count.ours.busy_share > 0
        parts = count.ours_parts  # every stream has a first, a last and middle chunks
        assert parts.first_chunks == parts.last_chunks == count.num_streams and parts.middle_chunks > 0
        assert parts.first_chunks + parts.middle_chunks + parts.last_chunks == count.ours.chunks
        assert min(parts.first_p95_ms, parts.middle_p95_ms, parts.last_p95_ms) > 0
        assert count.ours_identical == 1.0  # every stream equals NeMo's streaming of its file alone (fp32)
        assert count.ours_cycle.stepped_per_cycle == count.num_streams  # every timed cycle stepped all streams
        assert 0 < count.ours_cycle.frontend_share < 1 and count.ours_cycle.cycle_ms > 0
        assert count.nemo_step.step_ms > 0 and count.ours_over_nemo > 0
    assert result.pipeline_agreement is not None
    assert set(result.max_realtime()) == {"ours", "nemo"}
    saved = json.loads(Path(result.files["json"]).read_text())
    assert saved["command"] == "pytest smoke" and saved["environment"]["nemo"] and saved["counts"][1]["ours_over_nemo"]
    report = Path(result.files["markdown"]).read_text()
    assert "pytest smoke" in report and HOW_MEASURED[0] in report and "| 3 |" in report
    assert Path(result.files["plot"]).stat().st_size > 0
