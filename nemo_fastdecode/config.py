"""Dataclass configs, mirrored one to one by the YAML files in ``configs/``.

* :class:`FastGreedyConfig` -- the ``decoding.greedy`` section of ``strategy: fast_greedy``.
* :class:`FastGreedyDecodingConfig` -- the ``decoding`` section a NeMo user merges into a transducer
  model's config (``configs/decoding/fast_greedy.yaml``); every key also exists in NeMo's
  ``RNNTDecodingConfig``, so ``model.change_decoding_strategy(cfg)`` accepts it as is.
* :class:`TranscribeConfig` -- ``scripts/transcribe.py`` (``configs/transcribe.yaml``).

Use them as Hydra/OmegaConf schemas::

    cfg = OmegaConf.merge(OmegaConf.structured(FastGreedyDecodingConfig), OmegaConf.load(path))
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nemo_fastdecode.graphs.modes import GraphMode

__all__ = ["GRAPH_MODES", "FastGreedyConfig", "FastGreedyDecodingConfig", "TranscribeConfig"]

#: Valid values of ``decoding.greedy.graph_mode``.
GRAPH_MODES: tuple[str, ...] = ("auto", *(mode.value for mode in GraphMode))


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
    """

    max_symbols: int | None = 10
    loop_labels: bool = True
    use_cuda_graph_decoder: bool = True
    graph_mode: str = "auto"

    def __post_init__(self) -> None:
        if self.graph_mode not in GRAPH_MODES:
            raise ValueError(f"graph_mode={self.graph_mode!r} is not valid; valid values: {', '.join(GRAPH_MODES)}")
        if self.max_symbols is not None and self.max_symbols < 1:
            raise ValueError(f"max_symbols must be >= 1 or None, got {self.max_symbols}")


@dataclass
class FastGreedyDecodingConfig:
    """The ``decoding`` section selecting ``fast_greedy`` (a subset of NeMo's ``RNNTDecodingConfig``).

    Attributes:
        strategy: ``fast_greedy``, or any NeMo transducer strategy (``greedy_batch``, ``beam``, ...).
        greedy: options of the greedy strategies.
        compute_timestamps: fill ``Hypothesis.timestamp`` with char/word/segment timestamps
            (``None``: NeMo's default; ``transcribe(timestamps=True)`` turns it on).
        preserve_alignments: keep per-frame alignments (not supported by ``fast_greedy``: ``None``/``False``).
        tdt_include_token_duration: fill ``Hypothesis.token_duration`` for TDT models.
        fused_batch_size: NeMo's fused joint batch size (``None``: off), as in ``RNNTDecodingConfig``.
        rnnt_timestamp_type: which timestamps to compute: ``all``, ``char``, ``word`` or ``segment``.
        word_seperator: separator between words for word timestamps (NeMo's spelling).
        segment_gap_threshold: frames of silence that end a segment (``None``: punctuation only).
        temperature: logit temperature applied by the joint.
    """

    strategy: str = "fast_greedy"
    greedy: FastGreedyConfig = field(default_factory=FastGreedyConfig)
    compute_timestamps: bool | None = None
    preserve_alignments: bool | None = None
    tdt_include_token_duration: bool | None = None
    fused_batch_size: int | None = None
    rnnt_timestamp_type: str = "all"
    word_seperator: str = " "
    segment_gap_threshold: int | None = None
    temperature: float = 1.0


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
