"""What a streaming run or sweep measured, as dataclasses, Markdown reports and JSON files."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fastdecode_lab.streaming_sim.schedule import PathStats
from nemo_fastdecode.apps.plot import Series, plot_latency

UNEQUAL_WORK_WARNING = (
    "Warning: the paths decoded different numbers of tokens in this step, so its times compare unequal work."
)


@dataclass
class FixedStep:
    """Step time with ``streams`` streams stepping together (stagger 0) in ``slots`` slots, per path (ms), and the
    tokens each path decoded for those streams (their first chunk and the timed steps)."""

    streams: int
    slots: int
    repeats: int
    step_ms: dict[str, float]
    tokens: dict[str, int] = field(default_factory=dict)

    @property
    def equal_work(self) -> bool:
        """Every path decoded the same number of tokens for these streams (else the times compare unequal work)."""
        return len(set(self.tokens.values())) <= 1

    @property
    def ours_over_nemo(self) -> float | None:
        """Our step time / NeMo's (the streaming benchmark's target: at most 0.1 at 256 of 1024 slots)."""
        ours, nemo = (list(self.step_ms.values()) + [None, None])[:2]
        return round(ours / nemo, 4) if ours is not None and nemo else None


@dataclass
class BeamReference:
    """Our beam search's final tokens against NeMo's beam search of each stream alone (untimed: NeMo has no batched
    streaming beam search), over the first ``checked`` streams; ``boosted``: how many of those had phrases."""

    checked: int
    identical: int
    boosted: int
    method: str = (
        "nemo_alone_beam: NeMo's cache-aware encoder steps and ModifiedALSD computer continued over the stream's "
        "chunks, each stream alone, same beam size, LM and phrases"
    )

    @property
    def all_identical(self) -> bool:
        return self.checked > 0 and self.identical == self.checked


@dataclass
class StreamingRunResult:
    """What :func:`run` measured and wrote."""

    config: dict[str, Any]
    environment: dict[str, Any]
    geometry: dict[str, Any]
    paths: list[PathStats]
    transcripts: list[dict[str, Any]]
    identical_streams: float | None  # share of streams whose tokens equal NeMo's path (None: not compared)
    wer: float | None = None  # our finals against the inputs' reference texts (None: no input has one)
    fixed_step: FixedStep | None = None
    files: dict[str, str] = field(default_factory=dict)
    beam_reference: BeamReference | None = None  # decoding=beam with compare_nemo: the exactness check


@dataclass
class SweepPoint:
    """One stream count of a sweep: each path's stats and its fixed-batch step time, token agreement."""

    num_streams: int
    paths: list[PathStats]
    fixed_step: FixedStep | None
    identical_streams: float | None


@dataclass
class SweepResult:
    """What :func:`run_sweep` measured and wrote; ``max_realtime_streams`` per path name."""

    config: dict[str, Any]
    environment: dict[str, Any]
    geometry: dict[str, Any]
    num_slots: int
    points: list[SweepPoint]
    max_realtime_streams: dict[str, int | None]
    files: dict[str, str] = field(default_factory=dict)


def mode_line(config: dict[str, Any]) -> str:
    """The decoding mode: greedy or beam (size), the n-gram LM, the share of streams with phrase boosting."""
    mode = f"beam search, {config['beam_size']} beams" if config["decoding"] == "beam" else "greedy"
    if config.get("ngram_lm_model"):
        mode += f", n-gram LM {Path(config['ngram_lm_model']).name} (alpha {config['ngram_lm_alpha']})"
    share = config.get("boosting_streams_share", 0.0)
    if share > 0:
        mode += (
            f", phrase boosting on {100 * share:g}% of streams ({config['boosting_phrases']} random phrases each, "
            f"weight {config['boosting_alpha']})"
        )
    return f"- decoding: {mode}"


def _beam_reference_lines(ref: BeamReference | None, config: dict[str, Any]) -> list[str]:
    if config.get("decoding") != "beam" or not config.get("compare_nemo"):
        return []
    lines = [
        "NeMo has no batched streaming beam search (its conformer_stream_step refuses malsd_batch with partial "
        "hypotheses), so no NeMo path is timed in this run; NeMo's side is an exactness reference instead."
    ]
    if ref is None or ref.checked == 0:
        return lines + ["Beam search against NeMo's: not checked (nemo_beam_reference_streams = 0)."]
    verdict = "all identical" if ref.all_identical else f"{ref.checked - ref.identical} DIFFER"
    return lines + [
        f"Beam search against NeMo's ({ref.method}): final tokens identical on {ref.identical}/{ref.checked} "
        f"streams checked ({verdict}; {ref.boosted} of them with phrase boosting)."
    ]


