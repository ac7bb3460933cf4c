"""NeMo's streaming inference pipeline, backed by :class:`~nemo_fastdecode.streaming.engine.StreamingEngine`.

NeMo 3.0's streaming entry point (``examples/asr/asr_streaming_inference/asr_streaming_infer.py`` and its YAMLs)
builds its pipeline with ``PipelineBuilder.build_pipeline(cfg)`` and calls ``pipeline.run(audio_filepaths,
options, progress_bar)``. With one line of its config changed::

    pipeline_type: fast_cache_aware   # was: cache_aware

the builder returns a :class:`FastCacheAwarePipeline` (``registry.register`` hooks the builder; the start-up hook
in ``autoload/`` does it in NeMo's own scripts without an ``import``). Everything else stays: the same config
keys, NeMo's request generator reading the files in ``streaming.batch_size`` streams at a time, NeMo's
``BasePipeline.run`` and ``transcribe_step`` (so ``TranscribeStepOutput`` objects and the ``run`` result, a dict
``{stream_id: {"text", "segments", "audio_filepath", ...}}``, are NeMo's own, and the script writes them as before).

What changes is what runs inside each step: every frame's audio goes into the engine (PCM in, NeMo's whole-stream
features, the cache-aware encoder over slot caches, ``fast_greedy``), which steps all streams of the batch in one
cycle. The transcripts are those of NeMo's cache-aware streaming of each file alone (``CacheAwareStreamingAudioBuffer``
over the file's features + ``conformer_stream_step``; exact in fp32), not those of NeMo's ``CacheAwareRNNTPipeline``,
which computes features per buffer and shifts the chunk grid (tests/test_streaming_engine_pipeline.py explains).

Config keys read (NeMo's names and meanings): ``asr.model_name`` (a ``.nemo`` path or a pretrained name),
``asr.device`` / ``device_id`` / ``compute_dtype`` (the engine's cache and compute dtype; ``float32`` is exact),
``asr.use_cuda_graphs`` (optional, default true), ``asr.decoding.greedy.max_symbols`` / ``fast_math`` /
``ngram_lm_model`` / ``ngram_lm_alpha`` (the engine's n-gram LM fusion),
``streaming.sample_rate`` / ``batch_size`` / ``num_slots`` / ``att_context_size`` / ``chunk_size_in_secs`` (the
request frames' length; default one chunk), ``asr_output_granularity``, ``matmul_precision`` and ``log_level`` (set
as NeMo's builder sets them). Each stream gets one final transcript, at its end: endpointing
(``endpointing.stop_history_eou``) is not applied, and segments carry confidence 0.0 (as NeMo's without
``preserve_frame_confidence``). Refused with an error naming the setting: CTC decoding, beam strategies, ITN, NMT,
feature-buffer requests, ``use_cache: false``.

Per-stream biasing: with ``asr.decoding.greedy.enable_per_stream_biasing: true`` a request's ``biasing_cfg`` (NeMo's
``BiasingRequestItemConfig``) becomes its engine stream's boosting tree (``StreamOptions.boosting``; NeMo's options the
engine does not take are refused by name); without it such requests are ignored with a warning, as NeMo's pipeline
ignores them.
"""

from __future__ import annotations

import re
import warnings
from typing import TYPE_CHECKING, Any

import torch
from nemo.collections.asr.inference.model_wrappers.asr_inference_wrapper import ASRInferenceWrapper
from nemo.collections.asr.inference.pipelines.base_pipeline import BasePipeline
from nemo.collections.asr.inference.streaming.framing.multi_stream import ContinuousBatchedRequestStreamer
from nemo.collections.asr.inference.streaming.framing.request import FeatureBuffer, Frame
from nemo.collections.asr.inference.streaming.framing.request_options import ASRRequestOptions
from nemo.collections.asr.inference.streaming.state.state import StreamingState
from nemo.collections.asr.inference.utils.device_utils import setup_device
from nemo.collections.asr.inference.utils.enums import ASROutputGranularity, RequestType
from nemo.collections.asr.inference.utils.pipeline_utils import (
    get_leading_punctuation_regex_pattern,
    ids_to_text_without_stripping,
)
from nemo.collections.asr.inference.utils.text_segment import TextSegment, Word

