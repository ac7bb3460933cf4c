"""Exactness tables with the speed beside them: ours against NeMo's default strategies on the same inputs.

For each synthetic model and calibration (one model and one test set, built once) and each precision, path and
strategy, NeMo's strategy in its default configuration and ours in its default decode the same inputs in one
process, switched with ``model.change_decoding_strategy``:

* strategies: ``greedy`` -- NeMo's ``greedy_batch`` (label looping, CUDA graphs: NeMo's defaults) against our
  ``fast_greedy``; ``beam`` -- NeMo's ``malsd_batch`` (CUDA graphs allowed: NeMo's default) against our ``fast_beam``,
  both with ``beam_size`` beams, ``max_symbols`` per frame and ``return_best_hypothesis: true`` (the model config's
  ``false`` returns N-best lists, which ``transcribe`` with timestamps refuses);
* paths: ``transcribe`` -- ``model.transcribe(<WAV files>, batch_size, return_hypotheses=True, timestamps=True)``
  with NeMo's other defaults (our offline path stays off); ``decoding_api`` -- NeMo's
  ``model.decoding.rnnt_decoder_predictions_tensor`` on encoder outputs computed once per precision;
* precisions (:data:`PRECISIONS`): ``fp32``; ``bf16_autocast`` (``torch.autocast(<device>, bfloat16)`` around each
  call, fp32 weights; on the decoding API also :data:`BF16_ENCODER`, the autocast encoder's outputs cast to bf16);
  ``bf16_weights`` (through ``transcribe`` the whole model in bf16, through the decoding API the encoder, decoder
  and joint, the encoder's features cast to bf16).

Each row compares every utterance's token ids, per-token frames and TDT token durations (``identical`` needs all
three; where only durations differ from NeMo's batched hypotheses, NeMo's decode of the utterance alone decides, as
its batched TDT label loop records a later step's duration for an utterance that found its label early: see
:func:`run_row`), reports the largest absolute score difference, and times both sides: the best of ``repeats`` calls
after a warm-up call, the device synchronised around the clock (``transcribe``: the whole call; ``decoding_api``:
decoding every batch). A side that raises (NeMo's ``transcribe`` of a bf16 model, say) leaves its error text in the
row and the other side still runs; where NeMo's default raises on bf16 encoder outputs under autocast, ours is compared
with NeMo's decoding of the same outputs ``.float()``. Where autocast cannot run an LSTM (CPU autocast on a CPU without
bf16 instructions) the ``bf16_autocast`` rows are skipped, the reason in their note.

Each test set's emission statistics (:mod:`fastdecode_lab.emissions`: tokens per frame, tokens per emitting
frame) are those of NeMo's ``greedy_batch`` in fp32 through the decoding API, so that a reader sees which set is
bursty. Exactness is decided in fp32 (``../shared/DESIGN.md``, "Measuring"); bf16 rows are reported, not required.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from omegaconf import OmegaConf

from fastdecode_lab import synthetic
from fastdecode_lab.configs import BF16_ENCODER, STRATEGIES, RunOptions
from fastdecode_lab.emissions import (
    EmissionStats,
    emission_report_lines,
    emission_stats,
    trained_emission_stats_for,
)
from nemo_fastdecode.apps.comparison import as_int_list
from nemo_fastdecode.apps.environment import environment, report_header
from nemo_fastdecode.apps.models import is_hybrid
from nemo_fastdecode.apps.timing import synchronize
from nemo_fastdecode.nemo.context import eval_mode, quiet_nemo

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

#: an error's text is cut to this many characters in the row
ERROR_CHARS = 200

Batches = list[tuple[torch.Tensor, torch.Tensor]]  # (encoder output [B, D, T], lengths [B]) per batch
flush_print = functools.partial(print, flush=True)


@dataclass
class ExactnessRow:
    """One (precision, path, strategy) of a test set: NeMo's side and ours on the same inputs.

    ``identical`` and ``differences`` are ``None`` when a side has no hypotheses (it raised); ``differences`` counts
    the utterances whose tokens, frames or durations differ from NeMo's batched hypotheses (one utterance can count
    in several); ``identical`` also counts those whose durations alone differ there but equal NeMo's decode of the
    utterance alone (``durations_as_nemo_alone``; see :func:`run_row`)."""

    precision: str
    path: str
    strategy: str
    nemo_strategy: str
    our_strategy: str
    utterances: int
    identical: int | None = None
    differences: dict[str, int] | None = None
    durations_as_nemo_alone: int = 0  # counted in identical: durations as NeMo's decode of the utterance alone
    tokens_ours: int | None = None
    tokens_nemo: int | None = None
    max_score_difference: float | None = None
    seconds_ours: float | None = None
    seconds_nemo: float | None = None
    ratio: float | None = None  # seconds ours / NeMo's: below 1, ours is faster
    calls_ours: list[float] = field(default_factory=list)
    calls_nemo: list[float] = field(default_factory=list)
    encoder_dtype: str | None = None  # decoding_api: the dtype of the encoder outputs decoded
    error: str | None = None
    note: str | None = None


@dataclass
class ExactnessSet:
    """One synthetic model and calibration (its test set) and its rows."""

    model: str
    calibration: float | str  # target tokens per frame of the blank-bias calibration, or "trained"
    utterances: int
    audio_seconds: float
    batch_size: int
    beam_size: int
    max_symbols: int
    vocab: str
    emissions: EmissionStats | None = None  # NeMo's greedy_batch, fp32, decoding API, the whole set
    trained_emissions: EmissionStats | None = None  # the shipped trained model's of the same kind
    rows: list[ExactnessRow] = field(default_factory=list)
    wall_seconds: float = 0.0  # building, calibrating, encoding and every row
    error: str | None = None  # the set could not be built or run (its rows so far are kept)


@dataclass
class _Side:
    """One strategy's calls on a row's inputs."""

    hyps: list[Any]
    calls: list[float]


def _error_text(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".replace("\n", " ").replace("|", "/")
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


# ---- precisions -----------------------------------------------------------------------------------------------
def autocast_problem(device: torch.device) -> str | None:
    """Why bf16 autocast cannot run an LSTM (NeMo's prediction network) on ``device``, or ``None`` where it can.

    CPU autocast runs LSTMs in bf16 through oneDNN, which refuses them on CPUs without bf16 instructions; a GPU's
    autocast runs them."""
    if device.type == "cuda":
        return None
    lstm = torch.nn.LSTM(8, 8, batch_first=True)
    try:
        with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16):
            lstm(torch.zeros(1, 1, 8))
    except RuntimeError as error:
        return _error_text(error).split(". ")[0]  # oneDNN's advice to set ONEDNN_VERBOSE is noise here
    return None


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` (a GPU's, or the CPU's) for the ``bf16_autocast`` rows; nothing otherwise."""
    if precision in ("bf16_autocast", BF16_ENCODER):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def under(precision: str, device: torch.device, call: Callable[[], list[Any]]) -> Callable[[], list[Any]]:
    """``call`` run inside ``precision``'s autocast (entered anew at every call)."""

    def wrapped() -> list[Any]:
        with autocast(precision, device):
            return call()

    return wrapped


@contextlib.contextmanager
def bf16_weights(modules: Sequence[torch.nn.Module]) -> Iterator[None]:
    """The parameters and buffers of ``modules`` in bf16 for the block.

    The fp32 tensors themselves are put back afterwards: a cast back to fp32 would keep the bf16 rounding, and the
    rows after this one would decode another model."""
    saved = [
        (sub, kind, name, tensor, tensor.data)
        for module in modules
        for sub in module.modules()
        for kind in ("_parameters", "_buffers")
        for name, tensor in getattr(sub, kind).items()
        if tensor is not None
    ]
    try:
        for module in modules:
            module.to(torch.bfloat16)
        yield
    finally:
        for sub, kind, name, tensor, data in saved:
            tensor.data = data
            getattr(sub, kind)[name] = tensor
        for module in modules:
            for sub in module.modules():
                if isinstance(sub, torch.nn.RNNBase):  # its flat weight list points at the parameters
                    sub._init_flat_weights()
                    sub.flatten_parameters()


# ---- inputs ---------------------------------------------------------------------------------------------------
def encode_batches(
    model: ASRModel, audio: Sequence[np.ndarray], batch_size: int, device: torch.device, precision: str
) -> Batches:
    """The preprocessor and encoder over ``audio`` in batches of ``batch_size``, in order, under ``precision``'s
    autocast; the features are cast to the encoder's dtype (bf16 when its weights are). Encoder outputs are kept in
    the dtype the encoder returns."""
    out: Batches = []
    encoder_dtype = next(model.encoder.parameters()).dtype
    with torch.inference_mode(), eval_mode(model), autocast(precision, device):
        for start in range(0, len(audio), batch_size):
            chunk = [torch.as_tensor(a, dtype=torch.float32) for a in audio[start : start + batch_size]]
            lengths = torch.tensor([c.numel() for c in chunk], dtype=torch.int64)
            signal = torch.zeros(len(chunk), int(lengths.max()), dtype=torch.float32)
            for row, c in enumerate(chunk):
                signal[row, : c.numel()] = c
            features, feature_lengths = model.preprocessor(input_signal=signal.to(device), length=lengths.to(device))
            encoded, encoded_lengths = model.encoder(audio_signal=features.to(encoder_dtype), length=feature_lengths)
            out.append((encoded, encoded_lengths.to(torch.int64)))
    return out


def _as_bf16(batches: Batches) -> Batches:
    return [(e.to(torch.bfloat16), n) for e, n in batches]


def _as_fp32(batches: Batches) -> Batches:
    return [(e.float(), n) for e, n in batches]


# ---- decoding -------------------------------------------------------------------------------------------------
def decoding_section(base: dict[str, Any], strategy: str, *, beam_size: int, max_symbols: int, path: str) -> Any:
    """The model's decoding section with ``strategy`` in its default configuration: only ``max_symbols`` (NeMo's
    default unless changed) and for beam search ``beam_size`` and ``return_best_hypothesis`` are set; NeMo fills in
    the rest. ``compute_timestamps`` is on for ``transcribe`` (as ``timestamps=True`` would set it on its first call)
    and off for the decoding API (the hypotheses carry per-token frames either way; NeMo 3.0's word timestamps fail
    for char TDT models), and a TDT model records its token durations (a recording switch only)."""
    section: dict[str, Any] = {"strategy": strategy, "compute_timestamps": path == "transcribe"}
    if strategy in ("greedy_batch", "fast_greedy"):
        section["greedy"] = {"max_symbols": max_symbols}
    else:
        section["beam"] = {"beam_size": beam_size, "max_symbols": max_symbols, "return_best_hypothesis": True}
    if base.get("model_type") == "tdt" or base.get("durations"):
        section["tdt_include_token_duration"] = True
    return OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(section))


