"""Side-by-side decoder benchmark: NeMo's greedy strategies and ours on the same encoder outputs.

The encoder runs once per model; every decoder then decodes the same encoder outputs (cast to
the decoding dtype), after a warm-up, best of ``repeats``. Tokens are counted so that equal work is
visible, and every strategy's hypotheses are compared with NeMo's baseline (frame loop for RNN-T,
label loop without graphs for TDT). Beam search rows (:data:`BEAM_STRATEGIES`: NeMo's ``malsd_batch``
with and without graphs, ``fast_beam``) are opt-in through ``strategies`` and are compared with
``malsd_batch`` without graphs. Without a GPU everything runs on the CPU (a smoke test, not timings).

Each calibration is a separate test set: a number is the target tokens per frame of the blank-bias calibration,
``trained`` the trained models' rate and burst length (:func:`~fastdecode_lab.synthetic.calibrate_trained_like`);
the emission statistics of NeMo's baseline (:mod:`fastdecode_lab.emissions`) are reported next to the
trained models' ones.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from nemo.collections.asr.parts.submodules import rnnt_greedy_decoding as nemo_greedy
from nemo.collections.asr.parts.submodules.rnnt_beam_decoding import BeamBatchedRNNTInfer
from nemo.collections.asr.parts.submodules.tdt_beam_decoding import BeamBatchedTDTInfer

from fastdecode_lab import synthetic
from fastdecode_lab.emissions import (
    EmissionStats,
    emission_report_lines,
    emission_stats,
    trained_emission_stats_for,
)
from fastdecode_lab.profiling import profile_pass
from nemo_fastdecode.apps.comparison import agreement, decode_all
from nemo_fastdecode.apps.environment import environment
from nemo_fastdecode.apps.timing import synchronize, timed_passes
from nemo_fastdecode.beam.infer import FastBeamBatchedInfer
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer


@dataclass
class StrategyResult:
    model: str
    strategy: str
    decoder_seconds: float
    tokens: int
    identical_utterances: float  # share of utterances with the baseline's tokens and frames
    max_score_difference: float
    gpu_busy_share: float | None = None
    graph_mode: str | None = None
    speedup_vs_fastest_nemo: float | None = None
    rtfx: float | None = None
    decoder_share: float | None = None
    pass_seconds: list[float] | None = None  # every timed pass (decoder_seconds is their minimum)


@dataclass
class ModelReport:
    model: str
    audio_seconds: float
    utterances: int
    frames: int
    encoder_seconds: float
    tokens_per_frame: float
    encoder_dtype: str = "float32"  # decoding runs in fp32 on the encoder outputs of this dtype
    results: list[StrategyResult] = field(default_factory=list)
    calibration: float | str = 0.3  # target tokens per frame of the blank-bias calibration, or "trained"
    emissions: EmissionStats | None = None  # of the nemo_baseline row, on the whole test set
    trained_emissions: EmissionStats | None = None  # the trained model's of the same kind (RNN-T or TDT)


# beam search rows (opt-in: run only when named in `strategies`); the first is their reference
BEAM_STRATEGIES = (
    "nemo_malsd_batch",
    "nemo_malsd_batch+graphs",
    "fast_beam[no_while_graph]",
    "fast_beam[eager]",
    "fast_beam[full_graph]",
    "fast_beam[full_graph,torch_topk]",
    "fast_beam[full_graph,fast_math]",
    "fast_beam[full_graph,fast_math,compiled]",
    "fast_beam[no_while_graph,fast_math,compiled]",
)


def decoder_factories(model, max_symbols: int, beam_size: int = 4) -> dict[str, Callable[[], torch.nn.Module]]:
    """Name -> constructor of each decoder to compare (NeMo's first; ``nemo_baseline`` and, for the beam
    rows, ``nemo_malsd_batch`` are the references)."""
    spec = synthetic.transducer_spec(model)
    common = {
        "decoder_model": model.decoder,
        "joint_model": model.joint,
        "blank_index": spec.blank_id,
        "max_symbols_per_step": max_symbols,
    }

    def nemo(loop_labels: bool, graphs: bool):
        if spec.is_tdt:
            return lambda: nemo_greedy.GreedyBatchedTDTInfer(
                durations=spec.durations, use_cuda_graph_decoder=graphs, **common
            )
        return lambda: nemo_greedy.GreedyBatchedRNNTInfer(
            loop_labels=loop_labels, use_cuda_graph_decoder=graphs, **common
        )

    def ours(
        loop_labels: bool,
        mode: str,
        fused: bool | None = None,
        fast_math: bool = False,
        lookahead: int | None = None,
        looks: int | None = None,
        exact_predictor: bool = False,
    ):
        return lambda: FastGreedyBatchedInfer(
            durations=spec.durations,
            loop_labels=loop_labels,
            graph_mode=mode,
            fused_kernels=fused,
            fast_math=fast_math,
            lookahead_frames=lookahead,
            looks_per_iteration=looks,
            exact_predictor=exact_predictor,
            **common,
        )

    # the label loop's look-ahead (frames per joint call while skipping blanks; automatic at batch 32: fast math 16
    # RNN-T, 4 TDT; the exact predictor 4 RNN-T, 2 TDT; NeMo's modules 1)
    lookahead_rows = {
        f"fast_greedy_label_loop[full_graph,fast_math,lookahead={w}]": ours(
            True, "full_graph", fast_math=True, lookahead=w
        )
        for w in (1, 4, 8, 16)
    }
    lookahead_rows |= {
        f"fast_greedy_label_loop[full_graph,lookahead={w}]": ours(True, "full_graph", lookahead=w)
        for w in (1, 2, 4, 8, 16)
    }
    # the opt-in exact predictor (IEEE-fp32 few-row kernels and its automatic look-ahead) beside the default, NeMo's
    # modules at NeMo's shapes
    lookahead_rows |= {
        f"fast_greedy_label_loop[{mode},exact_predictor]": ours(True, mode, exact_predictor=True)
        for mode in ("full_graph", "no_while_graph")
    }
    # the label loop's shape: 0 = two-level (an inner WHILE loop skips blanks), K = one loop of K looks per iteration
    looks_rows = {
        f"fast_greedy_label_loop[full_graph{',fast_math' if fast else ''},looks={k}]": ours(
            True, "full_graph", fast_math=fast, looks=k
        )
        for fast in (True, False)
        for k in (0, 1, 2, 3)
    }

    def nemo_beam(graphs: bool):
        beam = {**common, "beam_size": beam_size, "search_type": "malsd_batch", "allow_cuda_graphs": graphs}
        if spec.is_tdt:
            return lambda: BeamBatchedTDTInfer(durations=spec.durations, **beam)
        return lambda: BeamBatchedRNNTInfer(**beam)

    def fast_beam(mode: str, fused_topk: bool | None = None, fast_math: bool = False, compiled: bool = False):
        return lambda: FastBeamBatchedInfer(
            durations=spec.durations,
            beam_size=beam_size,
            graph_mode=mode,
            fused_topk=fused_topk,
            fast_math=fast_math,
            compiled_step=compiled,
            **common,
        )

    beam_rows = dict(
        zip(
            BEAM_STRATEGIES,
            (
                nemo_beam(False),
                nemo_beam(True),
                fast_beam("no_while_graph"),
                fast_beam("eager"),
                fast_beam("full_graph"),
                fast_beam("full_graph", fused_topk=False),
                fast_beam("full_graph", fast_math=True),
                fast_beam("full_graph", fast_math=True, compiled=True),
                fast_beam("no_while_graph", fast_math=True, compiled=True),  # for kernel profiles
            ),
            strict=True,
        )
    )
    if spec.is_tdt:
        return {
            "nemo_baseline": nemo(True, False),
            "nemo_label_loop+graphs": nemo(True, True),
            "fast_greedy_label_loop[no_while_graph]": ours(True, "no_while_graph"),
            "fast_greedy_label_loop[eager]": ours(True, "eager"),
            "fast_greedy_label_loop[full_graph]": ours(True, "full_graph"),
            "fast_greedy_label_loop[full_graph,unfused]": ours(True, "full_graph", fused=False),
            "fast_greedy_label_loop[full_graph,fast_math]": ours(True, "full_graph", fast_math=True),
            "fast_greedy_label_loop[no_while_graph,fast_math]": ours(True, "no_while_graph", fast_math=True),
            **lookahead_rows,
            **looks_rows,
            **beam_rows,
        }
    return {
        "nemo_baseline": nemo(False, False),
        "nemo_frame_loop+graphs": nemo(False, True),
        "nemo_label_loop": nemo(True, False),
        "nemo_label_loop+graphs": nemo(True, True),
        "fast_greedy_frame_loop[no_while_graph]": ours(False, "no_while_graph"),
        "fast_greedy_label_loop[no_while_graph]": ours(True, "no_while_graph"),
        "fast_greedy_label_loop[eager]": ours(True, "eager"),
        "fast_greedy_frame_loop[full_graph]": ours(False, "full_graph"),
        "fast_greedy_label_loop[full_graph]": ours(True, "full_graph"),
        "fast_greedy_frame_loop[full_graph,unfused]": ours(False, "full_graph", fused=False),
        "fast_greedy_label_loop[full_graph,unfused]": ours(True, "full_graph", fused=False),
        "fast_greedy_frame_loop[full_graph,fast_math]": ours(False, "full_graph", fast_math=True),
        "fast_greedy_label_loop[full_graph,fast_math]": ours(True, "full_graph", fast_math=True),
        "fast_greedy_label_loop[no_while_graph,fast_math]": ours(True, "no_while_graph", fast_math=True),
        **lookahead_rows,
        **looks_rows,
        **beam_rows,
    }


def needs_cuda(name: str) -> bool:
    """Rows that only mean something on a GPU: our graph modes, NeMo's graph decoders (on the CPU NeMo quietly runs
    them without graphs, a duplicate row) and compiled steps."""
    return any(key in name for key in ("full_graph", "no_while_graph", "+graphs", "compiled"))


def _gpu_busy_share(decoder, batches) -> float | None:
    """Sum of GPU kernel time over wall time for one pass (how much of the decoder time the GPU works)."""
    try:
        wall, kernels = profile_pass(decoder, batches)
        return sum(total for _, total in kernels.values()) * 1e-6 / wall
    except Exception:  # profiler unavailable on this host: report nothing rather than a wrong number
        return None


def prepare_synthetic_set(
    preset: str,
    total_seconds: float,
    batch_size: int,
    max_symbols: int = 10,
    encoder_dtype: torch.dtype = torch.bfloat16,
    calibration: float | str = 0.3,
    seed: int = 0,
    device: torch.device | str | None = None,
):
    """A synthetic model on ``device`` (``None``: the GPU, else the CPU) and its encoded test-other-like set,
    calibrated on its first four batches (``calibration``: target tokens per frame of the blank bias, or
    ``"trained"``, see :func:`~fastdecode_lab.synthetic.apply_calibration`).

    Returns ``(model, durations, batches, encoder_seconds, tokens_per_frame)``; ``batches`` holds
    fp32 ``(encoder_output [B, D, T], lengths [B])`` pairs (decoding runs in fp32 on bf16 encoder outputs).
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = synthetic.build_synthetic_model(preset, seed=seed, device=device)
    durations = synthetic.librispeech_like_durations(total_seconds=total_seconds, seed=seed)
    audios = synthetic.synthetic_audio(durations, seed=seed)
    synchronize(device)
    start = time.perf_counter()
    encoded, lengths = synthetic.encode(model, audios, batch_size=batch_size, device=device, dtype=encoder_dtype)
    synchronize(device)
    encoder_seconds = time.perf_counter() - start
    # decoding runs in fp32 on the (bf16) encoder outputs
    batches = [(e.float(), n) for e, n in zip(encoded, lengths, strict=True)]
    rate = synthetic.apply_calibration(
        model, [b[0] for b in batches[:4]], [b[1] for b in batches[:4]], calibration, max_symbols=max_symbols, seed=seed
    )
    return model, durations, batches, encoder_seconds, rate


