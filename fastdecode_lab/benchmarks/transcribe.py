"""End-to-end benchmark of what ``model.transcribe`` users see: NeMo's default against ours on the same files.

Every row runs ``model.transcribe`` on the same audio files (a synthetic LibriSpeech test-other-like set written as
WAV files, in shuffled order as a manifest would list them), under bf16 autocast on a GPU, in one process:

* ``nemo`` -- NeMo's default strategy (``greedy_batch``) and NeMo's ``transcribe``;
* ``fast_greedy`` -- our decoder, NeMo's ``transcribe``;
* ``fast_greedy+offline`` -- our decoder and the offline path (:mod:`nemo_fastdecode.offline`: length-sorted
  budgeted batches, audio read ahead on threads, the decoder sized once);
* ``nemo+offline`` -- NeMo's decoder on the offline path (what the batching alone buys).

For each row: the first call (after the model and CUDA are initialised by a short call on other audio) and the
best of ``repeats`` later calls; for our rows also the first call in a new process (``first_call_new_process``: the
same set-up in ``new_processes`` child processes run one after another, after this one compiled every Triton kernel
into Triton's on-disk cache, as on any run but a machine's very first; their median and spread); then tokens,
agreement with the ``nemo`` row, and one extra call timed per stage (preprocessor, encoder, decoder; the rest is
reading audio and host work) with the GPU synchronised around each.
Each calibration is a separate test set: a number is the target tokens per frame of the blank-bias calibration,
``trained`` the trained models' rate and burst length (:func:`~fastdecode_lab.synthetic.calibrate_trained_like`).
The test set's emission statistics (:mod:`fastdecode_lab.emissions`) are measured on the ``nemo`` row's
hypotheses and reported next to the trained models' ones.
"""

from __future__ import annotations

import contextlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from fastdecode_lab import synthetic
from fastdecode_lab.emissions import (
    EmissionStats,
    emission_report_lines,
    emission_stats,
    trained_emission_stats_for,
)
from nemo_fastdecode.apps.environment import environment, report_header
from nemo_fastdecode.apps.models import apply_decoding
from nemo_fastdecode.apps.timing import synchronize
from nemo_fastdecode.offline import disable_fast_transcribe, enable_fast_transcribe

#: row name -> (strategy, offline path)
ROWS: dict[str, tuple[str, bool]] = {
    "nemo": ("greedy_batch", False),
    "fast_greedy": ("fast_greedy", False),
    "fast_greedy+offline": ("fast_greedy", True),
    "nemo+offline": ("greedy_batch", True),
}


@dataclass
class TranscribeRow:
    name: str
    first_call_seconds: float  # in this process: on a fresh machine it includes compiling the Triton kernels
    seconds: float  # best of the timed calls
    rtfx: float
    tokens: int
    identical_to_nemo: float  # share of utterances with the nemo row's token ids
    stages: dict[str, float] = field(default_factory=dict)
    call_seconds: list[float] = field(default_factory=list)
    first_call_new_process_seconds: float | None = None  # median over new processes, Triton's on-disk cache warm
    first_call_new_process_samples: list[float] = field(default_factory=list)  # each new process's first call


@dataclass
class TranscribeReport:
    model: str
    calibration: float | str  # target tokens per frame of the blank-bias calibration, or "trained"
    utterances: int
    audio_seconds: float
    batch_size: int
    precision: str
    emissions: EmissionStats | None = None
    trained_emissions: EmissionStats | None = None  # the trained model's of the same kind (RNN-T or TDT)
    rows: list[TranscribeRow] = field(default_factory=list)


