"""Every place nemo-fastdecode touches NeMo, each a named, idempotent patch (``install`` applies them all).

* :mod:`.registry` -- our strategies in NeMo's decoding construction (``AbstractRNNTDecoding.__init__``), their
  options as fields of NeMo's config dataclasses, portable ``.nemo`` saves, ``transcribe``'s offline path, and
  ``pipeline_type: fast_cache_aware`` in NeMo's streaming pipeline builder.
* :mod:`.nvrtc` -- NeMo's NVRTC helper without its write into CPython's shared ``b" "``.
* :mod:`.captures` -- NeMo's decoders capture CUDA graphs with the garbage collector paused.
* :mod:`.streaming_pipeline` -- our streaming engine behind NeMo's streaming inference pipeline interface.
* :mod:`.context` -- context managers around NeMo calls (eval mode, NeMo's logging quiet).

``autoload/nemo_fastdecode_autoload.py`` (run at interpreter start) reads the constants of :mod:`.constants`.
"""