def _set_decoding(model: ASRModel, section: Any) -> None:
    kwargs = {"decoder_type": "rnnt"} if is_hybrid(model) else {}
    with quiet_nemo():
        model.change_decoding_strategy(section, verbose=False, **kwargs)


def transcribe_call(model: ASRModel, paths: list[str], batch_size: int) -> list[Any]:
    """``model.transcribe`` with timestamps, its best hypotheses; the modules left in eval mode."""
    with torch.inference_mode(), quiet_nemo():
        out = model.transcribe(paths, batch_size=batch_size, return_hypotheses=True, timestamps=True, verbose=False)
    model.eval()  # NeMo's transcribe leaves modules in train mode
    return list(out[0] if isinstance(out, tuple) else out)


def decoding_api_call(model: ASRModel, batches: Batches) -> list[Any]:
    """NeMo's decoding API on every batch, its best hypotheses in order."""
    hyps: list[Any] = []
    with torch.inference_mode():
        for encoded, lengths in batches:
            out = model.decoding.rnnt_decoder_predictions_tensor(
                encoder_output=encoded, encoded_lengths=lengths, return_hypotheses=True
            )
            hyps.extend(out[0] if isinstance(out, tuple) else out)
    return hyps


def _run_side(
    model: ASRModel,
    section: Any,
    call: Callable[[], list[Any]],
    repeats: int,
    device: torch.device,
    warm_up_context: contextlib.AbstractContextManager | None = None,
) -> _Side:
    """Set the decoding, one warm-up call (CUDA graph capture, Triton compilation; inside ``warm_up_context``), then
    ``repeats`` timed calls."""
    _set_decoding(model, section)
    with warm_up_context or contextlib.nullcontext():
        call()
    calls: list[float] = []
    hyps: list[Any] = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        hyps = call()
        synchronize(device)
        calls.append(time.perf_counter() - start)
    return _Side(hyps, calls)