from nemo_fastdecode.nemo.constants import FAST_PIPELINE_TYPE as PIPELINE_TYPE
from nemo_fastdecode.streaming.boosting import boosting_options_from_nemo
from nemo_fastdecode.streaming.engine import StreamingEngine
from nemo_fastdecode.streaming.events import BoostingOptions, StreamEvent, StreamOptions

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["PIPELINE_TYPE", "FastCacheAwarePipeline", "build_pipeline"]

#: Greedy strategies whose output the engine reproduces (ours runs inside the engine whichever is named).
_GREEDY_STRATEGIES = ("greedy", "greedy_batch", "fast_greedy")


def build_pipeline(cfg: DictConfig) -> FastCacheAwarePipeline:
    """What ``PipelineBuilder.build_pipeline(cfg)`` returns for ``pipeline_type: fast_cache_aware``: NeMo's log level
    and matmul precision set as its builder sets them, then the pipeline."""
    from nemo.collections.asr.inference.factory.pipeline_builder import PipelineBuilder

    PipelineBuilder.set_log_level(cfg.log_level)
    PipelineBuilder.set_matmul_precision(cfg.matmul_precision)
    return FastCacheAwarePipeline(cfg)


class FastCacheAwarePipeline(BasePipeline):
    """NeMo's ``BasePipeline`` over one :class:`StreamingEngine` (see the module docstring).

    Args:
        cfg: NeMo's streaming inference config (``cache_aware_rnnt.yaml``'s keys), any ``pipeline_type``.

    Attributes:
        engine: the engine, ``streaming.num_slots`` slots, warmed up (CUDA graphs captured on a GPU).
        device: the model's device (NeMo's script synchronises it around ``run``).
    """

    def __init__(self, cfg: DictConfig):
        _check_config(cfg)
        device, _, dtype = setup_device(str(cfg.asr.device), cfg.asr.get("device_id", 0), str(cfg.asr.compute_dtype))
        self.device = torch.device(device)
        model = ASRInferenceWrapper.load_model(str(cfg.asr.model_name), self.device)  # NeMo's loader: .nemo or name
        if hasattr(model, "cur_decoder"):  # a hybrid model streams with its RNN-T head, as NeMo's pipeline does
            model.change_decoding_strategy(decoder_type="rnnt", verbose=False)
        greedy = cfg.asr.decoding.get("greedy", None) or {}
        streaming = cfg.streaming
        self.engine = StreamingEngine(
            model,
            num_slots=int(streaming.num_slots),
            att_context_size=list(streaming.att_context_size) if streaming.get("att_context_size") else None,
            dtype=dtype,
            use_cuda_graphs=bool(cfg.asr.get("use_cuda_graphs", True)),
            fast_math=bool(greedy.get("fast_math", False)),
            max_symbols=greedy.get("max_symbols", None),
            ngram_lm_model=greedy.get("ngram_lm_model", None),
            ngram_lm_alpha=float(greedy.get("ngram_lm_alpha", None) or 0.0),
        )
        self.engine.warm_up()
        self.per_stream_biasing = bool(greedy.get("enable_per_stream_biasing", False))
        self.model = model
        self.tokenizer = model.tokenizer
        self.sep = str(cfg.asr.decoding.get("word_seperator", " "))  # NeMo's key, spelled as NeMo spells it
        puncts = set(getattr(self.tokenizer, "supported_punctuation", set())) - set("'")
        self.leading_regex_pattern = get_leading_punctuation_regex_pattern(puncts)
        self.sample_rate = int(streaming.sample_rate)
        self.batch_size = int(streaming.batch_size)
        geometry = self.engine.geometry
        self.chunk_size_in_secs = float(streaming.get("chunk_size_in_secs", None) or geometry.chunk_seconds)
        # seconds per encoder frame: a word shorter than one frame still gets an end after its start (NeMo's rule)
        self._frame_seconds = geometry.subsampling_factor * self.engine.front.settings.hop / self.sample_rate
        self.asr_output_granularity = ASROutputGranularity.from_str(str(cfg.asr_output_granularity))
        self.init_nmt_model(None)
        self._engine_id: dict[int, int] = {}  # NeMo's stream id -> the engine's
        self._reported: dict[int, int] = {}  # tokens of the stream already in a step output
        self._warned: set[str] = set()
        if cfg.get("endpointing", None) and (cfg.endpointing.get("stop_history_eou", -1) or -1) > 0:
            self._warn_once(
                "endpointing",
                "fast_cache_aware: endpointing.stop_history_eou is not applied; each stream gets one final "
                "transcript, at its end",
            )
        if greedy.get("preserve_frame_confidence", False):
            self._warn_once("confidence", "fast_cache_aware: confidence is not computed; segments carry conf 0.0")
        super().__init__()

    # ---- NeMo's pipeline interface ---------------------------------------------------------------------------
    def get_sep(self) -> str:
        return self.sep

    def create_state(self, options: ASRRequestOptions) -> StreamingState:
        """A stream's NeMo state; its options filled with the pipeline's defaults (ITN / NMT refused)."""
        options = options.fill_defaults(
            default_enable_itn=False,
            default_enable_nmt=False,
            default_source_language=None,
            default_target_language=None,
            default_stop_history_eou=-1,
            default_asr_output_granularity=self.asr_output_granularity,
        )
        if options.enable_itn or options.enable_nmt:
            what = "enable_itn" if options.enable_itn else "enable_nmt"
            raise NotImplementedError(
                f"fast_cache_aware does not support request option {what}=True; use pipeline_type: cache_aware"
            )
        if options.has_biasing_request():
            if self.per_stream_biasing:
                self._boosting(options)  # NeMo's options the engine does not take are refused now, by name
            else:
                self._warn_once(
                    "biasing",
                    "fast_cache_aware: a request asks for biasing and asr.decoding.greedy.enable_per_stream_biasing is "
                    "false: ignored (as NeMo's pipeline ignores it)",
                )
        state = StreamingState()
        state.set_options(options)
        return state

    def get_request_generator(self) -> ContinuousBatchedRequestStreamer:
        """NeMo's generator: ``batch_size`` files at a time, audio frames of ``chunk_size_in_secs``."""
        return ContinuousBatchedRequestStreamer(
            n_frames_per_stream=1,
            frame_size_in_secs=self.chunk_size_in_secs,
            sample_rate=self.sample_rate,
            batch_size=self.batch_size,
            request_type=RequestType.FRAME,
            pad_last_frame=True,  # as NeMo's cache-aware pipeline; only a frame's valid samples are pushed
        )

    def reset_session(self) -> None:
        """Forget every stream (NeMo's states and the engine's: streams left open by an interrupted run end now)."""
        super().reset_session()
        for stream_id in self.engine.open_streams:
            self.engine.close(stream_id)
        self._engine_id.clear()
        self._reported.clear()

    def transcribe_step_for_feature_buffers(self, fbuffers: list[FeatureBuffer]) -> None:
        raise NotImplementedError(
            "fast_cache_aware takes audio frames (streaming.request_type: frame): the engine computes the features"
        )

    def transcribe_step_for_frames(self, frames: list[Frame]) -> None:
        """Push every frame's audio, run engine cycles until all of it is stepped, and write the streams' states.

        ``frames``: at most one per stream (NeMo's generator); a stream's first frame opens it in the engine, its
        last one ends it, and its final transcript is in this step's output.
        """
        for frame in frames:
            if frame.is_first:
                boosting = self._boosting(self.get_state(frame.stream_id).options)
                options = StreamOptions(sample_rate=self.sample_rate, sample_format="float32", boosting=boosting)
                self._engine_id[frame.stream_id] = self.engine.open(options)
                self._reported[frame.stream_id] = 0
            stream = self._engine_id[frame.stream_id]
            samples = frame.samples[: frame.valid_size]  # the last frame's zero padding is not audio
            self.engine.push(stream, samples.detach().to("cpu", torch.float32).numpy())
            if frame.is_last:
                self.engine.finish(stream)
        finals: dict[int, StreamEvent] = {}
        while self.engine.busy:  # one cycle steps one chunk of every stream with one waiting
            finals.update((event.stream_id, event) for event in self.engine.poll() if event.is_last)
        for frame in frames:
            self._write_state(frame, finals.get(self._engine_id[frame.stream_id]))

    # ---- states ----------------------------------------------------------------------------------------------
    def _write_state(self, frame: Frame, final: StreamEvent | None) -> None:
        """The stream's partial (or final) transcript and this step's new text, as NeMo's pipeline writes them."""
        state = self.get_state(frame.stream_id)
        stream = self._engine_id[frame.stream_id]
        ids = final.token_ids if final is not None else self.engine.token_ids(stream)
        new = ids[self._reported[frame.stream_id] :]
        self._reported[frame.stream_id] = len(ids)
        state.current_step_transcript = ids_to_text_without_stripping(new, self.tokenizer, self.sep) if new else ""
        if final is None:
            partial = ids_to_text_without_stripping(ids, self.tokenizer, self.sep) if ids else ""
            if partial and self.leading_regex_pattern:
                partial = re.sub(self.leading_regex_pattern, r"\1", partial)
            state.partial_transcript = partial
            return
        state.partial_transcript = ""
        segments = self._segments(final, state.options.is_word_level_output())
        state.final_segments = segments
        if state.options.is_word_level_output():
            state.final_transcript = self.sep.join(word.text for word in segments)
        else:
            state.final_transcript = final.text.strip()
        del self._engine_id[frame.stream_id], self._reported[frame.stream_id]

    def _segments(self, final: StreamEvent, words: bool) -> list[TextSegment]:
        """NeMo's output objects for a stream's final event: its words (``Word``) or one ``TextSegment``.

        Times are NeMo's word timestamps (seconds from the stream's start); a span of zero length ends one encoder
        frame after its start, as NeMo's ``BPEDecoder`` does. Confidence is 0.0 (not computed).
        """
        spans = [w for w in final.words or [] if str(w["word"]).strip()]
        if not spans or not final.text.strip():
            return []
        if words:
            return [Word(str(w["word"]), *self._times(w["start"], w["end"]), conf=0.0) for w in spans]
        start, end = self._times(spans[0]["start"], spans[-1]["end"])
        return [TextSegment(final.text.strip(), start, end, conf=0.0)]

    def _times(self, start: float, end: float) -> tuple[float, float]:
        start, end = float(start), float(end)
        return start, end if end > start else start + self._frame_seconds

    def _boosting(self, options: ASRRequestOptions | None) -> BoostingOptions | None:
        """The stream's boosting tree options from its request's ``biasing_cfg`` (``None``: none, or biasing off)."""
        if not self.per_stream_biasing or options is None or not options.has_biasing_request():
            return None
        return boosting_options_from_nemo(options.biasing_cfg)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=3)


