"""The single hook into NeMo's transducer decoding construction.

NeMo builds every RNN-T/TDT decoding (model constructor, ``change_decoding_strategy``, ``transcribe``
with timestamps, hybrid models' RNN-T head, cache-aware ``conformer_stream_step``) through
``AbstractRNNTDecoding.__init__``, which only knows NeMo's own strategy names. :func:`register`
wraps that constructor once: for one of our strategies it lets NeMo set everything up as for the
stand-in strategy it mirrors (same config keys: confidence, timestamps, punctuation, ...), then
replaces the decoding computer with ours and restores the strategy name in ``cfg``. NeMo's own
strategies go through untouched; an unknown name fails with the full list of valid ones. Our
strategies are rows of one table, :data:`FAST_STRATEGIES` (stand-in, config section, options dataclass, builder);
the keys they accept and the defaults they fill in come from the dataclasses in :mod:`nemo_fastdecode.config`.

The hook is one patch of :data:`nemo_fastdecode.nemo.PATCHES` (:func:`install_decoding_hook`, applied by
:func:`register` with the others). Idempotent: the wrapper is marked, NeMo's constructor is its ``__wrapped__``
(assigning that back undoes it). A portable ``.nemo`` config (NeMo's stand-in strategy, ours under
:data:`PORTABLE_KEY`, written by :mod:`.portable`) is turned back into ours here.

Building one of our strategies also starts Triton's once-per-process set-up on a background thread where a GPU is
present (:func:`nemo_fastdecode.kernels.warm_up.start_triton_warm_up`): a decoding is built as the model is
constructed, before its weights load and it moves to the GPU, so the set-up hides behind model loading.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, is_dataclass
from pathlib import Path

from nemo.collections.asr.parts.submodules import rnnt_decoding
from nemo.collections.asr.parts.submodules.rnnt_beam_decoding import BeamRNNTInferConfig
from nemo.collections.asr.parts.submodules.rnnt_greedy_decoding import GreedyBatchedRNNTInferConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from nemo_fastdecode.config import (
    FastBeamConfig,
    FastGreedyConfig,
    fusion_keys,
    greedy_max_symbols_setting,
    option_names,
    options_from_section,
)
from nemo_fastdecode.kernels import warm_up
from nemo_fastdecode.logs import logger
from nemo_fastdecode.nemo.constants import FAST_PIPELINE_TYPE, PORTABLE_KEY  # noqa: F401  (FAST_PIPELINE_TYPE: re-exported)
from nemo_fastdecode.nemo.patches import is_ours, mark
from nemo_fastdecode.nemo.pipeline_type import wants_fast_pipeline  # noqa: F401  (re-exported)

# the top-level keys NeMo's decoding section has (before register() adds fields to the sections' dataclasses)
_DECODING_KEYS = option_names(rnnt_decoding.RNNTDecodingConfig) | {PORTABLE_KEY}


@dataclass(frozen=True)
class FastStrategy:
    """One of our strategies and how it plugs into NeMo.

    Attributes:
        stand_in: NeMo strategy whose configuration keys it takes; NeMo sets the decoding up as for it.
        section: the ``decoding`` sub-section holding its options (``greedy`` / ``beam``).
        options_class: our options dataclass (:mod:`nemo_fastdecode.config`): names, defaults, validation.
        nemo_options: the keys NeMo accepts in that section for the stand-in (its config dataclass, plus the
            keys its ``RNNTDecoding`` reads from the section directly).
        graphs_switch: the stand-in's key that allows CUDA graphs (off: NeMo's computer is replaced at once).
        build: ``(decoding, decoding_cfg, options, decoder, joint) -> decoding module`` replacing NeMo's (``options``:
            the section parsed once, an instance of ``options_class``).
        records_steps: keeps NeMo's alignments and confidence (``preserve_alignments``, ``confidence_cfg``, ...);
            otherwise they are refused.
        fuses: applies the n-gram LM / boosting tree NeMo's set-up loads (``ngram_lm_model``, ``boosting_tree``);
            otherwise they are refused.
    """

    stand_in: str
    section: str
    options_class: type
    nemo_options: frozenset[str]
    graphs_switch: str
    build: Callable
    records_steps: bool = False
    fuses: bool = False

    @property
    def options(self) -> frozenset[str]:
        """Keys accepted in the section (anything else is a typo or an unsupported feature)."""
        return self.nemo_options | option_names(self.options_class)

    @property
    def own_options(self) -> frozenset[str]:
        """Our keys, removed before NeMo sees the stand-in's config."""
        return option_names(self.options_class) - self.nemo_options


