"""What a load test measured: one point per client count, Markdown, JSON and a latency-vs-clients plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nemo_fastdecode.apps.loadtest.client import ClientResult, percentiles
from nemo_fastdecode.apps.plot import Series, plot_latency
from nemo_fastdecode.apps.streaming_reference import Reference
from nemo_fastdecode.apps.wer import scored_records, word_error_rate_of

__all__ = ["LoadPoint", "LoadtestResult", "format_markdown", "read_result", "summarize", "write_result"]

WORD_KEYS = ("word", "start", "end", "start_offset", "end_offset")


@dataclass
class LoadPoint:
    """One run at ``clients`` concurrent clients.

    Attributes:
        completed: clients whose every final came back; ``refused``: connections the server refused (by close code).
        errors: clients with an ``error`` event or a failure (``error_samples``: the first few).
        chunk_latency_ms / final_latency_ms: p50, p95, p99 over all clients (partials before the commit: audio sent
            -> partial received; finals: commit sent -> final received).
        rtf_mean: mean over clients of (first audio sent -> last final) / audio seconds (real-time pacing: >= 1).
        throughput_x_realtime: audio seconds transcribed / wall seconds of the run.
        exact / checked: clients whose every final equals NeMo's streaming of that item's audio alone (text and
            word timestamps).
        wer / scored: NeMo's WER of the finals against their inputs' reference texts, over the ``scored`` clients
            whose input has one (``None`` / 0: no input has a reference text).
        partials: partials timed (``chunk_latency_ms``); ``late_partial_share``: the share of them whose audio ends
            past their item's first second (a model that emits only at a stream's start times stream starts only).
        start_lag_ms: p50, p95, p99 over served clients of first audio sent - scheduled start (a client process
            that falls behind, and the handshake).
        server_ms: the server's own p50 / p95 over the point from its ``/metrics`` (``cycle``: engine cycle time;
            ``chunk``: chunk audio received -> partial built; bucket upper bounds); ``None`` where not read.
    """

    clients: int
    completed: int
    refused: dict[str, int]
    errors: int
    error_samples: list[str]
    chunk_latency_ms: dict[int, float]
    final_latency_ms: dict[int, float]
    rtf_mean: float
    throughput_x_realtime: float
    audio_seconds: float
    wall_seconds: float
    checked: int = 0
    exact: int = 0
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    wer: float | None = None
    scored: int = 0
    server_ms: dict[str, dict[int, float] | None] | None = None
    start_lag_ms: dict[int, float] = field(default_factory=dict)
    partials: int = 0
    late_partial_share: float = 0.0


@dataclass
class LoadtestResult:
    config: dict[str, Any]
    environment: dict[str, Any]
    points: list[LoadPoint]
    files: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Every client served without error, every checked final exact."""
        return all(p.errors == 0 and not p.refused and p.exact == p.checked for p in self.points)


