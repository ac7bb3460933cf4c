"""The tools wing: what scripts, tests and benchmarks use around the decode-time library, never the library itself.

* :mod:`.synthetic` -- Parakeet-architecture NeMo models with random weights, synthetic audio, calibration.
* :mod:`.models` / :mod:`.manifests` -- load a model by name; read audio folders and manifests, write outputs.
* :mod:`.comparison` / :mod:`.timing` / :mod:`.profiling` -- decode, compare hypotheses, time, profile kernels.
* :mod:`.trained_models` / :mod:`.wer` -- the shipped trained models and example utterances; WER against references.
* :mod:`.environment` -- the GPU, driver, library versions and commit every report records.
* :mod:`.transcribe_app` -- ``scripts/transcribe.py``: transcription and the strategy comparison table.
* :mod:`.decoder_benchmark` -- ``scripts/benchmark.py``: NeMo's decoders and ours on the same encoder outputs.
* :mod:`.streaming_sim` -- ``scripts/streaming.py``: many streams arriving in real time, ours and NeMo's path.
* :mod:`.stream_audio_bench` -- ``scripts/stream_audio_bench.py``: PCM in, partials out, the engine against NeMo's
  ``CacheAwareRNNTPipeline``.
* :mod:`.configs` -- the scripts' configs (mirrored by ``configs/*.yaml``).

Nothing under ``nemo_fastdecode`` outside this package imports it (``tests/test_layout.py`` checks).
"""
