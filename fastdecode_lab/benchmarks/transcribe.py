"""End-to-end benchmark of what ``model.transcribe`` users see: NeMo run as throughput leaderboards run it, and ours.

Every row runs ``model.transcribe`` on the same audio files (a synthetic LibriSpeech test-other-like set written as
WAV files, listed in shuffled order as a manifest lists them, read by the row's data path), in one process, in each
of the run's precisions (:data:`~fastdecode_lab.configs.PRECISIONS`): ``fp32``; ``bf16_autocast`` (fp32 weights,
``torch.autocast(<device>, bfloat16)`` around each call); ``bf16_weights`` (the whole calibrated model cast with
``model.to(torch.bfloat16)``, put back to its fp32 tensors afterwards). The rows (:data:`ROWS`, each a
:class:`RowSpec`: strategy, decoding section, offline-path options, input order, batch size):

* ``nemo`` -- NeMo's default strategy (``greedy_batch``) and NeMo's ``transcribe``, files in manifest order, the run's
  ``batch_size``;
* ``nemo_sorted_b128`` -- the same with the files sorted longest-first (as leaderboards' evaluation scripts do) and
  ``batch_size=128``;
* ``nemo_sorted_best`` -- sorted, at the fastest of ``nemo_batch_sizes``: one warm call at the largest, then each
  size timed once (every size's time kept in the row), then ``repeats - 1`` more calls at the winner;
* ``fast_greedy`` -- our decoder, NeMo's ``transcribe``;
* ``fast_greedy+offline`` -- our decoder and the offline path (:mod:`nemo_fastdecode.offline`: length-sorted
  budgeted batches, audio read ahead on threads, the decoder sized once);
* ``fast_greedy+offline+fast_encoder`` -- the same with ``FastTranscribeOptions(fast_encoder=True)``;
* ``nemo+offline`` -- NeMo's decoder on the offline path (what the batching alone buys);
* ``fast_beam+offline`` and ``nemo_beam_sorted_best`` -- beam search with 4 beams: ours on the offline path, NeMo's
  ``malsd_batch`` sorted at its best batch (only when named in ``rows``).

Sorted rows' results are put back in input order before tokens are compared. A row whose offline options name a
field :class:`~nemo_fastdecode.offline.FastTranscribeOptions` lacks is skipped, and a row whose calls raise (NeMo's
``transcribe`` of a bf16 model: "mat1 and mat2 must have the same dtype") is recorded as failed; either way its
``error`` says why and the run goes on.

For each row: the first call (after the model and CUDA are initialised by a short call on other audio in the same
precision) and the best of ``repeats`` later calls; for our fastest row also the first call in a new process
(``first_call_new_process``: the same set-up in ``new_processes`` child processes run one after another, after this
one compiled every Triton kernel into Triton's on-disk cache, as on any run but a machine's very first; their median
and spread); then tokens, agreement with the reference row (the first NeMo row of the same precision and family that
ran, else of another precision) and one extra call timed per stage (:func:`stage_timer`). Each report's headline sets
our fastest row against NeMo's fastest row of the same family (greedy, beam), any precision; each row's ``vs NeMo
best`` is its time over the fastest NeMo row of the same precision and family.

Each calibration is a separate test set: a number is the target tokens per frame of the blank-bias calibration,
``trained`` the trained models' rate and burst length (:func:`~fastdecode_lab.synthetic.calibrate_trained_like`);
the calibration runs once, on bf16-autocast encoder outputs on a GPU (fp32 on the CPU), and every precision decodes
that model. The test set's emission statistics (:mod:`fastdecode_lab.emissions`) are measured on the hypotheses of
the greedy reference row in fp32 (where fp32 ran, else in the first precision that ran) and reported next to the
trained models' ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from fastdecode_lab import synthetic
from fastdecode_lab.benchmarks.exactness import _error_text, autocast, autocast_problem, bf16_weights
from fastdecode_lab.configs import PRECISIONS, check_choices
from fastdecode_lab.emissions import (
    EmissionStats,
    emission_report_lines,
    emission_stats,
    trained_emission_stats_for,
)
from nemo_fastdecode.apps.environment import environment, report_header
from nemo_fastdecode.apps.models import apply_decoding
from nemo_fastdecode.apps.timing import synchronize
from nemo_fastdecode.offline import FastTranscribeOptions, disable_fast_transcribe, enable_fast_transcribe

#: the beam rows' beam section (merged over the model's; ``max_symbols`` is the run's)
BEAM_4: dict[str, Any] = {"beam": {"beam_size": 4, "return_best_hypothesis": True}}
#: our strategies (a row with one of them, or on the offline path, is ours)
OUR_STRATEGIES = ("fast_greedy", "fast_beam")


@dataclass(frozen=True)
class RowSpec:
    """How a row calls ``model.transcribe``.

    Attributes:
        strategy: the decoding strategy (``apply_decoding``), with ``greedy.max_symbols`` or ``beam.max_symbols`` set
            to the run's.
        decoding: more of the decoding section, merged over the model's (e.g. :data:`BEAM_4`).
        offline: :class:`~nemo_fastdecode.offline.FastTranscribeOptions` fields for the offline path
            (``enable_fast_transcribe``); ``None``: NeMo's ``transcribe``.
        longest_first: hand ``transcribe`` the files sorted longest-first (results put back in input order).
        batch_size: ``transcribe``'s ``batch_size``; ``None``: the run's.
        sweep: time each of the run's ``nemo_batch_sizes`` and keep the fastest (``batch_size`` is then ignored).
    """

    strategy: str
    decoding: dict[str, Any] = field(default_factory=dict)
    offline: dict[str, Any] | None = None
    longest_first: bool = False
    batch_size: int | None = None
    sweep: bool = False

    @property
    def ours(self) -> bool:
        return self.strategy in OUR_STRATEGIES or self.offline is not None

    @property
    def family(self) -> str:
        """``greedy`` or ``beam``: rows are compared within a family."""
        return "greedy" if "greedy" in self.strategy else "beam"


ROWS: dict[str, RowSpec] = {
    "nemo": RowSpec("greedy_batch"),
    "nemo_sorted_b128": RowSpec("greedy_batch", longest_first=True, batch_size=128),
    "nemo_sorted_best": RowSpec("greedy_batch", longest_first=True, sweep=True),
    "fast_greedy": RowSpec("fast_greedy"),
    "fast_greedy+offline": RowSpec("fast_greedy", offline={}),
    "fast_greedy+offline+fast_encoder": RowSpec("fast_greedy", offline={"fast_encoder": True}),
    "nemo+offline": RowSpec("greedy_batch", offline={}),
    "fast_beam+offline": RowSpec("fast_beam", BEAM_4, offline={}),
    "nemo_beam_sorted_best": RowSpec("malsd_batch", BEAM_4, longest_first=True, sweep=True),
}
#: the rows a run without ``rows`` times: NeMo as leaderboards run it, and ours
DEFAULT_ROWS: tuple[str, ...] = (
    "nemo",
    "nemo_sorted_b128",
    "nemo_sorted_best",
    "fast_greedy+offline",
    "fast_greedy+offline+fast_encoder",
)


@dataclass
class TranscribeRow:
    """One row in one precision: its timings, tokens and stages, or the ``error`` that kept it from running."""

    name: str
    precision: str
    ours: bool
    family: str  # greedy or beam
    batch_size: int = 0  # transcribe's batch_size (a sweep's winner)
    longest_first: bool = False
    # in this process (on a fresh machine it includes compiling the Triton kernels); a sweep row: its warm call
    first_call_seconds: float = 0.0
    seconds: float = 0.0  # best of the timed calls
    rtfx: float = 0.0
    tokens: int = 0
    identical_to_nemo: float = 0.0  # share of utterances with the reference row's token ids
    reference: str = ""  # that row: "<name> (<precision>)"
    stages: dict[str, float] = field(default_factory=dict)
    call_seconds: list[float] = field(default_factory=list)
    sweep_seconds: dict[int, float] = field(default_factory=dict)  # batch size -> its one timed call (sweep rows)
    first_call_new_process_seconds: float | None = None  # median over new processes, Triton's on-disk cache warm
    first_call_new_process_samples: list[float] = field(default_factory=list)  # each new process's first call
    error: str | None = None  # why the row has no timings: "skipped: ..." or the exception its call raised

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class TranscribeReport:
    """One model and test set (calibration): every row in every precision."""

    model: str
    calibration: float | str  # target tokens per frame of the blank-bias calibration, or "trained"
    utterances: int
    audio_seconds: float
    batch_size: int
    precisions: list[str] = field(default_factory=list)
    emissions: EmissionStats | None = None
    emissions_row: str = ""  # the row whose hypotheses gave ``emissions``
    trained_emissions: EmissionStats | None = None  # the trained model's of the same kind (RNN-T or TDT)
    rows: list[TranscribeRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what did not go as planned outside the rows


class RowSkipped(Exception):
    """A row this installation cannot run as specified (an offline option it does not have)."""


@contextlib.contextmanager
def stage_timer(model, device: torch.device) -> Iterator[dict[str, float]]:
    """Seconds of one ``transcribe`` call per stage, the GPU synchronised at each boundary; enter it right before
    the call and read ``other`` after it.

    * ``data``: from entering the block to the first preprocessor call, plus, for every later batch, from the end of
      the previous batch's decoding to its preprocessor call: building the loader and waiting for each next batch
      (reading and resampling audio that was not read ahead, collating, the copy to the device), with the host work
      NeMo does per batch between the model's calls (handing the hypotheses back); on the offline path also sizing
      the decoder, which overlaps reading the first batches;
    * ``preprocessor``, ``encoder``: inside those modules' ``forward``;
    * ``decoder``: inside ``model.decoding.rnnt_decoder_predictions_tensor``;
    * ``other`` (set by the caller): the call's time less the above -- host work between the preprocessor, encoder
      and decoder of a batch, and from the last batch's decoding to the call's return (gathering the results).
    """
    stages: dict[str, float] = {"data": 0.0, "preprocessor": 0.0, "encoder": 0.0, "decoder": 0.0}
    starts: dict[str, float] = {}
    handles = []

    def data_pre(_m, _a):
        synchronize(device)
        now = time.perf_counter()
        stages["data"] += now - starts["data"]
        starts["preprocessor"] = now

    for name, module in (("preprocessor", model.preprocessor), ("encoder", model.encoder)):

        def pre(_m, _a, name=name):
            synchronize(device)
            starts[name] = time.perf_counter()

        def post(_m, _a, _o, name=name):
            synchronize(device)
            stages[name] += time.perf_counter() - starts[name]

        handles += [module.register_forward_pre_hook(data_pre if name == "preprocessor" else pre)]
        handles += [module.register_forward_hook(post)]
    decode = model.decoding.rnnt_decoder_predictions_tensor

    def timed_decode(*args, **kwargs):
        synchronize(device)
        start = time.perf_counter()
        out = decode(*args, **kwargs)
        synchronize(device)
        starts["data"] = time.perf_counter()  # the wait for the next batch starts here
        stages["decoder"] += starts["data"] - start
        return out

    model.decoding.rnnt_decoder_predictions_tensor = timed_decode
    synchronize(device)
    starts["data"] = time.perf_counter()
    try:
        yield stages
    finally:
        for handle in handles:
            handle.remove()
        del model.decoding.rnnt_decoder_predictions_tensor  # the class method again


def _transcribe(model, paths: list[str], batch_size: int, precision: str, order: list[int] | None = None) -> list[Any]:
    """``model.transcribe(paths)``'s hypotheses in ``precision``'s autocast (the weights are the caller's); with
    ``order``, the files are handed over in that order and the results put back in the order of ``paths``."""
    device = next(model.parameters()).device
    inputs = paths if order is None else [paths[i] for i in order]
    with autocast(precision, device), torch.inference_mode():
        hyps = model.transcribe(inputs, batch_size=batch_size, return_hypotheses=True, verbose=False)
    model.eval()  # NeMo's transcribe leaves modules in train mode
    hyps = hyps[0] if isinstance(hyps, tuple) else hyps
    if order is None:
        return hyps
    in_input_order: list[Any] = [None] * len(hyps)
    for hyp, index in zip(hyps, order, strict=True):
        in_input_order[index] = hyp
    return in_input_order


def _timed(call: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """Seconds of ``call()`` (the device synchronised on both sides) and what it returned."""
    synchronize(device)
    start = time.perf_counter()
    out = call()
    synchronize(device)
    return time.perf_counter() - start, out


@contextlib.contextmanager
def precision_weights(model, precision: str) -> Iterator[None]:
    """The model's weights as ``precision`` runs them: cast to bf16 for ``bf16_weights`` (its fp32 tensors back
    afterwards), as they are otherwise."""
    with bf16_weights([model]) if precision == "bf16_weights" else contextlib.nullcontext():
        yield


@dataclass(frozen=True)
class SyntheticSet:
    """What makes a benchmark's model and files: the same values give the same ones in any process. ``bf16``: the
    calibration and the warm-up call run under bf16 autocast on a GPU."""

    preset: str
    total_seconds: float
    batch_size: int
    calibration: float | str
    bf16: bool
    max_symbols: int
    seed: int


def _warm_up_files(folder: str, seed: int) -> list[str]:
    """Two short WAV files (1 s, 2 s) that are not in the test set: the call that initialises a model."""
    return [
        str(p)
        for p in synthetic.write_wavs(synthetic.synthetic_audio([1.0, 2.0], seed=seed + 1), folder, prefix="warm_up")
    ]


def warm_up(model, folder: str, synthetic_set: SyntheticSet, precision: str) -> str | None:
    """A short ``transcribe`` of other audio with NeMo's default decoder in ``precision`` (CUDA context, cuBLAS,
    the precision's kernels and NeMo's lazy set-up: no row pays them). Returns ``None``, or the error text where
    NeMo's ``transcribe`` raised in this precision (the first row then pays what the warm-up did not)."""
    apply_decoding(model, {"strategy": "greedy_batch"})
    try:
        _transcribe(model, _warm_up_files(folder, synthetic_set.seed), 2, precision)
    except Exception as error:  # NeMo's transcribe of a bf16 model; the rows record their own errors
        model.eval()
        return _error_text(error)
    return None


