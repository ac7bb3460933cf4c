"""Decoding options as dataclasses: the one place that names each option, its default and its valid values.

* :class:`FastGreedyConfig` -- the ``decoding.greedy`` section of ``strategy: fast_greedy``.
* :class:`FastGreedyDecodingConfig` -- the ``decoding`` section a NeMo user merges into a transducer
  model's config (``configs/decoding/fast_greedy.yaml``); every key also exists in NeMo's
  ``RNNTDecodingConfig``, so ``model.change_decoding_strategy(cfg)`` accepts it as is.
* :class:`FastBeamConfig` / :class:`FastBeamDecodingConfig` -- the same for ``strategy: fast_beam``
  (``configs/decoding/fast_beam.yaml``).
* :func:`options_from_section` -- a strategy's options read from a user's section, validated (once: the registry
  passes the result whole to the decoder classes' ``from_options``).
* :func:`greedy_max_symbols` -- NeMo's rule for the greedy ``max_symbols`` of a decoding section
  (:func:`greedy_max_symbols_setting`, the value set, then :func:`nemo_max_symbols`, what NeMo's decoders make of it).
* :func:`require_label_loop` -- the rule that fusion and per-stream biasing need the label loop, in one place.

The registry derives the keys it accepts and the defaults it fills in from these dataclasses; the YAML
files mirror them (tested). Use them as Hydra/OmegaConf schemas::

    cfg = OmegaConf.merge(OmegaConf.structured(FastGreedyDecodingConfig), OmegaConf.load(path))
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from nemo.collections.asr.parts.context_biasing import BoostingTreeModelConfig

from nemo_fastdecode.graphs.modes import GraphMode

__all__ = [
    "DEFAULT_MAX_SYMBOLS",
    "GRAPH_MODES",
    "FastBeamConfig",
    "FastBeamDecodingConfig",
    "FastGreedyConfig",
    "FastGreedyDecodingConfig",
    "LabelLoopOnly",
    "NemoDecodingKeys",
    "fusion_keys",
    "greedy_max_symbols",
    "greedy_max_symbols_setting",
    "nemo_max_symbols",
    "option_names",
    "options_from_section",
    "require_label_loop",
]

#: Valid values of ``decoding.greedy.graph_mode`` and ``decoding.beam.graph_mode``.
GRAPH_MODES: tuple[str, ...] = ("auto", *(mode.value for mode in GraphMode))

#: NeMo's default for ``max_symbols`` (``max_symbols_per_step`` in its greedy and beam configs).
DEFAULT_MAX_SYMBOLS = 10


def _check_graph_mode_and_max_symbols(graph_mode: str, max_symbols: int | None, unset: int | None = None) -> None:
    if graph_mode not in GRAPH_MODES:
        raise ValueError(f"graph_mode={graph_mode!r} is not valid; valid values: {', '.join(GRAPH_MODES)}")
    if max_symbols is not None and max_symbols != unset and max_symbols < 1:
        allowed = "None" if unset is None else f"None or {unset} (unset)"
        raise ValueError(f"max_symbols must be >= 1 or {allowed}, got {max_symbols}")


class LabelLoopOnly(ValueError):
    """``features`` were asked for with the frame-looping algorithm; they are implemented in the label loop only."""

    def __init__(self, features: Sequence[str], where: str = "") -> None:
        self.features = list(features)
        prefix = f"{where}." if where else ""
        switch = f"{prefix}loop_labels={'true' if where else 'True'}"  # a config's spelling, or Python's
        super().__init__(
            f"{' / '.join(prefix + feature for feature in self.features)} needs {switch}: n-gram LM / boosting tree "
            "fusion and per-stream biasing are implemented for the label-looping algorithm only (NeMo's frame loop "
            "refuses them too)"
        )


def require_label_loop(features: Sequence[str], loop_labels: bool, where: str = "") -> None:
    """The rule, in one place: fusion (``ngram_lm_model``, ``boosting_tree``, NeMo's ``fusion_models``) and per-stream
    biasing need ``loop_labels``; raises :class:`LabelLoopOnly` naming ``features`` (those asked for) otherwise."""
    if features and not loop_labels:
        raise LabelLoopOnly(features, where)


def fusion_keys(section: Mapping[str, Any] | Any) -> list[str]:
    """The fusion options a section (or options object) sets: ``ngram_lm_model`` and/or a non-empty
    ``boosting_tree``."""
    get = (
        section.get if isinstance(section, Mapping) or hasattr(section, "get") else functools.partial(getattr, section)
    )
    boosting_tree = get("boosting_tree", None)
    if type(boosting_tree) is dict:  # a plain section (OmegaConf's and the dataclass have attributes)
        boosting_tree = BoostingTreeModelConfig(**boosting_tree)
    keys = ["ngram_lm_model"] if get("ngram_lm_model", None) else []
    return keys + (["boosting_tree"] if boosting_tree and not BoostingTreeModelConfig.is_empty(boosting_tree) else [])


def _check_fast_encoder(options: FastGreedyConfig | FastBeamConfig) -> None:
    if options.fast_encoder and not options.offline_batching:
        raise ValueError("fast_encoder: true runs on the offline path: set offline_batching: true with it")


@dataclass
class FastGreedyConfig:
    """``decoding.greedy`` for ``strategy: fast_greedy``.

    Attributes:
        max_symbols: most tokens emitted per encoder frame, as in NeMo (``None`` falls back to
            ``max_symbols_per_step``, whose NeMo default is 10; see :func:`greedy_max_symbols`).
        loop_labels: label-looping algorithm (default); ``False`` selects frame looping (RNN-T only).
        use_cuda_graph_decoder: allow CUDA graphs; ignored on the CPU.
        graph_mode: ``auto`` (best mode the driver supports), ``full_graph`` (conditional WHILE nodes,
            CUDA >= 12.3), ``no_while_graph`` (graphs without conditional nodes) or ``eager``.
        fused_kernels: fused Triton step kernels, bit-identical to the torch ops they replace; ``None``: on CUDA.
        fast_math: opt-in: the prediction network and the joint's output layer on near-fp32 (3xTF32) tensor-core
            kernels, with a precomputed label table; faster, not bit-identical to NeMo (the benchmark reports its
            agreement). It decodes in fp32 whatever the caller's autocast (the encoder output is taken to fp32).
        exact_predictor: opt-in, label looping without ``fast_math``, float32 decodes on CUDA: the prediction network's
            step on IEEE-fp32 kernels (:class:`~nemo_fastdecode.prediction.ExactPredictor`: a label table, the
            recurrent GEMMs beside the joint's look, every product and the joint's output layer on an IEEE-fp32
            few-row CUDA kernel) and the joint looking several frames ahead per call. Faster; its scores agree with
            NeMo's to float32 rounding, so a near-tie may break the other way (the benchmarks report its agreement).
            ``False`` (default): NeMo's own modules (cuDNN LSTM, cuBLAS), op for op and shape for shape, NeMo's bits.
        offline_batching: opt-in: the model's ``transcribe`` (NeMo's ``transcribe_speech.py`` too) takes the offline
            path (:mod:`nemo_fastdecode.offline`): length-sorted batches under a padded-audio budget, audio read
            ahead on threads, the decoder sized once; results in the input order. Other batches than NeMo's give the
            encoder other padding and kernels, so a near-tie can decode the other way, as it can when NeMo's own
            ``batch_size`` changes (the transcribe benchmark reports the agreement).
        fast_encoder: opt-in, with ``offline_batching``: the offline path's fused encoder
            (:mod:`nemo_fastdecode.offline.fast_encoder`); equal to NeMo's encoder to rounding only.
        ngram_lm_model: NeMo's key: an n-gram LM to fuse (ARPA file, or NeMo's ``.nemo`` n-gram format; loaded by
            NeMo's ``NGramGPULanguageModel.from_file``); label looping only; ``None``: no LM.
        ngram_lm_alpha: NeMo's key: the LM's weight (its scores, natural log, times alpha, added to the logits).
        boosting_tree: NeMo's key: a phrase-boosting tree (NeMo's ``BoostingTreeModelConfig``: key phrases or a built
            ``.nemo`` tree; needs the model's tokenizer); label looping only.
        boosting_tree_alpha: NeMo's key: the boosting tree's weight.
    """

    max_symbols: int | None = DEFAULT_MAX_SYMBOLS
    loop_labels: bool = True
    use_cuda_graph_decoder: bool = True
    graph_mode: str = "auto"
    fused_kernels: bool | None = None
    fast_math: bool = False
    exact_predictor: bool = False
    offline_batching: bool = False
    fast_encoder: bool = False
    ngram_lm_model: str | None = None
    ngram_lm_alpha: float = 0.0
    boosting_tree: BoostingTreeModelConfig = field(default_factory=BoostingTreeModelConfig)
    boosting_tree_alpha: float = 0.0

    def __post_init__(self) -> None:
        # 0 is unset, as in NeMo: max_symbols_per_step applies (see greedy_max_symbols)
        _check_graph_mode_and_max_symbols(self.graph_mode, self.max_symbols, unset=0)
        require_label_loop(fusion_keys(self), self.loop_labels)
        _check_fast_encoder(self)


@dataclass
class NemoDecodingKeys:
    """The keys of NeMo's ``RNNTDecodingConfig`` that every ``decoding`` section here carries, NeMo's meaning.

    Attributes:
        compute_timestamps: fill ``Hypothesis.timestamp`` with char/word/segment timestamps
            (``None``: NeMo's default; ``transcribe(timestamps=True)`` turns it on).
        preserve_alignments: keep per-step alignments, as NeMo's greedy decoders do (``fast_greedy``; ``fast_beam``
            refuses them, as ``malsd_batch`` does).
        tdt_include_token_duration: fill ``Hypothesis.token_duration`` for TDT models.
        fused_batch_size: NeMo's fused joint batch size (``None``: off), as in ``RNNTDecodingConfig``.
        rnnt_timestamp_type: which timestamps to compute: ``all``, ``char``, ``word`` or ``segment``.
        word_seperator: separator between words for word timestamps (NeMo's spelling).
        segment_gap_threshold: frames of silence that end a segment (``None``: punctuation only).
        temperature: logit temperature applied by the joint.
    """

    compute_timestamps: bool | None = None
    preserve_alignments: bool | None = None
    tdt_include_token_duration: bool | None = None
    fused_batch_size: int | None = None
    rnnt_timestamp_type: str = "all"
    word_seperator: str = " "
    segment_gap_threshold: int | None = None
    temperature: float = 1.0


@dataclass
class FastGreedyDecodingConfig(NemoDecodingKeys):
    """The ``decoding`` section selecting ``fast_greedy`` (a subset of NeMo's ``RNNTDecodingConfig``).

    Attributes:
        strategy: ``fast_greedy``, or any NeMo transducer strategy (``greedy_batch``, ``beam``, ...).
        greedy: options of the greedy strategies.
        (the other keys: :class:`NemoDecodingKeys`)
    """

    strategy: str = "fast_greedy"
    greedy: FastGreedyConfig = field(default_factory=FastGreedyConfig)


@dataclass
class FastBeamConfig:
    """``decoding.beam`` for ``strategy: fast_beam``: the keys NeMo's ``malsd_batch`` reads, plus ours.

    Attributes:
        beam_size: hypotheses kept per utterance, ``1..16`` (and at most the number of non-blank tokens).
        max_symbols: most tokens per encoder frame and hypothesis (the key ``malsd_batch`` reads; NeMo's
            ``max_symbols_per_step`` has no effect there); ``None``: no limit.
        score_norm: rank hypotheses by score / (tokens + 1) when choosing the best and ordering the n-best.
        return_best_hypothesis: the best hypothesis per utterance; ``False``: NeMo ``NBestHypotheses``.
        allow_cuda_graphs: allow CUDA graphs; ignored on the CPU.
        graph_mode: as for ``fast_greedy`` (``auto``, ``full_graph``, ``no_while_graph``, ``eager``).
        fused_topk: ``None``: the Triton beam-step kernels (top-k, candidate selection) on CUDA, their torch
            references elsewhere; ``False`` keeps PyTorch's arithmetic on CUDA too (bit-identical to ``malsd_batch``).
        fast_math: opt-in, as for ``fast_greedy``: the prediction network and the joint's output layer on
            near-fp32 (3xTF32) tensor-core kernels; not bit-identical (the benchmark reports its agreement).
        compiled_step: experimental, CUDA only: each search step's pure-torch parts (candidate selection,
            hypothesis update, state gathers) fused by ``torch.compile`` (compiles on first use, tens of seconds).
        ngram_lm_model / ngram_lm_alpha / boosting_tree / boosting_tree_alpha: NeMo's keys, as for ``fast_greedy``:
            the n-gram LM and phrase-boosting tree fused into the search, as ``malsd_batch`` fuses them (the fusion
            steps run on the torch top-k and selection, not the Triton beam-step kernels).
        pruning_mode: NeMo's key: when the fusion scores join the ranking: ``late`` (before the top-k, the default of
            NeMo's ``malsd_batch`` set-up) or ``early`` (added to the top-k of the unfused log-probabilities).
        blank_lm_score_mode: NeMo's key: ``lm_weighted_full`` (blank's log-probability times ``1 + sum(alphas)``,
            labels also get ``log(1 - p(blank)) * sum(alphas)``) or ``no_score`` (blank unchanged).
        offline_batching, fast_encoder: opt-in, as for ``fast_greedy``: the model's ``transcribe`` on the offline
            path, and its fused encoder.
    """

    beam_size: int = 4
    max_symbols: int | None = DEFAULT_MAX_SYMBOLS
    score_norm: bool = True
    return_best_hypothesis: bool = True
    allow_cuda_graphs: bool = True
    graph_mode: str = "auto"
    fused_topk: bool | None = None
    fast_math: bool = False
    compiled_step: bool = False
    ngram_lm_model: str | None = None
    ngram_lm_alpha: float = 0.0
    boosting_tree: BoostingTreeModelConfig = field(default_factory=BoostingTreeModelConfig)
    boosting_tree_alpha: float = 0.0
    pruning_mode: str = "late"
    blank_lm_score_mode: str = "lm_weighted_full"
    offline_batching: bool = False
    fast_encoder: bool = False

    def __post_init__(self) -> None:
        _check_graph_mode_and_max_symbols(self.graph_mode, self.max_symbols)
        _check_fast_encoder(self)
        if isinstance(self.beam_size, bool) or not isinstance(self.beam_size, int) or not 1 <= self.beam_size <= 16:
            raise ValueError(
                f"beam_size must be in 1..16 (an int; the beam-step kernel's limit), got {self.beam_size!r}; "
                "use strategy 'malsd_batch' for larger beams"
            )


@dataclass
class FastBeamDecodingConfig(NemoDecodingKeys):
    """The ``decoding`` section selecting ``fast_beam``.

    Attributes:
        strategy: ``fast_beam``, or any NeMo transducer strategy.
        beam: options of the beam strategies.
        (the other keys: :class:`NemoDecodingKeys`; ``preserve_alignments`` is not supported by ``fast_beam``)
    """

    strategy: str = "fast_beam"
    beam: FastBeamConfig = field(default_factory=FastBeamConfig)


Options = TypeVar("Options", FastGreedyConfig, FastBeamConfig)


def option_names(options_class: type) -> frozenset[str]:
    """The keys an options dataclass defines (``max_symbols``, ``graph_mode``, ...; NeMo's config dataclasses too)."""
    return frozenset(f.name for f in dataclasses.fields(options_class))


def options_from_section(
    options_class: type[Options], section: Mapping[str, Any] | None, where: str = "decoding"
) -> Options:
    """The options of ``options_class`` that ``section`` sets, the dataclass defaults for the others.

    Keys of ``section`` that are not options of ``options_class`` (NeMo's own keys) are ignored here; the
    registry checks them. Types are checked as OmegaConf checks a structured config (``"5"`` for an int is 5,
    ``"five"`` is an error), values by the dataclass. Errors are ``ValueError`` naming ``where.key``.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import ValidationError

    section = section or {}
    given = {name: section[name] for name in option_names(options_class) if name in section}
    try:
        typed = OmegaConf.merge(OmegaConf.structured(options_class), given)
    except ValidationError as error:
        expected = {f.name: f.type for f in dataclasses.fields(options_class)}.get(error.key, "?")
        raise ValueError(
            f"{where}.{error.key}={error.value!r} is not valid: expected {expected} ({error.msg.splitlines()[0]})"
        ) from None
    try:
        return options_class(**{name: typed[name] for name in given})
    except LabelLoopOnly as error:  # the keys named as the user spelled them
        raise LabelLoopOnly(error.features, where) from None
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def nemo_max_symbols(max_symbols: int | None, *, graphs_allowed: bool, frame_loop: bool = False) -> int | None:
    """What NeMo 3.0's decoders make of a ``max_symbols`` (per step) argument; ``None`` means no limit.

    Left unset (``None`` or 0), NeMo's label-looping greedy computers (RNN-T and TDT) and its batched beam
    computers (``malsd_batch``) replace it by :data:`DEFAULT_MAX_SYMBOLS` at construction whenever CUDA graphs are
    allowed (their default), on the CPU too; without graphs, and in the frame loop, it stays unlimited.
    """
    if max_symbols:
        return int(max_symbols)
    return DEFAULT_MAX_SYMBOLS if graphs_allowed and not frame_loop else None


def greedy_max_symbols(section: Mapping[str, Any] | None, *, bounded: bool = False) -> int | None:
    """NeMo 3.0's rule for the greedy ``max_symbols`` of a ``decoding.greedy`` section.

    ``max_symbols`` if set (not ``None`` or 0), else ``max_symbols_per_step`` (as NeMo's ``RNNTDecoding`` reads
    them), then :func:`nemo_max_symbols` for the section's ``loop_labels`` and ``use_cuda_graph_decoder``.
    ``bounded`` turns no limit into :data:`DEFAULT_MAX_SYMBOLS`, for loops that need one (a captured streaming
    step, a calibration decoder).
    """
    section = section or {}
    max_symbols = nemo_max_symbols(
        greedy_max_symbols_setting(section),
        graphs_allowed=section.get("use_cuda_graph_decoder", True),
        frame_loop=not section.get("loop_labels", True),
    )
    return DEFAULT_MAX_SYMBOLS if max_symbols is None and bounded else max_symbols


def greedy_max_symbols_setting(section: Mapping[str, Any] | None) -> int | None:
    """The greedy ``max_symbols`` a ``decoding.greedy`` section sets, as NeMo's ``RNNTDecoding`` reads it:
    ``max_symbols`` if set (not ``None`` or 0), else ``max_symbols_per_step``; ``None``: unset. What the decoders
    make of it: :func:`nemo_max_symbols` (which :class:`~nemo_fastdecode.greedy.infer.FastGreedyBatchedInfer`
    applies)."""
    section = section or {}
    return section.get("max_symbols", None) or section.get("max_symbols_per_step", None)