def _compared(words: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An item's word timestamps, only the keys an exact final must match."""
    return [{k: w[k] for k in WORD_KEYS} for w in words]


def summarize(
    clients: int,
    results: list[ClientResult],
    wall_seconds: float,
    references: list[list[Reference]] | None,
    texts: Sequence[str | None] | None = None,
) -> LoadPoint:
    """Pool the clients' timings; check each final against its input's reference (NeMo's streaming of it alone) and,
    where ``texts`` has the input's reference text, score the finals' WER against it."""
    refused: dict[str, int] = {}
    for r in results:
        if r.refused is not None:
            refused[str(r.refused)] = refused.get(str(r.refused), 0) + 1
    served = [r for r in results if r.refused is None]
    finished = [r for r in served if r.ok and r.transcripts]
    point = LoadPoint(
        clients=clients,
        completed=len(finished),
        refused=refused,
        errors=sum(1 for r in served if r.errors),
        error_samples=[e for r in served for e in r.errors][:5],
        chunk_latency_ms=percentiles([x for r in served for x in r.chunk_latency_ms]),
        final_latency_ms=percentiles([x for r in served for x in r.final_latency_ms]),
        rtf_mean=(
            sum((r.finished - r.started) / r.audio_seconds for r in finished) / len(finished)
            if finished
            else float("nan")
        ),
        throughput_x_realtime=sum(r.audio_seconds for r in finished) / wall_seconds if wall_seconds > 0 else 0.0,
        audio_seconds=sum(r.audio_seconds for r in finished),
        wall_seconds=wall_seconds,
        start_lag_ms=percentiles([(r.started - r.scheduled) * 1000 for r in served if r.started > 0]),
    )
    ends = [end for r in served for end in r.partial_audio_ms]
    point.partials = len(ends)
    point.late_partial_share = sum(end > 1000 for end in ends) / len(ends) if ends else 0.0
    if references is not None:
        for r in finished:
            point.checked += 1
            refs = references[r.audio_index]
            want = [_compared(ref.words) for ref in refs]
            if r.transcripts == [ref.text for ref in refs] and [_compared(words) for words in r.words] == want:
                point.exact += 1
            elif len(point.mismatches) < 5:
                point.mismatches.append(
                    {
                        "client": r.index,
                        "input": r.audio_index,
                        "got": r.transcripts,
                        "want": [ref.text for ref in refs],
                    }
                )
    if texts is not None:
        records = [{"text": texts[r.audio_index], "pred_text": " ".join(r.transcripts)} for r in finished]
        point.wer, point.scored = word_error_rate_of(records), len(scored_records(records))
    return point


def format_markdown(result: LoadtestResult) -> str:
    c = result.config
    lines = [
        f"# Load test: {c['url']}",
        "",
        f"Model {c['model']!r}; {c['chunk_ms']:g} ms messages, {'real-time' if c['realtime'] else 'unpaced'}, "
        f"{'binary' if c['binary'] else 'base64 JSON'} audio; starts staggered over {c['stagger_seconds']:g} s; "
        + (f"a commit every {c['commit_every_seconds']:g} s of audio; " if c.get("commit_every_seconds") else "")
        + f"{c['processes']} client process(es).",
        "",
        "| clients | served | refused | errors | chunk p50 / p95 / p99 ms | final p50 / p95 / p99 ms | RTF | x real time "
        "| exact |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in result.points:
        chunk = " / ".join(f"{p.chunk_latency_ms[q]:.1f}" for q in (50, 95, 99))
        final = " / ".join(f"{p.final_latency_ms[q]:.1f}" for q in (50, 95, 99))
        refused = ", ".join(f"{n} ({code})" for code, n in p.refused.items()) or "0"
        exact = f"{p.exact}/{p.checked}" if c["check"] else "not checked"
        lines.append(
            f"| {p.clients} | {p.completed} | {refused} | {p.errors} | {chunk} | {final} | {p.rtf_mean:.3f} "
            f"| {p.throughput_x_realtime:.1f} | {exact} |"
        )
    for p in result.points:
        if p.wer is not None:
            lines.append(
                f"\n- {p.clients} clients: WER {100 * p.wer:.2f}% of the finals against the reference texts "
                f"({p.scored} finals)"
            )
    for p in result.points:
        lines.append(
            f"\n- {p.clients} clients: {p.partials} partials timed, {100 * p.late_partial_share:.1f}% of them past "
            "their item's first second of audio"
        )
    for p in result.points:
        if p.start_lag_ms:
            lag = " / ".join(f"{p.start_lag_ms[q]:.1f}" for q in (50, 95, 99))
            lines.append(
                f"\n- {p.clients} clients: start lag (first audio sent - scheduled start) p50 / p95 / p99 {lag} ms"
            )
    for p in result.points:
        if p.server_ms:
            parts = [f"{name} p50 / p95 {q[50]:g} / {q[95]:g} ms" for name, q in p.server_ms.items() if q is not None]
            lines.append(f"\n- {p.clients} clients, the server's /metrics (bucket upper bounds): " + "; ".join(parts))
    for p in result.points:
        for sample in p.error_samples:
            lines.append(f"\n- {p.clients} clients: {sample}")
        for m in p.mismatches:
            lines.append(f"\n- {p.clients} clients, client {m['client']} (input {m['input']}): NOT EXACT")
    lines += ["", "RTF: (first audio sent -> final received) / audio seconds, per client, mean."]
    return "\n".join(lines)


def read_result(path: str | Path) -> LoadtestResult:
    """A result :func:`write_result` wrote as JSON (its percentile keys, which JSON turns into strings, as ints)."""
    data = json.loads(Path(path).read_text())

    def quantiles(values: dict[str, float] | None) -> dict[int, float] | None:
        return None if values is None else {int(q): v for q, v in values.items()}

    points = []
    for point in data["points"]:
        for name in ("chunk_latency_ms", "final_latency_ms", "start_lag_ms"):
            point[name] = quantiles(point[name])
        if point.get("server_ms") is not None:
            point["server_ms"] = {name: quantiles(q) for name, q in point["server_ms"].items()}
        points.append(LoadPoint(**point))
    return LoadtestResult(data["config"], data["environment"], points, data.get("files", {}))


def write_result(result: LoadtestResult, out_dir: Path, tag: str | None) -> None:
    """``loadtest{_tag}.json`` / ``.md``, and the latency-vs-clients plot for more than one point."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"loadtest{f'_{tag}' if tag else ''}"
    result.files = {"json": f"{stem}.json", "markdown": f"{stem}.md"}
    if len(result.points) > 1:
        series: Series = {}
        for p in result.points:
            for name, quantiles in (("chunk", p.chunk_latency_ms), ("final", p.final_latency_ms)):
                for q in (50, 95, 99):
                    xs, ys = series.setdefault((name, q), ([], []))
                    xs.append(p.clients)
                    ys.append(max(quantiles[q], 1e-3))
        path = plot_latency(
            series, stem, target=result.config["latency_target_ms"], xlabel="concurrent clients", ylabel="latency (ms)"
        )
        result.files["plot"] = str(path)
    Path(result.files["json"]).write_text(json.dumps(asdict(result), indent=2) + "\n")
    Path(result.files["markdown"]).write_text(format_markdown(result) + "\n")
