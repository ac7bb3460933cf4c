"""Simulated real-time streaming of many concurrent streams, ours against NeMo's path (``scripts/streaming.py``).

* :mod:`.schedule` -- stream plans, the virtual clock that serves them, the step with every stream together.
* :mod:`.paths` -- ours (:class:`~nemo_fastdecode.streaming.StreamingTranscriber`) and NeMo's
  (:mod:`.nemo_path`: slot gather/scatter around ``conformer_stream_step``), warmed up.
* :mod:`.report` -- results as dataclasses, Markdown, JSON and a latency-vs-streams plot.
* :mod:`.app` -- the script: config, set-up, a run or a sweep over stream counts.
"""

from fastdecode_lab.streaming_sim.app import compose_streams, resolve_config, run, run_sweep
from fastdecode_lab.streaming_sim.paths import fast_path, nemo_path
from fastdecode_lab.streaming_sim.report import StreamingRunResult, SweepResult, format_markdown
from fastdecode_lab.streaming_sim.schedule import (
    PathStats,
    StreamPlan,
    fixed_step_chunks,
    plan_streams,
    served_in_real_time,
    simulate,
    time_fixed_steps,
)

__all__ = [
    "PathStats",
    "StreamPlan",
    "StreamingRunResult",
    "SweepResult",
    "compose_streams",
    "fast_path",
    "fixed_step_chunks",
    "format_markdown",
    "nemo_path",
    "plan_streams",
    "resolve_config",
    "run",
    "run_sweep",
    "served_in_real_time",
    "simulate",
    "time_fixed_steps",
]
