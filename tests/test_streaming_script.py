"""scripts/streaming.py: config mirror, the simulated multi-stream run (ours vs NeMo's path), the script (CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fastdecode_lab import streaming_sim as sim
from fastdecode_lab import synthetic
from fastdecode_lab.configs import StreamingConfig
from fastdecode_lab.streaming_sim.phrases import boosted_streams, stream_boosting
from nemo_fastdecode.apps import trained_models
from nemo_fastdecode.streaming import StreamingGeometry

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "streaming"

pytestmark = pytest.mark.usefixtures("single_thread")


def compose_streaming(name: str = "streaming", overrides: list[str] | None = None):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(config_name=name, overrides=overrides or [])


def test_streaming_yaml_matches_dataclass():
    cfg = compose_streaming()
    schema = OmegaConf.structured(StreamingConfig)
    assert OmegaConf.merge(schema, cfg) == schema  # the YAML holds exactly the dataclass defaults
    assert set(cfg) == set(schema)


@pytest.mark.parametrize(
    ("name", "preset", "layers", "d_model"),
    [
        ("streaming_hybrid_17x512", "hybrid-17x512-streaming", 17, 512),
        ("streaming_rnnt_0.6b", "rnnt-0.6b-streaming", 24, 1024),
    ],
)
def test_benchmark_presets(name, preset, layers, d_model):
    cfg = sim.resolve_config(compose_streaming(name))
    assert cfg.model == preset and list(cfg.att_context_size) == [70, 1]
    assert (cfg.num_streams, cfg.num_slots) == (256, 1024)
    enc = synthetic.make_synthetic_config(preset).encoder
    assert (enc.n_layers, enc.d_model, enc.att_context_style, enc.conv_context_size) == (
        layers,
        d_model,
        "chunked_limited",
        "causal",
    )
    assert [list(c) for c in enc.att_context_size] == [[70, 13], [70, 6], [70, 1], [70, 0]]
    assert enc.causal_downsampling is True


def test_config_errors():
    with pytest.raises(ValueError, match="dtype='fp8' is not valid; valid values: float32, bfloat16"):
        sim.resolve_config({"dtype": "fp8"})
    with pytest.raises(ValueError, match="num_streams must be >= 1"):
        sim.resolve_config({"num_streams": 0})
    with pytest.raises(ValueError, match="not both"):
        sim.resolve_config({"audio_dir": "a", "dataset_manifest": "b"})
    with pytest.raises(Exception, match="no_such_key"):
        sim.resolve_config({"no_such_key": 1})
    with pytest.raises(ValueError, match=r"ngram_lm_alpha=1\.0 needs ngram_lm_model"):
        sim.resolve_config({"ngram_lm_alpha": 1.0})


def test_plan_streams_arrivals():
    geometry = StreamingGeometry(
        att_context_size=(16, 1),
        feat_in=4,
        first_chunk=9,
        chunk=16,
        pre_encode_cache=9,
        drop_extra=2,
        min_last_chunk=8,
        out_frames=2,
        att_cache=16,
        conv_cache=8,
        subsampling_factor=8,
    )
    feats = [torch.zeros(4, 48), torch.zeros(4, 30)]
    plans = sim.plan_streams(feats, ["a", "b"], geometry, num_streams=3, stagger_seconds=0.5, seed=1)
    assert [p.name for p in plans] == ["a", "b", "a"]
    assert [c.shape[1] for c in plans[0].chunks] == [9, 16, 16]  # the 7-frame tail < min_last_chunk is dropped
    for plan in plans:
        assert 0 <= plan.start < 0.5
        assert plan.arrivals[0] == pytest.approx(plan.start + 0.09)
        assert all(b > a for a, b in zip(plan.arrivals, plan.arrivals[1:], strict=False))
    together = sim.plan_streams(feats, ["a", "b"], geometry, num_streams=2, stagger_seconds=0.0, max_stream_seconds=0.2)
    assert {p.start for p in together} == {0.0} and sum(c.shape[1] for c in together[0].chunks) == 9 + 11


def test_tiny_run_matches_nemo_path(tmp_path):
    lines: list[str] = []
    result = sim.run(
        {
            "model": "tiny-streaming",
            "num_streams": 5,
            "num_slots": 3,
            "max_stream_seconds": 1.6,
            "stagger_seconds": 0.5,
            "output_dir": str(tmp_path),
            "tag": "cpu",
            "cuda": -1,
            "att_context_size": [16, 1],
        },
        log=lines.append,
    )
    text = "\n".join(lines)
    assert "RANDOM, UNTRAINED WEIGHTS" in text and "| nemo_fastdecode (eager)" in text
    assert "synthetic utterances" in text and result.wer is None and "reference:" not in text  # no texts to score
    ours, nemo = result.paths
    assert nemo.name.startswith("NeMo gather/scatter + conformer_stream_step")
    assert ours.chunks == nemo.chunks > 0 and ours.audio_seconds == nemo.audio_seconds
    for p in result.paths:
        assert 0 < p.latency_p50_ms <= p.latency_p95_ms <= p.latency_p99_ms <= p.latency_max_ms
        assert p.throughput > 0 and p.batch_max <= 3  # 5 streams share 3 slots
    assert result.identical_streams == 1.0  # same tokens as NeMo's own path, stream by stream
    fixed = result.fixed_step  # all streams (as many as there are slots) stepping together, per path
    assert (fixed.streams, fixed.slots) == (3, 3) and list(fixed.step_ms) == [ours.name, nemo.name]
    assert fixed.ours_over_nemo == pytest.approx(fixed.step_ms[ours.name] / fixed.step_ms[nemo.name], rel=1e-3)
    assert "streams together (3 slots, median of 10)" in text and "ours / NeMo = " in text
    # equal work: both paths decoded the same tokens for the streams of the timed steps
    assert list(fixed.tokens) == list(fixed.step_ms) and fixed.tokens[ours.name] == fixed.tokens[nemo.name] > 0
    assert f"first chunk included): {fixed.tokens[ours.name]}, {fixed.tokens[nemo.name]}." in text
    assert ours.warmup_seconds == 0.0 and nemo.warmup_seconds > 0  # eager exact-size steps: nothing to capture
    assert sum(len(r["pred_text"]) for r in result.transcripts) > 0
    files = {k: Path(v) for k, v in result.files.items()}
    assert files["json"].name == "streaming_results_cpu.json"
    saved = json.loads(files["json"].read_text())
    assert saved["config"]["num_streams"] == 5 and len(saved["paths"]) == 2
    assert saved["paths"][0]["latency_p95_ms"] == ours.latency_p95_ms
    assert saved["fixed_step"]["ours_over_nemo"] == fixed.ours_over_nemo
    assert saved["fixed_step"]["tokens"] == fixed.tokens
    assert "| path |" in files["markdown"].read_text()
    records = [json.loads(line) for line in files["transcripts"].read_text().splitlines()]
    assert [r["stream"] for r in records] == list(range(5)) and all(r["identical"] for r in records)


def test_every_input_of_a_manifest_is_streamed_by_default(tmp_path):
    """8 inputs (more than the 6 streams the default used to have): 8 streams, one per input, none left out."""
    paths = synthetic.write_wavs(synthetic.synthetic_audio([0.6] * 8, seed=5), tmp_path / "wavs")
    manifest = tmp_path / "many.jsonl"
    manifest.write_text("".join(json.dumps({"audio_filepath": str(p)}) + "\n" for p in paths))
    lines: list[str] = []
    config = {"model": "tiny-streaming", "dataset_manifest": str(manifest), "compare_nemo": False, "cuda": -1}
    config |= {"fixed_step_repeats": 0, "stagger_seconds": 0.2, "output_dir": str(tmp_path / "out")}
    result = sim.run(config, log=lines.append)
    assert [Path(r["audio"]).name for r in result.transcripts] == [p.name for p in paths]
    assert json.loads(Path(result.files["json"]).read_text())["config"]["num_streams"] == 8
    assert not any("streaming the first" in line for line in lines)
    lines.clear()
    cut = sim.run({**config, "num_streams": 3}, log=lines.append)
    assert len(cut.transcripts) == 3 and "num_streams=3: streaming the first 3 of 8 inputs" in "\n".join(lines)


def test_tiny_run_with_an_ngram_lm_matches_nemo_path_fusing_it(tmp_path):
    """``ngram_lm_model`` / ``ngram_lm_alpha``: ours fuses the LM, NeMo's path too (the model's
    ``greedy.ngram_lm_model``); the streams' tokens agree, and differ from a run without the LM."""
    from fastdecode_lab.fusion_models import write_arpa

    lm = tmp_path / "lm.arpa"
    write_arpa(lm, vocab_size=28, seed=1)  # tiny-streaming's characters without blank
    base = {
        "model": "tiny-streaming", "num_streams": 5, "num_slots": 3, "max_stream_seconds": 1.6,
        "stagger_seconds": 0.5, "fixed_step_repeats": 0, "output_dir": str(tmp_path), "cuda": -1,
        "att_context_size": [16, 1],
    }  # fmt: skip
    plain = sim.run(base, log=lambda _: None)
    fused = sim.run({**base, "ngram_lm_model": str(lm), "ngram_lm_alpha": 2.0, "tag": "lm"}, log=lambda _: None)
    assert "n-gram LM (alpha 2.0)" in fused.paths[0].name
    assert fused.identical_streams == 1.0 and sum(len(r["pred_text"]) for r in fused.transcripts) > 0
    assert [r["pred_text"] for r in fused.transcripts] != [r["pred_text"] for r in plain.transcripts]


