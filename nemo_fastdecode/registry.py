"""The single hook into NeMo's transducer decoding construction.

NeMo builds every RNN-T/TDT decoding (model constructor, ``change_decoding_strategy``, ``transcribe``
with timestamps, hybrid models' RNN-T head, cache-aware ``conformer_stream_step``) through
``AbstractRNNTDecoding.__init__``, which only knows NeMo's own strategy names. :func:`register`
wraps that constructor once: for one of our strategies it lets NeMo set everything up as for the
stand-in strategy it mirrors (same config keys: confidence, timestamps, punctuation, ...), then
replaces the decoding computer with ours and restores the strategy name in ``cfg``. NeMo's own
strategies go through untouched; an unknown name fails with the full list of valid ones.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import is_dataclass

from nemo.collections.asr.parts.context_biasing import BoostingTreeModelConfig
from nemo.collections.asr.parts.submodules import rnnt_decoding
from omegaconf import DictConfig, OmegaConf, open_dict

# our strategy name -> NeMo strategy whose configuration keys it takes
STAND_IN_STRATEGY = {"fast_greedy": "greedy_batch"}
# options of the stand-in's config section that we accept; others NeMo reads itself or we reject below
FAST_GREEDY_OPTIONS = {
    "max_symbols",
    "max_symbols_per_step",
    "loop_labels",
    "use_cuda_graph_decoder",
    "graph_mode",
    "preserve_alignments",
    "preserve_frame_confidence",
    "compute_timestamps",
    "confidence_method_cfg",
    "ngram_lm_model",
    "ngram_lm_alpha",
    "boosting_tree",
    "boosting_tree_alpha",
    "enable_per_stream_biasing",
    "tdt_include_token_duration",
    "tdt_include_duration_confidence",
}

_original_init: Callable | None = None


def nemo_strategies() -> list[str]:
    return [s.value for s in rnnt_decoding.TransducerDecodingStrategyType]


def valid_strategies() -> list[str]:
    """Every transducer decoding strategy name, NeMo's and ours."""
    return nemo_strategies() + sorted(STAND_IN_STRATEGY)


def register() -> None:
    """Install the hook (idempotent). Called when ``nemo_fastdecode`` is imported."""
    global _original_init
    if _original_init is not None:
        return
    _original_init = rnnt_decoding.AbstractRNNTDecoding.__init__

    @functools.wraps(_original_init)
    def init_with_fast_strategies(self, decoding_cfg, decoder, joint, blank_id, *args, **kwargs):
        if is_dataclass(decoding_cfg):
            decoding_cfg = OmegaConf.structured(decoding_cfg)
        strategy = decoding_cfg.get("strategy", None)
        if strategy not in STAND_IN_STRATEGY:
            if strategy not in nemo_strategies():
                raise ValueError(
                    f"Unknown transducer decoding strategy {strategy!r}; valid strategies: {', '.join(valid_strategies())}"
                )
            return _original_init(self, decoding_cfg, decoder, joint, blank_id, *args, **kwargs)
        stand_in = _stand_in_config(decoding_cfg)
        _original_init(self, stand_in, decoder, joint, blank_id, *args, **kwargs)
        self.decoding = _build_fast_greedy(self, decoding_cfg, decoder, joint)
        self.cfg = decoding_cfg

    rnnt_decoding.AbstractRNNTDecoding.__init__ = init_with_fast_strategies


def unregister() -> None:
    """Remove the hook (tests)."""
    global _original_init
    if _original_init is not None:
        rnnt_decoding.AbstractRNNTDecoding.__init__ = _original_init
        _original_init = None


def _stand_in_config(decoding_cfg: DictConfig) -> DictConfig:
    # a plain (non-structured) copy: structured configs from our dataclasses refuse pop()
    stand_in = OmegaConf.create(OmegaConf.to_container(decoding_cfg))
    with open_dict(stand_in):
        stand_in.strategy = STAND_IN_STRATEGY[decoding_cfg.strategy]
        if stand_in.get("greedy") is None:
            stand_in.greedy = {}
        # NeMo's own computer is replaced right away: never let it capture graphs
        stand_in.greedy.use_cuda_graph_decoder = False
        stand_in.greedy.pop("graph_mode", None)
    return stand_in


def _build_fast_greedy(decoding, decoding_cfg: DictConfig, decoder, joint):
    from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer

    greedy_cfg = decoding_cfg.get("greedy") or {}
    unknown = sorted(set(greedy_cfg.keys()) - FAST_GREEDY_OPTIONS)
    if unknown:
        raise ValueError(
            f"Unsupported fast_greedy option(s) {unknown}; valid options: {', '.join(sorted(FAST_GREEDY_OPTIONS))}"
        )
    unsupported = []
    if decoding.preserve_alignments:
        unsupported.append("preserve_alignments")
    if decoding.preserve_frame_confidence:
        unsupported.append("confidence (preserve_frame_confidence / confidence_cfg)")
    boosting_tree = greedy_cfg.get("boosting_tree")
    if greedy_cfg.get("ngram_lm_model") or (boosting_tree and not BoostingTreeModelConfig.is_empty(boosting_tree)):
        unsupported.append("n-gram LM / boosting tree fusion")
    if greedy_cfg.get("enable_per_stream_biasing"):
        unsupported.append("per-stream biasing")
    if decoding._with_multiple_blanks:
        unsupported.append("multi-blank models")
    if unsupported:
        raise NotImplementedError(
            f"fast_greedy does not support {', '.join(unsupported)}; use strategy 'greedy_batch' for these"
        )
    if decoding._is_tdt and not greedy_cfg.get("loop_labels", True):
        raise ValueError("loop_labels=False (frame looping) is RNN-T only; TDT models decode with loop_labels=True")
    return FastGreedyBatchedInfer(
        decoder_model=decoder,
        joint_model=joint,
        blank_index=decoding.blank_id,
        max_symbols_per_step=greedy_cfg.get("max_symbols", None) or greedy_cfg.get("max_symbols_per_step", None),
        durations=list(decoding.durations) if decoding._is_tdt else None,
        loop_labels=greedy_cfg.get("loop_labels", True),
        use_cuda_graph_decoder=greedy_cfg.get("use_cuda_graph_decoder", True),
        graph_mode=greedy_cfg.get("graph_mode", "auto"),
        include_duration=decoding.tdt_include_token_duration,
    )