@contextlib.contextmanager
def stage_timer(model, device: torch.device) -> Iterator[dict[str, float]]:
    """Seconds spent in the preprocessor, the encoder and the decoding (GPU synchronised around each)."""
    stages: dict[str, float] = {"preprocessor": 0.0, "encoder": 0.0, "decoder": 0.0}
    starts: dict[str, float] = {}
    handles = []
    for name, module in (("preprocessor", model.preprocessor), ("encoder", model.encoder)):

        def pre(_m, _a, name=name):
            synchronize(device)
            starts[name] = time.perf_counter()

        def post(_m, _a, _o, name=name):
            synchronize(device)
            stages[name] += time.perf_counter() - starts[name]

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    decode = model.decoding.rnnt_decoder_predictions_tensor

    def timed_decode(*args, **kwargs):
        synchronize(device)
        start = time.perf_counter()
        out = decode(*args, **kwargs)
        synchronize(device)
        stages["decoder"] += time.perf_counter() - start
        return out

    model.decoding.rnnt_decoder_predictions_tensor = timed_decode
    try:
        yield stages
    finally:
        for handle in handles:
            handle.remove()
        del model.decoding.rnnt_decoder_predictions_tensor  # the class method again


def _transcribe(model, paths: list[str], batch_size: int, bf16: bool) -> list[Any]:
    device = next(model.parameters()).device
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16) if bf16 and device.type == "cuda" else contextlib.nullcontext()
    )
    with autocast, torch.inference_mode():
        hyps = model.transcribe(paths, batch_size=batch_size, return_hypotheses=True, verbose=False)
    model.eval()  # NeMo's transcribe leaves modules in train mode
    return hyps[0] if isinstance(hyps, tuple) else hyps


@dataclass(frozen=True)
class SyntheticSet:
    """What makes a benchmark's model and files: the same values give the same ones in any process."""

    preset: str
    total_seconds: float
    batch_size: int
    calibration: float | str
    bf16: bool
    max_symbols: int
    seed: int


@contextlib.contextmanager
def prepared(
    synthetic_set: SyntheticSet, device: torch.device | str | None = None
) -> Iterator[tuple[Any, list[str], list[float]]]:
    """The calibrated synthetic model, its WAV files (shuffled, as a manifest lists them) and their durations, after a
    short ``transcribe`` of other audio with NeMo's default decoder (CUDA context, cuBLAS and NeMo's lazy set-up: no
    row pays them); the files live as long as the block."""
    t = synthetic_set
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = synthetic.build_synthetic_model(t.preset, seed=t.seed, device=device)
    model.eval()
    durations = synthetic.librispeech_like_durations(total_seconds=t.total_seconds, seed=t.seed)
    audio = synthetic.synthetic_audio(durations, seed=t.seed)
    dtype = torch.bfloat16 if t.bf16 and device.type == "cuda" else None
    encoded, lengths = synthetic.encode(
        model, audio[: 2 * t.batch_size], batch_size=t.batch_size, device=device, dtype=dtype
    )
    synthetic.apply_calibration(
        model, [e.float() for e in encoded[:2]], lengths[:2], t.calibration, max_symbols=t.max_symbols, seed=t.seed
    )
    warm_up_audio = synthetic.synthetic_audio([1.0, 2.0], seed=t.seed + 1)
    with tempfile.TemporaryDirectory() as folder:
        paths = [str(p) for p in synthetic.write_wavs(audio, folder)]
        random.Random(t.seed).shuffle(paths)  # a manifest is not sorted by length
        warm_up = [str(p) for p in synthetic.write_wavs(warm_up_audio, folder, prefix="warm_up")]
        apply_decoding(model, {"strategy": "greedy_batch"})
        _transcribe(model, warm_up, 2, t.bf16)
        yield model, paths, durations


def _first_call(model, paths: list[str], synthetic_set: SyntheticSet, row: str) -> float:
    """Seconds of the first ``transcribe`` of ``paths`` with ``row``'s decoding."""
    strategy, offline = ROWS[row]
    device = next(model.parameters()).device
    apply_decoding(model, {"strategy": strategy, "greedy": {"max_symbols": synthetic_set.max_symbols}})
    (enable_fast_transcribe if offline else disable_fast_transcribe)(model)
    synchronize(device)
    start = time.perf_counter()
    _transcribe(model, paths, synthetic_set.batch_size, synthetic_set.bf16)
    synchronize(device)
    return time.perf_counter() - start


