"""NeMo 3.0's streaming pipeline (``CacheAwareRNNTPipeline``) as NeMo builds it, timed and run for transcripts.

NeMo's pipeline is driven by its own request generator (every file read as fast as possible, ``batch_size`` streams
at a time), so it does not follow a virtual clock the way our engine's polls do. It is measured here as it serves
``N`` streams that step together: ``N`` streams each get one frame (``chunk_size_in_secs`` of audio) per step and
``pipeline.transcribe_step`` (NeMo's whole step: per-buffer features, cache gather/scatter, encoder, greedy decoding,
text) is timed, synchronised, after two untimed warm-up steps (the first frames, then one more: lazy set-up and
CUDA-graph capture of its decoder at this batch size).

:func:`pipeline_config` is NeMo's ``cache_aware_rnnt.yaml`` with its fastest settings for this job (see there).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from nemo_fastdecode.apps.timing import synchronize

if TYPE_CHECKING:
    from nemo.collections.asr.inference.pipelines.base_pipeline import BasePipeline


def pipeline_config(
    model_name: str,
    device: torch.device,
    num_streams: int,
    att_context_size: Sequence[int] | None,
    compute_dtype: str = "bfloat16",
    use_cuda_graph_decoder: bool = True,
    matmul_precision: str = "high",
) -> DictConfig:
    """NeMo's streaming inference config (``examples/asr/conf/asr_streaming_inference/cache_aware_rnnt.yaml``'s keys)
    for ``num_streams`` streams stepping together, with the settings that make NeMo's pipeline fastest here:

    ``batch_size = num_slots = num_streams``; ``compute_dtype`` (the example's ``bfloat16``, or ``float32``) without
    AMP; ``greedy_batch`` (label looping) with CUDA-graph decoding (``use_cuda_graph_decoder``; the example turns it
    off), no per-stream biasing, confidence or alignments; ``use_cache`` and ``use_feat_cache`` (features of the newest
    chunk only); audio ``frame`` requests (audio in, as ours); ``matmul_precision`` as the example (``high``: TF32);
    endpointing off (``stop_history_eou: -1``: no end-of-utterance search per stream, our engine does none), ITN and
    NMT off; ``log_level`` 30.
    """
    is_cuda = device.type == "cuda"
    return OmegaConf.create(
        {
            "asr": {
                "model_name": model_name,
                "device": "cuda" if is_cuda else "cpu",
                "device_id": (device.index or 0) if is_cuda else 0,
                "compute_dtype": compute_dtype,
                "use_amp": False,
                "decoding": {
                    "strategy": "greedy_batch",
                    "preserve_alignments": False,
                    "fused_batch_size": -1,
                    "greedy": {
                        "loop_labels": True,
                        "use_cuda_graph_decoder": use_cuda_graph_decoder,
                        "enable_per_stream_biasing": False,
                        "preserve_frame_confidence": False,
                        "max_symbols": 10,
                    },
                },
            },
            "itn": {  # read only with enable_itn
                "input_case": "lower_cased",
                "whitelist": None,
                "overwrite_cache": False,
                "max_number_of_permutations_per_split": 729,
                "left_padding_size": 4,
                "batch_size": 32,
                "n_jobs": 1,
            },
            "nmt": None,
            "confidence": {
                "exclude_blank": True,
                "aggregation": "mean",
                "method_cfg": {"name": "entropy", "entropy_type": "tsallis", "alpha": 0.5, "entropy_norm": "exp"},
            },
            "endpointing": {"stop_history_eou": -1, "residue_tokens_at_end": 0},
            "streaming": {
                "sample_rate": 16000,
                "batch_size": num_streams,
                "word_boundary_tolerance": 4,
                "att_context_size": list(att_context_size) if att_context_size is not None else None,
                "use_cache": True,
                "use_feat_cache": True,
                "chunk_size_in_secs": None,
                "request_type": "frame",
                "num_slots": num_streams,
            },
            "matmul_precision": matmul_precision,
            "log_level": 30,
            "pipeline_type": "cache_aware",
            "asr_decoding_type": "rnnt",
            "enable_itn": False,
            "enable_nmt": False,
            "asr_output_granularity": "segment",
            "cache_dir": None,
            "lang": None,
            "return_tail_result": False,
        }
    )


@contextlib.contextmanager
def nemo_settings() -> Iterator[None]:
    """NeMo's builder sets torch's global matmul precision (and NeMo's log level): restored on the way out, so that
    our engine's measurements run with their own settings."""
    from nemo.utils import logging as nemo_logging

    precision, level = torch.get_float32_matmul_precision(), nemo_logging.getEffectiveLevel()
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(precision)
        nemo_logging.setLevel(level)


def build_nemo_pipeline(cfg: DictConfig, *, model: torch.nn.Module | None = None) -> BasePipeline:
    """NeMo's ``PipelineBuilder.build_pipeline(cfg)``; it loads its own copy of the model from ``cfg.asr.model_name``.

    ``model``: the in-memory model that file was saved from; NeMo's wrapper then gets a copy of it instead of
    restoring the file. The synthetic checkpoints a GPU run saves do not restore under torch 2.11 (its unpickler
    stops at "reduce for unrecognized function encoder.pre_encode.out.bias"); the weights are the same either way.
    """
    from nemo.collections.asr.inference.factory.pipeline_builder import PipelineBuilder
    from nemo.collections.asr.inference.model_wrappers.asr_inference_wrapper import ASRInferenceWrapper

    if model is None:
        return PipelineBuilder.build_pipeline(cfg)
    load_model = ASRInferenceWrapper.__dict__["load_model"]
    ASRInferenceWrapper.load_model = staticmethod(lambda name, map_location: _fresh_copy(model, map_location))
    try:
        return PipelineBuilder.build_pipeline(cfg)
    finally:
        ASRInferenceWrapper.load_model = load_model


def _fresh_copy(model: Any, device: torch.device) -> Any:
    """A new instance of ``model``'s class from its config, with its weights (what restoring its ``.nemo`` gives)."""
    fresh = type(model)(cfg=copy.deepcopy(model.cfg))
    fresh.load_state_dict(model.state_dict())
    return fresh.to(device).eval()


@dataclass
class PipelineStepTiming:
    """NeMo's pipeline step with ``streams`` streams stepping together: median and p95 (ms) of ``repeats`` steps."""

    streams: int
    step_ms: float
    step_p95_ms: float
    repeats: int


def time_pipeline_steps(
    pipeline: Any, audios: Sequence[np.ndarray], num_streams: int, repeats: int, device: torch.device
) -> PipelineStepTiming:
    """``pipeline.transcribe_step`` with ``num_streams`` streams stepping together (module docstring).

    Stream ``j`` plays ``audios[j % len(audios)]`` (float32) from its start, wrapping around, one frame of the
    pipeline's ``chunk_size_in_secs`` per step; after the timed steps every stream gets its last frame (untimed).
    """
    from nemo.collections.asr.inference.streaming.framing.request import Frame
    from nemo.collections.asr.inference.streaming.framing.request_options import ASRRequestOptions

    frame = round(pipeline.chunk_size_in_secs * pipeline.sample_rate)
    position = [0] * num_streams

    def frames(first: bool = False, last: bool = False) -> list[Frame]:
        out = []
        for j in range(num_streams):
            pcm = audios[j % len(audios)]
            samples = torch.from_numpy(np.take(pcm, np.arange(position[j], position[j] + frame), mode="wrap"))
            position[j] += frame
            options = ASRRequestOptions() if first else None
            out.append(Frame(samples=samples, stream_id=j, is_first=first, is_last=last, length=frame, options=options))
        return out

    pipeline.open_session()
    pipeline.transcribe_step(frames(first=True))
    pipeline.transcribe_step(frames())
    times = []
    for _ in range(repeats):
        requests = frames()
        synchronize(device)
        started = time.perf_counter()
        pipeline.transcribe_step(requests)
        synchronize(device)
        times.append(time.perf_counter() - started)
    pipeline.transcribe_step(frames(last=True))
    pipeline.close_session()
    return PipelineStepTiming(
        streams=num_streams,
        step_ms=round(1000 * float(np.median(times)), 3) if times else 0.0,
        step_p95_ms=round(1000 * float(np.percentile(times, 95)), 3) if times else 0.0,
        repeats=repeats,
    )


def pipeline_texts(pipeline: Any, wavs: Sequence[str]) -> list[str]:
    """NeMo's pipeline on the WAV files, as its streaming script runs it (``pipeline.run``): each file's text."""
    output = pipeline.run(list(wavs))
    by_file = {record["audio_filepath"]: record["text"] for record in output.values()}
    return [by_file.get(str(wav), "") for wav in wavs]
