"""What ``benchmarks/stream_audio_bench.py`` measured: dataclasses, the Markdown report, JSON and the latency plot."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fastdecode_lab.benchmarks.stream_audio.engine_clock import CycleTiming, LatencyParts
from fastdecode_lab.benchmarks.stream_audio.nemo_steps import PipelineStepTiming
from fastdecode_lab.streaming_sim.report import plot_sweep
from fastdecode_lab.streaming_sim.schedule import PathStats

#: The cycle-time ratio the benchmark aims at: our whole cycle at 256 streams over NeMo's pipeline step.
RATIO_TARGET = 0.1
#: The stream counts the report singles out (the ratio's and the front end's share).
RATIO_STREAMS, FRONTEND_STREAMS = 256, 1024


@dataclass
class CountResult:
    """One stream count: ours on the virtual clock and stepping together, NeMo's pipeline stepping together.

    ``errors``: ``{"ours" | "nemo": message}`` for a side that failed at this count (e.g. out of memory)."""

    num_streams: int
    ours: PathStats | None = None
    ours_cycle: CycleTiming | None = None
    ours_parts: LatencyParts | None = None  # p95 by the chunk's place in its stream
    ours_identical: float | None = None  # share of streams whose tokens equal NeMo's streaming of their file alone
    nemo_step: PipelineStepTiming | None = None
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ours_over_nemo(self) -> float | None:
        """Our whole cycle / NeMo's pipeline step, both with all streams stepping together."""
        if self.ours_cycle is None or self.nemo_step is None or not self.nemo_step.step_ms:
            return None
        return round(self.ours_cycle.cycle_ms / self.nemo_step.step_ms, 4)


@dataclass
class BenchResult:
    """The whole run: settings, environment, the per-count results, transcript agreement."""

    command: str
    config: dict[str, Any]
    environment: dict[str, Any]
    geometry: dict[str, Any]
    inputs: dict[str, Any]  # files, seconds, names
    chunk_seconds: float
    stagger_seconds: float
    counts: list[CountResult]
    pipeline_agreement: float | None = None  # share of files whose NeMo-pipeline text equals the reference
    files: dict[str, str] = field(default_factory=dict)

    def max_realtime(self) -> dict[str, int | None]:
        """Largest count served in real time (p95 latency <= target, keeps up), per side."""
        target, period = self.config["latency_target_ms"], 1000 * self.chunk_seconds
        ours = [c.num_streams for c in self.counts if c.ours and _ours_realtime(c.ours, target)]
        nemo = [
            c.num_streams for c in self.counts if c.nemo_step and c.nemo_step.step_ms <= min(target, period)
        ]  # all N arrive together and finish together: each chunk's latency is the step
        return {"ours": max(ours, default=None), "nemo": max(nemo, default=None)}


def _ours_realtime(stats: PathStats, target_ms: float) -> bool:
    return stats.busy_share < 1.0 and stats.latency_p95_ms <= target_ms


def _at(result: BenchResult, streams: int) -> CountResult | None:
    return next((c for c in result.counts if c.num_streams == streams), None)


