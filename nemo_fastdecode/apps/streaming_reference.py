"""NeMo's cache-aware streaming of one stream alone: the reference every streaming transcript is checked against.

The loop of NeMo's streaming script (``speech_to_text_cache_aware_streaming_infer.py``): the preprocessor's features of
the whole file, ``CacheAwareStreamingAudioBuffer`` chunks, the encoder's ``cache_aware_stream_step`` and the model's
decoding with partial hypotheses; then NeMo's word timestamps.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis

from nemo_fastdecode.decode_call import true_fp32

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

    from nemo_fastdecode.streaming.events import BoostingOptions

__all__ = ["Reference", "nemo_alone", "nemo_alone_beam", "reference_transcript"]


@dataclasses.dataclass(frozen=True)
class Reference:
    """NeMo's streaming transcript of one stream alone: token ids, text, word timestamps (NeMo's dicts)."""

    token_ids: list[int]
    text: str
    words: list[dict[str, Any]]


def nemo_alone(
    model: ASRModel, feats: torch.Tensor, biasing: Any = None
) -> tuple[list[torch.Tensor], Hypothesis | None, list[torch.Tensor]]:
    """NeMo's cache-aware streaming of one stream ``[feat_in, T]``.

    ``biasing``: NeMo's ``BiasingRequestItemConfig``, the stream's own boosting tree, handled as NeMo's
    ``CacheAwareRNNTPipeline`` handles a request's ``biasing_cfg``: added to the decoding computer's multi-model (the
    model's decoding needs ``greedy.enable_per_stream_biasing``), the stream's first partial hypothesis
    ``Hypothesis.empty_with_biasing_cfg``, the tree removed at the stream's end.

    Returns:
        Each chunk's encoder output ``[T_i, D]``, the final hypothesis (``None`` without a chunk), NeMo's chunks.
    """
    outputs, hyps, chunks = [], None, []
    multi_model = None
    if biasing is not None:
        multi_model = model.decoding.decoding.decoding_computer.biasing_multi_model
        if multi_model is None:
            raise ValueError("per-stream biasing needs the model's decoding with greedy.enable_per_stream_biasing=true")
        biasing.add_to_multi_model(tokenizer=model.tokenizer, biasing_multi_model=multi_model)
        hyps = [Hypothesis.empty_with_biasing_cfg(biasing)]
    with torch.inference_mode(), true_fp32():  # the decoding too: the reference is fp32 throughout
        for chunk, encoded, encoded_len in _stream_steps(model, feats):
            chunks.append(chunk)
            outputs.append(encoded[0, :, : int(encoded_len[0])].T.clone())
            hyps = model.decoding.rnnt_decoder_predictions_tensor(
                encoder_output=encoded, encoded_lengths=encoded_len, return_hypotheses=True, partial_hypotheses=hyps
            )
    if multi_model is not None:
        biasing.remove_from_multi_model(biasing_multi_model=multi_model)
        if not chunks:
            hyps = None
    return outputs, hyps[0] if hyps else None, chunks


def nemo_alone_beam(
    model: ASRModel,
    feats: torch.Tensor,
    beam_size: int,
    max_symbols: int = 10,
    score_norm: bool = True,
    ngram_lm_model: str | Path | torch.nn.Module | None = None,
    ngram_lm_alpha: float = 0.0,
    boosting: BoostingOptions | None = None,
) -> Hypothesis | None:
    """NeMo's cache-aware streaming of one stream ``[feat_in, T]`` with ``malsd_batch`` beam search across chunks.

    NeMo 3.0's streaming paths (``conformer_stream_step``, ``CacheAwareRNNTPipeline``) refuse partial hypotheses with
    ``malsd_batch`` (``BeamBatchedRNNTInfer.forward`` raises ``NotImplementedError``); NeMo continues a beam search
    only through its computer. So: the encoder's ``cache_aware_stream_step`` over NeMo's ``CacheAwareStreamingAudioBuffer``
    chunks (as :func:`nemo_alone`), each chunk's frames into NeMo's ``ModifiedALSDBatchedRNNTComputer`` /
    ``ModifiedALSDBatchedTDTComputer`` with the previous chunk's ``prev_batched_state`` (torch path, no CUDA graphs),
    the chunks' hypotheses joined with ``BatchedBeamHyps.flatten_`` and ``merge_(..., is_chunk_continuation=True,
    boundary_prev_ptr=...)``, the best beam by ``to_hyps_list(score_norm)``. A chunk without frames is not decoded.

    ``ngram_lm_model`` / ``ngram_lm_alpha``: an n-gram LM fused into the search as NeMo's ``RNNTDecoding`` sets
    ``malsd_batch`` up with ``beam.ngram_lm_model`` (``NGramGPULanguageModel.from_file(vocab_size=blank_id)``,
    ``late`` pruning, ``lm_weighted_full`` blank scoring); the computer carries the beams' LM states across chunks
    in ``prev_batched_state.fusion_states_list``. An ``NGramGPULanguageModel`` already loaded that way is used as it is
    (many streams' references load a large LM once).

    ``boosting``: the stream's phrases as one boosting tree fused after the LM, as NeMo's ``RNNTDecoding`` sets
    ``beam.boosting_tree`` / ``beam.boosting_tree_alpha`` up (``GPUBoostingTreeModel.from_config`` with the model's
    tokenizer, weight ``boosting.weight``): NeMo's beam search has no per-stream trees, so a stream's own phrases are
    the model-wide tree of a search of that stream alone.

    Returns:
        The best hypothesis (timestamps in encoder frames from the stream's start), ``None`` if no chunk had frames.
    """
    from nemo.collections.asr.parts.submodules.rnnt_beam_decoding import BeamBatchedRNNTInfer
    from nemo.collections.asr.parts.submodules.tdt_beam_decoding import BeamBatchedTDTInfer

    decoding_cfg = model.cfg.get("decoding", {}) or {}
    durations = decoding_cfg.get("durations", None) or None
    blank = int(model.decoding.blank_id)
    common = dict(beam_size=beam_size, max_symbols_per_step=max_symbols, allow_cuda_graphs=False)
    models, alphas = [], []
    if ngram_lm_model is not None:
        from nemo.collections.asr.parts.submodules.ngram_lm import NGramGPULanguageModel

        if isinstance(ngram_lm_model, torch.nn.Module):
            models.append(ngram_lm_model)
        else:
            models.append(NGramGPULanguageModel.from_file(lm_path=ngram_lm_model, vocab_size=blank))
        alphas.append(ngram_lm_alpha)
    if boosting is not None:
        from nemo.collections.asr.parts.context_biasing import BoostingTreeModelConfig, GPUBoostingTreeModel

        from nemo_fastdecode.streaming.boosting import TREE_OPTIONS

        tree = BoostingTreeModelConfig(
            key_phrases_list=list(boosting.phrases), **{name: getattr(boosting, name) for name in TREE_OPTIONS}
        )
        models.append(GPUBoostingTreeModel.from_config(tree, tokenizer=model.tokenizer))
        alphas.append(boosting.weight)
    if models:
        common.update(
            fusion_models=[m.to(feats.device) for m in models],
            fusion_models_alpha=alphas,
            pruning_mode="late",
            blank_lm_score_mode="lm_weighted_full",
        )
    if durations:
        infer = BeamBatchedTDTInfer(model.decoder, model.joint, list(durations), blank, **common)
    else:
        infer = BeamBatchedRNNTInfer(model.decoder, model.joint, blank, **common)
    computer = infer.decoding_computer
    outputs = _encoder_chunks(model, feats)
    joined, state = None, None
    with torch.no_grad(), true_fp32():  # outside inference mode: flatten_ and merge_ update the hypotheses in place
        for encoded in outputs:  # [D, T_i]
            if encoded.shape[1] == 0:
                continue
            x = encoded.T[None].clone()  # [1, T_i, D]
            hyps, state = computer(x=x, out_len=torch.tensor([x.shape[1]], device=x.device), prev_batched_state=state)
            roots = hyps.flatten_()
            if joined is None:
                joined = hyps
            else:
                joined.merge_(hyps, is_chunk_continuation=True, boundary_prev_ptr=roots)
    return None if joined is None else joined.to_hyps_list(score_norm=score_norm)[0]


def _encoder_chunks(model: ASRModel, feats: torch.Tensor) -> list[torch.Tensor]:
    """Each chunk's encoder output ``[D, T_i]`` of NeMo's cache-aware streaming of ``feats`` (as :func:`nemo_alone`)."""
    return [encoded[0, :, : int(length[0])].clone() for _, encoded, length in _stream_steps(model, feats)]


def _stream_steps(model: ASRModel, feats: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """NeMo's cache-aware streaming encoder over ``feats`` ``[feat_in, T]``: ``CacheAwareStreamingAudioBuffer``'s
    chunks through ``cache_aware_stream_step``, in inference mode and true fp32 (no TF32 in cuDNN's convolutions
    either). Yields each chunk ``[feat_in, t]``, its encoder output ``[1, D, T_i]`` and its length ``[1]``."""
    from nemo.collections.asr.parts.utils.streaming_utils import CacheAwareStreamingAudioBuffer

    buffer = CacheAwareStreamingAudioBuffer(model)
    buffer.append_processed_signal(feats[None])
    channel, time, channel_len = model.encoder.get_initial_cache_state(batch_size=1, device=feats.device)
    drop = model.encoder.streaming_cfg.drop_extra_pre_encoded
    with torch.inference_mode(), true_fp32():
        for step, (chunk, chunk_len) in enumerate(buffer):
            encoded, encoded_len, channel, time, channel_len = model.encoder.cache_aware_stream_step(
                processed_signal=chunk,
                processed_signal_length=chunk_len,
                cache_last_channel=channel,
                cache_last_time=time,
                cache_last_channel_len=channel_len,
                keep_all_outputs=buffer.is_buffer_empty(),
                drop_extra_pre_encoded=0 if step == 0 else drop,
            )
            yield chunk[0], encoded, encoded_len


def reference_transcript(model: ASRModel, pcm: np.ndarray, att_context_size: list[int] | None = None) -> Reference:
    """NeMo's streaming of int16 PCM ``[T]`` alone (read as NeMo reads a 16-bit WAV file: ``x / 32768``), or of
    float32 samples ``[T]`` as they are.

    ``att_context_size``: the encoder's look-ahead to use (set on the model); ``None``: its current one.
    """
    from nemo.collections.asr.parts.utils.timestamp_utils import process_timestamp_outputs

    if att_context_size is not None:
        model.encoder.set_default_att_context_size(list(att_context_size))
    if len(pcm) < model.preprocessor.featurizer.hop_length:  # no feature frame: nothing to decode
        return Reference([], "", [])
    device = next(model.parameters()).device
    pcm = np.asarray(pcm)
    samples = pcm.astype(np.float32) if pcm.dtype.kind == "f" else pcm.astype(np.int16).astype(np.float32) / 32768
    signal = torch.from_numpy(samples)[None].to(device)
    with torch.inference_mode():
        feats, length = model.preprocessor(input_signal=signal, length=torch.tensor([signal.shape[1]], device=device))
    _, hyp, _ = nemo_alone(model, feats[0, :, : int(length)])
    if hyp is None:
        return Reference([], "", [])
    timed = model.decoding.compute_rnnt_timestamps(copy.copy(hyp), "word")
    (timed,) = process_timestamp_outputs(
        [timed], model.encoder.subsampling_factor, model.cfg.preprocessor.window_stride
    )
    return Reference([int(t) for t in hyp.y_sequence], hyp.text, timed.timestamp["word"])
