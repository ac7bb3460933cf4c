"""Configs of the lab's scripts, mirrored one to one by the YAML files in ``configs/``.

* :class:`SyntheticManifestConfig` -- ``benchmarks/synthetic_manifest.py`` (``configs/synthetic_manifest.yaml``).
* :class:`StreamingConfig` -- ``scripts/streaming.py`` (``configs/streaming/*.yaml``).
* :class:`BenchmarkConfig` -- ``benchmarks/benchmark.py`` (``configs/benchmark.yaml``).
* :class:`TranscribeBenchmarkConfig` -- ``benchmarks/bench_transcribe.py`` (``configs/bench_transcribe.yaml``).
* :class:`ExactnessBenchmarkConfig` -- ``benchmarks/bench_exactness.py`` (``configs/bench_exactness.yaml``).
* :class:`StreamAudioBenchConfig` -- ``benchmarks/stream_audio_bench.py`` (``configs/stream_audio_bench*.yaml``).
* :class:`TinyModelsConfig` -- ``scripts/train_tiny_models.py`` (``configs/train_tiny_models.yaml``).

Output folders default to ``outputs/`` (ignored by git), never the repository's own folders.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastdecode_lab.tiny_models.voices import VoicesConfig
from nemo_fastdecode.streaming.config import EngineConfig


@dataclass
class SyntheticManifestConfig:
    """``benchmarks/synthetic_manifest.py``: speech-like synthetic WAV files and their manifest, for throughput runs where
    no audio can be had (e.g. ``scripts/transcribe_parallel.py`` on 1 and N GPUs of a machine without internet).

    Attributes:
        output_dir: ``manifest.jsonl`` and ``wavs/`` go here.
        total_seconds: audio in all, in utterances of LibriSpeech test-other-like durations (1.3-35 s, mean 6.3 s).
        seed: durations and audio (the same seed writes the same files).
    """

    output_dir: str = "outputs/synthetic_audio"
    total_seconds: float = 3600.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.total_seconds <= 0:
            raise ValueError(f"total_seconds must be > 0, got {self.total_seconds}")


@dataclass
class StreamingConfig:
    """``scripts/streaming.py``: simulated real-time cache-aware streaming of many concurrent streams.

    Attributes:
        model: the shipped trained cache-aware model (``trained-streaming``, the default; a small hybrid trained on
            synthesised English speech), a synthetic cache-aware preset (``tiny-streaming``,
            ``hybrid-17x512-streaming``, ``rnnt-0.6b-streaming``; random weights), a ``.nemo`` checkpoint or a
            pretrained model name.
        audio_dir: every ``.wav`` / ``.flac`` file in this folder, or
        dataset_manifest: every entry of this JSON-lines manifest (``audio_filepath``, optional ``text``: each
            stream's reference and final transcript are then printed with the WER). Neither: the shipped example
            utterances, with their reference texts (synthetic demo utterances for a synthetic preset).
        num_streams: concurrent streams; stream ``i`` plays input ``i mod (number of inputs)``; ``None`` (the
            default): one stream per input, every input streamed once. Fewer streams than inputs leave the rest out
            (the run says so).
        num_slots: slots (pre-allocated caches); ``None``: ``num_streams``.
        att_context_size: ``[left, lookahead]`` among the encoder's look-aheads; ``None``: its default.
        stagger_seconds: stream starts are drawn uniformly in ``[0, stagger_seconds)``; 0 starts all
            together (every step then has all streams: step time at that batch size).
        max_stream_seconds: cut each stream's audio to this length (``None``: whole files).
        dtype: ``float32`` (exact) or ``bfloat16`` (caches and encoder compute).
        use_cuda_graphs: one CUDA graph replay per step and batch-size bucket (GPU only).
        fast_math: decode with ``fast_greedy``'s opt-in fast math (near fp32, not bit-identical to NeMo).
        encoder_matmul: ``fp32`` (NeMo's modules, exact reference) or opt-in ``tf32x3`` (the encoder's GEMMs on
            near-fp32 3xTF32 tensor-core kernels; float32 dtype only) or ``tf32`` (the same kernels with single
            TF32 products; NeMo's path then runs with TF32 matmuls too, as NeMo's ``matmul_precision=high``).
        capture_decoder_step: with CUDA graphs, the decoder's work around its greedy loop as CUDA graphs too
            (:meth:`~nemo_fastdecode.streaming.decoding.SlotDecoder.capture_step`); ``False``: that work runs eagerly.
        compare_nemo: with ``decoding: greedy``, run the same streams through NeMo's path (slot gather/scatter +
            ``conformer_stream_step``) and compare transcripts and timings. With ``decoding: beam`` NeMo has no
            batched streaming beam search (``conformer_stream_step`` refuses ``malsd_batch`` with partial hypotheses),
            so no NeMo path is timed: NeMo's beam search of each of the first ``nemo_beam_reference_streams`` streams
            alone (its encoder steps and ``ModifiedALSD`` computer continued over the same chunks, untimed) is the
            exactness reference of our final tokens.
        decoding: ``greedy``, or ``beam``: our path decodes with NeMo's ``malsd_batch`` beam search per stream
            (``StreamingTranscriber(decoding="beam")``; needs ``fast_math: false``).
        beam_size: beams per stream with ``decoding: beam``.
        nemo_beam_reference_streams: with ``decoding: beam`` and ``compare_nemo``, how many streams (the first ones)
            are checked against NeMo's beam search of the stream alone; 0: none.
        ngram_lm_model: an n-gram LM over the model's tokens (an ARPA file or NeMo's ``.nemo`` n-gram LM) fused into
            every stream's decoding (``StreamingTranscriber(ngram_lm_model=...)``; with ``decoding: beam`` into the
            beams); NeMo's path fuses it too (the model's ``decoding.greedy.ngram_lm_model``). ``None``: none.
        ngram_lm_alpha: the LM's weight, > 0 with a model (NeMo's ``greedy.ngram_lm_alpha``).
        boosting_streams_share: the share of streams (in ``[0, 1]``, spread evenly over the streams) that open with
            their own phrase list to boost (``StreamingTranscriber.open(boosting=...)``, greedy or beam); 0: none.
            Phrases are text (the model's tokenizer tokenises them), so the model needs a tokenizer (a synthetic
            preset with ``vocab: bpe``). Greedy boosting needs ``compare_nemo: false`` (NeMo's timed path has no
            per-stream boosting); with beam, NeMo's reference fuses the stream's phrases as its boosting tree.
        boosting_alpha: the phrases' weight in the fusion (NeMo's ``boosting_model_alpha``), > 0.
        boosting_phrases: phrases per boosted stream, each 1 to 3 random tokens of the model's vocabulary (drawn per
            stream from ``seed``).
        vocab: a synthetic preset's vocabulary: ``char`` or ``bpe`` (a sentencepiece tokenizer, needed for phrase
            boosting); ignored for other models.
        cuda: GPU index; ``None``: GPU 0 if any, else the CPU; negative: the CPU.
        seed: synthetic model weights, demo audio and stream start times.
        output_dir: where ``streaming_results.json``, ``streaming_results.md`` and
            ``streaming_transcripts.jsonl`` go.
        tag: added to the output file names (e.g. the GPU and date).
        fixed_step_repeats: after the simulated run, time this many steps with all streams (at most
            ``num_slots``) stepping together, per path (stagger 0 at a fixed batch); 0 skips it.
        num_streams_sweep: run ours and NeMo's path at each of these stream counts instead of ``num_streams``
            (latency vs streams: ``streaming_sweep.json`` / ``.md`` and a plot).
        latency_target_ms: a sweep's real-time criterion: p95 chunk latency at most this, busy share below 1.
    """

    model: str = "trained-streaming"
    audio_dir: str | None = None
    dataset_manifest: str | None = None
    num_streams: int | None = None
    num_slots: int | None = None
    att_context_size: list[int] | None = None
    stagger_seconds: float = 1.0
    max_stream_seconds: float | None = None
    dtype: str = "float32"
    use_cuda_graphs: bool = True
    fast_math: bool = False
    encoder_matmul: str = "fp32"
    capture_decoder_step: bool = True
    compare_nemo: bool = True
    decoding: str = "greedy"
    beam_size: int = 4
    nemo_beam_reference_streams: int = 8
    ngram_lm_model: str | None = None
    ngram_lm_alpha: float = 0.0
    boosting_streams_share: float = 0.0
    boosting_alpha: float = 1.0
    boosting_phrases: int = 10
    vocab: str = "char"
    cuda: int | None = None
    seed: int = 0
    output_dir: str = "outputs/streaming"
    tag: str | None = None
    fixed_step_repeats: int = 10
    num_streams_sweep: list[int] | None = None
    latency_target_ms: float = 50.0

    def __post_init__(self) -> None:
        self.engine_config()  # the engine options' checks (precision, decoding, n-gram LM)
        if self.fixed_step_repeats < 0:
            raise ValueError(f"fixed_step_repeats must be >= 0, got {self.fixed_step_repeats}")
        if self.num_streams_sweep is not None and (
            not self.num_streams_sweep or any(int(n) < 1 for n in self.num_streams_sweep)
        ):
            raise ValueError(f"num_streams_sweep must be a non-empty list of counts >= 1, got {self.num_streams_sweep}")
        if self.nemo_beam_reference_streams < 0:
            raise ValueError(f"nemo_beam_reference_streams must be >= 0, got {self.nemo_beam_reference_streams}")
        share = self.boosting_streams_share
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"boosting_streams_share={share!r} is not valid; valid: a share in [0, 1]")
        if not (self.boosting_alpha > 0 and math.isfinite(self.boosting_alpha)):
            raise ValueError(f"boosting_alpha={self.boosting_alpha!r} is not valid; valid: a finite number > 0")
        if self.boosting_phrases < 1:
            raise ValueError(f"boosting_phrases={self.boosting_phrases!r} is not valid; valid: a count >= 1")
        if self.vocab not in ("char", "bpe"):
            raise ValueError(f"vocab={self.vocab!r} is not valid; valid values: char, bpe")
        if share > 0 and self.decoding == "greedy" and self.compare_nemo:
            raise ValueError(
                f"boosting_streams_share={share} with decoding: greedy needs compare_nemo: false (NeMo's "
                "conformer_stream_step path has no per-stream boosting to compare with); or decoding: beam, whose "
                "NeMo reference fuses each stream's phrases"
            )

    def engine_config(self, num_slots: int | None = None) -> EngineConfig:
        """The streaming options of these settings as the engine's :class:`EngineConfig` (the one place they are
        checked); ``num_slots``: default ``num_slots``, else ``num_streams``."""
        if num_slots is None:
            num_slots = self.num_slots if self.num_slots is not None else (self.num_streams or 1)  # None: per input
        return EngineConfig(
            num_slots=num_slots,
            att_context_size=self.att_context_size,
            dtype=self.dtype,
            use_cuda_graphs=self.use_cuda_graphs,
            encoder_matmul=self.encoder_matmul,
            fast_math=self.fast_math,
            decoding=self.decoding,
            beam_size=self.beam_size,
            ngram_lm_model=self.ngram_lm_model,
            ngram_lm_alpha=self.ngram_lm_alpha,
        )


def check_calibrations(calibrations: list[Any]) -> list[float | str]:
    """The benchmarks' ``calibrations``: a non-empty list of target tokens per frame (> 0) and/or ``trained``."""
    from fastdecode_lab.synthetic import check_calibration

    if not calibrations:
        raise ValueError(f"calibrations must be a non-empty list of numbers > 0 and/or 'trained', got {calibrations}")
    return [check_calibration(c) for c in calibrations]


