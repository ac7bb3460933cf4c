"""The engine's options as one object: ``EngineConfig``'s checks, and the server's and the lab's configs building it."""

from __future__ import annotations

import pytest
import torch

from fastdecode_lab.configs import StreamAudioBenchConfig, StreamingConfig
from nemo_fastdecode.apps.options import parse_config
from nemo_fastdecode.serve import ServeConfig
from nemo_fastdecode.streaming import EndpointingOptions, EngineConfig


def test_engine_config_checks_each_option_once():
    config = EngineConfig(num_slots=2)
    assert config.torch_dtype is torch.float32 and config.endpointing_options == EndpointingOptions()
    assert EngineConfig(num_slots=1, dtype="bfloat16").torch_dtype is torch.bfloat16
    assert EngineConfig(num_slots=1, dtype=torch.bfloat16).dtype_name == "bfloat16"
    with pytest.raises(ValueError, match=r"num_slots must be >= 1 \(an int\), got 0"):
        EngineConfig(num_slots=0)
    with pytest.raises(ValueError, match=r"dtype='float16' is not valid"):
        EngineConfig(num_slots=1, dtype=torch.float16)
    with pytest.raises(ValueError, match="idle_timeout_seconds must be > 0 or None"):
        EngineConfig(num_slots=1, idle_timeout_seconds=0.0)
    with pytest.raises(ValueError, match=r"endpointing \(vad or a blank-run rule\) needs decoding='greedy'"):
        EngineConfig(num_slots=1, decoding="beam", endpointing=EndpointingOptions(blank_run_ms=800))
    with pytest.raises(TypeError, match="endpointing must be an EndpointingOptions, got dict"):
        EngineConfig(num_slots=1, endpointing={"vad": True})


def test_engine_config_from_keywords():
    assert EngineConfig.from_options(3, fast_math=True) == EngineConfig(num_slots=3, fast_math=True)
    assert EngineConfig.from_options(num_slots=3) == EngineConfig(num_slots=3)
    config = EngineConfig(num_slots=3)
    assert EngineConfig.from_options(config) is config
    with pytest.raises(TypeError, match="given with an EngineConfig"):
        EngineConfig.from_options(config, fast_math=True)
    with pytest.raises(TypeError, match="unknown engine option"):
        EngineConfig.from_options(3, slots=4)
    with pytest.raises(TypeError, match="num_slots given twice"):
        EngineConfig.from_options(3, num_slots=4)


def test_server_builds_the_engine_config_from_its_flat_keys():
    config = parse_config(
        ServeConfig, ["slots=8", "att_context_size=[70,1]", "vad=true", "decoding=greedy", "dtype=bfloat16"], "t"
    )
    engine = config.engine
    assert engine.num_slots == 8 and list(engine.att_context_size) == [70, 1]
    assert engine.torch_dtype is torch.bfloat16 and engine.endpointing == EndpointingOptions(vad=True)
    assert engine.idle_timeout_seconds is None  # connections time out, not engine streams
    with pytest.raises(ValueError, match="slots must be >= 1"):
        ServeConfig(slots=0)


def test_lab_configs_build_the_engine_config():
    assert StreamingConfig(num_streams=5).engine_config() == EngineConfig(num_slots=5, dtype="float32")
    assert StreamingConfig(num_slots=2, fast_math=True).engine_config().fast_math
    bench = StreamAudioBenchConfig(encoder_matmul="tf32x3")
    assert bench.engine_config(4) == EngineConfig(num_slots=4, dtype="float32", encoder_matmul="tf32x3")
    with pytest.raises(ValueError, match="needs dtype=float32"):
        StreamAudioBenchConfig(dtype="bfloat16", encoder_matmul="tf32")