def _check_config(cfg: Any) -> None:
    """Refuse what the engine does not do, naming the setting and the valid values."""
    decoding_type = str(cfg.get("asr_decoding_type", "rnnt")).lower()
    if decoding_type != "rnnt":
        raise ValueError(
            f"pipeline_type: {PIPELINE_TYPE} decodes transducers: asr_decoding_type must be 'rnnt', got "
            f"{decoding_type!r} (for CTC use pipeline_type: cache_aware)"
        )
    strategy = str(cfg.asr.decoding.get("strategy", "greedy_batch"))
    if strategy not in _GREEDY_STRATEGIES:
        raise ValueError(
            f"pipeline_type: {PIPELINE_TYPE} decodes greedily: asr.decoding.strategy must be one of "
            f"{', '.join(_GREEDY_STRATEGIES)}, got {strategy!r} (for beam search use pipeline_type: cache_aware)"
        )
    for key in ("enable_itn", "enable_nmt"):
        if cfg.get(key, False):
            raise NotImplementedError(f"pipeline_type: {PIPELINE_TYPE} does not support {key}=true; set it false")
    request_type = str(cfg.streaming.get("request_type", "frame")).lower()
    if request_type != "frame":
        raise ValueError(
            f"pipeline_type: {PIPELINE_TYPE} takes audio: streaming.request_type must be 'frame', got {request_type!r}"
        )
    if not cfg.streaming.get("use_cache", True):
        raise ValueError(f"pipeline_type: {PIPELINE_TYPE} always steps with caches: streaming.use_cache must be true")
    if int(cfg.streaming.num_slots) < int(cfg.streaming.batch_size):
        raise ValueError(
            f"streaming.num_slots ({cfg.streaming.num_slots}) must be >= streaming.batch_size "
            f"({cfg.streaming.batch_size})"
        )