@contextlib.contextmanager
def prepared(
    synthetic_set: SyntheticSet, device: torch.device | str | None = None
) -> Iterator[tuple[Any, list[str], list[float]]]:
    """The calibrated synthetic model, its WAV files (shuffled, as a manifest lists them) and their durations, after
    :func:`warm_up` (in bf16 autocast where ``synthetic_set.bf16`` on a GPU); the files live as long as the block."""
    t = synthetic_set
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = synthetic.build_synthetic_model(t.preset, seed=t.seed, device=device)
    model.eval()
    durations = synthetic.librispeech_like_durations(total_seconds=t.total_seconds, seed=t.seed)
    audio = synthetic.synthetic_audio(durations, seed=t.seed)
    bf16 = t.bf16 and device.type == "cuda"
    encoded, lengths = synthetic.encode(
        model, audio[: 2 * t.batch_size], batch_size=t.batch_size, device=device, dtype=torch.bfloat16 if bf16 else None
    )
    synthetic.apply_calibration(
        model, [e.float() for e in encoded[:2]], lengths[:2], t.calibration, max_symbols=t.max_symbols, seed=t.seed
    )
    with tempfile.TemporaryDirectory() as folder:
        paths = [str(p) for p in synthetic.write_wavs(audio, folder)]
        random.Random(t.seed).shuffle(paths)  # a manifest is not sorted by length
        warm_up(model, folder, t, "bf16_autocast" if bf16 else "fp32")
        yield model, paths, durations


