"""Cache-aware streaming ASR for many desynchronised streams: ``open`` / ``step`` / ``flush`` / ``close``.

Typical use, with features cut the way NeMo's ``CacheAwareStreamingAudioBuffer`` cuts them::

    streamer = StreamingTranscriber(model, num_slots=64, att_context_size=[70, 1])
    a, b = streamer.open(), streamer.open()
    streamer.step([a], [chunk_a0])               # any subset of open streams steps at any time
    streamer.step([b, a], [chunk_b0, chunk_a1])  # each at its own position
    print(streamer.text(a))                      # partial transcript so far
    final = streamer.flush(a)                    # end of stream: final result, slot freed

A chunk is ``[feat_in, T]`` new mel-feature frames of one stream (no pre-encode cache: the slot keeps
it): at most ``geometry.first_chunk`` frames for a stream's first step and ``geometry.chunk`` after
(:func:`~nemo_fastdecode.streaming.geometry.split_features` cuts a whole stream). In fp32 every
stream's encoder output and tokens equal NeMo's ``conformer_stream_step`` run on that stream alone.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis

from nemo_fastdecode.decode_call import true_fp32
from nemo_fastdecode.kernels import warm_up
from nemo_fastdecode.streaming.beam_decoding import SlotBeamDecoder
from nemo_fastdecode.streaming.buckets import BucketedStep
from nemo_fastdecode.streaming.decoding import SlotDecoder, check_ngram_lm
from nemo_fastdecode.streaming.encoder import StreamingEncoderStep, check_streaming_encoder
from nemo_fastdecode.streaming.events import BoostingOptions
from nemo_fastdecode.streaming.geometry import StreamingGeometry
from nemo_fastdecode.streaming.slots import SlotState
from nemo_fastdecode.streaming.staging import HostStaging

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

__all__ = ["StepResult", "StreamResult", "StreamingTranscriber", "WarmUpTimes"]

_FEATURE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class StepResult:
    """What one :meth:`StreamingTranscriber.step` produced, row ``i`` for ``slots[i]``.

    Attributes:
        slots: the ``N`` slots that stepped, in the order given.
        encoded: ``[N, Tq, D]`` each stream's new encoder frames, left-aligned (a copy).
        encoded_lengths: ``[N]`` valid frames per row.
        hypotheses: each stream's hypothesis so far, with ``step(..., return_hypotheses=True)`` (else ``None``:
            building ``Hypothesis`` objects costs host time per stream; :meth:`StreamingTranscriber.text` and
            :meth:`StreamingTranscriber.hypothesis` build one when asked).
    """

    slots: list[int]
    encoded: torch.Tensor
    encoded_lengths: torch.Tensor
    hypotheses: list[Hypothesis | None] | None


@dataclass
class WarmUpTimes:
    """Seconds :meth:`StreamingTranscriber.warm_up` spent: encoder buckets, then the decoder at every bucket."""

    encoder_seconds: float
    decoder_seconds: float

    @property
    def total_seconds(self) -> float:
        return self.encoder_seconds + self.decoder_seconds


@dataclass
class StreamResult:
    """A finished stream: its final hypothesis (``None`` if it never stepped or ``decode=False``) and text."""

    slot: int
    hypothesis: Hypothesis | None
    text: str


class StreamingTranscriber:
    """Cache-aware streaming encoder + greedy or beam-search decoder over ``num_slots`` pre-allocated stream slots.

    Args:
        model: a NeMo transducer model with a cache-aware streaming FastConformer encoder (e.g. NeMo's
            ``fastconformer_hybrid_transducer_ctc_bpe_streaming.yaml``); put in eval mode.
        num_slots: most streams open at once (caches are allocated for all of them up front).
        att_context_size: ``[left, lookahead]``, one of the encoder's ``att_context_size`` list; sets the
            encoder's default with NeMo's ``set_default_att_context_size`` (as NeMo's streaming script
            does). ``None`` keeps the encoder's current one.
        dtype: dtype of the caches and of the encoder's compute (autocast); fp32 is the exact reference.
        decode: run the greedy decoder every step (``False``: encoder only).
        use_cuda_graphs: replay one CUDA graph per batch-size bucket on a GPU.
        use_triton: the encoder step's Triton kernels (attention, pre-encode window, subsampling) or their torch
            references (``None``: Triton on CUDA, torch on the CPU).
        max_symbols: greedy ``max_symbols`` (default: the model's).
        pad_to_bucket: pad eager steps to their bucket too (for tests; graphs always pad).
        fast_math: decode with ``fast_greedy``'s opt-in fast math (not bit-identical to NeMo's decoding).
        encoder_matmul: ``"fp32"`` (NeMo's Linear / Conv1d modules) or, opt-in, ``"tf32x3"``: the encoder's GEMMs
            on near-fp32 tensor-core kernels, or ``"tf32"``: the same with single TF32 products (fp32 ``dtype``
            only; :class:`StreamingEncoderStep`).
        capture_decoder_step: with CUDA graphs, :meth:`warm_up` also captures the decoder's work around its
            greedy loop per bucket (:meth:`SlotDecoder.capture_step`: that work is many small launches, so eagerly
            it is launch-bound; see ``docs/benchmarks.md``); ``False`` runs that work eagerly.
        phrase_boosting: set per-stream phrase boosting up now (:meth:`SlotDecoder.enable_boosting`), so that
            :meth:`warm_up` captures the decoder that fuses the streams' trees too; ``False``: the first stream that
            boosts phrases sets it up (its first steps then capture it).
        decoding: ``"greedy"`` (:class:`SlotDecoder`) or ``"beam"``: NeMo's ``malsd_batch`` beam search, each stream's
            beams continued chunk after chunk (:class:`SlotBeamDecoder`; ``max_symbols`` is then the beam's, default
            10; per-stream phrase boosting and the n-gram LM fused into the beams; no ``fast_math``).
        beam_size: beams per stream with ``decoding="beam"``.
        ngram_lm_model: an n-gram LM over the model's tokens fused into every stream's decoding (an ARPA file or
            NeMo's ``.nemo`` n-gram LM; NeMo's ``greedy.ngram_lm_model``, with ``decoding="beam"`` its
            ``beam.ngram_lm_model``); each slot keeps its LM states (one per beam).
        ngram_lm_alpha: the LM's weight, > 0 with a model (NeMo's ``greedy.ngram_lm_alpha`` / ``beam.ngram_lm_alpha``).
    """

    def __init__(
        self,
        model: ASRModel,
        num_slots: int,
        *,
        att_context_size: Sequence[int] | None = None,
        dtype: torch.dtype = torch.float32,
        decode: bool = True,
        use_cuda_graphs: bool = True,
        use_triton: bool | None = None,
        max_symbols: int | None = None,
        pad_to_bucket: bool = False,
        fast_math: bool = False,
        encoder_matmul: str = "fp32",
        capture_decoder_step: bool = True,
        phrase_boosting: bool = False,
        decoding: str = "greedy",
        beam_size: int = 4,
        ngram_lm_model: str | Path | None = None,
        ngram_lm_alpha: float = 0.0,
    ):
        if not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots must be a positive int, got {num_slots!r}")
        if dtype not in _CACHE_DTYPES:
            raise ValueError(f"dtype {dtype} is not supported; valid: {', '.join(map(str, _CACHE_DTYPES))}")
        encoder = model.encoder
        if att_context_size is not None:
            set_att_context_size(encoder, att_context_size)
        check_streaming_encoder(encoder)
        model.eval()
        self.model, self.num_slots, self.dtype = model, num_slots, dtype
        self.device = next(model.parameters()).device
        if self.device.type == "cuda":  # Triton's one-time set-up on a thread, behind the rest of this set-up
            warm_up.start_triton_warm_up()
        self.geometry = StreamingGeometry.from_encoder(encoder)
        attn = encoder.layers[0].self_attn
        self.slots = SlotState(
            num_slots,
            num_layers=len(encoder.layers),
            num_heads=attn.h,
            head_dim=attn.d_k,
            conv_channels=encoder.layers[0].conv.depthwise_conv.in_channels,
            geometry=self.geometry,
            device=self.device,
            dtype=dtype,
        )
        self.encoder_matmul = encoder_matmul
        self.encoder_step = StreamingEncoderStep(
            encoder, self.slots, use_triton=use_triton, matmul_precision=encoder_matmul
        )
        self.runner = BucketedStep(
            self._encode,
            num_slots,
            self.slots.dummy_slot,
            self.geometry.feat_in,
            self.geometry.chunk,
            self.device,
            use_cuda_graphs=use_cuda_graphs,
            pad_to_bucket=pad_to_bucket,
        )
        self.decoding = check_decoding(
            decoding,
            beam_size,
            fast_math=fast_math,
            ngram_lm_model=ngram_lm_model,
            ngram_lm_alpha=ngram_lm_alpha,
        )
        # slots opened since their state was last emptied: emptied together before anything reads them (one fill per
        # state tensor for all the streams that opened between two cycles, not a dozen small copies per stream)
        self._opened: list[int] = []
        self._reset_staging = HostStaging(self.device)
        self._decoder: SlotDecoder | SlotBeamDecoder | None = None
        if decode and decoding == "beam":
            self._decoder = SlotBeamDecoder(
                model,
                num_slots,
                beam_size=beam_size,
                max_symbols=max_symbols,
                use_cuda_graphs=use_cuda_graphs,
                ngram_lm_model=ngram_lm_model,
                ngram_lm_alpha=ngram_lm_alpha,
            )
        elif decode:
            self._decoder = SlotDecoder(
                model,
                num_slots,
                max_symbols=max_symbols,
                use_cuda_graphs=use_cuda_graphs,
                fast_math=fast_math,
                ngram_lm_model=ngram_lm_model,
                ngram_lm_alpha=ngram_lm_alpha,
            )
        self.capture_decoder_step = capture_decoder_step
        if phrase_boosting:
            if self.decoder is None:
                raise ValueError("phrase_boosting needs the decoder (decode=True)")
            self.decoder.enable_boosting()
        self._open = np.zeros(num_slots, dtype=bool)
        self._staging = HostStaging(self.device)  # each step's slot ids and chunk lengths
        self._started = np.zeros(num_slots, dtype=bool)  # host mirror of slots.started: checks without a sync

    @property
    def decoder(self) -> SlotDecoder | SlotBeamDecoder | None:
        """The slots' decoder (``None`` with ``decode=False``); the slots opened since the last read start afresh
        first."""
        self._reset_opened()
        return self._decoder

    @decoder.setter
    def decoder(self, decoder: SlotDecoder | SlotBeamDecoder | None) -> None:
        self._decoder = decoder

    def _reset_opened(self) -> None:
        """Empty the caches and decoder states of the slots opened since the last call, all in one copy and a few
        fills (nothing when none opened)."""
        if not self._opened:
            return
        opened, self._opened = self._opened, []
        rows = self._reset_staging.upload(np.asarray(opened, dtype=np.int64))
        self.slots.reset_(rows)
        if self._decoder is not None:
            self._decoder.reset(opened, rows)

    # ------------------------------------------------------------------------------------------
    @property
    def open_slots(self) -> list[int]:
        """Slots that hold a stream now."""
        return np.flatnonzero(self._open).tolist()

    def open(self, boosting: BoostingOptions | None = None, token_logprobs: bool = False) -> int:
        """Start a stream in the lowest free slot (emptied); returns the slot id.

        ``boosting``: the stream's phrases to boost (NeMo's per-stream boosting tree; greedy: label looping only);
        ``None``: none. Raises ``ValueError`` (before any slot changes) for phrases the model cannot boost.
        ``token_logprobs``: keep its tokens' log-probabilities (greedy decoding only: the caller checks).
        """
        if boosting is not None:
            if self.decoder is None:
                raise ValueError("phrase boosting needs the decoder (StreamingTranscriber(decode=True))")
            self.decoder.boosting_tree(boosting)  # built (and checked) before any slot changes
        for slot in np.flatnonzero(~self._open)[:1].tolist():  # the lowest free slot
            self._opened.append(slot)  # emptied before its first use
            if boosting is not None:
                self.decoder.set_boosting(slot, boosting)  # after the slot is emptied (reading decoder empties it)
            if token_logprobs:
                self.decoder.set_token_logprobs(slot, True)
            self._open[slot], self._started[slot] = True, False
            return slot
        raise RuntimeError(f"all {self.num_slots} slots are in use; close or flush a stream, or use more num_slots")

    def check_boosting(self, boosting: BoostingOptions) -> None:
        """Raise ``ValueError`` now if :meth:`open` would refuse ``boosting`` (the tree is built and kept for it)."""
        if self.decoder is None:
            raise ValueError("phrase boosting needs the decoder (StreamingTranscriber(decode=True))")
        self.decoder.boosting_tree(boosting)

    def close(self, slot: int) -> None:
        """End a stream without a result and free its slot."""
        self._check_slot(slot, "close")
        self._release(slot)

    def _release(self, slot: int) -> None:
        self._open[slot] = False
        if self.decoder is not None:
            self.decoder.set_boosting(slot, None)  # its tree leaves the multi-model

    def flush(self, slot: int) -> StreamResult:
        """End of stream: the final hypothesis and text, and the slot is freed.

        Cache-aware streaming has no look-ahead buffer beyond the last chunk (its frames are final when
        it is stepped), so the result is the hypothesis after the stream's last step.
        """
        self._check_slot(slot, "flush")
        hyp = self.hypothesis(slot)
        result = StreamResult(slot=slot, hypothesis=hyp, text=self.decoder.text(slot) if hyp is not None else "")
        self._release(slot)
        return result

    def hypothesis(self, slot: int) -> Hypothesis | None:
        """The stream's hypothesis so far (``None`` before it stepped, or with ``decode=False``)."""
        self._check_slot(slot, "hypothesis")
        return None if self.decoder is None else self.decoder.hypothesis(slot)

    def text(self, slot: int) -> str:
        """The stream's partial transcript."""
        self._check_slot(slot, "text")
        return self.decoder.text(slot) if self.decoder is not None else ""

    def token_ids(self, slot: int) -> list[int]:
        """The stream's token ids so far."""
        self._check_slot(slot, "token_ids")
        return self.decoder.token_ids(slot) if self.decoder is not None else []

    def warm_up(self) -> WarmUpTimes:
        """Do every capture now, so that no step captures: a serving loop calls this before its first stream.

        Runs the encoder step of every batch-size bucket once (capturing its CUDA graph), then the greedy
        decoder at every bucket with the longest chunk's frames (capturing its graph per bucket, buffers
        sized for the largest input), and (``capture_decoder_step``) captures the decoder's work around its
        loop on each bucket's outputs (:meth:`SlotDecoder.capture_step`). Only padding rows and the dummy
        slot are touched. Eager steps at exact sizes (CPU without ``pad_to_bucket``) have nothing to warm up.
        """
        times = WarmUpTimes(0.0, 0.0)
        if not self.runner.pad_to_bucket:
            return times
        with torch.inference_mode():
            started = time.perf_counter()
            self.runner.warm_up()
            self._synchronize()
            times.encoder_seconds = time.perf_counter() - started
            if self.decoder is not None:
                started = time.perf_counter()
                dim = self.model.encoder._feat_out
                self.decoder.warm_up(self.runner.sizes, self.geometry.out_frames, dim)
                if self.runner.use_graphs and self.capture_decoder_step:  # around the loop, on each bucket's outputs
                    for size in self.runner.sizes:
                        bucket = self.runner.prepare(size)
                        self.decoder.capture_step(*bucket.outputs, bucket.slot_ids)
                self._synchronize()
                times.decoder_seconds = time.perf_counter() - started
        return times

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------------------------------
    def step(
        self,
        slot_ids: Sequence[int] | np.ndarray,
        chunks: Sequence[torch.Tensor] | torch.Tensor,
        *,
        lengths: Sequence[int] | np.ndarray | None = None,
        return_hypotheses: bool = False,
    ) -> StepResult:
        """Advance the streams in ``slot_ids`` by one chunk each.

        Args:
            slot_ids: ``N`` distinct open slots, in any order (ints, or a 1-D integer array).
            chunks: ``N`` feature chunks ``[feat_in, T_i]`` (float32/float16/bfloat16, any device), or one
                tensor ``[N, feat_in, T]``; ``1 <= T_i <= geometry.first_chunk`` for a stream's first step,
                ``<= geometry.chunk`` after.
            lengths: with one ``[N, feat_in, T]`` tensor, the ``T_i`` of each row (its chunk left-aligned; what
                follows is ignored): chunks of different lengths in one batch without per-chunk host work.
                ``None``: every row has ``T`` frames.
            return_hypotheses: build the streams' NeMo hypotheses now (host work per stream).

        Returns:
            The streams' new encoder frames and updated hypotheses (:class:`StepResult`).

        Raises:
            ValueError / TypeError naming the bad slot id or chunk and the valid choices.
        """
        slots = self._check_step_slots(slot_ids)
        self._reset_opened()  # before the encoder reads the caches
        packed = lengths is not None
        if packed:
            host_lengths = self._checked_lengths(slots, chunks, lengths)
        else:
            features, host_lengths = self._batch_chunks(slots, chunks)
        # slot ids and lengths in one copy out of a pinned buffer: the host queues the step without waiting
        staged = self._staging.upload(np.stack([np.asarray(slots, dtype=np.int64), host_lengths]))
        if packed:
            features = self._masked(chunks, host_lengths, staged[1])
        n = len(slots)
        with torch.inference_mode():
            padded_ids, encoded, encoded_lengths = self.runner.run_padded(staged[0], features, staged[1])
            if self.decoder is not None:  # the whole bucket: padding rows are the dummy slot, length 0
                self.decoder.decode(slots, encoded, encoded_lengths, padded_ids)
            encoded, encoded_lengths = encoded[:n].clone(), encoded_lengths[:n].clone()
        self._started[np.asarray(slots)] = True
        hyps = self.decoder.hypotheses(slots) if return_hypotheses and self.decoder is not None else None
        return StepResult(slots=slots, encoded=encoded, encoded_lengths=encoded_lengths, hypotheses=hyps)

    def _encode(self, slot_ids, features, lengths):
        autocast = (
            torch.autocast(self.device.type, dtype=self.dtype)
            if self.dtype != torch.float32
            else contextlib.nullcontext()
        )
        # the exact configuration: NeMo's modules in true fp32 (cuDNN would run the convolutions in TF32)
        exact = self.dtype == torch.float32 and self.encoder_matmul == "fp32"
        with autocast, true_fp32(exact):
            return self.encoder_step(slot_ids, features, lengths)

    # ------------------------------------------------------------------------------------------
    def _check_slot(self, slot: int, action: str) -> None:
        if isinstance(slot, bool) or not isinstance(slot, int):
            raise TypeError(f"slot ids must be ints, got {slot!r} ({type(slot).__name__})")
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot id {slot} is out of range; valid slot ids: 0..{self.num_slots - 1}")
        if not self._open[slot]:
            raise ValueError(f"cannot {action} slot {slot}: it is not open; open slots: {_listing(self.open_slots)}")

    def _check_step_slots(self, slot_ids: Sequence[int] | np.ndarray) -> list[int]:
        if isinstance(slot_ids, torch.Tensor):
            slot_ids = slot_ids.tolist()
        if isinstance(slot_ids, np.ndarray) and slot_ids.ndim == 1 and slot_ids.dtype.kind in "iu":
            index = slot_ids.astype(np.int64, copy=False)
            slots, plain = index.tolist(), True
        else:
            slots = list(slot_ids)
            plain = set(map(type, slots)) == {int}
            index = np.asarray(slots, dtype=np.int64) if plain and slots else None
        if not slots:
            raise ValueError("slot_ids is empty; pass at least one open slot")
        if plain:  # the usual call: checked at once, vectorised
            in_range = index.min() >= 0 and index.max() < self.num_slots
            if in_range and self._open[index].all() and len(set(slots)) == len(slots):
                return slots
        seen: set[int] = set()  # else one by one, naming the first bad slot id
        for slot in slots:
            self._check_slot(slot, "step")
            if slot in seen:
                raise ValueError(f"slot id {slot} is repeated in slot_ids {slots}; each stream steps once per call")
            seen.add(slot)
        return slots

    def _checked_lengths(
        self, slots: list[int], chunks: torch.Tensor, lengths: Sequence[int] | np.ndarray
    ) -> np.ndarray:
        """Check a packed ``[N, F, T]`` batch and its ``[N]`` lengths (vectorised); the lengths as int64."""
        g = self.geometry
        if not isinstance(chunks, torch.Tensor) or chunks.dim() != 3:
            raise ValueError("with lengths, chunks must be one [N, feat_in, T] tensor")
        if chunks.dtype not in _FEATURE_DTYPES:
            raise TypeError(f"chunks have dtype {chunks.dtype}; valid: {', '.join(map(str, _FEATURE_DTYPES))}")
        n, feat_in, frames = chunks.shape
        host = np.asarray(lengths, dtype=np.int64)
        if (n, feat_in) != (len(slots), g.feat_in) or host.shape != (n,):
            raise ValueError(
                f"chunks of shape {tuple(chunks.shape)} with {host.size} lengths for {len(slots)} slot ids; "
                f"valid: [{len(slots)}, {g.feat_in}, T] and {len(slots)} lengths"
            )
        first = ~self._started[np.asarray(slots)]
        limits = np.minimum(np.where(first, g.first_chunk, g.chunk), frames)
        for i in np.flatnonzero((host < 1) | (host > limits))[:1].tolist():
            which = "first chunk" if first[i] else "chunk"
            raise ValueError(
                f"length {host[i]} of row {i} (slot {slots[i]}) is out of range; valid: 1 <= T <= {limits[i]} "
                f"(a stream's {which}, at most the tensor's {frames} frames)"
            )
        return host

    def _masked(self, chunks: torch.Tensor, lengths: np.ndarray, staged: torch.Tensor) -> torch.Tensor:
        """``[N, F, max(lengths)]`` float32 chunks, zero past each row's length (``staged``: the lengths on the
        transcriber's device)."""
        longest = int(lengths.max())
        device_lengths = staged if chunks.device == staged.device else torch.from_numpy(lengths).to(chunks.device)
        valid = torch.arange(longest, device=chunks.device)[None, None, :] < device_lengths[:, None, None]
        return torch.where(valid, chunks[:, :, :longest].to(torch.float32), 0.0)  # as _batch_chunks pads

    def _batch_chunks(self, slots: list[int], chunks) -> tuple[torch.Tensor, np.ndarray]:
        """Validate the chunks and pack them left-aligned into ``[N, F, Tmax]`` (one transfer to the device)."""
        g = self.geometry
        if isinstance(chunks, torch.Tensor) and chunks.dim() != 3:
            raise ValueError(
                f"chunks must be a list of [feat_in, T] tensors or one [N, feat_in, T] tensor, got "
                f"shape {tuple(chunks.shape)}"
            )
        first = ~self._started[np.asarray(slots)]
        limits = np.where(first, g.first_chunk, g.chunk)
        if isinstance(chunks, torch.Tensor):
            n, feat_in, frames = chunks.shape
            if (
                chunks.dtype in _FEATURE_DTYPES
                and (n, feat_in) == (len(slots), g.feat_in)
                and 1 <= frames <= limits.min()
            ):
                # already one batch, every row valid: no per-chunk work (else the per-chunk checks name the bad one)
                return chunks.to(torch.float32), np.full(n, frames, dtype=np.int64)
            chunks = list(chunks.unbind(0))
        if len(chunks) != len(slots):
            raise ValueError(f"got {len(chunks)} chunks for {len(slots)} slot ids; pass one chunk per slot id")
        # one pass of cheap attribute checks per chunk (a step of 256 streams spends its host time here)
        limits = limits.tolist()
        lengths = []
        for i, (slot, chunk, limit) in enumerate(zip(slots, chunks, limits, strict=True)):
            if not isinstance(chunk, torch.Tensor):
                raise TypeError(f"chunk {i} (slot {slot}) must be a torch.Tensor, got {type(chunk).__name__}")
            if chunk.dtype not in _FEATURE_DTYPES:
                raise TypeError(
                    f"chunk {i} (slot {slot}) has dtype {chunk.dtype}; valid: {', '.join(map(str, _FEATURE_DTYPES))}"
                )
            shape = chunk.shape
            if len(shape) != 2 or shape[0] != g.feat_in or not 1 <= shape[1] <= limit:
                which = "first chunk" if first[i] else "chunk"
                raise ValueError(
                    f"chunk {i} (slot {slot}) has shape {tuple(shape)}; valid: [{g.feat_in}, T] "
                    f"with 1 <= T <= {limit} (a stream's {which})"
                )
            lengths.append(shape[1])
        # packed where the first chunk is (host audio: one host-to-device copy of the whole batch later); one
        # stack of equal-length chunks, the odd first or last chunk zero-padded
        longest = max(lengths)
        device = chunks[0].device
        rows = [
            (c if c.device == device else c.to(device))
            if c.shape[1] == longest
            else F.pad(c.to(device), (0, longest - c.shape[1]))
            for c in chunks
        ]
        features = torch.stack(rows).to(torch.float32)  # [N, F, Tmax]
        return features, np.asarray(lengths, dtype=np.int64)


