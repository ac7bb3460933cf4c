"""Patch: our options become fields of NeMo's greedy and beam section dataclasses.

NeMo's Hydra schemas (``transcribe_speech.py``'s ``TranscriptionConfig``, every ``RNNTDecodingConfig``) are built
from ``GreedyBatchedRNNTInferConfig`` and ``BeamRNNTInferConfig``; without fields for our options,
``rnnt_decoding.greedy.fast_math=true`` would need Hydra's ``+``. :func:`install_option_fields` adds each option of
our options dataclasses (:mod:`nemo_fastdecode.config`; and NeMo's ``max_symbols``, which NeMo reads from the
greedy section without declaring it) to the existing classes, with our types and defaults, through
``dataclasses._FIELD``: the classes themselves must change, since the default factories of NeMo's configs refer to
them. NeMo reads its sections with ``.get`` and ignores keys it does not use. Idempotent: a field already there is
left alone (ours carry :data:`~nemo_fastdecode.nemo.patches.MARK` in their ``metadata``); deleting the added names
from ``__dataclass_fields__`` and ``__annotations__`` undoes it.
"""

from __future__ import annotations

import dataclasses
import typing

from nemo.collections.asr.parts.submodules.rnnt_beam_decoding import BeamRNNTInferConfig
from nemo.collections.asr.parts.submodules.rnnt_greedy_decoding import GreedyBatchedRNNTInferConfig

from nemo_fastdecode.nemo.patches import MARK
from nemo_fastdecode.nemo.registry import FAST_STRATEGIES, FastStrategy

__all__ = ["install_option_fields", "option_field_targets"]

# NeMo's greedy section reads `max_symbols` before `max_symbols_per_step`: unset by default, so NeMo's own
# strategies keep their behaviour; the beam section's `max_symbols` default (10) is what malsd_batch reads
_NEMO_FIELD_DEFAULTS = {("greedy", "max_symbols"): None}


def nemo_section_class(fast: FastStrategy) -> type:
    """NeMo's config dataclass of the strategy's section."""
    return GreedyBatchedRNNTInferConfig if fast.section == "greedy" else BeamRNNTInferConfig


def _added_fields(fast: FastStrategy) -> list[str]:
    """Our option names that NeMo's section dataclass did not declare itself."""
    target = nemo_section_class(fast)
    return [
        option.name
        for option in dataclasses.fields(fast.options_class)
        if option.name not in target.__dataclass_fields__ or MARK in target.__dataclass_fields__[option.name].metadata
    ]


def install_option_fields() -> None:
    """Our options (and NeMo's ``max_symbols``) as fields of NeMo's section dataclasses (idempotent)."""
    for fast in FAST_STRATEGIES.values():
        target = nemo_section_class(fast)
        hints = typing.get_type_hints(fast.options_class)
        for option in dataclasses.fields(fast.options_class):
            if option.name in target.__dataclass_fields__:
                continue
            default = _NEMO_FIELD_DEFAULTS.get((fast.section, option.name), option.default)
            field = dataclasses.field(default=default, metadata={MARK: True})
            field.name, field.type = option.name, _omegaconf_type(hints[option.name])
            field._field_type = dataclasses._FIELD
            target.__dataclass_fields__[option.name] = field
            target.__annotations__[option.name] = field.type
            setattr(target, option.name, default)


def option_field_targets() -> dict[str, object]:
    """The fields this patch added, by ``Class.name``."""
    return {
        f"{nemo_section_class(fast).__name__}.{name}": nemo_section_class(fast).__dataclass_fields__[name]
        for fast in FAST_STRATEGIES.values()
        for name in _added_fields(fast)
    }


def _omegaconf_type(hint: object) -> object:
    """``X | None`` as ``Optional[X]``: the form OmegaConf's structured configs understand."""
    args = typing.get_args(hint)
    if type(None) in args and len(args) == 2:
        return typing.Optional[next(a for a in args if a is not type(None))]  # noqa: UP045
    return hint