def _build_fast_greedy(decoding, decoding_cfg: DictConfig, options: FastGreedyConfig, decoder, joint):
    from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer

    section = decoding_cfg.get("greedy") or {}
    if decoding._is_tdt and not options.loop_labels:
        raise ValueError("loop_labels=False (frame looping) is RNN-T only; TDT models decode with loop_labels=True")
    nemo_computer = getattr(decoding.decoding, "decoding_computer", None)  # NeMo's, built for the stand-in
    return FastGreedyBatchedInfer.from_options(
        options,
        decoder_model=decoder,
        joint_model=joint,
        blank_index=decoding.blank_id,
        # as NeMo's RNNTDecoding reads it (max_symbols, else max_symbols_per_step); the decoder resolves it
        max_symbols_per_step=greedy_max_symbols_setting(section),
        durations=list(decoding.durations) if decoding._is_tdt else None,
        include_duration=decoding.tdt_include_token_duration,
        # the n-gram LM / boosting tree as NeMo's set-up loaded them for the stand-in (None: no fusion)
        fusion_models=getattr(nemo_computer, "fusion_models", None) or None,
        fusion_models_alpha=getattr(nemo_computer, "fusion_models_alpha", None) or None,
        enable_per_stream_biasing=bool(section.get("enable_per_stream_biasing", False)),
        # as NeMo's set-up resolved them for the stand-in (top level, greedy section, confidence_cfg)
        preserve_alignments=bool(decoding.preserve_alignments),
        preserve_frame_confidence=decoding.preserve_frame_confidence,
        exclude_blank_from_confidence=decoding.exclude_blank_from_confidence,
        confidence_method_cfg=decoding.confidence_method_cfg,
        include_duration_confidence=decoding.tdt_include_duration_confidence,
    )


def _build_fast_beam(decoding, decoding_cfg: DictConfig, options: FastBeamConfig, decoder, joint):
    from nemo_fastdecode.beam.infer import FastBeamBatchedInfer

    section = decoding_cfg.get("beam") or {}
    if section.get("beam_size") is None:
        raise ValueError("fast_beam needs decoding.beam.beam_size (e.g. 4)")
    # as NeMo's malsd_batch: `beam.max_symbols`; NeMo ignores `beam.max_symbols_per_step`
    per_step = section.get("max_symbols_per_step", None)
    if per_step is not None and per_step != options.max_symbols:
        logger.warning(
            "nemo_fastdecode: beam.max_symbols_per_step=%s has no effect (malsd_batch and fast_beam read "
            "beam.max_symbols, here %s)",
            per_step,
            options.max_symbols,
        )
    if section.get("softmax_temperature", 1.0) != 1.0:
        logger.warning("nemo_fastdecode: beam.softmax_temperature has no effect in malsd_batch and fast_beam")
    nemo_computer = getattr(decoding.decoding, "decoding_computer", None)  # NeMo's, built for the stand-in
    return FastBeamBatchedInfer.from_options(
        options,
        decoder_model=decoder,
        joint_model=joint,
        blank_index=decoding.blank_id,
        durations=list(decoding.durations) if decoding._is_tdt else None,
        # the n-gram LM / boosting tree and fusion modes as NeMo's set-up made them for the stand-in
        fusion_models=getattr(nemo_computer, "fusion_models", None) or None,
        fusion_models_alpha=getattr(nemo_computer, "fusion_models_alpha", None) or None,
        pruning_mode=getattr(nemo_computer, "pruning_mode", None),
        blank_lm_score_mode=getattr(nemo_computer, "blank_lm_score_mode", None),
    )


FAST_STRATEGIES: dict[str, FastStrategy] = {
    "fast_greedy": FastStrategy(
        stand_in="greedy_batch",
        section="greedy",
        options_class=FastGreedyConfig,
        # NeMo's RNNTDecoding reads `max_symbols` and `compute_timestamps` from the greedy section too
        nemo_options=option_names(GreedyBatchedRNNTInferConfig) | {"max_symbols", "compute_timestamps"},
        graphs_switch="use_cuda_graph_decoder",
        build=_build_fast_greedy,
        records_steps=True,
        fuses=True,
    ),
    "fast_beam": FastStrategy(
        stand_in="malsd_batch",
        section="beam",
        options_class=FastBeamConfig,
        # merged NeMo configs carry every key of its beam section; malsd_batch reads `max_symbols`
        nemo_options=option_names(BeamRNNTInferConfig) | {"max_symbols"},
        graphs_switch="allow_cuda_graphs",
        build=_build_fast_beam,
        fuses=True,
    ),
}
# our strategy name -> NeMo strategy whose configuration keys it takes
STAND_IN_STRATEGY = {name: strategy.stand_in for name, strategy in FAST_STRATEGIES.items()}


