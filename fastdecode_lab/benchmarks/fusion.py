"""Fused decoding benchmark: NeMo's decoders and ours with an n-gram LM and a boosting tree, on the same encoder outputs.

For each synthetic model the encoder runs once (:func:`~fastdecode_lab.benchmarks.decoder.prepare_synthetic_set`,
blank bias calibrated on plain greedy decoding); then, for each family (greedy, beam search) and each variant
(:data:`VARIANTS`: plain, + n-gram LM, + boosting tree, both), NeMo's decoder as its ``greedy_batch`` /
``malsd_batch`` strategy builds it (CUDA graphs allowed) and ours (``fast_greedy`` / ``fast_beam``) decode the same
batches in fp32 with the same fusion models, after a warm-up, best of ``repeats``. Our rows are compared with NeMo's
row of the same family and variant (tokens and frames per utterance). The fusion models are NeMo's own, built by
:mod:`fastdecode_lab.fusion_models`: a random ARPA LM over the token ids and a boosting tree of random
phrases. Without a GPU everything runs on the CPU (a smoke test, not timings).
"""

from __future__ import annotations

import gc
import json
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from nemo.collections.asr.parts.submodules import rnnt_greedy_decoding as nemo_greedy
from nemo.collections.asr.parts.submodules.rnnt_beam_decoding import BeamBatchedRNNTInfer
from nemo.collections.asr.parts.submodules.tdt_beam_decoding import BeamBatchedTDTInfer

from fastdecode_lab import synthetic
from fastdecode_lab.benchmarks.decoder import prepare_synthetic_set
from fastdecode_lab.fusion_models import boosting_tree, ngram_lm, random_phrases, write_arpa
from nemo_fastdecode.apps.comparison import agreement, decode_all
from nemo_fastdecode.apps.environment import environment
from nemo_fastdecode.apps.timing import timed_passes
from nemo_fastdecode.beam.infer import FastBeamBatchedInfer
from nemo_fastdecode.graphs import choose_graph_mode
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer

FAMILIES = ("greedy", "beam")
VARIANTS = ("plain", "lm", "boost", "lm+boost")
# NeMo's strategy names of each family and ours
STRATEGIES = {"greedy": ("greedy_batch+graphs", "fast_greedy"), "beam": ("malsd_batch+graphs", "fast_beam")}
# the targets: a fused mode at most this share of NeMo's time for the same mode; beam search with an LM at most this
# multiple of our plain greedy time
FUSED_OVER_NEMO_TARGET = 0.5
BEAM_LM_OVER_GREEDY_TARGET = 1.3


@dataclass
class FusionBenchmarkConfig:
    """``benchmarks/bench_fusion.py``: NeMo's greedy and beam decoders and ours, plain and fused, same encoder outputs.

    Attributes:
        models: synthetic presets; ``None``: ``rnnt-0.6b`` and ``tdt-0.6b`` on a GPU, ``tiny-rnnt`` and ``tiny-tdt``
            on the CPU (a smoke test: CPU timings say nothing about GPU decoding).
        total_seconds: audio per model, LibriSpeech test-other-like durations sorted longest first; ``None``:
            3600 on a GPU, 12 on the CPU.
        batch_size: utterances per batch.
        repeats: timed passes per row (the best is reported), after a warm-up.
        max_symbols: most tokens per frame (greedy) and per frame and beam (beam search).
        beam_size: beam rows' beam size.
        families: ``greedy`` and / or ``beam``.
        variants: of :data:`VARIANTS` (``plain``, ``lm``, ``boost``, ``lm+boost``).
        lm_order: the random ARPA LM's order; ``None``: 4 for vocabularies of 256 tokens or more, else 3.
        lm_shares: per order from 2, the share of candidate continuations kept
            (:func:`~fastdecode_lab.fusion_models.write_arpa`); ``None``: ``[0.05, 0.02, 0.5]`` (order 4;
            about 135,000 n-grams over 1,024 tokens) or ``[0.4, 0.3]`` (order 3; about 1,400 over 28 tokens).
        lm_alpha: the LM's weight (``ngram_lm_alpha``).
        boosting_phrases: random key phrases of 2-5 tokens in the boosting tree.
        boosting_alpha: the tree's weight (``boosting_tree_alpha``).
        target_tokens_per_frame: blank-bias calibration of plain greedy decoding.
        seed: synthetic weights, audio, LM and phrases.
        out_dir: where ``fusion_<models>_<GPU>[_<date>].json`` / ``.md`` go.
        date: added to the output file names (e.g. 2026-11-24).
    """

    models: list[str] | None = None
    total_seconds: float | None = None
    batch_size: int = 32
    repeats: int = 3
    max_symbols: int = 10
    beam_size: int = 4
    families: list[str] = field(default_factory=lambda: list(FAMILIES))
    variants: list[str] = field(default_factory=lambda: list(VARIANTS))
    lm_order: int | None = None
    lm_shares: list[float] | None = None
    lm_alpha: float = 0.3
    boosting_phrases: int = 100
    boosting_alpha: float = 0.5
    target_tokens_per_frame: float = 0.3
    seed: int = 0
    out_dir: str = "outputs/benchmarks"
    date: str | None = None