BPE_BASE = {
    "model": "tiny-streaming", "vocab": "bpe", "num_streams": 4, "num_slots": 3, "max_stream_seconds": 1.6,
    "stagger_seconds": 0.5, "fixed_step_repeats": 0, "cuda": -1, "att_context_size": [16, 1],
}  # fmt: skip


def test_tiny_beam_run_with_lm_and_boosting_is_checked_against_nemo_beam_search(tmp_path):
    """``decoding=beam`` with ``compare_nemo``: no NeMo path is timed (NeMo has no batched streaming beam search); the
    first streams' final tokens equal NeMo's beam search of each stream alone with the same LM and phrases."""
    from fastdecode_lab.fusion_models import write_arpa

    lm = tmp_path / "lm.arpa"
    write_arpa(lm, vocab_size=128, order=3, shares=(0.1, 0.2), seed=1)  # the BPE preset's tokens without blank
    lines: list[str] = []
    config = {
        **BPE_BASE, "output_dir": str(tmp_path), "tag": "beam", "decoding": "beam", "beam_size": 2,
        "ngram_lm_model": str(lm), "ngram_lm_alpha": 0.5, "boosting_streams_share": 0.5, "boosting_alpha": 2.0,
        "boosting_phrases": 4, "nemo_beam_reference_streams": 3,
    }  # fmt: skip
    result = sim.run(config, log=lines.append)
    assert sum(len(r["pred_text"]) for r in result.transcripts) > 0  # tokens came out
    (ours,) = result.paths  # NeMo's greedy path is not run as if it were comparable
    assert "beam search (2 beams), n-gram LM (alpha 0.5), phrase boosting on 50% of streams (weight 2.0)" in ours.name
    assert result.identical_streams is None
    ref = result.beam_reference
    assert (ref.checked, ref.boosted) == (3, 1) and ref.identical == ref.checked and ref.all_identical
    boosted = [r for r in result.transcripts if "boosting_phrases" in r]
    assert [r["stream"] for r in boosted] == [1, 3] and all(len(r["boosting_phrases"]) == 4 for r in boosted)
    records = [json.loads(line) for line in Path(result.files["transcripts"]).read_text().splitlines()]
    assert [r["identical_to_nemo_beam"] for r in records[:3]] == [True] * 3
    assert all("identical_to_nemo_beam" not in r and "identical" not in r for r in records[3:])
    saved = json.loads(Path(result.files["json"]).read_text())
    assert saved["beam_reference"]["identical"] == 3 and saved["beam_reference"]["all_identical"] is True
    report = Path(result.files["markdown"]).read_text()
    assert (
        "- decoding: beam search, 2 beams, n-gram LM lm.arpa (alpha 0.5), phrase boosting on 50% of streams" in report
    )
    assert "no NeMo path is timed in this run" in report and "Streams with identical tokens" not in report
    assert "final tokens identical on 3/3 streams checked (all identical; 1 of them with phrase boosting)" in report


