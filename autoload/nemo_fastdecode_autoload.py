"""Make NeMo's own entry points accept ``fast_greedy`` / ``fast_beam`` with no wrapper and no ``import``.

``nemo_fastdecode.pth`` (installed beside this module in site-packages) imports this module when Python
starts. It loads nothing heavy: it installs an import hook that acts on two NeMo modules when they are first
imported, and at that moment only wraps a function or two; ``nemo_fastdecode`` itself is imported later, when
NeMo is fully loaded and one of its strategies is asked for:

* ``nemo.core.config.hydra_runner``: a script decorated with NeMo's ``hydra_runner`` (``transcribe_speech.py``,
  ``transcribe_speech_parallel.py``, the cache-aware streaming script) imports ``nemo_fastdecode`` when its
  ``main`` starts, before Hydra reads the command line, so that ``rnnt_decoding.strategy=fast_greedy`` and our
  options (``rnnt_decoding.greedy.fast_math=true``) are accepted without Hydra's ``+``.
* ``nemo.collections.asr.parts.submodules.rnnt_decoding``: building a decoding whose config names one of our
  strategies (``model.change_decoding_strategy``, a ``.nemo`` restore, NeMo's streaming pipelines) imports
  ``nemo_fastdecode`` first, which registers the strategies.
* ``nemo.collections.asr.inference.factory.pipeline_builder``: ``PipelineBuilder.build_pipeline(cfg)`` with
  ``pipeline_type: fast_cache_aware`` (NeMo's ``asr_streaming_infer.py`` and its YAMLs) imports ``nemo_fastdecode``
  first, whose registry then builds our streaming engine's pipeline; other pipeline types go to NeMo untouched.

It also quiets the OneLogger telemetry lines that NeMo prints on every import (the ``nv_one_logger`` loggers
are set to ERROR). Set ``NEMO_FASTDECODE_AUTOLOAD=0`` to switch all of this off. Only the standard library is
imported here.

The names NeMo's configs use for us (strategy names, the portable ``.nemo`` key, the ``pipeline_type``) are those
of ``nemo_fastdecode/nemo/constants.py``, read by :func:`constants` on first need (the first decoding or pipeline
NeMo builds) without importing the package: ``importlib.util.find_spec`` gives its folder, and the file (standard
library only) is executed on its own.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
from pathlib import Path

__all__ = ["constants", "install", "installed"]

_DECODING_MODULE = "nemo.collections.asr.parts.submodules.rnnt_decoding"
_HYDRA_RUNNER_MODULE = "nemo.core.config.hydra_runner"
_PIPELINE_BUILDER_MODULE = "nemo.collections.asr.inference.factory.pipeline_builder"
_CONSTANTS_MODULE = "nemo_fastdecode.nemo.constants"
_constants: dict[str, object] | None = None


def _read_constants() -> dict[str, object]:
    module = sys.modules.get(_CONSTANTS_MODULE)
    if module is not None:  # the package is imported already
        return {name: value for name, value in vars(module).items() if name.isupper()}
    try:
        spec = importlib.util.find_spec("nemo_fastdecode")  # a top-level package: found, not imported
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / "nemo" / "constants.py"
        if path.is_file():
            namespace: dict[str, object] = {"__name__": _CONSTANTS_MODULE, "__file__": str(path)}
            exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), namespace)
            return {name: value for name, value in namespace.items() if name.isupper()}
    return {}  # the package is gone (a stale .pth): nothing names our strategies, NeMo runs untouched


def constants() -> dict[str, object]:
    """The constants of ``nemo_fastdecode/nemo/constants.py`` (``STRATEGIES``, ``PORTABLE_KEY``,
    ``FAST_PIPELINE_TYPE``), read once, on first call."""
    global _constants
    if _constants is None:
        _constants = _read_constants()
    return _constants


def _strategies() -> tuple[str, ...]:
    return tuple(constants().get("STRATEGIES", ()))


def _wants_fastdecode(decoding_cfg) -> bool:
    """The decoding config names one of our strategies (directly, or in a portable config's sidecar)."""
    strategies = _strategies()
    if not strategies:
        return False
    try:
        if decoding_cfg.get("strategy", None) in strategies:
            return True
        sidecar = decoding_cfg.get(constants().get("PORTABLE_KEY"), None)
        return bool(sidecar) and sidecar.get("strategy", None) in strategies
    except AttributeError:  # a dataclass config: only NeMo's own strategies can be spelled there
        return getattr(decoding_cfg, "strategy", None) in strategies


def _patch_decoding(module) -> None:
    cls = module.AbstractRNNTDecoding
    nemo_init = cls.__init__

    def init_loading_nemo_fastdecode(self, decoding_cfg, *args, **kwargs):
        if _wants_fastdecode(decoding_cfg) and "nemo_fastdecode.nemo.registry" not in sys.modules:
            import nemo_fastdecode  # noqa: F401  (registers: replaces AbstractRNNTDecoding.__init__)

            return cls.__init__(self, decoding_cfg, *args, **kwargs)
        return nemo_init(self, decoding_cfg, *args, **kwargs)

    init_loading_nemo_fastdecode.__wrapped__ = nemo_init
    cls.__init__ = init_loading_nemo_fastdecode


def _patch_hydra_runner(module) -> None:
    nemo_hydra_runner = module.hydra_runner

    def hydra_runner(*args, **kwargs):
        decorate = nemo_hydra_runner(*args, **kwargs)

        def decorator(task_function):
            wrapped = decorate(task_function)

            def main(*main_args, **main_kwargs):
                import nemo_fastdecode  # noqa: F401  (registers; our options become fields of NeMo's schema)

                return wrapped(*main_args, **main_kwargs)

            main.__wrapped__ = wrapped
            main.__name__, main.__doc__ = getattr(wrapped, "__name__", "main"), getattr(wrapped, "__doc__", None)
            return main

        return decorator

    hydra_runner.__wrapped__ = nemo_hydra_runner
    module.hydra_runner = hydra_runner
    package = sys.modules.get("nemo.core.config")
    if package is not None and getattr(package, "hydra_runner", None) is nemo_hydra_runner:
        package.hydra_runner = hydra_runner


def _wants_fast_pipeline(cfg) -> bool:
    getter = getattr(cfg, "get", None)
    pipeline_type = getter("pipeline_type", None) if getter is not None else getattr(cfg, "pipeline_type", None)
    return pipeline_type is not None and str(pipeline_type).lower() == constants().get("FAST_PIPELINE_TYPE")


def _patch_pipeline_builder(module) -> None:
    builder = module.PipelineBuilder
    nemo_build = builder.build_pipeline  # a staticmethod: the plain function

    def build_pipeline_loading_nemo_fastdecode(cfg):
        if _wants_fast_pipeline(cfg) and "nemo_fastdecode.nemo.registry" not in sys.modules:
            import nemo_fastdecode  # noqa: F401  (registers: replaces PipelineBuilder.build_pipeline)

            return builder.build_pipeline(cfg)
        return nemo_build(cfg)

    build_pipeline_loading_nemo_fastdecode.__wrapped__ = nemo_build
    builder.build_pipeline = staticmethod(build_pipeline_loading_nemo_fastdecode)


_PATCHES = {
    _DECODING_MODULE: _patch_decoding,
    _HYDRA_RUNNER_MODULE: _patch_hydra_runner,
    _PIPELINE_BUILDER_MODULE: _patch_pipeline_builder,
}


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then the module's patch."""

    def __init__(self, loader: importlib.abc.Loader, patch) -> None:
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the NeMo modules to patch through the other finders and wraps their loaders."""

    def find_spec(self, fullname, path, target=None):
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


_finder: _Finder | None = None


def installed() -> bool:
    """Whether the hook is installed in this interpreter."""
    return _finder is not None


def install() -> None:
    """Install the hook (idempotent); modules NeMo already imported are patched at once."""
    global _finder
    if _finder is not None:
        return
    for name in ("nv_one_logger", "nv_one_logger.api.config", "nv_one_logger.training_telemetry"):
        logging.getLogger(name).setLevel(logging.ERROR)
    _finder = _Finder()
    sys.meta_path.insert(0, _finder)
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])


if os.environ.get("NEMO_FASTDECODE_AUTOLOAD", "1") != "0":
    install()
