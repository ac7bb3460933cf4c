"""NeMo's decoders and ours on the same inputs, in one process: the tables under ``benchmarks/results/``.

* :mod:`.decoder` -- greedy and beam decoders on the same encoder outputs (``benchmarks/benchmark.py``).
* :mod:`.fusion` -- n-gram LM and phrase boosting (``benchmarks/bench_fusion.py``).
* :mod:`.exactness` -- exactness tables in every precision context (``benchmarks/bench_exactness.py``).
* :mod:`.transcribe` -- ``model.transcribe`` end to end (``benchmarks/bench_transcribe.py``).
* :mod:`.stream_audio` -- PCM in, partials out, against NeMo's pipeline (``benchmarks/stream_audio_bench.py``).
"""
