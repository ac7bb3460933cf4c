"""The lab around nemo-fastdecode: what tests, benchmarks and ``scripts/`` use, never shipped in the wheel.

* :mod:`.synthetic` -- Parakeet-architecture NeMo models with random weights, synthetic audio, calibration;
  ``import fastdecode_lab.models`` registers them as names the apps load (``model=tiny-rnnt``).
* :mod:`.emissions` -- emission statistics (tokens per frame, bursts) of trained and synthetic models.
* :mod:`.benchmarks` -- NeMo's decoders and ours side by side: decoder, fusion, exactness, ``transcribe``, the
  stream-audio benchmark.
* :mod:`.streaming_sim` -- ``scripts/streaming.py``: many streams arriving in real time, ours and NeMo's path.
* :mod:`.tiny_models` -- ``scripts/train_tiny_models.py``: the shipped small models' corpus, training and evaluation.
* :mod:`.profiling` -- kernel timelines of the decoders.
* :mod:`.configs` -- the lab scripts' configs (mirrored by ``configs/*.yaml``).

Nothing under ``nemo_fastdecode`` imports this package (``tests/test_layout.py`` checks).
"""

