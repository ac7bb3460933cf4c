"""The two streaming paths the simulation compares: ours and NeMo's, warmed up before the clock starts."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from fastdecode_lab.streaming_sim.nemo_path import NemoSlotStreamer
from fastdecode_lab.streaming_sim.schedule import StreamingPath
from nemo_fastdecode.apps.comparison import as_int_list
from nemo_fastdecode.apps.timing import synchronize
from nemo_fastdecode.streaming.transcriber import StreamingTranscriber

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

    from nemo_fastdecode.streaming.events import BoostingOptions


@contextlib.contextmanager
def _matmul_tf32(enabled: bool):
    """``torch.backends.cuda.matmul.allow_tf32 = enabled`` inside, the previous value restored after."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled or previous
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def fast_path(
    model: ASRModel,
    num_slots: int,
    dtype: torch.dtype,
    use_cuda_graphs: bool,
    fast_math: bool = False,
    encoder_matmul: str = "fp32",
    capture_decoder_step: bool = True,
    decoding: str = "greedy",
    beam_size: int = 4,
    ngram_lm_model: str | None = None,
    ngram_lm_alpha: float = 0.0,
    boosting_share: float = 0.0,
    boosting_alpha: float = 0.0,
    boosting: Sequence[BoostingOptions | None] = (),
) -> StreamingPath:
    """Ours: slot caches read in place, one graph replay per step (GPU), per-slot state of ``fast_greedy`` (or, with
    ``decoding="beam"``, each slot's beams of NeMo's ``malsd_batch``), fusing the n-gram LM ``ngram_lm_model`` if any
    and each stream's own phrases given at ``open`` (``boosting_share`` / ``boosting_alpha``: their share of the streams
    and weight, for the path's name).

    Warmed up before the clock starts: every encoder bucket's graph and the decoder's graph per bucket are
    captured (:meth:`StreamingTranscriber.warm_up`), so no step of the timed run captures. With ``boosting`` (the
    streams' phrases, as they will open), the decoder fusing the streams' trees is captured too, after the trees'
    storage has grown to hold them all at once (NeMo's multi-model keeps its storage when a tree leaves, and a growth
    would invalidate the captured graphs mid-run).
    """
    streamer = StreamingTranscriber(
        model, num_slots, dtype=dtype, use_cuda_graphs=use_cuda_graphs, fast_math=fast_math,
        encoder_matmul=encoder_matmul, capture_decoder_step=capture_decoder_step, decoding=decoding,
        beam_size=beam_size, ngram_lm_model=ngram_lm_model, ngram_lm_alpha=ngram_lm_alpha,
        phrase_boosting=any(options is not None for options in boosting),
    )  # fmt: skip
    started = time.perf_counter()
    trees = [options for options in boosting if options is not None][:num_slots]
    for slot in [streamer.open(options) for options in trees]:
        streamer.close(slot)
    warmup = time.perf_counter() - started + streamer.warm_up().total_seconds

    def finish(slot: int) -> list[int]:
        tokens = streamer.token_ids(slot)  # no Hypothesis needed
        streamer.close(slot)
        return tokens

    mode = "CUDA graph per bucket" if streamer.runner.use_graphs else "eager"
    mode += f", beam search ({beam_size} beams)" if decoding == "beam" else ""
    mode += f", n-gram LM (alpha {ngram_lm_alpha})" if ngram_lm_model is not None else ""
    if boosting_share > 0:
        mode += f", phrase boosting on {100 * boosting_share:g}% of streams (weight {boosting_alpha})"
    mode += (", fast_math" if fast_math else "") + (f", {encoder_matmul} encoder" if encoder_matmul != "fp32" else "")
    # what warm-up captured, not what was asked: no captures on the CPU, and a refused one falls back to eager
    captured = streamer.decoder is not None and streamer.decoder.captured_batch_sizes
    mode += ", decoder step captured" if captured else ""
    return StreamingPath(f"nemo_fastdecode ({mode})", streamer.open, streamer.step, finish, warmup)


def nemo_path(
    model: ASRModel,
    num_slots: int,
    dtype: torch.dtype,
    warm_streams: int = 1,
    tf32_matmuls: bool = False,
    ngram_lm_model: str | None = None,
    ngram_lm_alpha: float = 0.0,
) -> StreamingPath:
    """NeMo: gather the slots' caches, ``conformer_stream_step`` (model's decoding strategy), scatter back.

    ``ngram_lm_model``: the model's decoding fuses this n-gram LM from now on (``greedy.ngram_lm_model`` /
    ``ngram_lm_alpha``, NeMo's own loading), as ours does.

    Warmed up before the clock starts with ``warm_streams`` streams of silence (a first and a later chunk
    together: lazy library set-up, and NeMo's decoder graphs, if its strategy uses them, at the largest batch).
    ``tf32_matmuls``: NeMo's steps run with TF32 matmuls (``torch.backends.cuda.matmul.allow_tf32``, what
    NeMo's scripts set with ``matmul_precision=high``), the setting compared with ``encoder_matmul=tf32``.
    """
    if ngram_lm_model is not None:
        _fuse_ngram_lm(model, ngram_lm_model, ngram_lm_alpha)
    streamer = NemoSlotStreamer(model, num_slots)
    device = streamer.device
    autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype != torch.float32 else contextlib.nullcontext

    def step(slots: list[int], chunks: list[torch.Tensor]) -> None:
        with autocast(), _matmul_tf32(tf32_matmuls):
            streamer.step(slots, chunks)

    def open_(boosting: BoostingOptions | None) -> int:
        if boosting is not None:
            raise ValueError("NeMo's conformer_stream_step path has no per-stream phrase boosting")
        return streamer.open()

    def finish(slot: int) -> list[int]:
        hyp = streamer.flush(slot)
        return as_int_list(hyp.y_sequence) if hyp is not None else []

    g = streamer.geometry
    synchronize(device)
    started = time.perf_counter()
    slots = [streamer.open() for _ in range(min(warm_streams, num_slots))]
    for frames in (g.first_chunk, g.chunk):
        step(slots, [torch.zeros(g.feat_in, frames, device=device)] * len(slots))
    for slot in slots:
        streamer.flush(slot)
    synchronize(device)
    warmup = time.perf_counter() - started
    strategy = model.cfg.decoding.get("strategy", "?")
    name = f"NeMo gather/scatter + conformer_stream_step ({strategy}{', TF32 matmuls' if tf32_matmuls else ''})"
    return StreamingPath(name, open_, step, finish, warmup)


def _fuse_ngram_lm(model: ASRModel, ngram_lm_model: str, ngram_lm_alpha: float) -> None:
    """The model's decoding, as it is, with ``greedy.ngram_lm_model`` / ``ngram_lm_alpha`` set."""
    from omegaconf import open_dict

    cfg = copy.deepcopy(model.cfg.decoding)
    with open_dict(cfg):
        cfg.greedy.ngram_lm_model = str(ngram_lm_model)
        cfg.greedy.ngram_lm_alpha = float(ngram_lm_alpha)
    model.change_decoding_strategy(cfg, verbose=False)