def test_phrase_boosting_changes_the_boosted_streams_only(tmp_path):
    """Greedy, half the streams with phrases at a large weight: some boosted stream's tokens change, the others'
    stay those of the run without boosting (each stream's own tree)."""
    base = {**BPE_BASE, "compare_nemo": False, "output_dir": str(tmp_path)}
    plain = sim.run(base, log=lambda _: None)
    boosted = sim.run({**base, "boosting_streams_share": 0.5, "boosting_alpha": 8.0, "tag": "b"}, log=lambda _: None)
    assert sum(len(r["pred_text"]) for r in plain.transcripts) > 0
    assert "phrase boosting on 50% of streams (weight 8.0)" in boosted.paths[0].name
    changed = [a["pred_text"] != b["pred_text"] for a, b in zip(plain.transcripts, boosted.transcripts, strict=True)]
    has_phrases = ["boosting_phrases" in r for r in boosted.transcripts]
    assert has_phrases == [False, True, False, True]
    assert any(changed) and not any(c and not h for c, h in zip(changed, has_phrases, strict=True))


def test_beam_sweep_with_boosting_times_our_path_only(tmp_path):
    config = {
        **BPE_BASE, "num_streams_sweep": [1, 2], "max_stream_seconds": 0.7, "output_dir": str(tmp_path),
        "decoding": "beam", "beam_size": 2, "boosting_streams_share": 0.5, "fixed_step_repeats": 1,
    }  # fmt: skip
    result = sim.run(config, log=lambda _: None)
    assert [len(pt.paths) for pt in result.points] == [1, 1] and all(
        pt.identical_streams is None for pt in result.points
    )
    assert all(pt.paths[0].chunks > 0 for pt in result.points)
    table = Path(result.files["markdown"]).read_text()
    assert "- decoding: beam search, 2 beams, phrase boosting on 50% of streams" in table
    assert "NeMo has no batched streaming beam search: only our path is timed" in table