def nemo_strategies() -> list[str]:
    return [s.value for s in rnnt_decoding.TransducerDecodingStrategyType]


def valid_strategies() -> list[str]:
    """Every transducer decoding strategy name, NeMo's and ours."""
    return nemo_strategies() + sorted(FAST_STRATEGIES)


def register() -> None:
    """Register our strategies and apply every NeMo patch (idempotent): :func:`nemo_fastdecode.nemo.install`.
    Called when ``nemo_fastdecode`` is imported."""
    from nemo_fastdecode.nemo.patches import install

    install()


def install_decoding_hook() -> None:
    """Wrap ``AbstractRNNTDecoding.__init__`` so that it builds our strategies (idempotent)."""
    nemo_init = rnnt_decoding.AbstractRNNTDecoding.__init__
    if is_ours(nemo_init):
        return

    @functools.wraps(nemo_init)
    def init_with_fast_strategies(self, decoding_cfg, decoder, joint, blank_id, *args, **kwargs):
        if is_dataclass(decoding_cfg):
            decoding_cfg = OmegaConf.structured(decoding_cfg)
        strategy = _restore_portable_strategy(decoding_cfg)
        fast = FAST_STRATEGIES.get(strategy)
        if fast is None:
            if strategy not in nemo_strategies():
                raise ValueError(
                    f"Unknown transducer decoding strategy {strategy!r}; valid strategies: {', '.join(valid_strategies())}"
                )
            return nemo_init(self, decoding_cfg, decoder, joint, blank_id, *args, **kwargs)
        # before NeMo's set-up: it would load an n-gram LM or reject a multi-blank model in the stand-in's words
        _check_decoding_keys(strategy, decoding_cfg)
        options = _check_options(strategy, fast, decoding_cfg)
        warm_up.start_triton_warm_up()  # where a GPU is present; behind the model's loading, before its first decode
        nemo_init(self, _stand_in_config(decoding_cfg, fast), decoder, joint, blank_id, *args, **kwargs)
        if self.preserve_frame_confidence and not fast.records_steps:
            _unsupported(strategy, fast, ["confidence (preserve_frame_confidence / confidence_cfg)"])
        self.decoding = fast.build(self, decoding_cfg, options, decoder, joint)
        self.cfg = decoding_cfg

    rnnt_decoding.AbstractRNNTDecoding.__init__ = mark(init_with_fast_strategies, nemo_init)


def decoding_targets() -> dict[str, object]:
    return {"AbstractRNNTDecoding.__init__": rnnt_decoding.AbstractRNNTDecoding.__init__}


def _unsupported(strategy: str, fast: FastStrategy, features: list[str]) -> None:
    raise NotImplementedError(
        f"{strategy} does not support {', '.join(features)}; use strategy '{fast.stand_in}' for these"
    )


def _unknown_keys_message(strategy: str, keys: Iterable[str], valid: Iterable[str], where: str, noun: str) -> str:
    """``"Unknown fast_greedy key(s) ['greddy'] in decoding (did you mean 'greddy' -> 'greedy'?); valid keys: ..."``."""
    valid = sorted(valid)
    keys = sorted(keys)
    hints = [f"{key!r} -> {match[0]!r}" for key in keys if (match := difflib.get_close_matches(key, valid, n=1))]
    hint = f" (did you mean {', '.join(hints)}?)" if hints else ""
    return f"Unknown {strategy} {noun}(s) {keys} in {where}{hint}; valid {noun}s: {', '.join(valid)}"


def _check_decoding_keys(strategy: str, decoding_cfg: DictConfig) -> None:
    """A misspelled section (``greddy:``) in the decoding config of one of our strategies is an error, not ignored."""
    unknown = set(decoding_cfg.keys()) - _DECODING_KEYS
    if unknown:
        raise ValueError(_unknown_keys_message(strategy, unknown, _DECODING_KEYS, "decoding", noun="key"))


