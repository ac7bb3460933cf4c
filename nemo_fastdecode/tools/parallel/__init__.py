"""Offline transcription over several processes, GPUs and machines (``scripts/transcribe_parallel.py``).

* :mod:`~nemo_fastdecode.tools.parallel.shards` -- the inputs cut into length-balanced shards, each shard's output
  written once it is complete (a rerun skips finished shards), the outputs merged in input order.
* :mod:`~nemo_fastdecode.tools.parallel.lightning_run` -- Lightning's DDP predict: every rank transcribes its shards
  with the model's decoding strategy (``fast_greedy`` by default), rank 0 merges.
"""