class EncoderRecorder:
    """The encoder outputs of the calls made inside it, batch by batch: the inputs of NeMo's decoder within
    ``transcribe`` (for :func:`utterance_alone`)."""

    def __init__(self, model: ASRModel) -> None:
        self.model = model
        self.batches: Batches = []

    def __enter__(self) -> EncoderRecorder:
        self.batches = []
        self._handle = self.model.encoder.register_forward_hook(self._keep)
        return self

    def _keep(self, _module: torch.nn.Module, _args: Any, output: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.batches.append((output[0], output[1].to(torch.int64)))

    def __exit__(self, *_exc: object) -> None:
        self._handle.remove()


def utterance_alone(batches: Batches, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Utterance ``index`` (counted over the batches in order) as a batch of one: ``[1, D, T]``, ``[1]``."""
    for encoded, lengths in batches:
        if index < encoded.shape[0]:
            return encoded[index : index + 1], lengths[index : index + 1]
        index -= encoded.shape[0]
    raise IndexError("utterance index beyond the batches")


# ---- comparison -----------------------------------------------------------------------------------------------
def token_frames(hyp: Any) -> list[int]:
    """Each token's encoder frame (``hyp.timestamp``, or its ``"timestep"`` entry after ``transcribe``)."""
    stamps = hyp.timestamp
    if isinstance(stamps, dict):
        stamps = stamps.get("timestep")
    return as_int_list(stamps)


def differences(reference: Sequence[Any], hyps: Sequence[Any]) -> list[set[str]]:
    """Per utterance, what differs from the reference: ``tokens``, ``frames``, ``durations`` (empty: identical)."""
    if len(reference) != len(hyps):
        raise ValueError(f"{len(reference)} reference hypotheses but {len(hyps)} hypotheses")
    out = []
    for r, h in zip(reference, hyps, strict=True):
        differs = {
            "tokens": as_int_list(r.y_sequence) != as_int_list(h.y_sequence),
            "frames": token_frames(r) != token_frames(h),
            "durations": as_int_list(r.token_duration) != as_int_list(h.token_duration),
        }
        out.append({kind for kind, differ in differs.items() if differ})
    return out


def max_score_difference(reference: Sequence[Any], hyps: Sequence[Any]) -> float:
    return max((abs(float(r.score) - float(h.score)) for r, h in zip(reference, hyps, strict=True)), default=0.0)


def _tokens(hyps: Sequence[Any]) -> int:
    return sum(len(as_int_list(h.y_sequence)) for h in hyps)


def run_row(
    model: ASRModel,
    sections: dict[str, Any],
    row: ExactnessRow,
    call: Callable[[], list[Any]],
    repeats: int,
    device: torch.device,
    fallback: Callable[[], list[Any]] | None = None,
    alone: Callable[[bool], Callable[[int], Any]] | None = None,
    recorder: EncoderRecorder | None = None,
) -> ExactnessRow:
    """NeMo's side, then ours, through ``call``, each with its decoding section (``sections``: strategy -> section);
    their comparison and times go into ``row``. A side's error is kept in the row; ``fallback`` is NeMo's call on the
    same inputs ``.float()``, run where NeMo's default raised.

    NeMo's batched TDT label loop records, for a row that found its label before the others, the duration of a later
    inner step (``tests/test_greedy_exactness.py``); our durations are NeMo's per utterance. So where only durations
    differ, ``alone(fell_back)(i)`` -- NeMo's hypothesis of utterance ``i`` decoded alone on the inputs its side
    decoded (``recorder``, around its warm-up call, keeps them for ``transcribe``) -- decides."""
    errors: list[str] = []
    sides: dict[str, _Side | None] = {}
    fell_back = False
    for who, strategy in (("NeMo", row.nemo_strategy), ("ours", row.our_strategy)):
        context = recorder if who == "NeMo" else None
        try:
            sides[who] = _run_side(model, sections[strategy], call, repeats, device, context)
        except Exception as error:  # a row's failure is reported in its table cell, never fatal
            text = _error_text(error)
            errors.append(f"{who}: " + ("the same error" if errors and errors[0].endswith(text) else text))
            sides[who] = None
            if who == "NeMo" and fallback is not None:
                try:
                    sides[who] = _run_side(model, sections[strategy], fallback, repeats, device)
                    fell_back = True
                    row.note = "NeMo's side: the same encoder outputs .float() (its default raised on them)"
                except Exception as again:
                    errors.append(f"NeMo on .float(): {_error_text(again)}")
    nemo, ours = sides["NeMo"], sides["ours"]
    if nemo is not None:
        row.tokens_nemo, row.calls_nemo, row.seconds_nemo = _tokens(nemo.hyps), nemo.calls, min(nemo.calls)
    if ours is not None:
        row.tokens_ours, row.calls_ours, row.seconds_ours = _tokens(ours.hyps), ours.calls, min(ours.calls)
    if nemo is not None and ours is not None:
        per_utterance = differences(nemo.hyps, ours.hyps)
        row.differences = {kind: sum(kind in d for d in per_utterance) for kind in ("tokens", "frames", "durations")}
        only_durations = [i for i, d in enumerate(per_utterance) if d == {"durations"}]
        if only_durations and alone is not None:
            try:
                row.durations_as_nemo_alone = _durations_as_alone(
                    model, sections[row.nemo_strategy], alone(fell_back), ours.hyps, only_durations
                )
            except Exception as error:
                errors.append(f"NeMo per utterance: {_error_text(error)}")
        row.identical = sum(not d for d in per_utterance) + row.durations_as_nemo_alone
        row.max_score_difference = max_score_difference(nemo.hyps, ours.hyps)
        row.ratio = row.seconds_ours / row.seconds_nemo if row.seconds_nemo else None
    row.error = "; ".join(errors) or None
    return row


def _durations_as_alone(
    model: ASRModel, section: Any, alone: Callable[[int], Any], hyps: Sequence[Any], indices: Sequence[int]
) -> int:
    """How many of utterances ``indices`` of ``hyps`` have the tokens, frames and durations of NeMo's decoding of
    the utterance alone (untimed; NeMo's strategy set again first)."""
    _set_decoding(model, section)
    return sum(not differences([alone(i)], [hyps[i]])[0] for i in indices)


# ---- a test set -----------------------------------------------------------------------------------------------
class _SetRun:
    """One test set's model, audio, fp32 encoder outputs and rows (:func:`benchmark_exactness`)."""

    def __init__(
        self,
        result: ExactnessSet,
        audio: list[np.ndarray],
        options: RunOptions,
        device: torch.device,
        log: Callable[[str], None],
        progress: Callable[[ExactnessSet], None] | None = None,
    ) -> None:
        self.result, self.audio, self.options, self.device, self.log = result, audio, options, device, log
        self.progress = progress
        self.started = time.perf_counter()
        self.label = f"{result.model} (calibration {result.calibration})"
        with quiet_nemo():
            self.model = synthetic.build_synthetic_model(
                result.model, seed=options.seed, device=device, vocab=options.vocab
            )
        self.model.eval()
        self.fp32_batches = self.encode("fp32")
        encoded, lengths = zip(*self.fp32_batches[:2], strict=True)
        self.reached = synthetic.apply_calibration(
            self.model,
            list(encoded),
            list(lengths),
            result.calibration,
            max_symbols=options.max_symbols,
            seed=options.seed,
        )
        self.base = OmegaConf.to_container(self.model.cfg.decoding, resolve=True)
        self.is_tdt = self.base.get("model_type") == "tdt" or bool(self.base.get("durations"))
        result.trained_emissions = trained_emission_stats_for(self.model)
        # the set's emission pattern: NeMo's default greedy decoder in fp32 on every batch (untimed)
        _set_decoding(self.model, self.section("greedy_batch", "decoding_api"))
        reference = decoding_api_call(self.model, self.fp32_batches)
        result.emissions = emission_stats(reference, [int(n) for _, lengths in self.fp32_batches for n in lengths])

    def encode(self, precision: str) -> Batches:
        return encode_batches(self.model, self.audio, self.options.batch_size, self.device, precision)

    def section(self, strategy: str, path: str) -> Any:
        o = self.options
        return decoding_section(self.base, strategy, beam_size=o.beam_size, max_symbols=o.max_symbols, path=path)

    def rows(self, precision: str, path: str) -> Iterator[ExactnessRow]:
        for strategy in self.options.strategies:
            nemo_strategy, our_strategy = STRATEGIES[strategy]
            yield ExactnessRow(precision, path, strategy, nemo_strategy, our_strategy, self.result.utterances)

    def add(
        self,
        row: ExactnessRow,
        call: Callable[[], list[Any]] | None,
        fallback: Callable[[], list[Any]] | None = None,
        inputs: Callable[[bool], Batches] | None = None,
        recorder: EncoderRecorder | None = None,
    ) -> None:
        """Run ``row`` (``call`` None: not run, the reason in its note or error), keep it and report it.
        ``inputs(fell_back)``: the encoder outputs NeMo's side decoded, for the per-utterance duration check (TDT)."""
        start = time.perf_counter()
        if call is not None:
            sections = {s: self.section(s, row.path) for s in (row.nemo_strategy, row.our_strategy)}
            alone = self._alone(row.precision, inputs) if inputs is not None and self.is_tdt else None
            o = self.options
            run_row(self.model, sections, row, call, o.repeats, self.device, fallback, alone, recorder)
        self.result.rows.append(row)
        self.result.wall_seconds = time.perf_counter() - self.started
        self.log(f"{self.label} {row_summary(row)} [{time.perf_counter() - start:.1f} s]")
        if self.progress is not None:
            self.progress(self.result)

    def _alone(self, precision: str, inputs: Callable[[bool], Batches]) -> Callable[[bool], Callable[[int], Any]]:
        """``alone(fell_back)(i)``: NeMo's hypothesis of utterance ``i`` of ``inputs(fell_back)`` decoded alone."""

        def for_side(fell_back: bool) -> Callable[[int], Any]:
            batches = inputs(fell_back)

            def decode(index: int) -> Any:
                one = [utterance_alone(batches, index)]
                # transcribe's batches are recorded: they must be the files' batches, in order
                if int(one[0][1][0]) != int(utterance_alone(self.fp32_batches, index)[1][0]):
                    raise ValueError(f"utterance {index}: the recorded encoder outputs are not in the files' order")
                return under(precision, self.device, lambda: decoding_api_call(self.model, one))()[0]

            return decode

        return for_side

    def transcribe_rows(self, precision: str, wavs: list[str]) -> None:
        """``model.transcribe`` on the WAV files; ``bf16_weights``: the whole model in bf16."""
        weights = bf16_weights([self.model]) if precision == "bf16_weights" else contextlib.nullcontext()
        # TDT: the encoder outputs of NeMo's warm-up call, for the per-utterance duration check
        recorder = EncoderRecorder(self.model) if self.is_tdt else None
        with weights:
            call = under(precision, self.device, lambda: transcribe_call(self.model, wavs, self.options.batch_size))
            for row in self.rows(precision, "transcribe"):
                self.add(row, call, inputs=lambda _: recorder.batches if recorder else [], recorder=recorder)

    def decoding_api_rows(self, precision: str) -> None:
        """The decoding API rows of ``precision``: its encoder outputs computed once, then each strategy's row."""
        if precision == "fp32":
            self._decode_rows("fp32", self.fp32_batches)
        elif precision == "bf16_autocast":
            try:
                batches = self.encode(precision)
            except Exception as error:  # reported in the rows, as a decoder's error would be
                self._encoder_failed(["bf16_autocast", BF16_ENCODER], error)
                return
            # NeMo's default may refuse bf16 encoder outputs: ours is then compared with NeMo's on the same .float()
            self._decode_rows("bf16_autocast", batches, fallback=batches[0][0].dtype != torch.float32)
            self._decode_rows(BF16_ENCODER, _as_bf16(batches), fallback=True)
        else:
            with bf16_weights([self.model.encoder, self.model.decoder, self.model.joint]):
                try:
                    batches = self.encode(precision)
                except Exception as error:
                    self._encoder_failed(["bf16_weights"], error)
                    return
                self._decode_rows("bf16_weights", batches)

    def _decode_rows(self, precision: str, batches: Batches, fallback: bool = False) -> None:
        def call(batches: Batches) -> Callable[[], list[Any]]:
            return under(precision, self.device, lambda: decoding_api_call(self.model, batches))

        def inputs(fell_back: bool) -> Batches:
            return _as_fp32(batches) if fell_back else batches

        for row in self.rows(precision, "decoding_api"):
            row.encoder_dtype = str(batches[0][0].dtype).removeprefix("torch.")
            self.add(row, call(batches), call(_as_fp32(batches)) if fallback else None, inputs)

    def skip(self, precision: str, reason: str) -> None:
        """Rows of ``precision`` (every path) that were not run, ``reason`` in their note."""
        for path in self.options.paths:
            names = (
                [precision, BF16_ENCODER] if path == "decoding_api" and precision == "bf16_autocast" else [precision]
            )
            for name in names:
                for row in self.rows(name, path):
                    row.note = reason
                    self.add(row, None)

    def _encoder_failed(self, precisions: Sequence[str], error: Exception) -> None:
        for precision in precisions:
            for row in self.rows(precision, "decoding_api"):
                row.error = f"encoder: {_error_text(error)}"
                self.add(row, None)

    def close(self) -> None:
        """Free the model and the encoder outputs (a GPU's memory for the next model)."""
        del self.model, self.fp32_batches
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def benchmark_exactness(
    preset: str,
    calibration: float | str,
    total_seconds: float,
    options: RunOptions | None = None,
    device: torch.device | str | None = None,
    log: Callable[[str], None] = flush_print,
    progress: Callable[[ExactnessSet], None] | None = None,
) -> ExactnessSet:
    """Every (precision, path, strategy) row of one synthetic model and calibration (see the module docstring).

    The model (random weights, ``options.vocab`` vocabulary, ``options.seed``) is built and calibrated once, on the
    fp32 encoder outputs of the set's first two batches; the set is ``total_seconds`` of LibriSpeech test-other-like
    audio sorted longest first, given to ``transcribe`` as WAV files in that order and to the decoding API in the same
    batches of ``options.batch_size``. Never raises for a failure of the set itself: a row's failure is in the row,
    a failure to build or calibrate in the set's ``error`` (its traceback in the log), with the rows done so far.
    ``progress`` is called with the set after each row (a caller writes its reports there, so that a run stopped at
    a time limit keeps the rows it finished)."""
    options = options or RunOptions()
    calibration = synthetic.check_calibration(calibration)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    started = time.perf_counter()
    durations = synthetic.librispeech_like_durations(total_seconds=total_seconds, seed=options.seed)  # longest first
    o = options
    result = ExactnessSet(
        preset, calibration, len(durations), sum(durations), o.batch_size, o.beam_size, o.max_symbols, o.vocab
    )
    log(
        f"{preset} (calibration {calibration}): building the model and {len(durations)} utterances, {total_seconds:g} s"
    )
    run: _SetRun | None = None
    try:
        audio = synthetic.synthetic_audio(durations, seed=options.seed)
        run = _SetRun(result, audio, options, device, log, progress)
        log(
            f"{run.label}: calibrated to {run.reached:.3f} tokens/frame on two batches, ready in "
            f"{time.perf_counter() - started:.1f} s; emissions (NeMo greedy_batch, fp32): {result.emissions.summary()}"
        )
        with tempfile.TemporaryDirectory(prefix="exactness_") as folder:
            wavs = [str(p) for p in synthetic.write_wavs(audio, folder)]
            for precision in options.precisions:
                if precision == "bf16_autocast" and (problem := autocast_problem(device)):
                    run.skip(
                        precision, f"skipped: {device.type} autocast cannot run the LSTM prediction network ({problem})"
                    )
                    continue
                if "transcribe" in options.paths:
                    run.transcribe_rows(precision, wavs)
                if "decoding_api" in options.paths:
                    run.decoding_api_rows(precision)
    except Exception as error:  # one set's failure must not lose the others' results
        result.error = _error_text(error)
        log(f"{preset} (calibration {calibration}) failed:\n{traceback.format_exc()}")
    finally:
        if run is not None:
            run.close()
    result.wall_seconds = time.perf_counter() - started
    return result


def row_summary(row: ExactnessRow) -> str:
    """One progress line: the row, its agreement, tokens and times, its error."""
    same = f"{row.identical}/{row.utterances} identical" if row.identical is not None else "not compared"
    if row.durations_as_nemo_alone:
        same += f" ({row.durations_as_nemo_alone} with NeMo's durations of the utterance alone)"
    score = f", max |score diff| {row.max_score_difference:.3g}" if row.max_score_difference is not None else ""
    times = f", ours {_seconds(row.seconds_ours)} s, NeMo {_seconds(row.seconds_nemo)} s"
    ratio = f" (ratio {row.ratio:.3f})" if row.ratio is not None else ""
    tokens = f", tokens {row.tokens_ours} / {row.tokens_nemo}"
    error = f"; error: {row.error}" if row.error else ""
    note = f"; {row.note}" if row.note else ""
    return f"{row.precision} {row.path} {row.strategy}: {same}{tokens}{score}{times}{ratio}{note}{error}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


# ---- reports --------------------------------------------------------------------------------------------------
def _calibration_name(calibration: float | str) -> str:
    return "trained (rate and bursts)" if calibration == "trained" else f"{calibration:g} tokens/frame"


def _precision_lines(device_type: str) -> list[str]:
    lines = [
        "Precisions: `fp32` -- no autocast, fp32 weights; `bf16_autocast` -- `torch.autocast("
        f"'{device_type}', dtype=torch.bfloat16)` around each call, fp32 weights (decoding API: the encoder ran "
        f"under autocast and its outputs are decoded in the dtype it returned); `{BF16_ENCODER}` -- the same "
        "outputs cast to bf16 (where NeMo's default raises on them, its side decodes them `.float()`: see the "
        "note); `bf16_weights` -- through `transcribe` the whole model in bf16, through the decoding API the "
        "encoder, decoder and joint in bf16 (the features cast to bf16).",
        "",
    ]
    if device_type != "cuda":
        lines += [
            "No GPU: the bf16 rows ran on the CPU, `bf16_autocast` under CPU autocast where it can run the LSTM "
            "prediction network (else skipped, the reason in the rows' note), `bf16_weights` with CPU bf16 weights. "
            "CPU bf16 kernels are not the GPU's, so these rows say nothing about bf16 on a GPU, and CPU timings say "
            "nothing about GPU speed: a smoke test of the set-up.",
            "",
        ]
    return lines


def markdown_report(sets: Sequence[ExactnessSet], command: str, env: dict[str, Any]) -> str:
    """The tables: one per model, a row per (calibration, precision, path, strategy)."""
    repeats = {len(r.calls_nemo or r.calls_ours) for s in sets for r in s.rows} - {0}
    lines = [
        *report_header(f"Exactness and speed: ours against NeMo's default strategies ({env['gpu']})", command, env),
        "Strategies: `greedy` -- NeMo's `greedy_batch` (its defaults: label looping, CUDA graphs) against "
        "`fast_greedy`; `beam` -- NeMo's `malsd_batch` (its defaults, CUDA graphs allowed) against `fast_beam`; the "
        "same `max_symbols`, beam size and `return_best_hypothesis: true` on both sides, switched with "
        "`model.change_decoding_strategy` in one process on the same inputs. Paths: `transcribe` -- "
        "`model.transcribe(<WAV files, longest first>, batch_size, return_hypotheses=True, timestamps=True)`, "
        "NeMo's defaults otherwise; `decoding_api` -- `model.decoding.rnnt_decoder_predictions_tensor` on encoder "
        "outputs computed once per precision in the same batches.",
        "",
        "identical: utterances whose token ids, per-token frames and TDT token durations all match NeMo's "
        "(differing utterances: t = tokens, f = frames, d = durations, against NeMo's batched hypotheses). NeMo's "
        "batched TDT label loop records, for an utterance that found its label before the others, the duration of a "
        "later step; where only durations differ, NeMo's decode of the utterance alone (on the encoder outputs its "
        "side decoded) decides, and the note counts them. Scores are compared separately. Seconds: "
        f"the best of {'/'.join(map(str, sorted(repeats))) or '-'} calls after a warm-up call, the device "
        "synchronised around the clock (transcribe: the whole call; decoding_api: decoding every batch); "
        "ours/NeMo below 1: ours is faster.",
        "",
        *_precision_lines(str(env["device"]).split(":")[0]),
    ]
    for model in dict.fromkeys(s.model for s in sets):
        model_sets = [s for s in sets if s.model == model]
        first = model_sets[0]
        lines += [
            f"## {model}",
            "",
            f"{first.utterances} utterances, {first.audio_seconds:.0f} s of audio per set, batch_size "
            f"{first.batch_size}, beam_size {first.beam_size}, max_symbols {first.max_symbols}, {first.vocab} "
            "vocabulary, random weights.",
            "",
        ]
        for s in model_sets:
            emissions = f"emissions (NeMo greedy_batch, fp32): {s.emissions.summary()}." if s.emissions else ""
            failed = f" FAILED: {s.error}" if s.error else ""
            lines += [
                f"Set `{s.calibration}` ({_calibration_name(s.calibration)}; built and run in {s.wall_seconds:.0f} s): "
                f"{emissions}{failed}",
                "",
            ]
        lines += emission_report_lines(
            None, next((s.trained_emissions for s in model_sets if s.trained_emissions), None), ""
        )
        lines += [
            "| calibration | precision | path | strategy | utterances | identical | differ t/f/d | tokens ours / NeMo "
            "| max abs score diff | ours s | NeMo s | ours/NeMo | note |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for s in model_sets:
            for r in s.rows:
                lines.append(_table_row(s, r))
        lines.append("")
    return "\n".join(lines)


def _table_row(s: ExactnessSet, r: ExactnessRow) -> str:
    differ = (
        "-" if r.differences is None else "/".join(str(r.differences[k]) for k in ("tokens", "frames", "durations"))
    )
    identical = "-" if r.identical is None else f"{r.identical}/{r.utterances}"
    score = "-" if r.max_score_difference is None else f"{r.max_score_difference:.3g}"
    ratio = "-" if r.ratio is None else f"{r.ratio:.3f}"
    alone = (
        f"{r.durations_as_nemo_alone} with the durations of NeMo's decode of the utterance alone"
        if r.durations_as_nemo_alone
        else None
    )
    encoder = f"encoder output {r.encoder_dtype}" if r.encoder_dtype and r.precision != "fp32" else None
    notes = [n for n in (encoder, alone, r.note, r.error) if n]
    strategy = f"{r.strategy} ({r.our_strategy} / {r.nemo_strategy})"
    return (
        f"| {s.calibration} | {r.precision} | {r.path} | {strategy} | {r.utterances} | {identical} | {differ} | "
        f"{r.tokens_ours if r.tokens_ours is not None else '-'} / {r.tokens_nemo if r.tokens_nemo is not None else '-'} "
        f"| {score} | {_seconds(r.seconds_ours)} | {_seconds(r.seconds_nemo)} | {ratio} | {'; '.join(notes)} |"
    )


def write_exactness_reports(
    sets: Sequence[ExactnessSet],
    command: str,
    json_path: str,
    markdown_path: str,
    env: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
) -> str:
    """The JSON (command, options, environment, every set and row) and the Markdown tables; returns the Markdown."""
    env = env or environment()
    with open(json_path, "w") as f:
        json.dump(
            {"command": command, "options": options, "environment": env, "sets": [asdict(s) for s in sets]}, f, indent=1
        )
    markdown = markdown_report(sets, command, env)
    with open(markdown_path, "w") as f:
        f.write(markdown)
    return markdown