def _check_options(strategy: str, fast: FastStrategy, decoding_cfg: DictConfig):
    """The section's options (an instance of ``fast.options_class``, parsed and validated once); unknown keys in the
    section (ValueError) and features we do not support (NotImplementedError) are refused."""
    section = decoding_cfg.get(fast.section) or {}
    unknown = set(section.keys()) - fast.options
    if unknown:
        raise ValueError(
            _unknown_keys_message(strategy, unknown, fast.options, f"decoding.{fast.section}", noun="option")
        )
    # types and values (fusion needs the label loop, ...), before NeMo's stand-in reads the keys we share with it
    options = options_from_section(fast.options_class, section, f"decoding.{fast.section}")
    unsupported = []
    # NeMo takes the section's value when the top-level one is unset (greedy strategies)
    alignments = decoding_cfg.get("preserve_alignments", None)
    if not fast.records_steps and (alignments or (alignments is None and section.get("preserve_alignments", False))):
        unsupported.append("preserve_alignments")
    fusion = fusion_keys(section)
    if fusion and not fast.fuses:
        unsupported.append(f"n-gram LM / boosting tree fusion ({' / '.join(fusion)})")
    elif fusion:
        _check_lm_file(fast, section)
    if decoding_cfg.get("big_blank_durations"):
        unsupported.append("multi-blank models")
    if unsupported:
        _unsupported(strategy, fast, unsupported)
    return options


def _check_lm_file(fast: FastStrategy, section: Mapping) -> None:
    """The n-gram LM file exists (that fusion needs the label loop, the options dataclass checks)."""
    where = f"decoding.{fast.section}"
    lm_path = section.get("ngram_lm_model")
    if lm_path and not Path(str(lm_path)).is_file():
        raise ValueError(
            f"{where}.ngram_lm_model={str(lm_path)!r}: no such file (an ARPA file or NeMo's .nemo n-gram LM)"
        )


def _stand_in_config(decoding_cfg: DictConfig, fast: FastStrategy) -> DictConfig:
    # a plain (non-structured) copy: structured configs from our dataclasses refuse pop()
    stand_in = OmegaConf.create(OmegaConf.to_container(decoding_cfg))
    with open_dict(stand_in):
        stand_in.strategy = fast.stand_in
        if stand_in.get(fast.section) is None:
            stand_in[fast.section] = {}
        section = stand_in[fast.section]
        # NeMo's own computer is replaced right away: never let it capture graphs or build a biasing model
        section[fast.graphs_switch] = False
        section.pop("enable_per_stream_biasing", None)
        for key in fast.own_options:
            section.pop(key, None)
    return stand_in


def _restore_portable_strategy(decoding_cfg: DictConfig) -> str | None:
    """The config's strategy; a portable config (stand-in strategy, ours under :data:`PORTABLE_KEY`) is turned back
    into ours in place, so that the model's config names the strategy that decodes."""
    strategy = decoding_cfg.get("strategy", None)
    portable = decoding_cfg.get(PORTABLE_KEY, None)
    if not portable:
        return strategy
    ours = portable.get("strategy", None)
    fast = FAST_STRATEGIES.get(ours)
    if fast is None:
        raise ValueError(
            f"decoding.{PORTABLE_KEY}.strategy={ours!r} is not one of this package's strategies "
            f"({', '.join(sorted(FAST_STRATEGIES))})"
        )
    if strategy != fast.stand_in:  # the user switched strategies since: theirs wins
        return strategy
    with open_dict(decoding_cfg):
        decoding_cfg.strategy = ours
        decoding_cfg.pop(PORTABLE_KEY)
    return ours


def portable_decoding_config(cfg: DictConfig) -> DictConfig | None:
    """A copy of a model config whose decoding loads anywhere: NeMo's stand-in strategy, ours under
    :data:`PORTABLE_KEY`; ``None`` when the model does not decode with one of our strategies."""
    decoding = cfg.get("decoding", None) if isinstance(cfg, (DictConfig, Mapping)) else None
    strategy = decoding.get("strategy", None) if decoding is not None else None
    if strategy not in FAST_STRATEGIES:
        return None
    portable = OmegaConf.create(OmegaConf.to_container(cfg))
    with open_dict(portable):
        portable.decoding.strategy = FAST_STRATEGIES[strategy].stand_in
        portable.decoding[PORTABLE_KEY] = {"strategy": strategy}
    return portable
