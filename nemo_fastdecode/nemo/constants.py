"""The names NeMo's configs use for us, in one place: :mod:`.registry` and :mod:`.streaming_pipeline` import them,
and ``autoload/nemo_fastdecode_autoload.py`` (which may import only the standard library) reads this file.

Standard library only, no imports: the start-up hook executes it without importing the package."""

#: Our strategies' names (``decoding.strategy``).
STRATEGIES = ("fast_greedy", "fast_beam")
#: Where a portable ``.nemo`` config keeps our strategy (``decoding.nemo_fastdecode.strategy``); its
#: ``decoding.strategy`` is NeMo's stand-in.
PORTABLE_KEY = "nemo_fastdecode"
#: The ``pipeline_type`` of NeMo's streaming inference config that selects our engine (NeMo's own: ``buffered``,
#: ``cache_aware``).
FAST_PIPELINE_TYPE = "fast_cache_aware"
