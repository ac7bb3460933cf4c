"""The streaming engine's options, one object: :class:`EngineConfig`, checked once when it is built.

:class:`~nemo_fastdecode.streaming.engine.StreamingEngine` takes it whole (``StreamingEngine(model, config)``); the
server's :class:`~nemo_fastdecode.serve.ServeConfig` and the lab's configs build theirs in one place
(``ServeConfig.engine``, ``StreamingConfig.engine_config``, ``StreamAudioBenchConfig.engine_config``), so every rule
below is the one rule for every entry point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from nemo_fastdecode.streaming.encoder import check_precision
from nemo_fastdecode.streaming.events import EndpointingOptions
from nemo_fastdecode.streaming.transcriber import check_decoding

__all__ = ["DTYPES", "EngineConfig", "check_endpointing", "endpointing_options"]

#: the engine's cache and encoder compute dtypes, by their config names
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class EngineConfig:
    """Everything a :class:`~nemo_fastdecode.streaming.engine.StreamingEngine` is built with but the model.

    Attributes:
        num_slots: most streams open at once (an int >= 1); every per-stream buffer is allocated for them up front.
        att_context_size: ``[left, lookahead]`` in encoder frames, one of the encoder's look-aheads; ``None``: its
            current one.
        dtype: cache and encoder compute dtype, ``torch.float32`` (exact) or ``torch.bfloat16``, or its name
            (``"float32"`` / ``"bfloat16"``: kept as given; :attr:`torch_dtype` is the torch dtype).
        use_cuda_graphs: replay CUDA graphs per batch-size bucket on a GPU (call ``warm_up`` first), and the front
            end's feature pass as one graph per frame count.
        encoder_matmul: ``"fp32"`` (exact), or opt-in ``"tf32x3"`` / ``"tf32"`` (float32 only; see
            :class:`~nemo_fastdecode.streaming.transcriber.StreamingTranscriber`).
        fast_math: opt-in fast-math greedy decoding (not bit-identical to NeMo's; greedy only).
        max_symbols: greedy ``max_symbols``, tokens per encoder frame (``None``: the model's).
        idle_timeout_seconds: seconds; a stream without a push for this long is ended by ``poll`` (its final event is
            emitted, its slot freed); ``None``: never.
        max_cycle_seconds: seconds of one stream's audio fed to the front end per cycle (sizes its buffers:
            ``num_slots x max_cycle_seconds x rate`` samples); more waits on the host for the next cycles.
        max_chunks_per_cycle: most chunks one stream steps in a cycle (an int >= 1). A stream with more than a chunk
            of features waiting (its server fell behind) steps again in the same cycle, up to this many times, so that
            it catches up several chunks at a time while the cycle's fixed host cost is paid once; streams with
            endpointing or VAD step once (their utterance ends are decided chunk by chunk). A stream's chunks are the
            same whichever cycle steps them: the transcripts do not change.
        endpointing: when utterances end mid-stream (:class:`EndpointingOptions`; ``None``: never), for every stream
            that does not set its own in ``StreamOptions``. Silero VAD is loaded with the engine if it is on. Needs
            ``decoding="greedy"`` when a rule is on.
        phrase_boosting: set per-stream phrase boosting (``StreamOptions.boosting``) up with the engine, so that
            ``warm_up`` also captures (beam search: runs) the decoder that fuses the streams' boosting trees (a model
            with a tokenizer); ``False``: the first stream with phrases sets it up.
        decoding: ``"greedy"`` or ``"beam"``: NeMo's ``malsd_batch`` beam search, every stream's beams continued chunk
            after chunk (partial events carry the best beam so far); not with endpointing or ``fast_math``.
        beam_size: beams per stream with ``decoding="beam"`` (an int >= 1).
        ngram_lm_model: path of an n-gram LM over the model's tokens (an ARPA file or NeMo's ``.nemo`` n-gram LM) fused
            into every stream's decoding, as NeMo's ``greedy.ngram_lm_model`` / ``beam.ngram_lm_model``; ``None``: none.
        ngram_lm_alpha: the LM's weight, finite and > 0 with a model, 0 without (NeMo's ``greedy.ngram_lm_alpha``).
        masked_end_frame: after each stream's last feature frame, step one frame of the preprocessor's ``pad_value``,
            the masked frame NeMo's streaming script keeps at the end of every file: the final tokens then equal that
            script's on each file alone. ``False``: the stream's ``L // hop`` frames, as NeMo's offline ``transcribe``
            encodes them.
    """

    num_slots: int
    att_context_size: Sequence[int] | None = None
    dtype: torch.dtype | str = torch.float32
    use_cuda_graphs: bool = True
    encoder_matmul: str = "fp32"
    fast_math: bool = False
    max_symbols: int | None = None
    idle_timeout_seconds: float | None = None
    max_cycle_seconds: float = 1.0
    max_chunks_per_cycle: int = 4
    endpointing: EndpointingOptions | None = None
    phrase_boosting: bool = False
    decoding: str = "greedy"
    beam_size: int = 4
    ngram_lm_model: str | Path | None = None
    ngram_lm_alpha: float = 0.0
    masked_end_frame: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.num_slots, bool) or not isinstance(self.num_slots, int) or self.num_slots < 1:
            raise ValueError(f"num_slots must be >= 1 (an int), got {self.num_slots!r}")
        check_precision(self.dtype_name, self.encoder_matmul)
        if self.idle_timeout_seconds is not None and not self.idle_timeout_seconds > 0:
            raise ValueError(f"idle_timeout_seconds must be > 0 or None, got {self.idle_timeout_seconds!r}")
        if not (isinstance(self.max_chunks_per_cycle, int) and self.max_chunks_per_cycle >= 1):
            raise ValueError(f"max_chunks_per_cycle must be an int >= 1, got {self.max_chunks_per_cycle!r}")
        if not isinstance(self.masked_end_frame, bool):
            raise TypeError(f"masked_end_frame must be a bool, got {self.masked_end_frame!r}")
        check_decoding(
            self.decoding,
            self.beam_size,
            fast_math=self.fast_math,
            ngram_lm_model=self.ngram_lm_model,
            ngram_lm_alpha=self.ngram_lm_alpha,
        )
        check_endpointing(self.decoding, self.endpointing_options)

    @property
    def dtype_name(self) -> str:
        """``"float32"`` / ``"bfloat16"`` (another torch dtype: its name, which the precision check refuses)."""
        if isinstance(self.dtype, torch.dtype):
            return str(self.dtype).removeprefix("torch.")
        return self.dtype

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype_name]

    @property
    def endpointing_options(self) -> EndpointingOptions:
        """:attr:`endpointing`, ``EndpointingOptions()`` (no rule on) for ``None``; checked to be one."""
        return EndpointingOptions() if self.endpointing is None else endpointing_options(self.endpointing)

    @classmethod
    def from_options(cls, config: int | EngineConfig | None = None, /, **options: Any) -> EngineConfig:
        """``config`` if it is an :class:`EngineConfig` (then no ``options``), else
        ``EngineConfig(num_slots=config, **options)`` (``config`` ``None``: ``num_slots`` among the ``options``)."""
        if isinstance(config, EngineConfig):
            if options:
                raise TypeError(f"options {', '.join(sorted(options))} given with an EngineConfig: set them in it")
            return config
        unknown = sorted(set(options) - set(_names()))
        if unknown:
            raise TypeError(f"unknown engine option(s) {', '.join(unknown)}; valid: {', '.join(_names())}")
        if config is not None:
            if "num_slots" in options:
                raise TypeError(f"num_slots given twice: {config!r} and num_slots={options['num_slots']!r}")
            options["num_slots"] = config
        return cls(**options)


def _names() -> list[str]:
    return [f.name for f in fields(EngineConfig)]


def endpointing_options(options: Any) -> EndpointingOptions:
    """``options``, checked to be an :class:`EndpointingOptions`."""
    if not isinstance(options, EndpointingOptions):
        raise TypeError(f"endpointing must be an EndpointingOptions, got {type(options).__name__}")
    return options


def check_endpointing(decoding: str, options: EndpointingOptions) -> None:
    """Utterance ends cut a stream's tokens where they were decoded; a beam search may still replace them."""
    if decoding == "beam" and options.enabled:
        raise ValueError(
            "endpointing (vad or a blank-run rule) needs decoding='greedy'; valid with decoding='beam': "
            "EndpointingOptions() (no endpointing)"
        )
