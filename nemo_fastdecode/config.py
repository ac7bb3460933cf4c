"""Dataclass configs, mirrored one to one by the YAML files in ``configs/``.

* :class:`FastGreedyConfig` -- the ``decoding.greedy`` section of ``strategy: fast_greedy``.
* :class:`FastGreedyDecodingConfig` -- the ``decoding`` section a NeMo user merges into a transducer
  model's config (``configs/decoding/fast_greedy.yaml``); every key also exists in NeMo's
  ``RNNTDecodingConfig``, so ``model.change_decoding_strategy(cfg)`` accepts it as is.
* :class:`FastBeamConfig` / :class:`FastBeamDecodingConfig` -- the same for ``strategy: fast_beam``
  (``configs/decoding/fast_beam.yaml``).
* :class:`TranscribeConfig` -- ``scripts/transcribe.py`` (``configs/transcribe.yaml``).
* :class:`StreamingConfig` -- ``scripts/streaming.py`` (``configs/streaming.yaml``).

Use them as Hydra/OmegaConf schemas::

    cfg = OmegaConf.merge(OmegaConf.structured(FastGreedyDecodingConfig), OmegaConf.load(path))
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nemo_fastdecode.graphs.modes import GraphMode

# how the streaming encoder's Linear and pointwise-convolution GEMMs run: "fp32" = NeMo's modules (cuBLAS/cuDNN fp32,
# the exact reference); "tf32x3" = kernels/matmul.py on tensor cores (near fp32; CUDA and fp32 compute only);
# "tf32" = the same kernels with one TF32 product (10-bit mantissas: what NeMo runs with matmul_precision=high)
ENCODER_MATMULS = ("fp32", "tf32x3", "tf32")

__all__ = [
    "GRAPH_MODES",
    "FastBeamConfig",
    "FastBeamDecodingConfig",
    "FastGreedyConfig",
    "FastGreedyDecodingConfig",
    "NemoDecodingKeys",
    "StreamingConfig",
    "TranscribeConfig",
]

#: Valid values of ``decoding.greedy.graph_mode``.
GRAPH_MODES: tuple[str, ...] = ("auto", *(mode.value for mode in GraphMode))


def _check_graph_mode_and_max_symbols(graph_mode: str, max_symbols: int | None) -> None:
    if graph_mode not in GRAPH_MODES:
        raise ValueError(f"graph_mode={graph_mode!r} is not valid; valid values: {', '.join(GRAPH_MODES)}")
    if max_symbols is not None and max_symbols < 1:
        raise ValueError(f"max_symbols must be >= 1 or None, got {max_symbols}")


@dataclass
class FastGreedyConfig:
    """``decoding.greedy`` for ``strategy: fast_greedy``.

    Attributes:
        max_symbols: most tokens emitted per encoder frame, as in NeMo (``None`` falls back to
            ``max_symbols_per_step``, whose NeMo default is 10).
        loop_labels: label-looping algorithm (default); ``False`` selects frame looping (RNN-T only).
        use_cuda_graph_decoder: allow CUDA graphs; ignored on the CPU.
        graph_mode: ``auto`` (best mode the driver supports), ``full_graph`` (conditional WHILE nodes,
            CUDA >= 12.3), ``no_while_graph`` (graphs without conditional nodes) or ``eager``.
        fused_kernels: fused Triton step kernels, bit-identical to the torch ops they replace; ``None``: on CUDA.
        fast_math: opt-in: the prediction network and the joint's output layer on near-fp32 (3xTF32) tensor-core
            kernels, with a precomputed label table; faster, not bit-identical to NeMo (the benchmark reports its
            agreement).
    """

    max_symbols: int | None = 10
    loop_labels: bool = True
    use_cuda_graph_decoder: bool = True
    graph_mode: str = "auto"
    fused_kernels: bool | None = None
    fast_math: bool = False

    def __post_init__(self) -> None:
        _check_graph_mode_and_max_symbols(self.graph_mode, self.max_symbols)


@dataclass
class NemoDecodingKeys:
    """The keys of NeMo's ``RNNTDecodingConfig`` that every ``decoding`` section here carries, NeMo's meaning.

    Attributes:
        compute_timestamps: fill ``Hypothesis.timestamp`` with char/word/segment timestamps
            (``None``: NeMo's default; ``transcribe(timestamps=True)`` turns it on).
        preserve_alignments: keep per-frame alignments (not supported by our strategies: ``None``/``False``).
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
    """

    beam_size: int = 4
    max_symbols: int | None = 10
    score_norm: bool = True
    return_best_hypothesis: bool = True
    allow_cuda_graphs: bool = True
    graph_mode: str = "auto"
    fused_topk: bool | None = None
    fast_math: bool = False
    compiled_step: bool = False

    def __post_init__(self) -> None:
        _check_graph_mode_and_max_symbols(self.graph_mode, self.max_symbols)
        if not 1 <= self.beam_size <= 16:
            raise ValueError(f"beam_size must be in 1..16, got {self.beam_size}")


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


@dataclass
class TranscribeConfig:
    """``scripts/transcribe.py``: transcribe a folder of audio or a NeMo manifest with ``fast_greedy``.

    Attributes:
        model: a synthetic preset (``tiny-rnnt``, ``tiny-tdt``, ``tiny-hybrid``, ``rnnt-0.6b``,
            ``rnnt-1.1b``, ``tdt-0.6b``; random weights), a path to a ``.nemo`` checkpoint, or a
            pretrained model name for ``ASRModel.from_pretrained`` (needs network access).
        audio_dir: transcribe every ``.wav`` / ``.flac`` file in this folder (sorted by name).
        dataset_manifest: or every entry of this JSON-lines manifest (``audio_filepath``, optional
            ``text``; relative paths are relative to the manifest's folder).
            Neither given: the embedded demo (4 synthetic utterances, synthetic model).
        output_filename: where to write the output manifest (``pred_text`` per entry). ``None``: next to
            the input (``<manifest stem>_transcribed.jsonl`` / ``<audio_dir>/transcribe_output.jsonl``),
            or ``./transcribe_output.jsonl`` for the demo.
        batch_size: utterances per batch.
        bf16: run the model under ``torch.autocast(dtype=torch.bfloat16)`` on a GPU.
        timestamps: compute char/word/segment timestamps and write them into the manifest.
        cuda: GPU index; ``None`` picks GPU 0 when there is one, else the CPU; a negative value
            forces the CPU (NeMo's ``transcribe_speech.py`` convention).
        seed: seed of the synthetic model's random weights and of the demo audio.
        compare_strategies: after transcribing, time ``fast_greedy`` against NeMo's ``greedy_batch``
            (frame and label looping, no CUDA graphs) on the same encoder outputs and check that the
            hypotheses are identical. ``None``: only for the embedded demo.
        decoding: the model's decoding section, applied with ``model.change_decoding_strategy``.
    """

    model: str = "tiny-rnnt"
    audio_dir: str | None = None
    dataset_manifest: str | None = None
    output_filename: str | None = None
    batch_size: int = 32
    bf16: bool = False
    timestamps: bool = False
    cuda: int | None = None
    seed: int = 0
    compare_strategies: bool | None = None
    decoding: FastGreedyDecodingConfig = field(default_factory=FastGreedyDecodingConfig)


@dataclass
class StreamingConfig:
    """``scripts/streaming.py``: simulated real-time cache-aware streaming of many concurrent streams.

    Attributes:
        model: a synthetic cache-aware preset (``tiny-streaming``, ``hybrid-17x512-streaming``,
            ``rnnt-0.6b-streaming``; random weights), a ``.nemo`` checkpoint or a pretrained model name.
        audio_dir: every ``.wav`` / ``.flac`` file in this folder, or
        dataset_manifest: every entry of this JSON-lines manifest. Neither: synthetic demo utterances.
        num_streams: concurrent streams; stream ``i`` plays input ``i mod (number of inputs)``.
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
        compare_nemo: run the same streams through NeMo's path (slot gather/scatter +
            ``conformer_stream_step``) and compare transcripts and timings.
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

    model: str = "tiny-streaming"
    audio_dir: str | None = None
    dataset_manifest: str | None = None
    num_streams: int = 4
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
    cuda: int | None = None
    seed: int = 0
    output_dir: str = "."
    tag: str | None = None
    fixed_step_repeats: int = 10
    num_streams_sweep: list[int] | None = None
    latency_target_ms: float = 50.0

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype={self.dtype!r} is not valid; valid values: float32, bfloat16")
        if self.encoder_matmul not in ENCODER_MATMULS:
            raise ValueError(
                f"encoder_matmul={self.encoder_matmul!r} is not valid; valid values: {', '.join(ENCODER_MATMULS)}"
            )
        if self.encoder_matmul != "fp32" and self.dtype != "float32":
            raise ValueError(f"encoder_matmul={self.encoder_matmul!r} needs dtype=float32, got {self.dtype}")
        if self.fixed_step_repeats < 0:
            raise ValueError(f"fixed_step_repeats must be >= 0, got {self.fixed_step_repeats}")
        if self.num_streams_sweep is not None and (
            not self.num_streams_sweep or any(int(n) < 1 for n in self.num_streams_sweep)
        ):
            raise ValueError(f"num_streams_sweep must be a non-empty list of counts >= 1, got {self.num_streams_sweep}")