def _set_up_row(model, spec: RowSpec, max_symbols: int) -> None:
    """``spec``'s decoding strategy, and the offline path on or off. Raises :class:`RowSkipped` where
    :class:`FastTranscribeOptions` lacks one of the row's offline options."""
    disable_fast_transcribe(model)
    if spec.offline is not None:
        known = {f.name for f in dataclasses.fields(FastTranscribeOptions)}
        missing = sorted(set(spec.offline) - known)
        if missing:
            raise RowSkipped(
                f"skipped: nemo_fastdecode.offline.FastTranscribeOptions has no field {', '.join(missing)}"
            )
    section: dict[str, Any] = {"strategy": spec.strategy, spec.family: {"max_symbols": max_symbols}}
    for key, value in spec.decoding.items():
        section[key] = {**section.get(key, {}), **value} if isinstance(value, dict) else value
    apply_decoding(model, section)
    if spec.offline is not None:
        enable_fast_transcribe(model, FastTranscribeOptions(**spec.offline))


def _longest_first(durations: Sequence[float]) -> list[int]:
    return sorted(range(len(durations)), key=lambda i: -durations[i])


def _first_call(
    model, paths: list[str], durations: list[float], synthetic_set: SyntheticSet, row: str, precision: str
) -> float:
    """Seconds of the first ``transcribe`` of ``paths`` with ``row``'s set-up, at the row's batch size (a sweep row
    has none before its sweep: refused)."""
    spec = ROWS[row]
    if spec.sweep:
        raise ValueError(f"{row} picks its batch size by a sweep: no first call of its own")
    _set_up_row(model, spec, synthetic_set.max_symbols)
    run = _Run(model, paths, durations, synthetic_set, repeats=1, nemo_batch_sizes=[])
    seconds, _ = run.call(spec, spec.batch_size or synthetic_set.batch_size, precision)
    return seconds