def test_boosting_and_beam_reference_config_errors():
    with pytest.raises(ValueError, match=r"boosting_streams_share=1\.5 is not valid; valid: a share in \[0, 1\]"):
        sim.resolve_config({"boosting_streams_share": 1.5})
    with pytest.raises(ValueError, match=r"boosting_streams_share=-0\.1 is not valid"):
        sim.resolve_config({"boosting_streams_share": -0.1})
    with pytest.raises(ValueError, match=r"boosting_alpha=0\.0 is not valid; valid: a finite number > 0"):
        sim.resolve_config({"boosting_alpha": 0.0})
    with pytest.raises(ValueError, match=r"boosting_phrases=0 is not valid; valid: a count >= 1"):
        sim.resolve_config({"boosting_phrases": 0})
    with pytest.raises(ValueError, match=r"nemo_beam_reference_streams must be >= 0, got -1"):
        sim.resolve_config({"nemo_beam_reference_streams": -1})
    with pytest.raises(ValueError, match=r"vocab='wordpiece' is not valid; valid values: char, bpe"):
        sim.resolve_config({"vocab": "wordpiece"})
    with pytest.raises(
        ValueError, match=r"boosting_streams_share=0\.5 with decoding: greedy needs compare_nemo: false"
    ):
        sim.resolve_config({"boosting_streams_share": 0.5})
    assert sim.resolve_config({"decoding": "beam", "boosting_streams_share": 0.5}).compare_nemo  # NeMo's reference
    with pytest.raises(
        ValueError, match=r"needs a model with a tokenizer .* use a BPE model \(a synthetic preset with vocab=bpe\)"
    ):
        stream_boosting(torch.nn.Linear(1, 1), 4, 0.5, 1.0, 3)
    assert stream_boosting(torch.nn.Linear(1, 1), 3, 0.0, 1.0, 3) == [None] * 3  # no tokenizer needed without phrases
    assert boosted_streams(8, 0.25) == [False, False, False, True, False, False, False, True]
    assert boosted_streams(3, 1.0) == [True] * 3 and not any(boosted_streams(5, 0.0))