def format_markdown(result: BenchResult) -> str:
    """The report: how it ran, one row per stream count, the headline numbers, and how each number is measured."""
    c, env = result.config, result.environment
    g = result.geometry
    target = c["latency_target_ms"]
    period_ms = round(1000 * result.chunk_seconds, 1)
    lines = [
        f"# Streaming audio in, partial transcripts out: {c['model']}",
        "",
        f"- command: `{result.command}`",
        f"- commit {env.get('commit')}; {env.get('gpu', env['device'])}, driver {env.get('driver')}; torch "
        f"{env['torch']}, CUDA {env.get('cuda')}, Triton {env.get('triton')}, NeMo {env.get('nemo')}, "
        f"Python {env.get('python')}",
        f"- att_context_size {list(g['att_context_size'])}: {period_ms} ms chunks; audio pushed in {period_ms} ms "
        f"pieces; starts uniform in [0, {result.stagger_seconds}) s",
        f"- inputs: {result.inputs['files']} files, {result.inputs['seconds']} s in all, each cut to "
        f"{c['max_stream_seconds']} s; stream i plays file i mod {result.inputs['files']}",
        f"- ours: StreamingEngine, dtype {c['dtype']}, encoder_matmul {c['encoder_matmul']}, CUDA graphs "
        f"{c['use_cuda_graphs']}, fast_math {c['fast_math']}, num_slots = streams; warm-up before any clock (graph "
        f"captures, first cycles): {', '.join(f'{x.ours.warmup_seconds} s' for x in result.counts if x.ours)}",
        f"- NeMo: CacheAwareRNNTPipeline from PipelineBuilder.build_pipeline, compute_dtype "
        f"{c['nemo']['compute_dtype'] if env['device'].startswith('cuda') else 'float32 (NeMo on the CPU)'} (no AMP), greedy_batch with CUDA-graph decoding "
        f"{c['nemo']['use_cuda_graph_decoder']}, batch_size = num_slots = streams, use_cache and use_feat_cache, "
        f"frame requests, matmul_precision {c['nemo']['matmul_precision']}, endpointing/ITN/NMT off",
        "",
        "| streams | ours: chunk latency p50 / p95 / p99 (ms) | ours: cycle p50 / p95 (ms) | ours: busy "
        "| ours: cycle, all together (ms) | front end share | NeMo pipeline step, all together (ms) "
        "| ours / NeMo | ours = NeMo alone |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for count in result.counts:
        o, cyc, n = count.ours, count.ours_cycle, count.nemo_step
        latency = f"{o.latency_p50_ms} / {o.latency_p95_ms} / {o.latency_p99_ms}" if o else _err(count, "ours")
        cycle = f"{o.step_p50_ms} / {o.step_p95_ms}" if o else ""
        busy = f"{o.busy_share:.2f}" if o else ""
        together = f"{cyc.cycle_ms}" if cyc else ""
        share = f"{100 * cyc.frontend_share:.1f}%" if cyc and cyc.frontend_share is not None else ""
        nemo = f"{n.step_ms}" if n else _err(count, "nemo")
        ratio = f"{count.ours_over_nemo:.3f}" if count.ours_over_nemo is not None else ""
        same = f"{100 * count.ours_identical:.1f}%" if count.ours_identical is not None else ""
        lines.append(
            f"| {count.num_streams} | {latency} | {cycle} | {busy} | {together} | {share} | {nemo} | {ratio} | {same} |"
        )
    best = result.max_realtime()
    lines += [
        "",
        "| streams | ours: p95 of first chunks / middle chunks / last chunks (ms) | chunks |",
        "|---|---|---|",
    ]
    for count in result.counts:
        if (p := count.ours_parts) is not None:
            lines.append(
                f"| {count.num_streams} | {p.first_p95_ms} / {p.middle_p95_ms} / {p.last_p95_ms} "
                f"| {p.first_chunks} / {p.middle_chunks} / {p.last_chunks} |"
            )
    lines += [
        "",
        f"- largest count served in real time (p95 chunk latency <= {target} ms, keeping up): ours "
        f"{best['ours'] or 'none'}, NeMo's pipeline {best['nemo'] or 'none'} (of the counts measured)",
    ]
    at = _at(result, RATIO_STREAMS)
    if at is not None and at.ours_over_nemo is not None:
        verdict = "meets" if at.ours_over_nemo <= RATIO_TARGET else "misses"
        lines.append(
            f"- whole cycle at {RATIO_STREAMS} streams / NeMo's pipeline step for the same streams: "
            f"{at.ours_over_nemo:.3f} ({verdict} the target <= {RATIO_TARGET})"
        )
    at = _at(result, FRONTEND_STREAMS)
    if at is not None and at.ours_cycle is not None and at.ours_cycle.frontend_share is not None:
        lines.append(
            f"- front end's share of the cycle at {FRONTEND_STREAMS} streams: {100 * at.ours_cycle.frontend_share:.1f}%"
        )
    if result.pipeline_agreement is not None:
        lines.append(
            f"- NeMo's pipeline text equal to NeMo's streaming of the file alone: {100 * result.pipeline_agreement:.1f}% "
            "of files (it computes features per buffer: tests/test_streaming_engine_pipeline.py)"
        )
    lines += ["", *HOW_MEASURED]
    return "\n".join(lines)


def _err(count: CountResult, side: str) -> str:
    return f"failed: {count.errors[side][:80]}" if side in count.errors else ""


HOW_MEASURED = [
    "How each number is measured:",
    "",
    "- ours, chunk latency: N streams on a virtual clock; each stream's audio arrives in pushes of one chunk period "
    "(push k when its last sample would have been recorded), the server pushes what has arrived and polls the engine "
    "whenever it has work, the clock advancing by each poll's synchronised wall time. A chunk's latency runs from the "
    "arrival of the push that completed its last feature frame to the end of the poll that stepped it (its partial "
    "event); a stream's last chunk from its last push to its final event. p50 / p95 / p99 over every chunk; the second "
    "table splits the p95 by the chunk's place in its stream (first, middle, last: the last one's final event "
    "carries word timestamps).",
    "- ours, cycle p50 / p95: the synchronised wall time of the polls that had work in that run (front end, encoder, "
    "decoder, events); busy: their sum over the simulated time (below 1 the server keeps up; device and host work "
    "together, an upper bound on the GPU's busy share).",
    "- ours, cycle all together: median of the timed polls in which all N streams step one chunk each (one chunk "
    "period of audio pushed to every stream before each, not timed; first chunks done before). Front end share: "
    "median, over as many more such polls, of the time inside the front end's calls (taking the cycle's audio from "
    "the inbox, append, features; synchronised around each) over the poll's time. Each push is copied into the "
    "engine's pinned inbox when it arrives, outside the poll (a server does it while the GPU steps).",
    "- NeMo pipeline step, all together: NeMo's pipeline is driven by its own request generator and does not follow "
    "a virtual clock; here N streams each get one frame of chunk_size_in_secs audio per step and "
    "pipeline.transcribe_step (features per buffer, cache gather/scatter, encoder, decoding, text) is timed "
    "synchronised, median of the timed steps after two untimed ones. Its real-time capacity is judged the same way: "
    "with every stream's chunk arriving together, each chunk's latency is one step, so a count is served in real "
    "time when the step is at most the latency target (and shorter than the chunk period).",
    "- ours / NeMo: our whole cycle all together over NeMo's step all together, same streams, same audio.",
    "- ours = NeMo alone: share of streams whose final tokens equal NeMo's cache-aware streaming of their file alone "
    "(CacheAwareStreamingAudioBuffer's chunks of the whole-file features of the same PCM, the encoder's cache_aware_stream_step and the model's decoding: tools/streaming_reference.py; exact in fp32).",
]


def write_result(result: BenchResult, out_dir: Path, tag: str | None) -> None:
    """``stream_audio_bench{_tag}.json`` / ``.md`` and the latency-vs-streams plot (``.png``, or ``.svg``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"stream_audio_bench{f'_{tag}' if tag else ''}"
    payload = asdict(result)
    payload["max_realtime_streams"] = result.max_realtime()
    for count, saved in zip(result.counts, payload["counts"], strict=True):
        saved["ours_over_nemo"] = count.ours_over_nemo
    result.files = {"json": f"{stem}.json", "markdown": f"{stem}.md"}
    view = _PlotView(result)
    plot = plot_sweep(view, stem) if view.points else None  # nothing measured yet: no plot
    if plot is not None:
        result.files["plot"] = str(plot)
    payload["files"] = result.files
    Path(f"{stem}.json").write_text(json.dumps(payload, indent=2) + "\n")
    Path(f"{stem}.md").write_text(format_markdown(result) + "\n")


@dataclass
class _Latency:
    """A series point for the plot: NeMo's latency when every chunk arrives together is its step."""

    name: str
    latency_p50_ms: float
    latency_p95_ms: float
    latency_p99_ms: float


@dataclass
class _PlotPoint:
    num_streams: int
    paths: list[Any]


class _PlotView:
    """The shape :func:`~fastdecode_lab.streaming_sim.report.plot_sweep` reads: points with per-path latencies."""

    def __init__(self, result: BenchResult):
        self.config = result.config
        period_ms = 1000 * result.chunk_seconds
        self.points = []
        for count in result.counts:
            paths: list[Any] = []
            if count.ours is not None:
                paths.append(count.ours)
            if count.nemo_step is not None and count.nemo_step.step_ms < period_ms:  # beyond: the queue grows
                step = count.nemo_step.step_ms
                paths.append(_Latency("NeMo CacheAwareRNNTPipeline (all together)", step, step, step))
            if paths:
                self.points.append(_PlotPoint(count.num_streams, paths))