@dataclass
class FusionRow:
    """One decoder on one family and variant; ratios are filled in once every row of the model is timed."""

    family: str
    variant: str
    strategy: str  # NeMo's (``greedy_batch+graphs``, ``malsd_batch+graphs``) or ours (``fast_greedy``, ``fast_beam``)
    seconds: float  # the best of pass_seconds
    pass_seconds: list[float]
    tokens: int
    identical_to_nemo: float  # share of utterances with NeMo's tokens and frames (1.0 on NeMo's own row)
    max_score_difference: float
    graph_mode: str | None = None  # ours: full_graph / no_while_graph / eager; NeMo's: its cuda_graphs_mode
    ours_over_nemo: float | None = None  # our seconds / NeMo's for the same family and variant
    over_our_greedy_plain: float | None = None  # our seconds / our plain greedy seconds

    @property
    def ours(self) -> bool:
        return self.strategy.startswith("fast_")


@dataclass
class FusionModelReport:
    model: str
    audio_seconds: float
    utterances: int
    frames: int
    encoder_seconds: float
    tokens_per_frame: float  # calibrated, plain greedy
    encoder_dtype: str
    beam_size: int
    lm: dict = field(default_factory=dict)  # order, n-grams per order, alpha
    boosting: dict = field(default_factory=dict)  # phrases, alpha
    rows: list[FusionRow] = field(default_factory=list)


def check_choices(name: str, values: list[str], valid: tuple[str, ...]) -> None:
    bad = [v for v in values if v not in valid]
    if bad or not values:
        raise ValueError(f"{name}={values}: valid {name} are {', '.join(valid)} (at least one)")


def decoder_factory(model, family: str, ours: bool, max_symbols: int, beam_size: int) -> Callable[..., torch.nn.Module]:
    """A constructor ``(fusion_models, fusion_models_alpha) -> decoder`` as NeMo's strategy or ours builds it."""
    spec = synthetic.transducer_spec(model)
    common = {"decoder_model": model.decoder, "joint_model": model.joint, "blank_index": spec.blank_id}

    def make(models: list | None, alphas: list[float] | None) -> torch.nn.Module:
        fused = {"fusion_models": models or None, "fusion_models_alpha": alphas or None}
        if family == "greedy":
            if ours:
                return FastGreedyBatchedInfer(
                    durations=spec.durations, max_symbols_per_step=max_symbols, **common, **fused
                )
            nemo = {**common, **fused, "max_symbols_per_step": max_symbols, "use_cuda_graph_decoder": True}
            if spec.is_tdt:
                return nemo_greedy.GreedyBatchedTDTInfer(durations=spec.durations, **nemo)
            return nemo_greedy.GreedyBatchedRNNTInfer(loop_labels=True, **nemo)
        beam = {**common, **fused, "beam_size": beam_size, "max_symbols_per_step": max_symbols}
        if ours:
            return FastBeamBatchedInfer(durations=spec.durations, **beam)
        # NeMo's malsd_batch as RNNTDecoding sets it up (its defaults: late pruning, LM-weighted blank scores)
        nemo = {**beam, "search_type": "malsd_batch", "allow_cuda_graphs": True}
        nemo.update(pruning_mode="late", blank_lm_score_mode="lm_weighted_full")
        if spec.is_tdt:
            return BeamBatchedTDTInfer(durations=spec.durations, **nemo)
        return BeamBatchedRNNTInfer(**nemo)

    return make