def _device(model) -> torch.device:
    return next(model.parameters()).device


def first_call_in_new_process(
    synthetic_set: SyntheticSet,
    row: str,
    precision: str = "fp32",
    device: torch.device | str | None = None,
    timeout: float = 600.0,
) -> float:
    """The first ``transcribe`` call of ``row`` in ``precision`` in a new Python process on the same model and files
    (made again there from ``synthetic_set``, warmed up in that precision): what every run after a machine's first
    sees, the Triton kernels loaded from the on-disk cache this process filled. Raises ``RuntimeError`` with the
    child's output if it fails."""
    argument = json.dumps(
        {
            "synthetic_set": asdict(synthetic_set),
            "row": row,
            "precision": precision,
            "device": None if device is None else str(device),
        }
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
    precision = values["precision"]
    with (
        prepared(synthetic_set, values["device"]) as (model, paths, durations),
        tempfile.TemporaryDirectory() as folder,
    ):
        with precision_weights(model, precision):
            warm_up(model, folder, synthetic_set, precision)
            seconds = _first_call(model, paths, durations, synthetic_set, values["row"], precision)
        print(f"{_CHILD_RESULT}{seconds:.6f}", flush=True)


@dataclass
class _Run:
    """What every row of one report shares."""

    model: Any
    paths: list[str]
    durations: list[float]
    synthetic_set: SyntheticSet
    repeats: int
    nemo_batch_sizes: list[int]

    @property
    def device(self) -> torch.device:
        return _device(self.model)

    def call(self, spec: RowSpec, batch_size: int, precision: str) -> tuple[float, list[Any]]:
        """One timed ``transcribe`` with the row's input order (the set-up is the caller's)."""
        order = _longest_first(self.durations) if spec.longest_first else None
        return _timed(lambda: _transcribe(self.model, self.paths, batch_size, precision, order), self.device)

    def row(self, name: str, precision: str) -> tuple[TranscribeRow, list[Any]]:
        """``name``'s row in ``precision`` and its last call's hypotheses (none where it was skipped or failed)."""
        spec = ROWS[name]
        row = TranscribeRow(name, precision, spec.ours, spec.family, longest_first=spec.longest_first)
        try:
            _set_up_row(self.model, spec, self.synthetic_set.max_symbols)
            if spec.sweep:  # one warm call at the largest, each size once, then the rest of the repeats at the best
                row.first_call_seconds, _ = self.call(spec, max(self.nemo_batch_sizes), precision)
                for size in sorted(self.nemo_batch_sizes, reverse=True):
                    row.sweep_seconds[size], hyps = self.call(spec, size, precision)
                row.batch_size = min(row.sweep_seconds, key=row.sweep_seconds.__getitem__)
                row.call_seconds = [row.sweep_seconds[row.batch_size]]
                repeats = self.repeats - 1
            else:
                row.batch_size = spec.batch_size or self.synthetic_set.batch_size
                row.first_call_seconds, hyps = self.call(spec, row.batch_size, precision)
                repeats = self.repeats
            for _ in range(repeats):
                seconds, hyps = self.call(spec, row.batch_size, precision)
                row.call_seconds.append(seconds)
            with stage_timer(self.model, self.device) as stages:
                seconds, _ = self.call(spec, row.batch_size, precision)
            stages["other"] = seconds - sum(stages.values())
        except RowSkipped as skipped:
            row.error = str(skipped)
            return row, []
        except Exception as error:  # recorded in the report; the other rows still run
            row.error = _error_text(error)
            return row, []
        finally:
            disable_fast_transcribe(self.model)
            self.model.eval()
        row.seconds = min(row.call_seconds)
        row.rtfx = sum(self.durations) / row.seconds
        row.tokens = sum(len(h.y_sequence) for h in hyps)
        row.stages = {k: round(v, 4) for k, v in stages.items()}
        return row, hyps


def _token_ids(hyps: list[Any]) -> list[list[int]]:
    return [[int(t) for t in h.y_sequence] for h in hyps]


def _reference_for(row: TranscribeRow, rows: list[TranscribeRow]) -> TranscribeRow:
    """The row ``row`` is compared with: the first NeMo row that ran in the same family and precision, else in the
    same family and any precision, else the first row that ran."""
    ran = [r for r in rows if r.ok]
    for candidates in (
        [r for r in ran if not r.ours and r.family == row.family and r.precision == row.precision],
        [r for r in ran if not r.ours and r.family == row.family],
        ran,
    ):
        if candidates:
            return candidates[0]
    return row


def benchmark_transcribe(
    preset: str,
    total_seconds: float,
    batch_size: int = 32,
    repeats: int = 2,
    calibration: float | str = 0.3,
    precisions: Sequence[str] = ("fp32",),
    rows: list[str] | None = None,
    nemo_batch_sizes: Sequence[int] = (16, 32, 64, 128),
    max_symbols: int = 10,
    seed: int = 0,
    device: torch.device | str | None = None,
    log: Callable[[str], None] = print,
    first_call_new_process: bool = False,
    new_processes: int = 1,
) -> TranscribeReport:
    """Time ``model.transcribe`` for each row of :data:`DEFAULT_ROWS` (or ``rows``, names in :data:`ROWS`) in each
    of ``precisions`` on one synthetic model and test set.

    ``calibration``: the target tokens per frame of the blank-bias calibration, or ``"trained"`` (see the module
    docstring); calibrated on the first two batches' encoder outputs. ``repeats``: timed calls per row after its
    first (a sweep row's: its call in the sweep and ``repeats - 1`` more). ``first_call_new_process``: also time the
    first call of our fastest row in ``new_processes`` child processes, one after another
    (:func:`first_call_in_new_process`); the row keeps each and their median (a first call is one sample, and one
    process's can carry a cost others do not)."""
    calibration = synthetic.check_calibration(calibration)
    precisions = check_choices("precisions", precisions, PRECISIONS)
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if first_call_new_process and new_processes < 1:
        raise ValueError(f"new_processes must be >= 1 when first_call_new_process is set, got {new_processes}")
    names = check_choices("rows", rows or list(DEFAULT_ROWS), list(ROWS))
    sizes = sorted(set(nemo_batch_sizes))
    if any(ROWS[n].sweep for n in names) and (not sizes or sizes[0] < 1):
        raise ValueError(f"nemo_batch_sizes must be batch sizes >= 1, got {list(nemo_batch_sizes)}")
    synthetic_set = SyntheticSet(preset, total_seconds, batch_size, calibration, True, max_symbols, seed)
    with prepared(synthetic_set, device) as (model, paths, durations), tempfile.TemporaryDirectory() as folder:
        run = _Run(model, paths, durations, synthetic_set, repeats, sizes)
        report = TranscribeReport(preset, calibration, len(durations), sum(durations), batch_size, precisions)
        report.trained_emissions = trained_emission_stats_for(model)
        hyps_of: dict[int, list[Any]] = {}
        problem = autocast_problem(run.device)
        for precision in precisions:
            if precision == "bf16_autocast" and problem:
                reason = f"skipped: {run.device.type} autocast cannot run the LSTM prediction network ({problem})"
                for name in names:
                    report.rows.append(TranscribeRow(name, precision, ROWS[name].ours, ROWS[name].family, error=reason))
                continue
            with precision_weights(model, precision):
                if failed := warm_up(model, folder, synthetic_set, precision):
                    report.notes.append(f"{precision}: the warm-up call with NeMo's default failed ({failed})")
                for name in names:
                    row, hyps = run.row(name, precision)
                    report.rows.append(row)
                    hyps_of[id(row)] = hyps
                    log(f"{preset} (calibration {calibration}, {precision}) {_log_line(row)}")
        for row in report.rows:
            if row.ok:
                reference = _reference_for(row, report.rows)
                ids, expected = _token_ids(hyps_of[id(row)]), _token_ids(hyps_of[id(reference)])
                row.identical_to_nemo = sum(a == b for a, b in zip(expected, ids, strict=True)) / len(ids)
                row.reference = f"{reference.name} ({reference.precision})"
        greedy = sorted((r for r in report.rows if r.ok and r.family == "greedy"), key=lambda r: r.precision != "fp32")
        if greedy:  # fp32 first: the test set's statistics, not a precision's
            first = _reference_for(greedy[0], [r for r in greedy if r.precision == greedy[0].precision])
            report.emissions = emission_stats(hyps_of[id(first)])
            report.emissions_row = f"{first.name} row, {first.precision}"
        best = _fastest([r for r in report.rows if r.ours and r.family == "greedy"])
        if first_call_new_process and best is not None:
            samples = [
                first_call_in_new_process(synthetic_set, best.name, best.precision, device)
                for _ in range(new_processes)
            ]
            best.first_call_new_process_samples = samples
            best.first_call_new_process_seconds = statistics.median(samples)
            log(
                f"{preset} (calibration {calibration}) {best.name} ({best.precision}): first call in new processes {_new_process_cell(best)}"
            )
    return report


def _log_line(row: TranscribeRow) -> str:
    if not row.ok:
        return f"{row.name}: {row.error}"
    sweep = f" (sweep {_sweep_cell(row)})" if row.sweep_seconds else ""
    return (
        f"{row.name}: batch {row.batch_size}{sweep}, first {row.first_call_seconds:.3f} s, best {row.seconds:.3f} s "
        f"(RTFx {row.rtfx:.0f}), {row.tokens} tokens, stages {row.stages}"
    )


def _fastest(rows: list[TranscribeRow]) -> TranscribeRow | None:
    ran = [r for r in rows if r.ok]
    return min(ran, key=lambda r: r.seconds) if ran else None


def _sweep_cell(row: TranscribeRow) -> str:
    """``16: 1.234, 32: 1.101 s``: each swept batch size's timed call."""
    return ", ".join(f"{size}: {seconds:.3f}" for size, seconds in sorted(row.sweep_seconds.items())) + " s"


def _new_process_cell(row: TranscribeRow) -> str:
    """``<median> (<median / best>x; <min>-<max> s, <n> processes)``: the median first call in a new process, its
    ratio to the row's best call, and the spread; ``-`` where not measured."""
    samples = row.first_call_new_process_samples
    if not samples:
        return "-"
    median = statistics.median(samples)
    spread = f"{min(samples):.3f}-{max(samples):.3f} s, {len(samples)} processes" if len(samples) > 1 else "1 process"
    return f"{median:.3f} ({median / row.seconds:.2f}x; {spread})"


def headlines(report: TranscribeReport) -> list[str]:
    """One line per family with both a NeMo row and one of ours that ran: our fastest row's RTFx, its speed-up over
    NeMo's fastest row (any precision of each), and its share of utterances with the reference row's tokens."""
    lines = []
    for family in ("greedy", "beam"):
        rows = [r for r in report.rows if r.family == family]
        ours, nemo = _fastest([r for r in rows if r.ours]), _fastest([r for r in rows if not r.ours])
        if ours is None or nemo is None:
            continue
        lines.append(
            f"**{family}: ours at best {ours.name} ({ours.precision}) RTFx {ours.rtfx:,.0f}, "
            f"{nemo.seconds / ours.seconds:.2f}x NeMo at best** ({nemo.name}, {nemo.precision}, batch {nemo.batch_size}: "
            f"RTFx {nemo.rtfx:,.0f}); same tokens as {ours.reference}: {ours.identical_to_nemo:.1%}"
        )
    return lines


def write_transcribe_reports(reports: list[TranscribeReport], command: str, json_path: str, markdown_path: str) -> str:
    """JSON (environment, command, every report) and a Markdown table per report; returns the Markdown."""
    env = environment()
    with open(json_path, "w") as f:
        json.dump({"command": command, "environment": env, "reports": [asdict(r) for r in reports]}, f, indent=1)
    lines = report_header(f"model.transcribe end to end ({env['gpu']})", command, env)
    for r in reports:
        calibration = "trained (rate and bursts)" if r.calibration == "trained" else f"{r.calibration} tokens/frame"
        lines += [
            f"## {r.model}, calibration {calibration}: {r.utterances} files, {r.audio_seconds:.0f} s, "
            f"batch_size {r.batch_size}, {', '.join(r.precisions)}",
            "",
            *[f"- {line}" for line in headlines(r) + r.notes],
            "",
            *emission_report_lines(r.emissions, r.trained_emissions, r.emissions_row or "reference row"),
            "| precision | row | batch | first call s | first call, new process s (median; x best) | best s | RTFx "
            "| vs NeMo best | tokens | same tokens as | data s | preproc s | encoder s | decoder s | other s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in r.rows:
            if not row.ok:
                lines.append(f"| {row.precision} | {row.name} | {row.error} |" + " |" * 12)
                continue
            nemo = _fastest(
                [n for n in r.rows if not n.ours and n.family == row.family and n.precision == row.precision]
            )
            ratio = f"{row.seconds / nemo.seconds:.3f}" if nemo else "-"
            batch = f"{row.batch_size} (sweep {_sweep_cell(row)})" if row.sweep_seconds else str(row.batch_size)
            order = ", longest first" if row.longest_first else ""
            s = row.stages
            lines.append(
                f"| {row.precision} | {row.name} | {batch}{order} | {row.first_call_seconds:.3f} | "
                f"{_new_process_cell(row)} | {row.seconds:.3f} | {row.rtfx:.0f} | {ratio} | {row.tokens} | "
                f"{row.identical_to_nemo:.1%} {row.reference} | "
                + " | ".join(f"{s.get(k, 0):.3f}" for k in ("data", "preprocessor", "encoder", "decoder", "other"))
                + " |"
            )
        lines.append("")
    markdown = "\n".join(lines)
    with open(markdown_path, "w") as f:
        f.write(markdown)
    return markdown