def benchmark_model(
    preset: str,
    total_seconds: float,
    batch_size: int,
    repeats: int = 3,
    max_symbols: int = 10,
    encoder_dtype: torch.dtype = torch.bfloat16,
    calibration: float | str = 0.3,
    strategies: list[str] | None = None,
    seed: int = 0,
    profile_busy: bool = False,
    experimental: bool = False,
    beam_size: int = 4,
    device: torch.device | str | None = None,
    log: Callable[[str], None] = print,
    baseline_repeats: int | None = None,
) -> ModelReport:
    """Every selected row of :func:`decoder_factories` on one synthetic model's encoded test set.

    ``repeats`` timed passes per row after two warm-up passes, the best reported; ``nemo_baseline`` (the eager
    reference) runs ``baseline_repeats`` passes (``None``: ``repeats``) without warm-up.
    """
    model, durations, batches, encoder_seconds, rate = prepare_synthetic_set(
        preset, total_seconds, batch_size, max_symbols, encoder_dtype, calibration, seed, device
    )
    lengths = [n for _, n in batches]
    frames = int(sum(int(n.sum()) for n in lengths))
    dtype_name = str(encoder_dtype or torch.float32).removeprefix("torch.")
    report = ModelReport(preset, sum(durations), len(durations), frames, encoder_seconds, rate, dtype_name)
    report.calibration = synthetic.check_calibration(calibration)
    report.trained_emissions = trained_emission_stats_for(model)
    log(
        f"{preset} (calibration {report.calibration}): {len(durations)} utterances, {sum(durations):.0f} s, "
        f"{frames} frames, encoder {encoder_seconds:.2f} s, calibrated {rate:.3f} tokens/frame"
    )
    beam_selected = any(name in BEAM_STRATEGIES for name in strategies or ())
    references: dict[bool, list] = {}  # beam row? -> the first hypotheses of that family
    on_gpu = batches[0][0].is_cuda if batches else False
    skipped = []
    for name, factory in decoder_factories(model, max_symbols, beam_size).items():
        is_beam = name in BEAM_STRATEGIES
        if is_beam and not (beam_selected and (name in strategies or name == BEAM_STRATEGIES[0])):
            continue  # beam rows are opt-in; their reference comes with any of them
        if not is_beam and strategies and name not in strategies and name != "nemo_baseline":
            continue
        ablation = name.endswith("unfused]") or any(k in name for k in ("lookahead=", "looks=", "no_while_graph,exact"))
        if ablation and not experimental and name not in (strategies or ()):  # opt-in: named or experimental
            continue
        if not on_gpu and needs_cuda(name):
            skipped.append(name)
            continue
        decoder = factory()
        if name == "nemo_baseline" and baseline_repeats is not None:
            pass_seconds, hyps = timed_passes(decoder, batches, baseline_repeats)  # eager: nothing to warm up
        else:
            decode_all(decoder, batches[:2])  # warm-up: graphs captured, kernels loaded
            decode_all(decoder, batches[:1] + batches[-1:])  # the largest and the smallest batch shapes
            pass_seconds, hyps = timed_passes(decoder, batches, repeats)
        seconds = min(pass_seconds)
        identical, score_diff = agreement(references.setdefault(is_beam, hyps), hyps)
        if name == "nemo_baseline":
            report.emissions = emission_stats(hyps, [int(n) for lens in lengths for n in lens])
            log(f"  emissions of nemo_baseline: {report.emissions.summary()}")
        busy = (
            _gpu_busy_share(decoder, batches)
            if profile_busy and name.startswith(("fast_", "nemo_label_loop+", "nemo_frame_loop+", "nemo_malsd_batch+"))
            else None
        )
        mode = getattr(getattr(decoder, "computer", None), "graph_mode", None)
        result = StrategyResult(
            preset,
            name,
            seconds,
            sum(len(h.y_sequence) for h in hyps),
            identical,
            score_diff,
            busy,
            mode.value if mode is not None else None,
        )
        result.pass_seconds = pass_seconds
        result.rtfx = report.audio_seconds / (encoder_seconds + seconds)
        result.decoder_share = seconds / (encoder_seconds + seconds)
        report.results.append(result)
        log(f"  {name:42s} {seconds:8.3f} s  tokens {result.tokens}  identical {identical:.3f}  busy {busy}")
        # a decoder's loop holds reference cycles: collect it now, so its CUDA graphs and memory pools do not
        # outlive it into the next rows' timings
        del decoder
        gc.collect()
    if skipped:
        log(f"  skipped on the CPU (they need CUDA): {', '.join(skipped)}")
    for is_beam in (False, True):  # greedy rows against NeMo's greedy, beam rows against NeMo's beam search
        family = [r for r in report.results if (r.strategy in BEAM_STRATEGIES) == is_beam]
        fastest_nemo = min((r.decoder_seconds for r in family if r.strategy.startswith("nemo")), default=None)
        for r in family:
            r.speedup_vs_fastest_nemo = fastest_nemo / r.decoder_seconds if fastest_nemo else None
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return report


