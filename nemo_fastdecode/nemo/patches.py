"""The table of our patches to NeMo (:data:`PATCHES`) and :func:`install`, which applies them all.

Each patch is one function, ``install_*`` / ``guard_*`` in a module of this package, that replaces one NeMo
object (a method, a module function, a dataclass's fields, a logger's filter) and returns at once when it already
did: the objects it installs carry :data:`MARK` (dataclass fields in their ``metadata``), and a replaced function
keeps NeMo's as ``__wrapped__`` (assigning that back undoes the patch). Each row also names a ``targets`` function:
the objects NeMo's code now finds where the patch acts, which the tests check are ours and unchanged by a second
:func:`install`.

Standard library only: the NeMo modules are imported by the patch functions, when :func:`install` runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MARK", "PATCHES", "Patch", "install", "is_ours", "mark"]

#: The attribute (or, on a dataclass field, the ``metadata`` key) that marks an object installed by a patch.
MARK = "_nemo_fastdecode"


def mark(replacement: Callable[..., Any], original: Any = None) -> Callable[..., Any]:
    """``replacement`` marked as ours, with the NeMo object it replaces as ``__wrapped__`` (when given)."""
    setattr(replacement, MARK, True)
    if original is not None:
        replacement.__wrapped__ = original
    return replacement


def is_ours(obj: object) -> bool:
    """Whether ``obj`` was installed by one of our patches."""
    if getattr(obj, MARK, False) is True:
        return True
    metadata = getattr(obj, "metadata", None)
    return isinstance(metadata, Mapping) and metadata.get(MARK, False) is True


@dataclass(frozen=True)
class Patch:
    """One NeMo touch point.

    Attributes:
        name: what it patches, in NeMo's terms.
        module: our module that holds it (under ``nemo_fastdecode.nemo``).
        install_function: its idempotent install function in that module.
        targets_function: ``() -> {label: object}``, the objects the patch put in place (each :func:`is_ours`).
    """

    name: str
    module: str
    install_function: str
    targets_function: str

    def _function(self, name: str) -> Callable[..., Any]:
        return getattr(importlib.import_module(f"{__package__}.{self.module}"), name)

    def install(self) -> None:
        self._function(self.install_function)()

    def targets(self) -> dict[str, object]:
        return self._function(self.targets_function)()


#: Every patch, in the order :func:`install` applies them.
PATCHES: tuple[Patch, ...] = (
    Patch(
        "AbstractRNNTDecoding.__init__ (our strategy names)", "registry", "install_decoding_hook", "decoding_targets"
    ),
    Patch(
        "GreedyBatchedRNNTInferConfig / BeamRNNTInferConfig fields (our options)",
        "option_fields",
        "install_option_fields",
        "option_field_targets",
    ),
    Patch("FileIO.to_config_file (portable .nemo saves)", "portable", "install_portable_save", "portable_targets"),
    Patch(
        "EncDecRNNTModel / EncDecHybridRNNTCTCModel.transcribe (offline batching)",
        "offline_transcribe",
        "install_offline_transcribe",
        "offline_transcribe_targets",
    ),
    Patch(
        "PipelineBuilder.build_pipeline (pipeline_type: fast_cache_aware)",
        "pipeline_type",
        "install_pipeline_type",
        "pipeline_type_targets",
    ),
    Patch("nemo_logger filter (repeated set-up lines)", "logs", "quiet_repeated_nemo_lines", "logger_targets"),
    Patch("cuda_python_utils.run_nvrtc (shared b' ')", "nvrtc", "guard_nemo_nvrtc", "nvrtc_targets"),
    Patch("*Computer._graph_reinitialize (collector paused)", "captures", "guard_nemo_captures", "capture_targets"),
)


def install() -> None:
    """Apply every patch of :data:`PATCHES` (idempotent: a second call changes nothing)."""
    for patch in PATCHES:
        patch.install()