def _setup_lines(
    config: dict[str, Any], environment: dict[str, Any], g: dict[str, Any], streams: str, slots: int
) -> list[str]:
    return [
        mode_line(config),
        f"- device: {environment.get('gpu', environment['device'])}, torch {environment['torch']}",
        f"- att_context_size {list(g['att_context_size'])}: {g['chunk'] * 10} ms chunks, {g['out_frames']} encoder "
        f"frame(s) per chunk, {g['att_cache']} frames of left context",
        f"- {streams} streams, {slots} slots, starts uniform in "
        f"[0, {config['stagger_seconds']}) s, streams cut to {config['max_stream_seconds']} s, dtype {config['dtype']}",
    ]


def _fixed_step_line(fixed: FixedStep | None) -> list[str]:
    if fixed is None:
        return []
    times = ", ".join(f"{name}: {ms} ms" for name, ms in fixed.step_ms.items())
    line = f"Step with all {fixed.streams} streams together ({fixed.slots} slots, median of {fixed.repeats}): {times}"
    if fixed.ours_over_nemo is not None:
        line += f"; ours / NeMo = {fixed.ours_over_nemo:.3f} (target <= 0.1)"
    tokens = ", ".join(map(str, fixed.tokens.values()))
    lines = [line + f"; tokens decoded for these streams (first chunk included): {tokens}."]
    if not fixed.equal_work:
        lines.append(UNEQUAL_WORK_WARNING)
    return lines