def test_sweep_tiny_run(tmp_path):
    """``num_streams_sweep``: both paths at every count, one streamer per path, table + JSON + plot."""
    lines: list[str] = []
    result = sim.run(
        {
            "model": "tiny-streaming",
            "num_streams_sweep": [3, 1],
            "num_slots": 2,
            "max_stream_seconds": 0.7,
            "stagger_seconds": 0.2,
            "fixed_step_repeats": 2,
            "output_dir": str(tmp_path),
            "tag": "cpu",
            "cuda": -1,
            "att_context_size": [16, 1],
        },
        log=lines.append,
    )
    assert isinstance(result, sim.SweepResult) and result.num_slots == 3  # slots for the largest count
    assert [pt.num_streams for pt in result.points] == [1, 3]
    for pt in result.points:
        assert len(pt.paths) == 2 and pt.identical_streams == 1.0
        assert pt.fixed_step.streams == pt.num_streams and pt.fixed_step.ours_over_nemo > 0
        assert all(p.chunks > 0 and p.latency_p50_ms <= p.latency_p99_ms for p in pt.paths)
    names = [p.name for p in result.points[0].paths]
    assert list(result.max_realtime_streams) == names
    for i, name in enumerate(names):
        realtime = [pt.num_streams for pt in result.points if sim.served_in_real_time(pt.paths[i], 50.0)]
        assert result.max_realtime_streams[name] == (max(realtime) if realtime else None)
    files = {k: Path(v) for k, v in result.files.items()}
    assert files["json"].name == "streaming_sweep_cpu.json" and files["plot"].suffix in (".png", ".svg")
    assert files["plot"].stat().st_size > 0
    saved = json.loads(files["json"].read_text())
    assert [pt["num_streams"] for pt in saved["points"]] == [1, 3] and "ours_over_nemo" in saved["points"][0][
        "fixed_step"
    ]
    table = files["markdown"].read_text()
    assert "| 3 | nemo_fastdecode (eager) |" in table and "largest count in real time with p95 <= 50.0 ms" in table
    tokens = result.points[1].fixed_step.tokens
    assert f"(tokens decoded for those streams: {' / '.join(map(str, tokens.values()))})" in table
    assert any(line.startswith("3 streams: ") for line in lines)


def test_sweep_preset_and_errors():
    cfg = sim.resolve_config(compose_streaming("streaming_sweep_17x512"))
    assert cfg.model == "hybrid-17x512-streaming" and list(cfg.num_streams_sweep) == [64, 256, 512, 1024]
    assert (cfg.num_slots, cfg.max_stream_seconds, list(cfg.att_context_size)) == (1024, 8.0, [70, 1])
    with pytest.raises(ValueError, match="num_streams_sweep must be a non-empty list of counts >= 1"):
        sim.resolve_config({"num_streams_sweep": [4, 0]})
    with pytest.raises(ValueError, match="fixed_step_repeats must be >= 0"):
        sim.resolve_config({"fixed_step_repeats": -1})