def first_call_in_new_process(
    synthetic_set: SyntheticSet, row: str, device: torch.device | str | None = None, timeout: float = 600.0
) -> float:
    """The first ``transcribe`` call of ``row`` in a new Python process on the same model and files (made again there
    from ``synthetic_set``): what every run after a machine's first sees, the Triton kernels loaded from the on-disk cache
    this process filled. Raises ``RuntimeError`` with the child's output if it fails."""
    argument = json.dumps(
        {"synthetic_set": asdict(synthetic_set), "row": row, "device": None if device is None else str(device)}
    )
    code = "import sys, fastdecode_lab.benchmarks.transcribe as b; b._child_first_call(sys.argv[1])"
    done = subprocess.run(
        [sys.executable, "-c", code, argument], capture_output=True, text=True, timeout=timeout, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(_CHILD_RESULT)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the new-process first call of {row} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return float(lines[-1].removeprefix(_CHILD_RESULT))


_CHILD_RESULT = "first call seconds: "


def _child_first_call(argument: str) -> None:
    """The child of :func:`first_call_in_new_process`: prints the first call's seconds."""
    import nemo_fastdecode  # noqa: F401  (registers the strategies, as the parent's script did)

    values = json.loads(argument)
    synthetic_set = SyntheticSet(**values["synthetic_set"])
    with prepared(synthetic_set, values["device"]) as (model, paths, _):
        print(f"{_CHILD_RESULT}{_first_call(model, paths, synthetic_set, values['row']):.6f}", flush=True)


def benchmark_transcribe(
    preset: str,
    total_seconds: float,
    batch_size: int = 32,
    repeats: int = 3,
    calibration: float | str = 0.3,
    bf16: bool = True,
    rows: list[str] | None = None,
    max_symbols: int = 10,
    seed: int = 0,
    device: torch.device | str | None = None,
    log: Callable[[str], None] = print,
    first_call_new_process: bool = False,
    new_processes: int = 3,
) -> TranscribeReport:
    """Time ``model.transcribe`` for each row of :data:`ROWS` (or ``rows``) on one synthetic model and test set.

    ``calibration``: the target tokens per frame of the blank-bias calibration, or ``"trained"`` (see the module
    docstring); calibrated on the first two batches' encoder outputs. ``first_call_new_process``: also time our rows'
    first call in ``new_processes`` child processes, one after another (:func:`first_call_in_new_process`); the row
    keeps each and their median (a first call is one sample, and one process's can carry a cost others do not)."""
    calibration = synthetic.check_calibration(calibration)
    if first_call_new_process and new_processes < 1:
        raise ValueError(f"new_processes must be >= 1 when first_call_new_process is set, got {new_processes}")
    names = rows or list(ROWS)
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        raise ValueError(f"unknown rows {unknown}; valid rows: {', '.join(ROWS)}")
    synthetic_set = SyntheticSet(preset, total_seconds, batch_size, calibration, bf16, max_symbols, seed)
    with prepared(synthetic_set, device) as (model, paths, durations):
        dtype_name = "bf16 autocast" if bf16 and next(model.parameters()).is_cuda else "fp32"
        report = TranscribeReport(preset, calibration, len(durations), sum(durations), batch_size, dtype_name)
        report.trained_emissions = trained_emission_stats_for(model)
        device = next(model.parameters()).device
        reference: list[list[int]] | None = None
        for name in names:
            first = _first_call(model, paths, synthetic_set, name)
            calls = []
            for _ in range(repeats):
                synchronize(device)
                start = time.perf_counter()
                hyps = _transcribe(model, paths, batch_size, bf16)
                synchronize(device)
                calls.append(time.perf_counter() - start)
            with stage_timer(model, device) as stages:
                synchronize(device)
                start = time.perf_counter()
                _transcribe(model, paths, batch_size, bf16)
                synchronize(device)
                stages["other"] = time.perf_counter() - start - sum(stages.values())
            disable_fast_transcribe(model)
            ours = ROWS[name][0] != "greedy_batch"
            new_process = (
                [first_call_in_new_process(synthetic_set, name, device) for _ in range(new_processes)]
                if first_call_new_process and ours
                else []
            )
            ids = [[int(t) for t in h.y_sequence] for h in hyps]
            if name == "nemo" or reference is None:
                report.emissions = report.emissions or emission_stats(hyps)
            reference = reference or ids
            row = TranscribeRow(
                name,
                first,
                min(calls),
                report.audio_seconds / min(calls),
                sum(map(len, ids)),
                sum(a == b for a, b in zip(reference, ids, strict=True)) / len(ids),
                {k: round(v, 4) for k, v in stages.items()},
                calls,
                statistics.median(new_process) if new_process else None,
                new_process,
            )
            report.rows.append(row)
            in_new = f" (new processes: {_new_process_cell(row)})" if new_process else ""
            log(
                f"{preset} (calibration {calibration}) {name}: first {first:.3f} s{in_new}, best {row.seconds:.3f} s "
                f"(RTFx {row.rtfx:.0f}), {row.tokens} tokens, {row.identical_to_nemo:.1%} as nemo, stages {row.stages}"
            )
    return report


def _new_process_cell(row: TranscribeRow) -> str:
    """``<median> (<median / best>x; <min>-<max> s, <n> processes)``: the median first call in a new process, its
    ratio to the row's best call, and the spread; ``-`` where not measured."""
    samples = row.first_call_new_process_samples
    if not samples:
        return "-"
    median = statistics.median(samples)
    spread = f"{min(samples):.3f}-{max(samples):.3f} s, {len(samples)} processes" if len(samples) > 1 else "1 process"
    return f"{median:.3f} ({median / row.seconds:.2f}x; {spread})"


def write_transcribe_reports(reports: list[TranscribeReport], command: str, json_path: str, markdown_path: str) -> str:
    """JSON (environment, command, every report) and a Markdown table; returns the Markdown."""
    env = environment()
    with open(json_path, "w") as f:
        json.dump({"command": command, "environment": env, "reports": [asdict(r) for r in reports]}, f, indent=1)
    lines = report_header(f"model.transcribe end to end ({env['gpu']})", command, env)
    for r in reports:
        nemo = next((row for row in r.rows if row.name == "nemo"), None)
        calibration = "trained (rate and bursts)" if r.calibration == "trained" else f"{r.calibration} tokens/frame"
        lines += [
            f"## {r.model}, calibration {calibration}: {r.utterances} files, {r.audio_seconds:.0f} s, "
            f"batch_size {r.batch_size}, {r.precision}",
            "",
            *emission_report_lines(r.emissions, r.trained_emissions, "nemo row"),
            "| row | first call s | first call, new process s (median; x best) | best s | RTFx | vs nemo | tokens "
            "| same tokens as nemo | preproc s | encoder s | decoder s | other s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in r.rows:
            ratio = f"{row.seconds / nemo.seconds:.3f}" if nemo else "-"
            s = row.stages
            lines.append(
                f"| {row.name} | {row.first_call_seconds:.3f} | {_new_process_cell(row)} | "
                f"{row.seconds:.3f} | {row.rtfx:.0f} | {ratio} | "
                f"{row.tokens} | {row.identical_to_nemo:.1%} | {s.get('preprocessor', 0):.3f} | "
                f"{s.get('encoder', 0):.3f} | {s.get('decoder', 0):.3f} | {s.get('other', 0):.3f} |"
            )
        lines.append("")
    markdown = "\n".join(lines)
    with open(markdown_path, "w") as f:
        f.write(markdown)
    return markdown