def graph_mode(decoder: torch.nn.Module, device: torch.device) -> str:
    """The graph mode a decoder ran in: ours (the greedy computer's, or the one the beam computer chooses on
    ``device``), or NeMo's computer's ``cuda_graphs_mode`` (NeMo switches graphs off for fusion models without
    Triton, and runs eagerly on the CPU)."""
    computer = getattr(decoder, "computer", None)
    if computer is not None:
        mode = getattr(computer, "graph_mode", None)
        if mode is None:
            mode = choose_graph_mode(device, computer.use_cuda_graphs, computer.forced_mode)
        return mode.value
    mode = getattr(getattr(decoder, "decoding_computer", None), "cuda_graphs_mode", None)
    return mode.value if mode is not None and device.type == "cuda" else "no_graphs"


def lm_options(vocab_size: int, order: int | None, shares: list[float] | None) -> tuple[int, list[float]]:
    """The ARPA LM's order and shares: the given ones, else a size that suits the vocabulary."""
    large = vocab_size >= 256
    order = order or (4 if large else 3)
    if shares is None:
        shares = [0.05, 0.02, 0.5] if large else [0.4, 0.3]
        shares = (shares + [0.5] * order)[: order - 1]
    return order, list(shares)


def benchmark_fusion(
    preset: str,
    total_seconds: float,
    cfg: FusionBenchmarkConfig,
    encoder_dtype: torch.dtype | None = torch.bfloat16,
    device: torch.device | str | None = None,
    log: Callable[[str], None] = print,
) -> FusionModelReport:
    """Every family and variant of ``cfg`` on one synthetic model: NeMo's row, then ours, on the same batches."""
    check_choices("families", list(cfg.families), FAMILIES)
    check_choices("variants", list(cfg.variants), VARIANTS)
    model, durations, batches, encoder_seconds, rate = prepare_synthetic_set(
        preset,
        total_seconds=total_seconds,
        batch_size=cfg.batch_size,
        max_symbols=cfg.max_symbols,
        encoder_dtype=encoder_dtype,
        calibration=cfg.target_tokens_per_frame,
        seed=cfg.seed,
        device=device,
    )
    on = batches[0][0].device
    vocab_size = synthetic.transducer_spec(model).blank_id
    frames = int(sum(int(n.sum()) for _, n in batches))
    dtype_name = str(encoder_dtype or torch.float32).removeprefix("torch.")
    report = FusionModelReport(
        preset, sum(durations), len(durations), frames, encoder_seconds, rate, dtype_name, cfg.beam_size
    )
    order, shares = lm_options(vocab_size, cfg.lm_order, cfg.lm_shares)
    with tempfile.TemporaryDirectory(prefix="bench_fusion_") as tmp:
        counts = write_arpa(Path(tmp) / "lm.arpa", vocab_size, order=order, shares=shares, seed=cfg.seed)
        lm = ngram_lm(Path(tmp) / "lm.arpa", vocab_size).to(on)
    phrases = random_phrases(vocab_size, cfg.boosting_phrases, seed=cfg.seed)
    tree = boosting_tree(phrases, vocab_size).to(on)
    report.lm = {"order": order, "ngrams": counts, "shares": shares, "alpha": cfg.lm_alpha}
    report.boosting = {"phrases": len(phrases), "tokens_per_phrase": "2-5", "alpha": cfg.boosting_alpha}
    log(
        f"{preset}: {len(durations)} utterances, {sum(durations):.0f} s, {frames} frames, encoder "
        f"{encoder_seconds:.2f} s, calibrated {rate:.3f} tokens/frame; LM order {order} with {sum(counts)} n-grams "
        f"{counts}, boosting tree of {len(phrases)} phrases"
    )
    fusion = {
        "plain": ([], []),
        "lm": ([lm], [cfg.lm_alpha]),
        "boost": ([tree], [cfg.boosting_alpha]),
        "lm+boost": ([lm, tree], [cfg.lm_alpha, cfg.boosting_alpha]),
    }
    for family in FAMILIES:
        if family not in cfg.families:
            continue
        for variant in VARIANTS:
            if variant not in cfg.variants:
                continue
            reference = None
            for ours, strategy in zip((False, True), STRATEGIES[family], strict=True):
                decoder = decoder_factory(model, family, ours, cfg.max_symbols, cfg.beam_size)(*fusion[variant])
                decode_all(decoder, batches[:2])  # warm-up: graphs captured, kernels loaded
                decode_all(decoder, batches[:1] + batches[-1:])  # the largest and the smallest batch shapes
                pass_seconds, hyps = timed_passes(decoder, batches, cfg.repeats)
                reference = reference if reference is not None else hyps
                identical, score_diff = agreement(reference, hyps)
                mode = graph_mode(decoder, on)
                row = FusionRow(
                    family,
                    variant,
                    strategy,
                    min(pass_seconds),
                    pass_seconds,
                    sum(len(h.y_sequence) for h in hyps),
                    identical,
                    score_diff,
                    mode,
                )
                report.rows.append(row)
                log(
                    f"  {family:6s} {variant:8s} {strategy:20s} {row.seconds:8.3f} s  tokens {row.tokens}  "
                    f"identical {identical:.3f}"
                )
                # a decoder's loop holds reference cycles: free its graphs and memory pools before the next row
                del decoder, hyps
                gc.collect()
    fill_ratios(report.rows)
    del model, lm, tree
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return report


