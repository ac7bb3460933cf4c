"""Streaming audio in, partial transcripts out: our engine against NeMo 3.0's pipeline (``benchmarks/stream_audio_bench.py``).

* :mod:`.engine_clock` -- our :class:`~nemo_fastdecode.streaming.StreamingEngine` serving PCM that arrives in real
  time on a virtual clock (chunk latency, cycle times, busy share), and whole cycles with all streams together.
* :mod:`.nemo_steps` -- NeMo's ``CacheAwareRNNTPipeline`` as its builder makes it, its step timed with all streams
  together, and its transcripts.
* :mod:`.report` -- results as dataclasses, Markdown, JSON and the latency-vs-streams plot.
* :mod:`.app` -- the script: model, inputs, NeMo's streaming of each input alone (the reference), every count.
"""

from fastdecode_lab.benchmarks.stream_audio.app import resolve_config, run
from fastdecode_lab.benchmarks.stream_audio.report import BenchResult, CountResult, format_markdown

__all__ = ["BenchResult", "CountResult", "format_markdown", "resolve_config", "run"]