def write_reports(reports: list[ModelReport], command: str, json_path: str, markdown_path: str) -> str:
    env = environment()
    with open(json_path, "w") as f:
        json.dump({"environment": env, "command": command, "models": [asdict(r) for r in reports]}, f, indent=2)
    beam = any(r.strategy in BEAM_STRATEGIES for report in reports for r in report.results)
    lines = [
        f"# {'Beam search' if beam else 'Greedy'} decoding benchmark on {env['gpu']}",
        "",
        f"Command: `{command}`",
        "",
        f"torch {env['torch']} (CUDA {env['cuda']}), Triton {env['triton']}, NeMo {env['nemo']}, driver "
        f"{env['driver']}, commit {env['commit']}. Synthetic random-weight models; fp32 decoding of "
        f"{', '.join(sorted({r.encoder_dtype for r in reports}))} encoder outputs; decoder seconds are the best of the "
        "repeats after a warm-up (nemo_baseline, the eager reference: its passes without warm-up, see the command).",
        "",
    ]
    if env["gpu"] == "cpu":
        lines += ["**CPU run: a smoke test of the set-up; these timings do not represent GPU decoding.**", ""]
    for report in reports:
        calibration = report.calibration if report.calibration == "trained" else f"{report.calibration} tokens/frame"
        lines += [
            f"## {report.model}, calibration {calibration}: {report.utterances} utterances, "
            f"{report.audio_seconds:.0f} s audio, {report.frames} frames, {report.tokens_per_frame:.3f} tokens/frame "
            f"(calibration batches), encoder {report.encoder_seconds:.2f} s",
            "",
            *emission_report_lines(report.emissions, report.trained_emissions, "nemo_baseline"),
            "| strategy | graph mode | decoder s | x fastest NeMo | tokens | identical to baseline | max score diff | GPU busy | RTFx | decoder share |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in report.results:
            busy = "" if r.gpu_busy_share is None else f"{r.gpu_busy_share:.0%}"
            lines.append(
                f"| {r.strategy} | {r.graph_mode or ''} | {r.decoder_seconds:.3f} | {r.speedup_vs_fastest_nemo or 0:.2f} | "
                f"{r.tokens} | {r.identical_utterances:.1%} | {r.max_score_difference:.2e} | {busy} | {r.rtfx:.0f} | "
                f"{r.decoder_share:.1%} |"
            )
        lines.append("")
    text = "\n".join(lines)
    with open(markdown_path, "w") as f:
        f.write(text)
    return text
