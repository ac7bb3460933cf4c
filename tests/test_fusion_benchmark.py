"""benchmarks/bench_fusion.py's engine: the random ARPA LM and phrase tree, its config, and a CPU smoke run in which every
fused row of ours equals NeMo's row of the same variant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from fastdecode_lab.benchmarks.fusion import (
    VARIANTS,
    FusionBenchmarkConfig,
    benchmark_fusion,
    write_fusion_reports,
)
from fastdecode_lab.fusion_models import TokenIdTokenizer, boosting_tree, random_phrases, write_arpa

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def read_arpa(path: Path) -> list[set[tuple[str, ...]]]:
    levels: list[set[tuple[str, ...]]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.endswith("-grams:"):
            levels.append(set())
        elif levels and "\t" in line:
            levels[-1].add(tuple(line.split("\t")[1].split(" ")))
    return levels


@pytest.mark.parametrize("order,shares", [(3, (0.4, 0.3)), (4, (0.3, 0.2, 0.5))])
def test_arpa_lm_is_well_formed_and_reproducible(order, shares, tmp_path):
    counts = write_arpa(tmp_path / "a.arpa", 20, order=order, shares=shares, seed=1)
    levels = read_arpa(tmp_path / "a.arpa")
    assert [len(level) for level in levels] == counts and len(counts) == order and all(counts)
    for k in range(1, order):  # every n-gram's prefix and suffix are n-grams of the order below
        assert all(g[:-1] in levels[k - 1] and g[1:] in levels[k - 1] for g in levels[k])
    write_arpa(tmp_path / "b.arpa", 20, order=order, shares=shares, seed=1)
    assert (tmp_path / "a.arpa").read_text() == (tmp_path / "b.arpa").read_text()
    with pytest.raises(ValueError, match="one share per order"):
        write_arpa(tmp_path / "c.arpa", 20, order=order, shares=shares[:-1])


def test_random_phrases_build_nemo_boosting_tree():
    phrases = random_phrases(28, count=30, seed=2)
    assert len(set(phrases)) == 30 and all(2 <= len(p.split()) <= 5 for p in phrases)
    tree = boosting_tree(phrases, 28)
    assert tree.vocab_size == 28
    with pytest.raises(ValueError, match="outside 0..27"):
        TokenIdTokenizer(28).text_to_ids("3 28")


def test_yaml_mirrors_the_dataclass():
    yaml = OmegaConf.load(CONFIGS / "bench_fusion.yaml")
    schema = OmegaConf.structured(FusionBenchmarkConfig)
    assert OmegaConf.merge(schema, yaml) == schema
    assert set(yaml.keys()) == set(schema.keys())


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny-rnnt", "tiny-tdt"])
def test_cpu_smoke_run_every_row_equals_nemo(preset, tmp_path, single_thread):
    cfg = FusionBenchmarkConfig(batch_size=4, repeats=1, boosting_phrases=30, boosting_alpha=2.0, lm_alpha=1.0)
    report = benchmark_fusion(preset, 10.0, cfg, encoder_dtype=None, device="cpu", log=lambda _: None)
    assert report.utterances > 1 and report.lm["order"] == 3 and report.boosting["phrases"] == 30
    rows = {(r.family, r.variant, r.ours): r for r in report.rows}
    assert set(rows) == {(f, v, o) for f in ("greedy", "beam") for v in VARIANTS for o in (False, True)}
    for (family, variant, ours), row in rows.items():
        nemo = rows[(family, variant, False)]
        assert nemo.tokens > 0, f"{family} {variant}: nothing emitted, nothing compared"
        assert row.identical_to_nemo == 1.0 and row.tokens == nemo.tokens, (family, variant, ours)
        assert row.seconds == min(row.pass_seconds) > 0
        assert row.graph_mode == ("eager" if ours else "no_graphs")  # the CPU: no graphs
        if ours:
            assert row.ours_over_nemo == pytest.approx(row.seconds / nemo.seconds)
            assert row.over_our_greedy_plain == pytest.approx(row.seconds / rows[("greedy", "plain", True)].seconds)
    for family in ("greedy", "beam"):  # the fusion changes the search, so the comparisons could fail
        fused = [rows[(family, v, False)].tokens for v in VARIANTS[1:]]
        assert any(t != rows[(family, "plain", False)].tokens for t in fused), family
    text = write_fusion_reports([report], "pytest", str(tmp_path / "r.json"), str(tmp_path / "r.md"))
    assert "do not represent GPU decoding" in text and "| beam | lm+boost |" in text
    assert "beam 4 + LM / our plain greedy" in text
    saved = json.loads((tmp_path / "r.json").read_text())
    assert len(saved["models"][0]["rows"]) == 16 and saved["models"][0]["targets"]
    with pytest.raises(ValueError, match="valid variants"):
        benchmark_fusion(preset, 1.0, FusionBenchmarkConfig(variants=["ngram"]), device="cpu")
