"""The server's own view of a load-test point: its Prometheus histograms, read before and after the point.

The clients measure latency end to end (audio sent -> partial received). The server's ``/metrics`` on the same port
say how much of it the server spent: its engine cycle time and its chunk latency (audio that completed a chunk
received -> partial built). Clients far slower than the server's own figures point at the client side (or the
sockets); the server's chunk latency near the clients' points at the server.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["HISTOGRAMS", "histogram_quantiles_ms", "metrics_url", "scrape_histograms"]

#: the server's histograms a load test reports, by the name the report gives them
HISTOGRAMS = {"cycle": "nemo_fastdecode_cycle_seconds", "chunk": "nemo_fastdecode_chunk_latency_seconds"}

Buckets = dict[float, float]  # upper bound (s) -> cumulative count


def metrics_url(websocket_url: str) -> str:
    """``ws://host:port/v1/realtime`` -> ``http://host:port/metrics`` (``wss`` -> ``https``)."""
    parts = urllib.parse.urlsplit(websocket_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme)
    if scheme is None:
        raise ValueError(f"url={websocket_url!r} is not a WebSocket URL; valid schemes: ws, wss")
    return urllib.parse.urlunsplit((scheme, parts.netloc, "/metrics", "", ""))


def scrape_histograms(url: str, timeout: float = 5.0) -> dict[str, Buckets] | None:
    """The cumulative buckets of :data:`HISTOGRAMS` at ``url``; ``None`` when the server has no metrics there."""
    try:
        text = urllib.request.urlopen(url, timeout=timeout).read().decode()
    except (urllib.error.URLError, OSError, ValueError):
        return None
    wanted = {metric: name for name, metric in HISTOGRAMS.items()}
    found: dict[str, Buckets] = {}
    for family in text_string_to_metric_families(text):
        name = wanted.get(family.name)
        if name is None:
            continue
        found[name] = {
            float(sample.labels["le"]): sample.value for sample in family.samples if sample.name.endswith("_bucket")
        }
    return found if len(found) == len(HISTOGRAMS) else None


def histogram_quantiles_ms(
    before: Mapping[str, Buckets], after: Mapping[str, Buckets], quantiles: tuple[int, ...] = (50, 95)
) -> dict[str, dict[int, float] | None]:
    """Per histogram, the quantiles (ms) of what was observed between the two scrapes.

    A quantile is the upper bound of the first bucket holding it (an upper estimate; ``inf`` past the last finite
    bucket); ``None`` where nothing was observed.
    """
    out: dict[str, dict[int, float] | None] = {}
    for name in HISTOGRAMS:
        bounds = sorted(after[name])
        counts = [after[name][b] - before.get(name, {}).get(b, 0.0) for b in bounds]
        total = counts[-1] if counts else 0.0
        if total <= 0:
            out[name] = None
            continue
        out[name] = {
            q: next(b for b, c in zip(bounds, counts, strict=True) if c >= q / 100 * total) * 1000 for q in quantiles
        }
    return out
