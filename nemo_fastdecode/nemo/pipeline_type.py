"""Patch: ``pipeline_type: fast_cache_aware`` in NeMo's streaming inference builder.

NeMo's ``PipelineBuilder.build_pipeline(cfg)`` (what ``asr_streaming_infer.py`` calls) knows only its own pipeline
types. :func:`install_pipeline_type` wraps it: a config with ``pipeline_type:``
:data:`~nemo_fastdecode.nemo.constants.FAST_PIPELINE_TYPE` (:func:`wants_fast_pipeline`) gets our
:class:`~nemo_fastdecode.nemo.streaming_pipeline.FastCacheAwarePipeline` (built on first use); every other type
goes to NeMo's builder untouched. Idempotent: the wrapper is marked; NeMo's builder is its ``__wrapped__``
(reinstall it as a ``staticmethod`` to undo).
"""

from __future__ import annotations

import functools

from nemo_fastdecode.nemo.constants import FAST_PIPELINE_TYPE
from nemo_fastdecode.nemo.patches import is_ours, mark

__all__ = ["install_pipeline_type", "pipeline_type_targets", "wants_fast_pipeline"]


def wants_fast_pipeline(cfg: object) -> bool:
    """NeMo's streaming inference config selects our engine (``pipeline_type: fast_cache_aware``, any case)."""
    getter = getattr(cfg, "get", None)
    pipeline_type = getter("pipeline_type", None) if getter is not None else getattr(cfg, "pipeline_type", None)
    return str(pipeline_type).lower() == FAST_PIPELINE_TYPE


def install_pipeline_type() -> None:
    """``PipelineBuilder.build_pipeline(cfg)`` builds our pipeline for :data:`FAST_PIPELINE_TYPE` (idempotent)."""
    from nemo.collections.asr.inference.factory.pipeline_builder import PipelineBuilder

    nemo_build = PipelineBuilder.build_pipeline  # a staticmethod: the plain function
    if is_ours(nemo_build):
        return

    @functools.wraps(nemo_build)
    def build_pipeline(cfg):
        if wants_fast_pipeline(cfg):
            from nemo_fastdecode.nemo.streaming_pipeline import build_pipeline as build_fast_pipeline

            return build_fast_pipeline(cfg)
        return nemo_build(cfg)

    PipelineBuilder.build_pipeline = staticmethod(mark(build_pipeline, nemo_build))


def pipeline_type_targets() -> dict[str, object]:
    from nemo.collections.asr.inference.factory.pipeline_builder import PipelineBuilder

    return {"PipelineBuilder.build_pipeline": PipelineBuilder.build_pipeline}
