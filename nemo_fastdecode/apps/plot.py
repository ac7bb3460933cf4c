"""Latency quantiles against a count (streams, clients), one colour per name: a PNG with matplotlib, else an SVG."""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: ``(name, quantile) -> (xs, ys)``: one line per name and quantile (50, 95, 99)
Series = dict[tuple[str, int], tuple[list[int], list[float]]]


def plot_latency(
    series: Series, stem: Path, *, target: float, xlabel: str = "concurrent streams", ylabel: str = "chunk latency (ms)"
) -> Path:
    """Latency quantiles against a count (log-log), one colour per name: ``stem.png`` (matplotlib) or ``stem.svg``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        path = stem.with_suffix(".svg")
        path.write_text(_svg_plot(series, target, xlabel, ylabel))
        return path
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (name, q), (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", linestyle=_DASHES[q], color=_colour(name, series), label=f"{name} p{q}")
    ax.axhline(target, color="grey", linewidth=0.8, linestyle=":", label=f"{target} ms")
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel)
    ax.set_xticks(sorted({x for xs, _ in series.values() for x in xs}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = stem.with_suffix(".png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


_DASHES = {50: "-", 95: "--", 99: ":"}


_SVG_DASHES = {50: "", 95: "6,3", 99: "2,3"}


_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def _colour(name: str, series: dict) -> str:
    names = list(dict.fromkeys(n for n, _ in series))
    return _COLOURS[names.index(name) % len(_COLOURS)]


def _svg_plot(series: Series, target: float, xlabel: str, ylabel: str) -> str:
    """A dependency-free log-log line plot of ``series`` (same content as the matplotlib one)."""
    width, height, left, right, top, bottom = 720, 450, 70, 250, 20, 50
    xs = [x for xs, _ in series.values() for x in xs]
    ys = [y for _, ys in series.values() for y in ys] + [target]
    lx = (np.log10(min(xs)), np.log10(max(xs)) if max(xs) > min(xs) else np.log10(min(xs)) + 1)
    ly = (np.floor(np.log10(min(ys))), np.ceil(np.log10(max(ys))) + (min(ys) == max(ys)))

    def px(x: float) -> float:
        return left + (np.log10(x) - lx[0]) / (lx[1] - lx[0]) * (width - left - right)

    def py(y: float) -> float:
        return height - bottom - (np.log10(y) - ly[0]) / (ly[1] - ly[0]) * (height - top - bottom)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="11"><rect width="100%" height="100%" fill="white"/>'
    ]
    for e in range(int(ly[0]), int(ly[1]) + 1):
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{py(10**e):.1f}" y2="{py(10**e):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{py(10**e) + 4:.1f}" text-anchor="end">{10**e:g}</text>')
    for x in sorted(set(xs)):
        out.append(f'<text x="{px(x):.1f}" y="{height - bottom + 16}" text-anchor="middle">{x}</text>')
    out.append(f'<text x="{(left + width - right) / 2}" y="{height - 10}" text-anchor="middle">{xlabel}</text>')
    out.append(
        f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" text-anchor="middle">{ylabel}</text>'
    )
    out.append(
        f'<line x1="{left}" x2="{width - right}" y1="{py(target):.1f}" y2="{py(target):.1f}" stroke="grey" '
        'stroke-dasharray="2,2"/>'
    )
    for i, ((name, q), (sx, sy)) in enumerate(series.items()):
        colour, dash = _colour(name, series), _SVG_DASHES[q]
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(sx, sy, strict=True))
        out.append(
            f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.6" stroke-dasharray="{dash}"/>'
        )
        out += [
            f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{colour}"/>' for x, y in zip(sx, sy, strict=True)
        ]
        ty = top + 14 * i + 8
        out.append(
            f'<line x1="{width - right + 10}" x2="{width - right + 34}" y1="{ty}" y2="{ty}" stroke="{colour}" '
            f'stroke-width="1.6" stroke-dasharray="{dash}"/>'
        )
        label = f"{name[:28]} p{q}".replace("&", "&amp;").replace("<", "&lt;")
        out.append(f'<text x="{width - right + 38}" y="{ty + 4}">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