@dataclass
class TranscribeBenchmarkConfig:
    """``benchmarks/bench_transcribe.py``: ``model.transcribe`` end to end, NeMo as throughput leaderboards run it
    beside ours on the same files (:mod:`fastdecode_lab.benchmarks.transcribe`).

    Attributes:
        models: synthetic presets; ``None``: ``rnnt-0.6b`` and ``tdt-0.6b`` on a GPU, ``tiny-rnnt`` on the CPU (a
            smoke test of the set-up).
        total_seconds: audio per model (LibriSpeech test-other-like durations); ``None``: 1800 on a GPU, 10 on the CPU.
        batch_size: ``transcribe``'s batch size for the rows without their own (``nemo``, ours: the offline path's
            default budget follows it).
        nemo_batch_sizes: the batch sizes the ``*_sorted_best`` rows try (one warm call at the largest, each timed
            once, the fastest kept).
        repeats: timed calls per row after the first call (the best is reported).
        calibrations: each a separate test set: a number is the target tokens per frame of the blank-bias
            calibration; ``trained`` makes the synthetic model emit at the trained models' rate and burst length
            (:func:`~fastdecode_lab.synthetic.calibrate_trained_like`).
        precisions: each row runs in each: ``fp32``, ``bf16_autocast`` (fp32 weights, bf16 autocast around each
            call), ``bf16_weights`` (the model cast to bf16 after calibration).
        rows: names from :data:`~fastdecode_lab.benchmarks.transcribe.ROWS`; ``None``:
            :data:`~fastdecode_lab.benchmarks.transcribe.DEFAULT_ROWS` (NeMo unsorted, sorted at batch 128 and at its
            best batch; ``fast_greedy`` on the offline path, with and without ``fast_encoder``).
        seed: synthetic weights and audio.
        first_call_new_process: also time the first call of our fastest row in a new process (the same model and
            files made again there, Triton's kernels loaded from the on-disk cache this run filled), on each model's
            first calibration (a first call belongs to the code path, not to the emissions); ``None``: on a GPU only.
        new_processes: how many new processes time that first call, one after another (the median is reported
            with the spread).
        out_dir: where ``transcribe_<models>_<GPU>[_<date>].json`` / ``.md`` go.
        date: added to the output file names.
    """

    models: list[str] | None = None
    total_seconds: float | None = None
    batch_size: int = 32
    nemo_batch_sizes: list[int] = field(default_factory=lambda: [16, 32, 64, 128])
    repeats: int = 2
    calibrations: list[Any] = field(default_factory=lambda: [0.3, "trained"])
    precisions: list[str] = field(default_factory=lambda: ["bf16_autocast", "bf16_weights", "fp32"])
    rows: list[str] | None = None
    seed: int = 0
    first_call_new_process: bool | None = None
    new_processes: int = 1
    out_dir: str = "outputs/benchmarks"
    date: str | None = None

    def __post_init__(self) -> None:
        self.calibrations = check_calibrations(self.calibrations)
        self.precisions = check_choices("precisions", self.precisions, PRECISIONS)
        if self.new_processes < 1:
            raise ValueError(f"new_processes must be >= 1, got {self.new_processes}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if not self.nemo_batch_sizes or min(self.nemo_batch_sizes) < 1:
            raise ValueError(f"nemo_batch_sizes must be batch sizes >= 1, got {self.nemo_batch_sizes}")


# ---- the exactness benchmark's choices (fastdecode_lab.benchmarks.exactness) ----
#: the precisions a run can ask for
PRECISIONS: tuple[str, ...] = ("fp32", "bf16_autocast", "bf16_weights")
#: the decoding API row that ``bf16_autocast`` adds: the autocast encoder's outputs cast to bf16
BF16_ENCODER = "bf16_autocast_bf16_encoder"
#: the paths a run can ask for
PATHS: tuple[str, ...] = ("transcribe", "decoding_api")
#: strategy -> (NeMo's strategy, ours)
STRATEGIES: dict[str, tuple[str, str]] = {
    "greedy": ("greedy_batch", "fast_greedy"),
    "beam": ("malsd_batch", "fast_beam"),
}


def check_choices(name: str, values: Sequence[str], valid: Sequence[str]) -> list[str]:
    """``values`` as a list, each one of ``valid`` (a non-empty choice), else ``ValueError`` naming the valid ones."""
    unknown = [v for v in values if v not in valid]
    if unknown or not values:
        raise ValueError(f"{name}={list(values)} is not valid; choose one or more of: {', '.join(valid)}")
    return list(values)


@dataclass(frozen=True)
class RunOptions:
    """What every row of a test set shares (:func:`benchmark_exactness` documents them)."""

    precisions: tuple[str, ...] = PRECISIONS
    paths: tuple[str, ...] = PATHS
    strategies: tuple[str, ...] = tuple(STRATEGIES)
    batch_size: int = 32
    beam_size: int = 4
    max_symbols: int = 10
    repeats: int = 3
    vocab: str = "bpe"
    seed: int = 0

    def __post_init__(self) -> None:
        check_choices("precisions", self.precisions, PRECISIONS)
        check_choices("paths", self.paths, PATHS)
        check_choices("strategies", self.strategies, tuple(STRATEGIES))
        if min(self.repeats, self.batch_size, self.beam_size, self.max_symbols) < 1:
            raise ValueError(
                f"repeats, batch_size, beam_size and max_symbols must be >= 1, got {self.repeats}, "
                f"{self.batch_size}, {self.beam_size} and {self.max_symbols}"
            )


@dataclass
class ExactnessBenchmarkConfig:
    """``benchmarks/bench_exactness.py``: exactness tables with the speed beside them, ours against NeMo's default
    strategies (:mod:`fastdecode_lab.benchmarks.exactness`).

    Attributes:
        models: synthetic presets; ``None``: ``rnnt-0.6b`` and ``tdt-0.6b`` on a GPU, ``tiny-rnnt`` and ``tiny-tdt``
            on the CPU (a smoke test of the set-up).
        calibrations: each a separate test set: a number is the target tokens per frame of the blank-bias
            calibration; ``trained`` the trained models' rate and burst length
            (:func:`~fastdecode_lab.synthetic.calibrate_trained_like`).
        precisions: ``fp32``, ``bf16_autocast`` (with the decoding API's ``bf16_autocast_bf16_encoder`` row),
            ``bf16_weights``.
        paths: ``transcribe`` (``model.transcribe`` with timestamps) and ``decoding_api``
            (``model.decoding.rnnt_decoder_predictions_tensor`` on encoder outputs).
        strategies: ``greedy`` (``greedy_batch`` against ``fast_greedy``) and ``beam`` (``malsd_batch`` against
            ``fast_beam``).
        total_seconds: audio per set (LibriSpeech test-other-like durations); ``None``: 1800 on a GPU, 10 on the CPU.
        batch_size: ``transcribe``'s batch size and the encoder's batches for the decoding API.
        beam_size: beams of both beam searches.
        max_symbols: most tokens per frame for every strategy (NeMo's default: 10).
        repeats: timed calls per side after one warm-up call (the best is reported); ``None``: 3 on a GPU, 1 on the
            CPU (a smoke test: there NeMo's ``transcribe`` set-up, not decoding, takes most of a call).
        vocab: the synthetic models' vocabulary: ``bpe`` (a sentencepiece tokenizer, as Parakeet checkpoints have;
            NeMo 3.0's timestamps fail for char TDT models under beam search) or ``char``.
        seed: synthetic weights and audio.
        out_dir: where ``exactness_<models>[_<subset>]_<GPU or cpu>[_<date>].json`` / ``.md`` go, rewritten after
            every set; ``<subset>`` names the calibrations, precisions, paths and strategies that are not the default
            ones (:meth:`subset_tag`), so that runs of parts of the tables into one folder keep their own files.
        date: added to the output file names.
    """

    models: list[str] | None = None
    calibrations: list[Any] = field(default_factory=lambda: [0.3, "trained"])
    precisions: list[str] = field(default_factory=lambda: ["fp32", "bf16_autocast", "bf16_weights"])
    paths: list[str] = field(default_factory=lambda: ["transcribe", "decoding_api"])
    strategies: list[str] = field(default_factory=lambda: ["greedy", "beam"])
    total_seconds: float | None = None
    batch_size: int = 32
    beam_size: int = 4
    max_symbols: int = 10
    repeats: int | None = None
    vocab: str = "bpe"
    seed: int = 0
    out_dir: str = "outputs/benchmarks"
    date: str | None = None

    def __post_init__(self) -> None:
        self.calibrations = check_calibrations(self.calibrations)
        if self.total_seconds is not None and self.total_seconds <= 0:
            raise ValueError(f"total_seconds must be > 0 or null, got {self.total_seconds}")
        if self.vocab not in ("char", "bpe"):
            raise ValueError(f"vocab={self.vocab!r} is not valid; valid values: char, bpe")
        self.run_options()  # checks the choices and counts

    def run_options(self, repeats: int = 3) -> RunOptions:
        """The options every set runs with (:class:`RunOptions`);
        ``repeats`` where the config leaves it ``None``."""
        return RunOptions(
            tuple(self.precisions),
            tuple(self.paths),
            tuple(self.strategies),
            self.batch_size,
            self.beam_size,
            self.max_symbols,
            self.repeats if self.repeats is not None else repeats,
            self.vocab,
            self.seed,
        )

    def subset_tag(self) -> str:
        """The calibrations, precisions, paths and strategies that differ from the defaults, joined for a file name
        (``trained_fp32``); empty for the defaults."""
        defaults = ExactnessBenchmarkConfig()
        parts = [
            "-".join(map(str, getattr(self, name)))
            for name in ("calibrations", "precisions", "paths", "strategies")
            if getattr(self, name) != getattr(defaults, name)
        ]
        return "_".join(parts)


@dataclass
class BenchmarkConfig:
    """``benchmarks/benchmark.py``: NeMo's decoders and ours on the same encoder outputs of a synthetic test set.

    Attributes:
        models: synthetic presets; ``None``: ``rnnt-0.6b`` and ``tdt-0.6b`` on a GPU, ``tiny-rnnt`` and ``tiny-tdt``
            on the CPU (a smoke test of the set-up: CPU timings say nothing about GPU decoding).
        total_seconds: audio per model, LibriSpeech test-other-like durations sorted longest first; ``None``:
            3600 on a GPU, 20 on the CPU.
        batch_size: utterances per batch.
        repeats: timed passes per strategy (the best is reported).
        baseline_repeats: passes of ``nemo_baseline``, NeMo's eager reference (its hypotheses are every row's
            reference; its time is never the fastest NeMo, and it takes most of a run's time: 10 s a pass on the
            0.6B RNN-T); no warm-up before them.
        max_symbols: most tokens per frame for every decoder.
        calibrations: each a separate test set: a number is the target tokens per frame of the blank-bias
            calibration; ``trained`` makes the synthetic model emit at the trained models' rate and burst length
            (:func:`~fastdecode_lab.synthetic.calibrate_trained_like`).
        strategies: rows to time (names from :func:`~fastdecode_lab.benchmarks.decoder.decoder_factories`);
            ``None``: every greedy row. Beam rows run only when named. Rows that need CUDA (graph modes,
            NeMo's graph decoders, compiled steps) are skipped on the CPU, with a note.
        beam_size: beam rows' beam size.
        seed: synthetic weights and audio.
        experimental: also time the ablations (unfused step kernels, look-ahead and looks-per-iteration sweeps).
        profile_busy: GPU-busy share of each row under ``torch.profiler``.
        out_dir: where ``{greedy,beam}_<GPU>[_<date>].json`` / ``.md`` go.
        date: added to the output file names (e.g. 2026-11-23).
    """

    models: list[str] | None = None
    total_seconds: float | None = None
    batch_size: int = 32
    repeats: int = 3
    baseline_repeats: int = 1
    max_symbols: int = 10
    calibrations: list[Any] = field(default_factory=lambda: [0.3, "trained"])
    strategies: list[str] | None = None
    beam_size: int = 4
    seed: int = 0
    experimental: bool = False
    profile_busy: bool = False
    out_dir: str = "outputs/benchmarks"
    date: str | None = None

    def __post_init__(self) -> None:
        if self.total_seconds is not None and self.total_seconds <= 0:
            raise ValueError(f"total_seconds must be > 0 or null, got {self.total_seconds}")
        if self.batch_size < 1 or self.repeats < 1 or self.baseline_repeats < 1:
            raise ValueError(
                f"batch_size, repeats and baseline_repeats must be >= 1, got {self.batch_size}, {self.repeats} and "
                f"{self.baseline_repeats}"
            )
        self.calibrations = check_calibrations(self.calibrations)


@dataclass
class NemoPipelineSettings:
    """NeMo's ``CacheAwareRNNTPipeline`` in ``benchmarks/stream_audio_bench.py``
    (:func:`~fastdecode_lab.benchmarks.stream_audio.nemo_steps.pipeline_config` lists every setting).

    Attributes:
        enabled: measure NeMo's pipeline at all (``False``: ours only).
        compute_dtype: ``bfloat16`` (NeMo's example config) or ``float32``.
        use_cuda_graph_decoder: NeMo's CUDA-graph greedy decoding.
        matmul_precision: NeMo's ``highest`` / ``high`` (the example: TF32 matmuls) / ``medium``.
    """

    enabled: bool = True
    compute_dtype: str = "bfloat16"
    use_cuda_graph_decoder: bool = True
    matmul_precision: str = "high"

    def __post_init__(self) -> None:
        if self.compute_dtype not in ("bfloat16", "float32"):
            raise ValueError(f"nemo.compute_dtype={self.compute_dtype!r} is not valid; valid values: bfloat16, float32")
        if self.matmul_precision not in ("highest", "high", "medium"):
            raise ValueError(
                f"nemo.matmul_precision={self.matmul_precision!r} is not valid; valid values: highest, high, medium"
            )


@dataclass
class StreamAudioBenchConfig:
    """``benchmarks/stream_audio_bench.py``: our engine against NeMo's ``CacheAwareRNNTPipeline`` on the same audio.

    Attributes:
        model: a synthetic cache-aware preset (built with a BPE tokenizer, as NeMo's pipeline needs; random weights,
            blank bias calibrated) or a ``.nemo`` checkpoint.
        audio_dir / dataset_manifest: the audio (``.wav`` / ``.flac`` files, or a JSON-lines manifest); neither:
            ``num_files`` synthetic speech-like utterances of LibriSpeech-like durations.
        num_files: synthetic utterances when no audio is given.
        max_stream_seconds: cut each input to this length (``None``: whole files).
        stream_counts: concurrent streams to measure; stream ``i`` plays input ``i mod (number of inputs)``.
        att_context_size: ``[left, lookahead]`` among the encoder's look-aheads; ``None``: its default.
        stagger_seconds: stream starts uniform in ``[0, stagger_seconds)``; ``None``: one chunk period.
        latency_target_ms: real time = p95 chunk latency at most this and the server keeps up (busy < 1).
        dtype: our engine's ``float32`` (exact) or ``bfloat16``.
        use_cuda_graphs / encoder_matmul / fast_math: our engine's options (:class:`StreamingConfig` explains).
        cycle_repeats: timed cycles (ours) and steps (NeMo's) with all streams stepping together, per count.
        compare_transcripts: NeMo's streaming of each input alone (the reference) and NeMo's pipeline on the inputs'
            WAV files, compared with ours.
        nemo: NeMo's pipeline settings.
        cuda: GPU index; ``None``: GPU 0 if any, else the CPU; negative: the CPU.
        seed: synthetic weights and audio, stream start times.
        output_dir: ``stream_audio_bench{_tag}.json`` / ``.md`` / plot, and the saved ``.nemo`` and WAV inputs.
        tag: added to the output file names (e.g. the GPU and date).
    """

    model: str = "tiny-streaming"
    audio_dir: str | None = None
    dataset_manifest: str | None = None
    num_files: int = 4
    max_stream_seconds: float | None = 2.0
    stream_counts: list[int] = field(default_factory=lambda: [2, 4])
    att_context_size: list[int] | None = None
    stagger_seconds: float | None = None
    latency_target_ms: float = 50.0
    dtype: str = "float32"
    use_cuda_graphs: bool = True
    encoder_matmul: str = "fp32"
    fast_math: bool = False
    cycle_repeats: int = 3
    compare_transcripts: bool = True
    nemo: NemoPipelineSettings = field(default_factory=NemoPipelineSettings)
    cuda: int | None = None
    seed: int = 0
    output_dir: str = "outputs/stream_audio_bench"
    tag: str | None = None

    def __post_init__(self) -> None:
        if not self.stream_counts or any(int(n) < 1 for n in self.stream_counts):
            raise ValueError(f"stream_counts must be a non-empty list of counts >= 1, got {self.stream_counts}")
        self.engine_config(max(int(n) for n in self.stream_counts))  # the engine options' checks
        if self.num_files < 1 or self.cycle_repeats < 1:
            raise ValueError(f"num_files and cycle_repeats must be >= 1, got {self.num_files}, {self.cycle_repeats}")
        if self.stagger_seconds is not None and self.stagger_seconds < 0:
            raise ValueError(f"stagger_seconds must be >= 0 or null, got {self.stagger_seconds}")
        if self.audio_dir is not None and self.dataset_manifest is not None:
            raise ValueError("give audio_dir or dataset_manifest, not both")

    def engine_config(self, num_slots: int) -> EngineConfig:
        """Our engine for ``num_slots`` streams, as these settings ask for it (the one place they are checked)."""
        return EngineConfig(
            num_slots=num_slots,
            att_context_size=self.att_context_size,
            dtype=self.dtype,
            use_cuda_graphs=self.use_cuda_graphs,
            encoder_matmul=self.encoder_matmul,
            fast_math=self.fast_math,
        )


#: the stages of ``scripts/train_tiny_models.py``, in the order they run
TINY_MODEL_STAGES: tuple[str, ...] = ("data", "train", "export", "evaluate", "ship")


#: the models ``scripts/train_tiny_models.py`` trains (configs/tiny_models/<name>.yaml)
TINY_MODELS: tuple[str, ...] = ("tdt", "streaming_hybrid")


def check_init_from(init_from: Any) -> str | dict[str, str] | None:
    """``TinyModelsConfig.init_from`` checked: ``None``, ``"shipped"`` or a ``{model: path}`` mapping of known models
    (returned as a plain dict); a ``ValueError`` naming the valid values otherwise."""
    if init_from is None or init_from == "shipped":
        return init_from
    valid = "null (from scratch), shipped (the package's .nemo of each model) or a mapping {model: path to a .nemo}"
    if not isinstance(init_from, Mapping):
        raise ValueError(f"init_from={init_from!r} is not valid; valid values: {valid}")
    unknown = [str(key) for key in init_from if key not in TINY_MODELS]
    if unknown:
        raise ValueError(f"init_from names unknown models {unknown}; valid models: {', '.join(TINY_MODELS)}")
    if not all(isinstance(path, str) and path for path in init_from.values()):
        raise ValueError(f"init_from={dict(init_from)!r}: each model maps to the path of a .nemo file")
    return {str(model): path for model, path in init_from.items()}


@dataclass
class TinyModelsConfig:
    """``scripts/train_tiny_models.py``: small ASR models trained on synthesised speech, end to end.

    Attributes:
        stages: what to run, in this order: ``data`` (corpus, eSpeak NG speech, manifests, tokenizer), ``train``
            (resumes from the last checkpoint; exports the model when training reaches its end), ``export``
            (the ``.nemo`` of the last checkpoint), ``evaluate`` (held-out WER), ``ship`` (the models, their
            evaluations and ``num_examples`` test utterances copied to ``ship_dir``). Each skips work already done.
        models: which of :data:`TINY_MODELS` ``train`` / ``export`` / ``evaluate`` handle.
        output_dir: everything goes here (:mod:`fastdecode_lab.tiny_models.layout`).
        model_configs: the folder of ``tdt.yaml`` / ``streaming_hybrid.yaml``; ``None``: ``configs/tiny_models``.
        model_overrides: merged into each model's ``model:`` config (e.g. ``{encoder: {n_layers: 2}}``), or ``None``.
        seed: the corpus, voices, speaking parameters and training.
        num_train / num_dev / num_test: sentences per split (dev / test: held-out sentences; test also held-out
            voices).
        synthesis_workers: parallel eSpeak processes (and Festival / Flite processes); ``None``: one per CPU core.
        voices: the other synthesisers (Festival's voices for training, held-out voices, Flite for evaluation
            only), the augmentation and the pause-joined multi-utterance examples
            (:class:`~fastdecode_lab.tiny_models.voices.VoicesConfig`); empty voice tables: eSpeak NG only.
        vocab_size: SentencePiece BPE pieces.
        batch_size: utterances per training batch.
        num_workers: data-loading processes; ``None``: all CPU cores but two, at most 12.
        max_steps: training steps (the LR schedule, NoamAnnealing, does not depend on it).
        max_time: training time as Lightning's ``DD:HH:MM:SS``, counted over resumed runs; ``None``: no limit. A
            trained model trains on from its last checkpoint when ``max_time`` or ``max_steps`` is raised.
        warmup_steps: the LR warm-up; ``None``: the model config's.
        precision: Lightning's; ``None``: ``bf16-mixed`` on a GPU, ``32`` on the CPU.
        accelerator: Lightning's (``auto``, ``gpu``, ``cpu``).
        val_check_interval: validate on ``dev`` every this many steps.
        log_every_n_steps: training log interval (loss, learning rate, WER on the batch).
        checkpoint_every_n_steps: how often ``last.ckpt`` is written (and at the end of every run).
        init_from: the weights a model starts from when it has no ``last.ckpt`` (a run with one resumes from it):
            ``None``: random (from scratch); ``shipped``: the package's shipped ``.nemo`` of the model's kind
            (``trained-tdt`` for ``tdt``, ``trained-streaming`` for ``streaming_hybrid``); a mapping
            ``{model: path to a .nemo}``: that file (models it does not name start from scratch). The ``.nemo``
            must have the recipe's tokenizer (the same corpus: ``num_train``, ``seed``, ``vocab_size``) and
            exactly the architecture of the model config with ``model_overrides``; only the weights are taken, so
            the optimiser and the Noam warm-up start again from step 0.
        gpu_memory_fraction: the share of the GPU's memory this training may use
            (``torch.cuda.set_per_process_memory_fraction``), 0 < f <= 1, so that several trainings share one
            GPU (two: 0.45 each); ``None``: no limit. Ignored on the CPU.
        loss: ``torch`` (:mod:`fastdecode_lab.tiny_models.transducer_loss`, any device, equal to NeMo's
            loss) or ``nemo`` (NeMo's Numba CUDA kernels; GPU only for TDT).
        eval_batch_size: utterances per batch in ``evaluate`` (streams per batch and engine slots when streaming).
        eval_beam_size: beams of ``evaluate``'s beam rows (NeMo's ``malsd_batch`` and our ``fast_beam``); ``None``:
            no beam rows (greedy rows always run: NeMo's ``greedy_batch`` and our ``fast_greedy``).
        eval_streaming: ``evaluate`` also streams the streaming model, chunk by chunk, at each look-ahead: NeMo's
            cache-aware streaming and our ``StreamingEngine``.
        eval_streaming_utterances: test utterances for the streaming evaluation; ``None``: all.
        eval_sessions: sessions of ``eval_session_utterances`` consecutive test utterances, each followed by
            ``eval_session_pause_seconds`` of silence, decoded offline and (cache-aware models) streamed, as a live
            session holds several utterances; 0: none.
        ship_dir: where ``ship`` copies the models; ``None``: the package's assets
            (:data:`nemo_fastdecode.apps.trained_models.ASSETS_DIR`), the embedded defaults of the demos.
        num_examples: test utterances ``ship`` copies beside the models as the demos' example utterances.
        example_splits: the evaluation splits they come from, taken in turn (the first entries of each): by default
            eSpeak NG's held-out voices, Festival's held-out voice and Flite, the held-out engine, so the demos show
            speech the models never heard. Splits without a manifest (``voices.engines`` left them out) are skipped.
    """

    stages: list[str] = field(default_factory=lambda: list(TINY_MODEL_STAGES))
    models: list[str] = field(default_factory=lambda: list(TINY_MODELS))
    output_dir: str = "outputs/tiny_models"
    model_configs: str | None = None
    model_overrides: dict[str, Any] | None = None
    seed: int = 0
    num_train: int = 48000
    num_dev: int = 500
    num_test: int = 1000
    synthesis_workers: int | None = None
    voices: VoicesConfig = field(default_factory=VoicesConfig)
    vocab_size: int = 256
    batch_size: int = 128
    num_workers: int | None = None
    max_steps: int = 100000
    max_time: str | None = "00:00:06:00"
    warmup_steps: int | None = None
    precision: str | None = None
    accelerator: str = "auto"
    val_check_interval: int = 1000
    log_every_n_steps: int = 50
    checkpoint_every_n_steps: int = 500
    init_from: Any = None
    gpu_memory_fraction: float | None = None
    loss: str = "torch"
    eval_batch_size: int = 64
    eval_beam_size: int | None = 4
    eval_streaming: bool = True
    eval_streaming_utterances: int | None = 300
    eval_sessions: int = 20
    eval_session_utterances: int = 6
    eval_session_pause_seconds: float = 1.2
    ship_dir: str | None = None
    num_examples: int = 6
    example_splits: list[str] = field(default_factory=lambda: ["test", "test_festival_voices", "test_flite"])

    def __post_init__(self) -> None:
        for name, values, valid in (("stages", self.stages, TINY_MODEL_STAGES), ("models", self.models, TINY_MODELS)):
            unknown = [v for v in values if v not in valid]
            if unknown or not values:
                raise ValueError(f"{name}={list(values)} is not valid; choose from: {', '.join(valid)}")
        if self.loss not in ("torch", "nemo"):
            raise ValueError(f"loss={self.loss!r} is not valid; valid values: torch, nemo")
        for name in ("num_train", "vocab_size", "batch_size", "max_steps", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_beam_size is not None and self.eval_beam_size < 1:
            raise ValueError(f"eval_beam_size must be >= 1 or null (no beam rows), got {self.eval_beam_size}")
        if self.num_dev < 1 or self.num_test < 1:
            raise ValueError(f"num_dev and num_test must be >= 1, got {self.num_dev} and {self.num_test}")
        if self.eval_sessions < 0 or self.eval_session_utterances < 1 or self.eval_session_pause_seconds < 0:
            raise ValueError(
                "eval_sessions must be >= 0, eval_session_utterances >= 1 and eval_session_pause_seconds >= 0, got "
                f"{self.eval_sessions}, {self.eval_session_utterances} and {self.eval_session_pause_seconds}"
            )
        if self.gpu_memory_fraction is not None and not 0 < self.gpu_memory_fraction <= 1:
            raise ValueError(
                f"gpu_memory_fraction must be in (0, 1] or null (no limit), got {self.gpu_memory_fraction}"
            )
        self.init_from = check_init_from(self.init_from)
        if not self.example_splits:
            raise ValueError("example_splits must name at least one evaluation split, e.g. [test]")
