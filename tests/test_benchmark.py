"""benchmarks/benchmark.py's engine on a tiny synthetic model (CPU): rows, agreement with the references, reports."""

from __future__ import annotations

import json

import pytest

from fastdecode_lab.benchmarks.decoder import benchmark_model, needs_cuda, write_reports


@pytest.mark.parametrize("preset", ["tiny-rnnt", "tiny-tdt"])
def test_greedy_and_beam_rows_agree_with_their_references(preset, tmp_path):
    strategies = ["fast_greedy_label_loop[eager]", "fast_beam[eager]"]
    report = benchmark_model(
        preset, total_seconds=12, batch_size=4, repeats=2, strategies=strategies, beam_size=2, device="cpu",
        log=lambda _: None,
    )  # fmt: skip
    rows = {r.strategy: r for r in report.results}
    # each family's reference comes with it: NeMo's baseline greedy, NeMo's malsd_batch for beam rows
    assert set(rows) == {"nemo_baseline", "nemo_malsd_batch", *strategies}
    for name in strategies:
        assert rows[name].identical_utterances == 1.0
        assert rows[name].speedup_vs_fastest_nemo is not None and rows[name].decoder_seconds > 0
        assert rows[name].decoder_seconds == min(rows[name].pass_seconds) and len(rows[name].pass_seconds) == 2
    assert rows["fast_beam[eager]"].tokens == rows["nemo_malsd_batch"].tokens
    assert rows["fast_greedy_label_loop[eager]"].tokens == rows["nemo_baseline"].tokens
    text = write_reports([report], "pytest", str(tmp_path / "r.json"), str(tmp_path / "r.md"))
    assert text.startswith("# Beam search decoding benchmark") and "| fast_beam[eager] | eager |" in text
    saved = json.loads((tmp_path / "r.json").read_text())
    assert [r["strategy"] for r in saved["models"][0]["results"]] == [r.strategy for r in report.results]
    report.results = [r for r in report.results if "beam" not in r.strategy and "malsd" not in r.strategy]
    greedy = write_reports([report], "pytest", str(tmp_path / "g.json"), str(tmp_path / "g.md"))
    assert greedy.startswith("# Greedy decoding benchmark")


def test_idle_gaps_split_launch_gaps_from_host_time():
    """The timeline analysis of benchmarks/profile_streaming.py: overlapping kernels, short and long gaps."""
    from fastdecode_lab.profiling import idle_gaps

    timeline = [("b", 12, 20), ("a", 0, 10), ("c", 15, 25), ("d", 30, 40), ("e", 200, 210), ("b", 211, 215)]
    gaps = idle_gaps(timeline, short_us=50.0)
    assert gaps.busy_us == 10 + 8 + 5 + 10 + 10 + 4  # union of the intervals (b and c overlap)
    assert (gaps.short_gaps_us, gaps.short_gaps, gaps.long_gaps_us) == (2 + 5 + 1, 3, 160)
    assert gaps.before == [("c", 5, 1), ("a", 2, 1), ("e", 1, 1)]  # the kernel each idle stretch follows
    assert gaps.long_between == [("d", "e", 160, 1)]  # the kernels around each long stretch
    assert idle_gaps([]).busy_us == 0.0


def test_on_the_cpu_rows_that_need_cuda_are_skipped_and_said_so(tmp_path):
    """benchmarks/benchmark.py's default rows on the CPU: graph rows are skipped with a note, the rest run."""
    lines: list[str] = []
    report = benchmark_model("tiny-rnnt", total_seconds=5, batch_size=4, repeats=1, device="cpu", log=lines.append)
    rows = [r.strategy for r in report.results]
    assert "nemo_baseline" in rows and "fast_greedy_label_loop[eager]" in rows
    assert not any(needs_cuda(name) for name in rows)
    note = next(line for line in lines if "skipped on the CPU" in line)
    assert "fast_greedy_label_loop[full_graph]" in note and "nemo_label_loop+graphs" in note
    assert all(r.identical_utterances == 1.0 and r.tokens > 0 for r in report.results)
    text = write_reports([report], "pytest", str(tmp_path / "r.json"), str(tmp_path / "r.md"))
    assert "do not represent GPU decoding" in text and f"{report.encoder_dtype} encoder outputs" in text


@pytest.mark.slow
def test_trained_calibration_decodes_exactly_and_reports_emissions(tmp_path, single_thread):
    report = benchmark_model(
        "tiny-rnnt", total_seconds=12, batch_size=4, repeats=1, calibration="trained",
        strategies=["fast_greedy_label_loop[eager]", "nemo_label_loop"], device="cpu", log=lambda _: None,
    )  # fmt: skip
    assert report.calibration == "trained" and report.emissions.tokens > 0
    assert all(r.identical_utterances == 1.0 and r.tokens == report.emissions.tokens for r in report.results)
    trained = report.trained_emissions
    assert report.emissions.tokens_per_emitting_frame < 1.5 * trained.tokens_per_emitting_frame
    text = write_reports([report], "pytest", str(tmp_path / "r.json"), str(tmp_path / "r.md"))
    assert "calibration trained" in text and "Emissions (nemo_baseline)" in text
    assert json.loads((tmp_path / "r.json").read_text())["models"][0]["trained_emissions"]["tokens"] == trained.tokens


def test_baseline_repeats_time_the_reference_row_alone():
    lines: list[str] = []
    report = benchmark_model(
        "tiny-rnnt",
        total_seconds=5,
        batch_size=4,
        repeats=2,
        baseline_repeats=1,
        strategies=["fast_greedy_label_loop[eager]"],
        device="cpu",
        log=lines.append,
    )
    rows = {r.strategy: r for r in report.results}
    assert set(rows) == {"nemo_baseline", "fast_greedy_label_loop[eager]"}
    assert rows["nemo_baseline"].tokens > 0
    assert len(rows["nemo_baseline"].pass_seconds) == 1
    assert len(rows["fast_greedy_label_loop[eager]"].pass_seconds) == 2
    assert rows["fast_greedy_label_loop[eager]"].identical_utterances == 1.0


def test_per_iteration_table_sets_kernel_time_beside_the_full_graph_twin():
    from fastdecode_lab.profiling import per_iteration_lines

    walls = {"fast[no_while_graph]": 0.05, "fast[full_graph]": 0.02, "other[no_while_graph]": 0.01}
    # 100 iterations of 8 kernels taking 1,000 us in all; the full graph's 0.02 s make 200 us per iteration
    lines = per_iteration_lines(
        walls, {"fast[no_while_graph]": (100, 800, 1000.0), "other[no_while_graph]": (10, 50, 20.0)}
    )
    rows = [line for line in lines if line.startswith("| fast") or line.startswith("| other")]
    assert rows == [
        "| fast[no_while_graph] | 100 | 8.0 | 10.0 | 200.0 | 190.0 |",
        "| other[no_while_graph] | 10 | 5.0 | 2.0 | - | - |",  # no full-graph twin profiled
    ]
    assert per_iteration_lines(walls, {}) == []