def test_script_end_to_end_default_demo(tmp_path):
    """``python scripts/streaming.py`` in a fresh process with no input: the shipped trained model streams the example
    utterances; each stream's final equals NeMo's path, and the reference texts come out (WER)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(ROOT / "scripts" / "streaming.py"), f"output_dir={tmp_path / 'out'}", "cuda=-1"]
    command += ["fixed_step_repeats=1"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "RANDOM, UNTRAINED WEIGHTS" not in done.stdout
    assert "Streams with identical tokens (ours vs NeMo's path): 100.0%" in done.stdout
    records = [json.loads(line) for line in (tmp_path / "out" / "streaming_transcripts.jsonl").read_text().splitlines()]
    examples = trained_models.example_entries()
    assert len(records) == len(examples) > 0  # one stream per example utterance
    for record, example in zip(records, examples, strict=True):
        assert Path(record["audio"]).name == Path(example["audio_filepath"]).name and record["text"] == example["text"]
        assert record["pred_text"] and record["identical"]  # words came out, the same as NeMo's cache-aware path
        assert f"reference:  {record['text']}\n  hypothesis: {record['pred_text']}" in done.stdout
    saved = json.loads((tmp_path / "out" / "streaming_results.json").read_text())
    assert saved["config"]["model"] == "trained-streaming" and saved["wer"] <= 0.15  # held-out voices
    assert f"WER {100 * saved['wer']:.2f}% over {len(records)} utterance(s)" in done.stdout
    assert not (tmp_path / "outputs").exists()  # no Hydra run folders


def test_profile_streaming_script_prints_the_step_and_its_top_ops(capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import profile_streaming
    finally:
        sys.path.pop(0)
    profile_streaming.main(
        [
            "config=streaming",
            "model=tiny-streaming",
            "streams=2",
            "slots=3",
            "repeats=1",
            "top=3",
            "max_stream_seconds=1",
        ]
    )
    out = capsys.readouterr().out
    assert "nemo_fastdecode (eager): 2 streams stepping together, step" in out
    assert "Name" in out and "aten::" in out


def run_script(name: str, argv: list[str]):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        module = __import__(name)
    finally:
        sys.path.pop(0)
    module.main(argv)


def test_step_breakdown_script_times_each_phase_of_each_step(capsys):
    run_script("streaming_step_breakdown", ["config=streaming", "model=tiny-streaming", "streams=2", "slots=3",
                                            "repeats=3", "max_stream_seconds=1", "encoder_matmul=fp32", "fixed_step_repeats=2"])  # fmt: skip
    out = capsys.readouterr().out
    assert "2 streams stepping together (steps 2..4), encoder_matmul=fp32" in out
    table = out.split("tokens\n", 1)[1].split("  median", 1)[0]  # step, 4 phase times, tokens
    rows = [line.split() for line in table.splitlines()]
    assert [int(row[0]) for row in rows] == [2, 3, 4]
    assert all(len(row) == 6 and float(row[1]) >= float(row[4]) for row in rows)  # the step holds its decoder
    assert "median of steps 2..3 (the fixed step's)" in out and "median of steps 4..4" in out


def test_decoder_profile_script_profiles_one_decoder_step(capsys):
    run_script("profile_streaming_decoder", ["config=streaming", "model=tiny-streaming", "streams=2", "slots=3",
                                             "max_stream_seconds=1", "encoder_matmul=fp32"])  # fmt: skip
    out = capsys.readouterr().out
    assert "2 streams, fast_math=False: one decoder step," in out and "tokens emitted, loop eager" in out
    assert "GPU kernels:" in out


def test_the_fixed_step_leaves_out_short_last_chunks():
    """Every stream steps a chunk of one length, so both paths do the same work (NeMo's batched step pads)."""
    full, short = torch.zeros(80, 32), torch.zeros(80, 7)
    plans = [
        sim.StreamPlan("a", 0.0, [torch.zeros(80, 9), full, full, short], [1.0, 2.0, 3.0, 4.0]),
        sim.StreamPlan("b", 0.0, [torch.zeros(80, 9), full, short], [1.0, 2.0, 3.0]),
        sim.StreamPlan("c", 0.0, [torch.zeros(80, 9)], [1.0]),
    ]
    for repeat in range(4):
        chunks = sim.fixed_step_chunks(plans, repeat)
        assert [c.shape[1] for c in chunks] == [32, 32, 9]
    assert sim.fixed_step_chunks(plans[:1], 1) is not None and sim.fixed_step_chunks(plans[:1], 1)[0] is full


def test_decoding_is_overridable_on_the_command_line():
    """``decoding=beam`` is a value of the streaming config, not NeMo-style decoding configs (``configs/decoding/``, a
    Hydra group the streaming script's search path must not see)."""
    assert compose_streaming(overrides=["decoding=beam"]).decoding == "beam"
    assert compose_streaming("streaming_hybrid_17x512", ["decoding=beam"]).decoding == "beam"
