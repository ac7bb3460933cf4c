"""Prometheus metrics of one server, in a registry of its own (several servers in one process stay apart).

Served at ``/metrics``: open streams and connections, the engine's cycle time, chunk latency (audio received ->
partial built), final latency (commit received -> final built), refusals by reason, audio received, GPU memory.
"""

from __future__ import annotations

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "ServerMetrics"]

# seconds: from sub-millisecond GPU cycles to multi-second CPU ones
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServerMetrics:
    """The server's metrics (``nemo_fastdecode_*``)."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.registry = r = CollectorRegistry()
        prefix = "nemo_fastdecode_"
        self.connections = Gauge(prefix + "connections", "WebSocket connections holding a slot", registry=r)
        self.open_streams = Gauge(prefix + "open_streams", "engine streams holding a slot", registry=r)
        self.cycle_seconds = Histogram(
            prefix + "cycle_seconds",
            "one engine cycle (feed, features, step, events)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.chunk_latency_seconds = Histogram(
            prefix + "chunk_latency_seconds",
            "audio that completed a chunk received -> its partial built",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.final_latency_seconds = Histogram(
            prefix + "final_latency_seconds", "commit received -> final built", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.refusals = Counter(
            prefix + "refusals", "refused connections and messages, by reason", ["reason"], registry=r
        )
        self.audio_seconds = Counter(prefix + "audio_seconds", "audio received", registry=r)
        self.events = Counter(prefix + "events", "server events sent, by type", ["type"], registry=r)
        gpu = Gauge(prefix + "gpu_memory_bytes", "GPU memory held by PyTorch", ["kind"], registry=r)
        on_gpu = device is not None and device.type == "cuda"
        # read at scrape time; no device synchronisation
        gpu.labels("allocated").set_function(lambda: torch.cuda.memory_allocated(device) if on_gpu else 0.0)
        gpu.labels("reserved").set_function(lambda: torch.cuda.memory_reserved(device) if on_gpu else 0.0)

    def refused(self, reason: str) -> None:
        self.refusals.labels(reason).inc()

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)