def fill_ratios(rows: list[FusionRow]) -> None:
    """Our rows' seconds over NeMo's for the same family and variant, and over our plain greedy seconds."""
    nemo = {(r.family, r.variant): r.seconds for r in rows if not r.ours}
    greedy = next((r.seconds for r in rows if r.ours and (r.family, r.variant) == ("greedy", "plain")), None)
    for r in rows:
        if r.ours:
            base = nemo.get((r.family, r.variant))
            r.ours_over_nemo = r.seconds / base if base else None
            r.over_our_greedy_plain = r.seconds / greedy if greedy else None


def targets(report: FusionModelReport) -> list[str]:
    """Each target with the measured ratio and whether it is met."""
    lines = []
    for r in report.rows:
        if r.ours and r.variant != "plain" and r.ours_over_nemo is not None:
            met = "met" if r.ours_over_nemo <= FUSED_OVER_NEMO_TARGET else "NOT met"
            lines.append(
                f"{r.family} {r.variant}: {r.strategy} / NeMo = {r.ours_over_nemo:.2f} "
                f"(target <= {FUSED_OVER_NEMO_TARGET}: {met})"
            )
        if r.ours and (r.family, r.variant) == ("beam", "lm") and r.over_our_greedy_plain is not None:
            met = "met" if r.over_our_greedy_plain <= BEAM_LM_OVER_GREEDY_TARGET else "NOT met"
            lines.append(
                f"beam {report.beam_size} + LM / our plain greedy = {r.over_our_greedy_plain:.2f} "
                f"(decoders alone; target <= {BEAM_LM_OVER_GREEDY_TARGET}: {met})"
            )
            # what RTFx compares: the same encoder pass, then either decoder
            greedy_seconds = r.seconds / r.over_our_greedy_plain
            end_to_end = (report.encoder_seconds + r.seconds) / (report.encoder_seconds + greedy_seconds)
            met = "met" if end_to_end <= BEAM_LM_OVER_GREEDY_TARGET else "NOT met"
            lines.append(
                f"beam {report.beam_size} + LM / our plain greedy, encoder included = {end_to_end:.2f} "
                f"(encoder {report.encoder_seconds:.2f} s; target <= {BEAM_LM_OVER_GREEDY_TARGET}: {met})"
            )
    return lines