def format_markdown(result: StreamingRunResult) -> str:
    """The results as a Markdown report: setup, one table row per path, ratios, agreement."""
    c = result.config
    lines = [
        f"# Cache-aware streaming: {c['model']}, {c['num_streams']} streams",
        "",
        *_setup_lines(
            c, result.environment, result.geometry, str(c["num_streams"]), c["num_slots"] or c["num_streams"]
        ),
        "",
        "| path | steps | mean batch | step p50 / p95 (ms) | chunk latency p50 / p95 / p99 (ms) | RTFx | busy | warm-up (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in result.paths:
        lines.append(
            f"| {p.name} | {p.steps} | {p.batch_mean} | {p.step_p50_ms} / {p.step_p95_ms} | "
            f"{p.latency_p50_ms} / {p.latency_p95_ms} / {p.latency_p99_ms} | {p.throughput} | {p.busy_share:.2f} | "
            f"{p.warmup_seconds} |"
        )
    lines.append("")
    if len(result.paths) > 1:
        ours, nemo = result.paths[0], result.paths[1]
        ratio = nemo.compute_seconds / ours.compute_seconds if ours.compute_seconds else float("nan")
        lines.append(f"Compute time: NeMo / ours = {ratio:.2f}x over the same chunks.")
        lines.append(f"Streams with identical tokens (ours vs NeMo's path): {100 * result.identical_streams:.1f}%")
    lines += _beam_reference_lines(result.beam_reference, c)
    if result.wer is not None:
        scored = sum(1 for r in result.transcripts if "text" in r)
        lines.append(
            f"WER of our final transcripts against the reference texts: {100 * result.wer:.2f}% ({scored} streams)"
        )
    lines += _fixed_step_line(result.fixed_step)
    lines += ["", "Median step time by batch size (ms):", ""]
    lines += [f"- {p.name}: {p.step_ms_by_batch}" for p in result.paths]
    lines += [
        "",
        "Busy = compute time / simulated time; below 1 the server keeps up with real-time arrival. Warm-up (graph",
        "captures, lazy library set-up) ran before the simulated clock started.",
    ]
    return "\n".join(lines)


def format_sweep_markdown(result: SweepResult) -> str:
    """The sweep as Markdown: one row per (stream count, path), and the largest real-time count per path."""
    c = result.config
    target = c["latency_target_ms"]
    counts = "/".join(str(p.num_streams) for p in result.points)
    lines = [
        f"# Cache-aware streaming, latency vs streams: {c['model']}",
        "",
        *_setup_lines(c, result.environment, result.geometry, counts, result.num_slots),
        "",
        "| streams | path | chunk latency p50 / p95 / p99 (ms) | step p50 (ms) | step, all together (ms) | busy "
        "| identical tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for pt in result.points:
        for p in pt.paths:
            fixed = pt.fixed_step.step_ms.get(p.name, "") if pt.fixed_step else ""
            same = f"{100 * pt.identical_streams:.1f}%" if pt.identical_streams is not None else ""
            lines.append(
                f"| {pt.num_streams} | {p.name} | {p.latency_p50_ms} / {p.latency_p95_ms} / {p.latency_p99_ms} | "
                f"{p.step_p50_ms} | {fixed} | {p.busy_share:.2f} | {same} |"
            )
    lines.append("")
    for name, best in result.max_realtime_streams.items():
        lines.append(f"- {name}: largest count in real time with p95 <= {target} ms: {best if best else 'none'}")
    if c.get("decoding") == "beam" and c.get("compare_nemo"):
        lines.append(
            "- NeMo has no batched streaming beam search: only our path is timed; the check against NeMo's beam "
            "search of each stream alone runs in a run without num_streams_sweep."
        )
    for pt in result.points:
        if pt.fixed_step is not None and pt.fixed_step.ours_over_nemo is not None:
            tokens = " / ".join(str(count) for count in pt.fixed_step.tokens.values())
            lines.append(
                f"- {pt.num_streams} streams stepping together: ours / NeMo step time = "
                f"{pt.fixed_step.ours_over_nemo:.3f} (tokens decoded for those streams: {tokens})"
            )
            if not pt.fixed_step.equal_work:
                lines.append(f"  {UNEQUAL_WORK_WARNING}")
    return "\n".join(lines)


def write_run_result(result: StreamingRunResult, out_dir: Path, tag: str | None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = f"_{tag}" if tag else ""
    json_path = out_dir / f"streaming_results{suffix}.json"
    md_path = out_dir / f"streaming_results{suffix}.md"
    jsonl_path = out_dir / f"streaming_transcripts{suffix}.jsonl"
    result.files = {"json": str(json_path), "markdown": str(md_path), "transcripts": str(jsonl_path)}
    payload = asdict(result)
    payload.pop("transcripts")
    if result.fixed_step is not None:
        payload["fixed_step"]["ours_over_nemo"] = result.fixed_step.ours_over_nemo
    if result.beam_reference is not None:
        payload["beam_reference"]["all_identical"] = result.beam_reference.all_identical
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    md_path.write_text(format_markdown(result) + "\n")
    with open(jsonl_path, "w", encoding="utf8") as f:
        for record in result.transcripts:
            f.write(json.dumps(record) + "\n")


def write_sweep_result(result: SweepResult, out_dir: Path, tag: str | None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"streaming_sweep{f'_{tag}' if tag else ''}"
    payload = asdict(result)
    for point, saved in zip(result.points, payload["points"], strict=True):
        if point.fixed_step is not None:
            saved["fixed_step"]["ours_over_nemo"] = point.fixed_step.ours_over_nemo
    result.files = {"json": f"{stem}.json", "markdown": f"{stem}.md"}
    Path(f"{stem}.json").write_text(json.dumps(payload, indent=2) + "\n")
    Path(f"{stem}.md").write_text(format_sweep_markdown(result) + "\n")
    plot = plot_sweep(result, stem)
    if plot is not None:
        result.files["plot"] = str(plot)


def plot_sweep(result: SweepResult, stem: Path) -> Path | None:
    """p50/p95/p99 chunk latency vs streams, one colour per path: ``stem.png`` (matplotlib) or ``stem.svg``."""
    return plot_latency(_sweep_series(result), stem, target=result.config["latency_target_ms"])


def _sweep_series(result: SweepResult) -> Series:
    series: Series = {}
    for pt in result.points:
        for p in pt.paths:
            for q in (50, 95, 99):
                xs, ys = series.setdefault((p.name, q), ([], []))
                xs.append(pt.num_streams)
                ys.append(max(getattr(p, f"latency_p{q}_ms"), 1e-3))
    return series
