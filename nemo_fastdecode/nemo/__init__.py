"""Every place nemo-fastdecode touches NeMo, each a named, idempotent patch; :func:`install` applies them all.

The patches (rows of :data:`PATCHES`, in :mod:`.patches`; each module's docstring says what NeMo function it
wraps, why, and how it is undone):

* ``AbstractRNNTDecoding.__init__`` -- :func:`.registry.install_decoding_hook`: our strategy names in NeMo's decoding
  construction (model constructor, ``change_decoding_strategy``, ``.nemo`` restores, streaming).
* ``GreedyBatchedRNNTInferConfig`` / ``BeamRNNTInferConfig`` fields -- :func:`.option_fields.install_option_fields`:
  our options in NeMo's config dataclasses (Hydra schemas accept them without ``+``).
* ``FileIO.to_config_file`` -- :func:`.portable.install_portable_save`: ``.nemo`` files that load without us.
* ``EncDecRNNTModel.transcribe`` / ``EncDecHybridRNNTCTCModel.transcribe`` --
  :func:`.offline_transcribe.install_offline_transcribe`: the offline path (``greedy.offline_batching``).
* ``PipelineBuilder.build_pipeline`` -- :func:`.pipeline_type.install_pipeline_type`: ``pipeline_type:
  fast_cache_aware`` builds our streaming engine (:mod:`.streaming_pipeline`).
* the ``nemo_logger`` filter -- :func:`.logs.quiet_repeated_nemo_lines`: NeMo's repeated set-up lines shown once.
* ``cuda_python_utils.run_nvrtc`` -- :func:`.nvrtc.guard_nemo_nvrtc`: NeMo's NVRTC helper without its write into
  CPython's shared ``b" "``.
* the capturing computers' ``_graph_reinitialize`` -- :func:`.captures.guard_nemo_captures`: NeMo's decoders
  capture CUDA graphs with the garbage collector paused.

Applied by the apps only (not at import): :func:`.one_line_logs.one_line_nemo_messages`, a filter on NeMo's logger
that prints each of its messages on one line, once.

Besides the patches: :mod:`.streaming_pipeline` (our streaming engine behind NeMo's streaming inference pipeline
interface), :mod:`.context` (context managers around NeMo calls), and :mod:`.constants` (the names NeMo's configs
use for us), which ``autoload/nemo_fastdecode_autoload.py`` (run at interpreter start) reads without importing
this package.

Importing this package itself imports nothing from NeMo: the patch functions do, when :func:`install` runs
(``import nemo_fastdecode`` calls it).
"""

from nemo_fastdecode.nemo.patches import PATCHES, Patch, install

__all__ = ["PATCHES", "Patch", "install"]
