"""The exactness benchmark (issue 47): its config mirrors the dataclass, bf16 weights leave the model as it was, and a
CPU smoke run of the smallest configuration reports every row, with tokens compared and every fp32 utterance
identical."""

import contextlib
from pathlib import Path

import pytest
import torch
from conftest import make_networks, random_encoder_output
from omegaconf import OmegaConf

from fastdecode_lab.benchmarks import exactness as exactness_benchmark
from fastdecode_lab.benchmarks.exactness import (
    BF16_ENCODER,
    RunOptions,
    benchmark_exactness,
    bf16_weights,
    write_exactness_reports,
)
from fastdecode_lab.configs import ExactnessBenchmarkConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_yaml_mirrors_the_dataclass_and_bad_choices_are_refused():
    yaml = OmegaConf.load(CONFIGS / "bench_exactness.yaml")
    schema = OmegaConf.structured(ExactnessBenchmarkConfig)
    assert OmegaConf.merge(schema, yaml) == schema
    assert set(yaml.keys()) == set(schema.keys())
    # as the script builds it, with command-line overrides: the subset names the output files
    merged = OmegaConf.merge(schema, yaml, OmegaConf.from_dotlist(["calibrations=[trained]", "precisions=[fp32]"]))
    config = ExactnessBenchmarkConfig(**OmegaConf.to_container(merged))
    assert config.subset_tag() == "trained_fp32" and ExactnessBenchmarkConfig().subset_tag() == ""
    assert config.run_options(repeats=1).repeats == 1 and ExactnessBenchmarkConfig(repeats=2).run_options().repeats == 2
    for bad, message in (
        ({"precisions": ["fp16"]}, "precisions"),
        ({"paths": []}, "paths"),
        ({"strategies": ["sampling"]}, "strategies"),
        ({"repeats": 0}, "repeats"),
        ({"vocab": "words"}, "vocab"),
        ({"calibrations": [0]}, "trained"),
    ):
        with pytest.raises(ValueError, match=message):
            ExactnessBenchmarkConfig(**bad)


def test_bf16_weights_puts_the_fp32_tensors_back():
    decoder, joint = make_networks(tdt=True, seed=1)
    before = {name: (tensor, tensor.detach().clone()) for name, tensor in joint.state_dict(keep_vars=True).items()}
    before |= {f"decoder.{n}": (t, t.detach().clone()) for n, t in decoder.state_dict(keep_vars=True).items()}
    x, _ = random_encoder_output(1, 2, seed=2)
    with bf16_weights([decoder, joint]):
        assert all(p.dtype == torch.bfloat16 for p in [*decoder.parameters(), *joint.parameters()])
    after = joint.state_dict(keep_vars=True) | {
        f"decoder.{n}": t for n, t in decoder.state_dict(keep_vars=True).items()
    }
    for name, (tensor, value) in before.items():
        # the same tensors, in fp32, with their values bit for bit (a cast back would keep bf16's rounding)
        assert after[name] is tensor and tensor.dtype == value.dtype and torch.equal(tensor, value), name
    with torch.inference_mode():  # the LSTM still runs on its own parameters
        g, _ = decoder.predict(torch.tensor([[1, 2]]), state=None, add_sos=False, batch_size=1)
        assert joint.joint(x.transpose(1, 2), g).dtype == torch.float32


def test_a_set_that_cannot_be_built_reports_its_error():
    result = benchmark_exactness("no-such-preset", 0.3, 2.0, device="cpu", log=lambda _: None)
    assert result.error and "no-such-preset" in result.error and result.rows == []


@pytest.mark.slow
def test_cpu_smoke_run_reports_every_row(tmp_path, single_thread):
    options = RunOptions(batch_size=2, repeats=1)
    result = benchmark_exactness("tiny-tdt", 0.3, 8.0, options, device="cpu", log=lambda _: None)
    assert result.error is None and result.utterances == 2
    expected = []  # in the order they run: per precision, transcribe then decoding API, greedy then beam
    for precision in ("fp32", "bf16_autocast", "bf16_weights"):
        api = [precision, BF16_ENCODER] if precision == "bf16_autocast" else [precision]
        for path, names in (("transcribe", [precision]), ("decoding_api", api)):
            expected += [(name, path, strategy) for name in names for strategy in ("greedy", "beam")]
    assert [(r.precision, r.path, r.strategy) for r in result.rows] == expected
    assert result.emissions.tokens_per_frame > 0
    for row in result.rows:
        if row.precision == "fp32":  # decided in fp32: every utterance identical, with tokens to compare
            assert row.error is None and row.tokens_nemo > 0 and row.tokens_ours == row.tokens_nemo, row
            assert row.identical == row.utterances and row.seconds_ours > 0 and row.seconds_nemo > 0, row
        elif row.identical is None:  # bf16 rows are reported, not required: run, or skipped with a reason
            assert row.error or (row.note and row.note.startswith("skipped")), row
    # NeMo's batched TDT loop records other durations for some utterances: its decode of each alone decides
    assert any(r.durations_as_nemo_alone for r in result.rows if r.strategy == "greedy")
    markdown = write_exactness_reports([result], "test", str(tmp_path / "r.json"), str(tmp_path / "r.md"))
    assert (tmp_path / "r.json").exists() and markdown.count("| 0.3 | ") == len(expected)


@pytest.mark.slow
def test_autocast_rows_and_nemos_float_reference(monkeypatch, single_thread):
    # the CPU may have no bf16 LSTM: the autocast rows run without autocast here, so that the bf16-encoder row feeds
    # bf16 outputs to fp32 modules, which NeMo's default refuses (as a GPU's might): its side decodes them .float()
    monkeypatch.setattr(exactness_benchmark, "autocast_problem", lambda device: None)
    monkeypatch.setattr(exactness_benchmark, "autocast", lambda precision, device: contextlib.nullcontext())
    options = RunOptions(precisions=("bf16_autocast",), paths=("decoding_api",), strategies=("greedy",), repeats=1)
    result = benchmark_exactness("tiny-rnnt", 0.3, 5.0, options, device="cpu", log=lambda _: None)
    autocast_row, bf16_row = result.rows
    assert (autocast_row.precision, bf16_row.precision) == ("bf16_autocast", BF16_ENCODER)
    assert autocast_row.identical == autocast_row.utterances and autocast_row.encoder_dtype == "float32"
    assert bf16_row.encoder_dtype == "bfloat16" and bf16_row.error.startswith("NeMo: RuntimeError")
    assert bf16_row.note.startswith("NeMo's side: the same encoder outputs .float()") and bf16_row.tokens_nemo > 0