DECODINGS = ("greedy", "beam")


def check_decoding(
    decoding: str,
    beam_size: int,
    *,
    fast_math: bool = False,
    ngram_lm_model: str | Path | None = None,
    ngram_lm_alpha: float = 0.0,
) -> str:
    """Raise ``ValueError`` naming the option for a decoding the streaming decoder cannot run; returns ``decoding``."""
    if decoding not in DECODINGS:
        raise ValueError(f"decoding={decoding!r} is not supported; valid: {', '.join(map(repr, DECODINGS))}")
    if decoding == "beam":
        if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
            raise ValueError(f"beam_size must be a positive int, got {beam_size!r}")
        if fast_math:
            raise ValueError("fast_math=True needs decoding='greedy'; valid with decoding='beam': fast_math=False")
    check_ngram_lm(ngram_lm_model, ngram_lm_alpha)
    return decoding


def set_att_context_size(encoder: torch.nn.Module, att_context_size: Sequence[int]) -> None:
    """Select one of the encoder's look-aheads (NeMo's ``set_default_att_context_size``), checked."""
    wanted = [int(v) for v in att_context_size]
    valid = [list(c) for c in encoder.att_context_size_all]
    if wanted not in valid:
        raise ValueError(f"att_context_size={wanted} is not one of this encoder's look-aheads; valid: {valid}")
    if list(encoder.att_context_size) != wanted:
        encoder.set_default_att_context_size(wanted)


def _listing(values: list[int], limit: int = 16) -> str:
    if not values:
        return "none"
    shown = ", ".join(map(str, values[:limit]))
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")
