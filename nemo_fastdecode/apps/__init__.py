"""The user-facing apps on top of the library: the ``nemo-fastdecode`` console script and what it runs.

* :mod:`.cli` -- ``nemo-fastdecode COMMAND key=value ...`` (``serve``, ``loadtest``).
* :mod:`.serve` -- load a model, build the streaming engine, serve (:mod:`nemo_fastdecode.serve`).
* :mod:`.loadtest` -- concurrent clients against a server: latency and exactness report.
* :mod:`.transcribe` -- ``scripts/transcribe.py``: files or the embedded demo through ``model.transcribe``.
* :mod:`.parallel` -- ``scripts/transcribe_parallel.py``: a manifest across GPUs (Lightning or Ray Data).
* :mod:`.models` / :mod:`.trained_models` -- load a model by name; the shipped trained models and examples.
* :mod:`.manifests` / :mod:`.wer` / :mod:`.comparison` / :mod:`.timing` / :mod:`.environment` / :mod:`.plot` /
  :mod:`.streaming_reference` -- what the apps share: inputs and outputs, WER, decoder comparison, timing, the
  environment a report records, latency plots, NeMo's streaming reference transcripts.
* :mod:`.configs` -- the apps' configs (mirrored by ``configs/*.yaml``).
"""