def write_fusion_reports(reports: list[FusionModelReport], command: str, json_path: str, markdown_path: str) -> str:
    """JSON (environment, command, every row) and a Markdown table per model; returns the Markdown."""
    env = environment()
    with open(json_path, "w") as f:
        models = [{**asdict(r), "targets": targets(r)} for r in reports]
        json.dump({"environment": env, "command": command, "models": models}, f, indent=2)
    lines = [
        f"# Fused decoding benchmark (n-gram LM, boosting tree) on {env['gpu']}",
        "",
        f"Command: `{command}`",
        "",
        f"torch {env['torch']} (CUDA {env['cuda']}), Triton {env['triton']}, NeMo {env['nemo']}, driver "
        f"{env['driver']}, commit {env['commit']}. Synthetic random-weight models; fp32 decoding of "
        f"{', '.join(sorted({r.encoder_dtype for r in reports}))} encoder outputs. NeMo's rows are its "
        "`greedy_batch` (label looping) and `malsd_batch` decoders with CUDA graphs, ours `fast_greedy` and "
        "`fast_beam`, with the same NeMo fusion models (`NGramGPULanguageModel` from a random ARPA LM over the "
        "token ids, `GPUBoostingTreeModel` of random phrases). Seconds are the best of the repeats after a warm-up; "
        "identical = share of utterances with NeMo's tokens and frames for the same variant.",
        "",
    ]
    if env["gpu"] == "cpu":
        lines += ["**CPU run: a smoke test of the set-up; these timings do not represent GPU decoding.**", ""]
    for report in reports:
        lm, tree = report.lm, report.boosting
        lines += [
            f"## {report.model}: {report.utterances} utterances, {report.audio_seconds:.0f} s audio, "
            f"{report.frames} frames, {report.tokens_per_frame:.3f} tokens/frame (plain greedy), encoder "
            f"{report.encoder_seconds:.2f} s",
            "",
            f"LM: order {lm['order']}, {sum(lm['ngrams'])} n-grams {lm['ngrams']}, alpha {lm['alpha']}; boosting "
            f"tree: {tree['phrases']} phrases of {tree['tokens_per_phrase']} tokens, alpha {tree['alpha']}; beam "
            f"size {report.beam_size}.",
            "",
            "| family | variant | NeMo s | ours s | ours / NeMo | ours / our plain greedy | NeMo tokens | our tokens "
            "| identical | max score diff | graph modes (NeMo / ours) |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        nemo = {(r.family, r.variant): r for r in report.rows if not r.ours}
        for r in (r for r in report.rows if r.ours):
            n = nemo[(r.family, r.variant)]
            lines.append(
                f"| {r.family} | {r.variant} | {n.seconds:.3f} | {r.seconds:.3f} | {r.ours_over_nemo or 0:.2f} | "
                f"{r.over_our_greedy_plain or 0:.2f} | {n.tokens} | {r.tokens} | {r.identical_to_nemo:.1%} | "
                f"{r.max_score_difference:.2e} | {n.graph_mode} / {r.graph_mode} |"
            )
        lines += ["", *(f"- {t}" for t in targets(report)), ""]
    text = "\n".join(lines)
    with open(markdown_path, "w") as f:
        f.write(text)
    return text
