"""PCM in, partial and final transcripts out: many streams, one batched cycle for all of them.

:class:`StreamingEngine` wraps one :class:`~nemo_fastdecode.streaming.frontend.AudioFrontEnd` (every stream's PCM in
one host-to-device copy per cycle, NeMo's whole-file mel features frame by frame) and one
:class:`~nemo_fastdecode.streaming.transcriber.StreamingTranscriber` (cache-aware encoder + greedy decoder over slots).
Clients ``push`` audio whenever it arrives (each push is copied at once into pinned host memory:
:class:`~nemo_fastdecode.streaming.inbox.AudioInbox`); the serving loop calls ``poll`` over and over; each poll is one
cycle:

1. idle streams (no push for ``idle_timeout_seconds``) are ended;
2. every stream's waiting audio (at most ``max_cycle_seconds`` of it, and only while fewer than a chunk of its
   frames wait to be stepped) goes into the front end in one copy, and the front end computes the new feature
   frames of all streams (ended streams: their last frames, with NeMo's zero padding);
3. ONE :meth:`~StreamingTranscriber.step` advances every stream that has a chunk, NeMo's chunk schedule cut as
   frames arrive (:mod:`~nemo_fastdecode.streaming.chunking`): streams join and leave between cycles;
4. events: a partial event for every stream whose transcript grew, a final event for every stream that ended.

Example (the package's small cache-aware model trained on synthesised English speech, on one of its example
utterances; a NeMo cache-aware checkpoint such as ``nvidia/stt_en_fastconformer_hybrid_large_streaming_multi`` is
used the same way)::

    import numpy as np
    import soundfile as sf
    from nemo.collections.asr.models import ASRModel
    from nemo_fastdecode.streaming import StreamingEngine
    from nemo_fastdecode.apps.trained_models import example_entries, trained_model_path

    model = ASRModel.restore_from(str(trained_model_path("trained-streaming"))).eval()
    engine = StreamingEngine(model, num_slots=4, idle_timeout_seconds=30.0)
    engine.warm_up()  # captures the CUDA graphs now (on a GPU), not during the first steps
    example = example_entries()[0]
    pcm, _ = sf.read(example["audio_filepath"], dtype="int16")  # 4.3 s of 16 kHz mono int16
    stream = engine.open()
    for piece in np.array_split(pcm, len(pcm) // 1280):  # as it arrives: about 80 ms per network message
        engine.push(stream, piece.tobytes())
        for event in engine.poll():  # the serving loop: one cycle for every stream
            print(event.stream_id, event.text)
    final = engine.close(stream)  # the rest of its audio, now; frees the slot
    print(final.text, final.words)
    print("reference:", example["text"])

Exactness: in fp32 every stream's tokens, text and word timestamps equal NeMo's cache-aware streaming of that
stream alone (``CacheAwareStreamingAudioBuffer`` over the preprocessor's features of the whole file, then
``conformer_stream_step``), whatever the push sizes and however streams interleave (tests/test_streaming_engine.py).
The whole file's features are its ``seq_len = L // hop`` frames, those NeMo's offline ``transcribe`` encodes. NeMo's
streaming script (``speech_to_text_cache_aware_streaming_infer.py``) streams one frame more: its buffer's
``append_audio_file`` keeps the preprocessor's whole output (``L // hop + 1`` STFT frames, the last one past
``seq_len`` and masked to ``pad_value``) and takes its width as the stream's length. That frame can change a stream's
last tokens; ``masked_end_frame=True`` streams it too, and the tokens then equal the script's on each file
(tests/test_streaming_engine_script.py).

Endpointing: a final event need not end its stream. :meth:`StreamingEngine.end_segment` emits the final event
of the stream's current segment (its tokens since the previous segment) and the stream goes on: audio, caches and
decoder state continue, the next events carry ``segment + 1`` and only the tokens emitted after it. With
:class:`~nemo_fastdecode.streaming.events.EndpointingOptions` (off by default) the engine ends utterances itself, in
the cycle, after the step: where Silero VAD (:mod:`~nemo_fastdecode.streaming.vad`, batched over the streams on the
front end's samples) ends a speech segment, once the decoder has passed the point where the silence was confirmed
(the segment gets the tokens before it), or where NeMo's blank-run rule fires
(:mod:`~nemo_fastdecode.streaming.endpointing`; the segment gets every token so far). Only events are cut: the
segments' tokens joined are the stream's tokens without endpointing, as NeMo's ``CacheAwareRNNTPipeline`` keeps its
caches and hypothesis at an end of utterance. A segment without tokens is not finalised. A stream's last event
(``close``, or the cycle where a finished stream ends) is never split by the blank-run rule; ``close`` returns one
event, so it splits nothing. After each :meth:`StreamingEngine.poll`, :attr:`StreamingEngine.speech_events` holds the
speech starts and stops the VAD found in it (:class:`~nemo_fastdecode.streaming.events.SpeechEvent`).

What a segment's tokens equal, precisely: segment ``k`` of a stream has the tokens of NeMo's cache-aware streaming of
the *whole stream* alone (fp32) whose encoder frames lie between the ``k``-th and ``k + 1``-th cut (a VAD cut: the
first encoder frame at or after the sample where silero, on that stream alone, confirmed the silence; a blank-run
cut: every token decoded at that step). It is not the transcript of the segment's audio decoded on its own: the
encoder's caches and the decoder's state carry the context across the cut, as NeMo's pipeline does.

Fusion: each stream may boost its own phrases (``StreamOptions.boosting``, NeMo's per-stream boosting tree), and
``ngram_lm_model`` / ``ngram_lm_alpha`` fuse one n-gram LM (NeMo's ``NGramGPULanguageModel``) into every stream's greedy
decoding, as NeMo's ``greedy.ngram_lm_model`` / ``ngram_lm_alpha`` do; both combine. Each stream's LM state starts
after ``<BOS>`` when it opens and continues across its chunks and segments, as its decoder state does. In fp32 every
stream's tokens equal NeMo's cache-aware streaming of it alone with the same fusion (tests/test_streaming_lm.py,
tests/test_streaming_boosting.py). With ``decoding="beam"`` the LM is fused into every stream's beams as NeMo's
``malsd_batch`` fuses ``beam.ngram_lm_model``, each beam's LM state continued across chunks
(tests/test_streaming_lm.py), and a stream's phrases as NeMo's ``malsd_batch`` fuses a boosting tree of them after the
LM, each beam's tree state continued across chunks (tests/test_streaming_beam_boosting.py).

Not thread-safe: one thread (e.g. a server's event loop) calls every method.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from nemo_fastdecode.streaming.chunking import ChunkSchedule, FeatureQueue
from nemo_fastdecode.streaming.endpointing import BlankRunEndpointer
from nemo_fastdecode.streaming.events import (
    BoostingOptions,
    CapacityError,
    EndpointingOptions,
    EndReason,
    SpeechEvent,
    StreamEndedError,
    StreamError,
    StreamEvent,
    StreamingEngineError,
    StreamOptions,
    UnknownStreamError,
)
from nemo_fastdecode.streaming.frontend import AudioFrontEnd, SampleFormat
from nemo_fastdecode.streaming.inbox import AudioInbox
from nemo_fastdecode.streaming.token_text import TokenText
from nemo_fastdecode.streaming.transcriber import StreamingTranscriber, WarmUpTimes
from nemo_fastdecode.streaming.vad import BatchedVAD, SpeechEnds, SpeechMarks
from nemo_fastdecode.streaming.word_timestamps import WordTimestamps

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

__all__ = ["StreamingEngine"]


class StreamingEngine:
    """Cache-aware streaming ASR for up to ``num_slots`` streams at once: raw PCM in, transcripts out.

    Args:
        model: a NeMo transducer model with a cache-aware streaming FastConformer encoder and NeMo's mel
            preprocessor (``normalize: NA``); put in eval mode.
        num_slots: most streams open at once (everything is allocated for them up front).
        att_context_size: ``[left, lookahead]``, one of the encoder's look-aheads (``None``: its current one).
        dtype: cache and encoder compute dtype; fp32 is exact.
        use_cuda_graphs: replay CUDA graphs per batch-size bucket on a GPU (call :meth:`warm_up` first), and the
            front end's feature pass as one graph per frame count.
        encoder_matmul: ``"fp32"`` (exact), or opt-in ``"tf32x3"`` / ``"tf32"`` (see :class:`StreamingTranscriber`).
        fast_math: opt-in fast-math greedy decoding (not bit-identical to NeMo's).
        max_symbols: greedy ``max_symbols`` (default: the model's).
        idle_timeout_seconds: a stream without a push for this long is ended by :meth:`poll` (its final event is
            emitted, its slot freed); ``None``: never.
        max_cycle_seconds: most audio of one stream fed to the front end per cycle (sizes its buffers); more waits
            on the host for the next cycles.
        max_chunks_per_cycle: most chunks one stream steps in a cycle. A stream with more than a chunk of features
            waiting (its server fell behind: a stall, a burst of openings) steps again in the same cycle, up to this
            many times, so that it catches up several chunks at a time while the cycle's fixed host cost is paid
            once; streams with endpointing or VAD step once (their utterance ends are decided chunk by chunk).
            A stream's chunks are the same whichever cycle steps them: the transcripts do not change.
        clock: seconds, monotonic (injectable for tests).
        endpointing: when utterances end mid-stream (:class:`EndpointingOptions`; default: never), for every stream
            that does not set its own in :class:`StreamOptions`. Silero VAD is loaded here if it is on.
        phrase_boosting: set per-stream phrase boosting (``StreamOptions.boosting``) up now, so that :meth:`warm_up`
            also captures (beam search: runs) the decoder that fuses the streams' boosting trees (a model with a
            tokenizer; greedy: label looping); ``False``: the first stream with phrases sets it up.
        decoding: ``"greedy"`` or ``"beam"``: NeMo's ``malsd_batch`` beam search, every stream's beams continued chunk
            after chunk; partial events carry the best beam so far (sent whenever it changes), the final event the
            best beam at the stream's end; with an n-gram LM and per-stream phrase boosting too. Not with endpointing.
        beam_size: beams per stream with ``decoding="beam"``.
        ngram_lm_model: an n-gram LM over the model's tokens fused into every stream's decoding, as NeMo's
            ``greedy.ngram_lm_model`` (an ARPA file or NeMo's ``.nemo`` n-gram LM; greedy: label looping, with
            per-stream boosting too) or, with ``decoding="beam"``, as NeMo's ``malsd_batch`` ``beam.ngram_lm_model``.
        ngram_lm_alpha: the LM's weight, > 0 with a model (NeMo's ``greedy.ngram_lm_alpha``).
        masked_end_frame: after each stream's last feature frame, step one frame of the preprocessor's
            ``pad_value``, the masked frame NeMo's streaming script keeps at the end of every file (see the module
            docstring): the final tokens then equal that script's on each file alone (a stream without a sample gets
            no frame). ``False`` (default): the stream's ``L // hop`` frames, as NeMo's offline ``transcribe`` encodes
            them.
    """

    def __init__(
        self,
        model: ASRModel,
        num_slots: int,
        *,
        att_context_size: Sequence[int] | None = None,
        dtype: torch.dtype = torch.float32,
        use_cuda_graphs: bool = True,
        encoder_matmul: str = "fp32",
        fast_math: bool = False,
        max_symbols: int | None = None,
        idle_timeout_seconds: float | None = None,
        max_cycle_seconds: float = 1.0,
        max_chunks_per_cycle: int = 4,
        clock: Callable[[], float] = time.monotonic,
        endpointing: EndpointingOptions | None = None,
        phrase_boosting: bool = False,
        decoding: str = "greedy",
        beam_size: int = 4,
        ngram_lm_model: str | Path | None = None,
        ngram_lm_alpha: float = 0.0,
        masked_end_frame: bool = False,
    ):
        if idle_timeout_seconds is not None and not idle_timeout_seconds > 0:
            raise ValueError(f"idle_timeout_seconds must be > 0 or None, got {idle_timeout_seconds!r}")
        if not (isinstance(max_chunks_per_cycle, int) and max_chunks_per_cycle >= 1):
            raise ValueError(f"max_chunks_per_cycle must be an int >= 1, got {max_chunks_per_cycle!r}")
        if not isinstance(masked_end_frame, bool):
            raise TypeError(f"masked_end_frame must be a bool, got {masked_end_frame!r}")
        self.max_chunks_per_cycle = max_chunks_per_cycle
        self.endpointing = _endpointing_options(EndpointingOptions() if endpointing is None else endpointing)
        self._beam = decoding == "beam"
        self._check_endpointing(self.endpointing)
        self.transcriber = StreamingTranscriber(
            model,
            num_slots,
            att_context_size=att_context_size,
            dtype=dtype,
            use_cuda_graphs=use_cuda_graphs,
            max_symbols=max_symbols,
            fast_math=fast_math,
            encoder_matmul=encoder_matmul,
            phrase_boosting=phrase_boosting,
            decoding=decoding,
            beam_size=beam_size,
            ngram_lm_model=ngram_lm_model,
            ngram_lm_alpha=ngram_lm_alpha,
        )
        self.model, self.num_slots = model, num_slots
        self.device = self.transcriber.device
        self.geometry = g = self.transcriber.geometry
        self.front = AudioFrontEnd(
            model.preprocessor,
            num_slots,
            self.device,
            max_push_seconds=max_cycle_seconds,
            cuda_graphs=use_cuda_graphs,
        )
        s = self.front.settings
        if s.features != g.feat_in:
            raise ValueError(f"the preprocessor makes {s.features} features per frame; the encoder takes {g.feat_in}")
        self.idle_timeout_seconds = idle_timeout_seconds
        self._clock = clock
        self._cycle_samples = math.floor(max_cycle_seconds * s.sample_rate)
        self._max_chunk = max(g.first_chunk, g.chunk)
        # a stream is fed only while less than a chunk waits, then gets one cycle of frames (+ its flush's last ones,
        # + the masked end frame)
        capacity = self._max_chunk + self._cycle_samples // s.hop + 4 + int(masked_end_frame)
        self.schedule = ChunkSchedule(g, num_slots)
        self.queue = FeatureQueue(num_slots, g.feat_in, capacity, self.device)
        self.masked_end_frame = masked_end_frame
        self._end_frames: torch.Tensor | None = None
        if masked_end_frame:  # one column per slot: every stream ending in a cycle gets its frame in one write
            pad_value = float(model.preprocessor.featurizer.pad_value)
            self._end_frames = torch.full((g.feat_in, num_slots), pad_value, dtype=torch.float32, device=self.device)
        preprocessor_cfg = model.cfg.get("preprocessor", {}) or {}
        self._window_stride = float(preprocessor_cfg.get("window_stride", s.hop / s.sample_rate))  # NeMo's timestamps
        self._token_text = TokenText(model.decoding)
        self._word_timestamps = WordTimestamps(self._token_text, g.subsampling_factor, self._window_stride)
        # per slot, on the host (vectorised over slots in each cycle)
        self._stream_of = np.full(num_slots, -1, dtype=np.int64)
        self._ending = np.zeros(num_slots, dtype=bool)  # no more audio: flush, step the rest, emit the final event
        self._flushed = np.zeros(num_slots, dtype=bool)  # the front end gave the stream's last frames
        self._last_push = np.zeros(num_slots, dtype=np.float64)
        self.inbox = AudioInbox(num_slots, self.device)  # pushed bytes, in pinned memory until a cycle takes them
        self._reported = np.zeros(num_slots, dtype=np.int64)  # tokens of the stream when its last event was built
        self._segment = np.zeros(num_slots, dtype=np.int64)
        self._segment_token = np.zeros(num_slots, dtype=np.int64)  # first token of the current segment
        self._segment_start = np.zeros(num_slots, dtype=np.float64)  # seconds
        # greedy: the current segment's tokens and text as the last partial event said them (its next event reads
        # only the newer tokens from the device and extends the text)
        self._said_ids: list[list[int]] = [[] for _ in range(num_slots)]
        self._said_text: list[str] = [""] * num_slots
        self._carry: list[bytes] = [b""] * num_slots  # the first bytes of a sample whose other bytes are to come
        self._samples = np.zeros(num_slots, dtype=np.int64)  # whole samples pushed
        self._format = [SampleFormat.INT16] * num_slots
        self._itemsize = np.full(num_slots, SampleFormat.INT16.itemsize, dtype=np.int64)  # bytes per sample
        self._options: list[StreamOptions | None] = [None] * num_slots
        self._reason: list[EndReason | None] = [None] * num_slots
        self._slot_of: dict[int, int] = {}
        self._next_id = 0
        # end of utterance: per-slot rules; the VAD's ends waiting for the decoder to pass them (encoder frame, sample)
        self._frame_samples = g.subsampling_factor * s.hop  # audio samples per encoder frame
        self._blank_run = BlankRunEndpointer(num_slots, self._window_stride * g.subsampling_factor * 1000, self.device)
        self._vad: BatchedVAD | None = BatchedVAD(self.front) if self.endpointing.vad else None
        self._vad_on = np.zeros(num_slots, dtype=bool)
        self._endpointed = np.zeros(num_slots, dtype=bool)  # any rule on
        self._cuts: list[list[tuple[int, int]]] = [[] for _ in range(num_slots)]
        self._next_cut = np.full(num_slots, np.iinfo(np.int64).max, dtype=np.int64)  # frame of the first cut
        self._stepping = False  # inside poll's while_stepping: only push may run
        self.speech_events: list[SpeechEvent] = []
        """The VAD's speech starts and stops found by the last :meth:`poll` (streams with ``vad`` on), per stream in
        time order; replaced at every poll."""

    # ---- streams -------------------------------------------------------------------------------------------
    @property
    def open_streams(self) -> list[int]:
        """Ids of the streams that hold a slot (including those ended whose final event is still to come)."""
        return sorted(self._slot_of)

    def open(self, options: StreamOptions | None = None) -> int:
        """Start a stream; returns its id (never reused).

        ``options.boosting``: the stream's own phrases to boost (NeMo's per-stream boosting tree fused into its greedy
        decoding or beam search); a cycle in which no stream with phrases steps runs the plain decoder.

        Raises:
            CapacityError: every slot holds a stream.
            ValueError: options the front end cannot take (rate, channels, sample format), or phrases the model cannot
                boost, naming the value.
        """
        self._refuse_while_stepping("open a stream")
        options = StreamOptions() if options is None else options
        if not isinstance(options, StreamOptions):
            raise TypeError(f"options must be a StreamOptions, got {type(options).__name__}")
        endpointing = self.endpointing if options.endpointing is None else _endpointing_options(options.endpointing)
        self._check_endpointing(endpointing)
        free = np.flatnonzero(self._stream_of < 0)
        if free.size == 0:
            raise CapacityError(self.num_slots)
        slot = int(free[0])
        if options.boosting is not None:
            if not isinstance(options.boosting, BoostingOptions):
                raise TypeError(f"boosting must be a BoostingOptions, got {type(options.boosting).__name__}")
            self.transcriber.check_boosting(options.boosting)  # the tree is built before anything changes
        if endpointing.vad and self._vad is None:  # the first stream that asks for it loads it
            self._vad = BatchedVAD(self.front)
        self.front.open(
            slot, sample_rate=options.sample_rate, channels=options.channels, sample_format=options.sample_format
        )  # checks the options before anything changes
        transcriber_slot = self.transcriber.open(boosting=options.boosting)
        assert transcriber_slot == slot, "the engine and its transcriber take the lowest free slot alike"
        stream_id, self._next_id = self._next_id, self._next_id + 1
        self._slot_of[stream_id] = slot
        self._stream_of[slot] = stream_id
        self.schedule.reset(slot)
        self._ending[slot] = self._flushed[slot] = False
        self._last_push[slot] = self._clock()
        self.inbox.drop(slot)
        self._reported[slot] = self._samples[slot] = 0
        self._segment[slot] = self._segment_token[slot] = 0
        self._segment_start[slot] = 0.0
        self._said_ids[slot], self._said_text[slot] = [], ""
        self._carry[slot] = b""
        self._options[slot], self._reason[slot] = options, None
        self._format[slot] = SampleFormat.parse(options.sample_format)
        self._itemsize[slot] = self._format[slot].itemsize
        self._open_endpointing(slot, endpointing)
        return stream_id

    def _open_endpointing(self, slot: int, options: EndpointingOptions) -> None:
        self._vad_on[slot], self._endpointed[slot] = options.vad, options.enabled
        if options.vad:
            self._vad.open(slot, options)
        self._blank_run.open(slot, options)
        self._cuts[slot].clear()
        self._next_cut[slot] = np.iinfo(np.int64).max

    def push(self, stream_id: int, pcm: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Queue audio of one stream for the next cycles (any length, at any time): its whole samples are copied
        at once into the engine's pinned :attr:`inbox`, so the caller may reuse its buffer when this returns.

        Args:
            stream_id: an open stream.
            pcm: raw bytes in the stream's ``sample_format`` (any byte count: a sample split between pushes is put
                together), or a 1-D numpy array of its dtype (int16 or float32). Empty pushes only count as activity
                for the idle timeout.

        Raises:
            UnknownStreamError / StreamEndedError: an id never opened / a stream closed, finished or timed out.
            StreamError: not audio, more than one channel, the wrong dtype, a non-finite float sample (named with its
                index). Nothing is queued then, and no other stream is affected.
        """
        slot = self._live_slot(stream_id, "push audio to")
        data = self._as_bytes(stream_id, slot, pcm)
        # whole samples are queued; the bytes of a sample split between pushes wait for the rest here
        itemsize, carry = self._format[slot].itemsize, self._carry[slot]
        total = len(carry) + len(data)
        whole = total - total % itemsize
        if carry and whole:
            samples = carry + data[: whole - len(carry)]
        else:
            samples = data if whole == len(data) else memoryview(data)[:whole]
        if whole and self._format[slot] is SampleFormat.FLOAT32:
            self._check_finite(stream_id, slot, samples)
        # every check passed
        self._carry[slot] = carry + data if not whole else bytes(data[len(data) - (total - whole) :])  # kept: a copy
        self._samples[slot] += whole // itemsize
        self._last_push[slot] = self._clock()
        if whole:
            self.inbox.write(slot, samples)

    def push_many(
        self, stream_ids: Sequence[int], audio: bytes | memoryview, starts: np.ndarray, stops: np.ndarray
    ) -> int:
        """:meth:`push` of ``audio[starts[i]:stops[i]]`` to ``stream_ids[i]`` for each ``i``, in order; the int16
        pushes of whole samples go in together (one copy into the inbox when they are adjacent in ``audio``, the
        counts updated in arrays). A server applies a network batch of pushes this way.

        Returns how many pushes were applied: all, or the index of the first that :meth:`push` refuses (it and the
        later ones are not applied; push it alone for its error).
        """
        count = len(stream_ids)
        slot_of, carry = self._slot_of, self._carry
        slots = np.fromiter((slot_of.get(i, -1) for i in stream_ids), dtype=np.int64, count=count)
        starts, stops = np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)
        # together: open, not ending, int16, whole samples, no split sample waiting
        simple = slots >= 0
        simple[simple] = ~self._ending[slots[simple]] & (self._itemsize[slots[simple]] == 2)
        simple &= (stops - starts) % 2 == 0
        for i in np.flatnonzero(simple).tolist():
            if carry[slots[i]]:
                simple[i] = False
        done = 0
        while done < count:
            run = count if simple[done:].all() else done + int(np.argmin(simple[done:]))
            if run > done:
                together = slots[done:run]
                self.inbox.write_many(together, audio, starts[done:run], stops[done:run])
                np.add.at(self._samples, together, (stops[done:run] - starts[done:run]) // 2)
                self._last_push[together] = self._clock()
                done = run
            if done < count:  # one push the general way
                try:
                    self.push(stream_ids[done], audio[int(starts[done]) : int(stops[done])])
                except StreamingEngineError:
                    return done
                slot = slots[done]
                done += 1
                if slot >= 0 and carry[slot]:  # it left a split sample: the stream's later pushes follow it
                    simple[done:][slots[done:] == slot] = False
        return count

    def finish(self, stream_id: int) -> None:
        """End of the stream's audio: a later :meth:`poll` steps the rest (batched with the other streams) and emits
        its final event. Nothing happens if it is already ending."""
        self._refuse_while_stepping("finish a stream")
        slot = self._live_slot(stream_id, "finish", ending_ok=True)
        if not self._ending[slot]:
            self._ending[slot], self._reason[slot] = True, EndReason.END

    def close(self, stream_id: int) -> StreamEvent:
        """End the stream now: its remaining audio is stepped (the front end's last frames, the last partial chunk),
        and its final event is returned (not emitted by :meth:`poll`); the slot is free afterwards.

        The stream steps alone here, chunk after chunk; a server that ends many streams at once batches them with
        :meth:`finish` instead (or :meth:`abort` to drop it without a final event).
        """
        self._refuse_while_stepping("close a stream")
        slot = self._live_slot(stream_id, "close", ending_ok=True)
        self.finish(stream_id)
        members = np.zeros(self.num_slots, dtype=bool)
        members[slot] = True
        while True:  # each cycle feeds, flushes or steps it: it ends
            for event in self._cycle(members, endpoint=False):  # one event returned: no segment is split off
                if event.is_last:
                    return event

    def abort(self, stream_id: int) -> None:
        """Drop the stream now: its waiting audio and frames are discarded, no final event is built, and the slot is
        free at once (a client that went away; a server that discards a buffer). Its id is ended."""
        self._refuse_while_stepping("abort a stream")
        self._free(self._live_slot(stream_id, "abort", ending_ok=True))

    def end_segment(self, stream_id: int) -> StreamEvent:
        """The final event of the stream's current segment, now; the stream goes on (the endpointing hook).

        The event has the tokens since the previous segment (``is_final``, not ``is_last``, reason
        :attr:`EndReason.SEGMENT`); audio, caches and decoder state continue, and later events carry the next
        segment's tokens only, and its index. Audio pushed but not yet stepped belongs to the next segment.
        """
        self._refuse_while_stepping("end a segment")
        slot = self._live_slot(stream_id, "end a segment of")
        if self._beam:
            raise ValueError(
                f"stream {stream_id}: end_segment needs decoding='greedy' (a beam search may still replace the "
                "tokens a segment would keep); with decoding='beam' a stream has one segment"
            )
        (event,) = self._end_segments([slot])
        return event

    def _end_segments(
        self,
        slots: list[int],
        bounds: list[int] | None = None,
        ends: list[float] | None = None,
        skip_empty: bool = False,
    ) -> list[StreamEvent]:
        """Final events of the current segments of ``slots``; the next segments start after them.

        Args:
            slots: the streams.
            bounds: per stream, the segment keeps its tokens at encoder frames before this one (the rest opens the
                next segment); ``None``: every token.
            ends: per stream, the seconds where the segment ends (default: the audio decoded so far).
            skip_empty: a segment without tokens gets no event and goes on.
        """
        events = self._events(slots, final=True, last=False, bounds=bounds, ends=ends, skip_empty=skip_empty)
        for event in events:
            slot = self._slot_of[event.stream_id]
            self._segment[slot] += 1
            self._segment_token[slot] += len(event.token_ids)
            self._segment_start[slot] = event.end
        return events

    def text(self, stream_id: int) -> str:
        """The stream's whole transcript so far (all segments)."""
        return self.transcriber.text(self._live_slot(stream_id, "read", ending_ok=True))

    def token_ids(self, stream_id: int) -> list[int]:
        """The stream's token ids so far (all segments)."""
        return self.transcriber.token_ids(self._live_slot(stream_id, "read", ending_ok=True))

    def decoded_seconds(self, stream_id: int) -> float:
        """Seconds of the stream's audio its transcript accounts for now: the feature frames stepped (the ``end`` of a
        partial event built now). It grows by one chunk per cycle that steps the stream."""
        return self._stepped_seconds(self._live_slot(stream_id, "read", ending_ok=True))

    def warm_up(self) -> WarmUpTimes:
        """Capture every CUDA graph now (:meth:`StreamingTranscriber.warm_up`) and launch every variant of the audio
        front end's kernels (:meth:`AudioFrontEnd.warm_up`, while no stream is open), before the first stream: a
        kernel compiled under load stalls every stream."""
        self.front.warm_up()
        return self.transcriber.warm_up()

    @property
    def busy(self) -> bool:
        """Whether a :meth:`poll` now has work: audio to feed, a chunk to step or a stream to end."""
        live = self._stream_of >= 0
        steps, _ = self.schedule.next_chunks(np.flatnonzero(live))
        return bool((live & ((self.inbox.pending_bytes > 0) | self._ending)).any() or steps.size)

    # ---- the cycle -----------------------------------------------------------------------------------------
    def poll(self, while_stepping: Callable[[], None] | None = None) -> list[StreamEvent]:
        """One cycle for every stream (see the module docstring); returns its events.

        ``while_stepping``: called once the cycle's device work is queued and before its results are read back, so
        that host work overlaps the GPU's step. It may call :meth:`push` only (the audio waits for the next cycle);
        any other method raises ``RuntimeError`` there. A server applies its clients' pushes in it.

        Events: first a partial event for each stream whose transcript grew in this cycle (a stream that stepped
        without a new token has none: greedy tokens never change once emitted, so there is nothing new to say),
        then a final event for each stream that ended (its slot is free afterwards), each in slot order.
        A stream with more audio waiting than one chunk steps up to ``max_chunks_per_cycle`` chunks in a cycle, and
        takes at most ``max_cycle_seconds`` of its audio into features: call ``poll`` until :attr:`busy` is false
        to drain a burst.
        """
        live = self._stream_of >= 0
        if self.idle_timeout_seconds is not None:
            idle = live & ~self._ending & (self._clock() - self._last_push > self.idle_timeout_seconds)
            for slot in np.flatnonzero(idle).tolist():
                self._ending[slot], self._reason[slot] = True, EndReason.IDLE_TIMEOUT
        self.speech_events = []
        return self._cycle(live, while_stepping=while_stepping)

    def _cycle(
        self, members: np.ndarray, endpoint: bool = True, while_stepping: Callable[[], None] | None = None
    ) -> list[StreamEvent]:
        """Feed, compute features, step and report the streams in ``members`` (``[S]`` bool); ``endpoint``: end
        utterances where the streams' rules say so; ``while_stepping``: as :meth:`poll` takes it."""
        self._refuse_while_stepping("poll")
        live = members & (self._stream_of >= 0)
        # 1. audio in: one copy for every stream fed; features for every stream (ended ones: their last frames)
        feed = live & (self.inbox.pending_bytes > 0) & (self.schedule.backlog < self._max_chunk)
        fed = np.flatnonzero(feed)  # each takes at most one cycle's audio; the rest waits
        staged = self.inbox.take(fed, self._cycle_samples * self._itemsize[fed])
        if staged is not None:
            self.front.append_staged(staged)
        flush = live & self._ending & (self.inbox.pending_bytes == 0) & ~self._flushed
        for slot in np.flatnonzero(flush).tolist():
            if self._carry[slot]:
                warnings.warn(
                    f"stream {self._stream_of[slot]} ends with {len(self._carry[slot])} byte(s) of an incomplete "
                    f"{self._format[slot].value} sample; dropped",
                    stacklevel=3,
                )
                self._carry[slot] = b""
        out = self.front.features(flush=np.flatnonzero(flush))
        self._flushed |= flush
        heard = live & self._vad_on & (feed | flush)  # the VAD reads the rings before the next append overwrites them
        if heard.any():
            vad = self._vad.process(np.flatnonzero(heard), np.flatnonzero(flush & heard))
            self._report_speech(vad.marks, vad.ends)
            self._queue_cuts(vad.ends)
        self.queue.write(out.slots, out.starts, out.counts, out.features)
        self.schedule.add(out.slots, out.counts)
        if self.masked_end_frame and out.ended.size:
            self._append_end_frames(out.ended)
        self.schedule.end(out.ended)
        if (self.schedule.backlog > self.queue.capacity).any():  # the feed policy above rules this out
            raise RuntimeError("a stream's waiting feature frames overflowed the engine's feature queue")
        # 2. one step of every stream that has a chunk; those with another one waiting step again (catching up)
        stepped, lengths = self.schedule.next_chunks(np.flatnonzero(live))
        again = stepped
        for _ in range(self.max_chunks_per_cycle):
            if again.size == 0:
                break
            batch = self.queue.read(again, self.schedule.stepped[again], lengths)
            self.transcriber.step(again, batch, lengths=lengths)
            self.schedule.advance(again, lengths)
            again, lengths = self.schedule.next_chunks(again[~(self._endpointed[again] | self._vad_on[again])])
        if while_stepping is not None:
            self._stepping = True
            try:
                while_stepping()
            finally:
                self._stepping = False
        # 3. events: utterance ends, partial for the streams whose tokens grew, final for the streams that are over
        ending = np.flatnonzero(live & self._flushed)
        done = ending[self.schedule.done(ending)]
        events = self._endpoint(stepped[self._endpointed[stepped]], done) if endpoint else []
        stepped = np.setdiff1d(stepped, done, assume_unique=True)
        grew, counts = self._grew(stepped)
        counts = None if counts is None else counts[grew]
        events += self._events(stepped[grew].tolist(), final=False, last=False, counts=counts)
        events += self._events(done.tolist(), final=True, last=True)
        for slot in done.tolist():
            self._free(slot)
        return events

    def _append_end_frames(self, slots: np.ndarray) -> None:
        """One frame of ``pad_value`` after the last feature frame of each of ``slots`` (streams the front end just
        flushed), counted as theirs: NeMo's streaming script steps it as the stream's last frame. A stream without a
        sample gets none (it has no preprocessor output; NeMo's preprocessor fails on an empty file)."""
        slots = slots[self.front.received_samples(slots) > 0]
        if slots.size == 0:
            return
        ones = np.ones(slots.size, dtype=np.int64)
        self.queue.write(slots, self.schedule.received[slots], ones, self._end_frames[:, : slots.size])
        self.schedule.add(slots, ones)

    def _report_speech(self, marks: SpeechMarks, ends: SpeechEnds) -> None:
        """The VAD's marks as :class:`SpeechEvent` s; ``segment``: the stream's current one, past the utterance ends
        still waiting for the decoder and those found earlier in this same call."""
        if marks.slots.size == 0:
            return
        rate = self.front.settings.sample_rate
        for slot, sample, started in zip(
            marks.slots.tolist(), marks.samples.tolist(), marks.started.tolist(), strict=True
        ):
            earlier = int(((ends.slots == slot) & (ends.ends < sample)).sum())
            self.speech_events.append(
                SpeechEvent(
                    stream_id=int(self._stream_of[slot]),
                    started=bool(started),
                    seconds=sample / rate,
                    segment=int(self._segment[slot]) + len(self._cuts[slot]) + earlier,
                )
            )

    def _queue_cuts(self, ends: SpeechEnds) -> None:
        """Keep the VAD's speech ends until the decoder passes them: the first encoder frame at or after the sample
        where the silence was confirmed (tokens before it end the utterance), and that sample."""
        frames = -(-ends.decided // self._frame_samples)
        for slot, frame, sample in zip(ends.slots.tolist(), frames.tolist(), ends.decided.tolist(), strict=True):
            self._cuts[slot].append((frame, sample))
            self._next_cut[slot] = self._cuts[slot][0][0]

    def _endpoint(self, slots: np.ndarray, done: np.ndarray) -> list[StreamEvent]:
        """Utterance ends of the streams that just stepped (``slots``, rules on): the VAD's ends the decoder has
        passed, oldest first, then NeMo's blank-run rule (not for ``done`` streams: their last event follows)."""
        if slots.size == 0:
            return []
        decoder = self.transcriber.decoder
        blank = self._blank_run.decide(decoder, slots)
        rows = torch.from_numpy(slots).to(self.device)
        facts = [decoder.state.decoded_lengths.index_select(0, rows), decoder.counts.index_select(0, rows), blank]
        decoded, counts, blank = torch.stack([f.long() for f in facts]).cpu().numpy()  # one read back
        events = []
        while True:  # a step may pass more than one end
            ready = np.flatnonzero(self._next_cut[slots] <= decoded)
            if ready.size == 0:
                break
            cuts = [self._cuts[slot].pop(0) for slot in slots[ready].tolist()]
            for slot in slots[ready].tolist():
                self._next_cut[slot] = self._cuts[slot][0][0] if self._cuts[slot] else np.iinfo(np.int64).max
            rate = self.front.settings.sample_rate
            bounds, ends = [frame for frame, _ in cuts], [sample / rate for _, sample in cuts]
            events += self._end_segments(slots[ready].tolist(), bounds, ends, skip_empty=True)
        quiet = (blank > 0) & (counts > self._segment_token[slots]) & ~np.isin(slots, done)
        return events + self._end_segments(slots[quiet].tolist())

    def _grew(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``[N]`` bool: the streams' token counts grew since their last event (one device read); with beam search,
        the best beam changed. And (greedy) the ``[N]`` token counts read, ``None`` with beam search."""
        if slots.size == 0:
            return np.zeros(0, dtype=bool), None
        if self._beam:
            return self.transcriber.decoder.changed(slots), None
        counts = self.transcriber.decoder.token_counts(slots)
        return counts > self._reported[slots], counts

    def _events(
        self,
        slots: list[int],
        *,
        final: bool,
        last: bool,
        bounds: list[int] | None = None,
        ends: list[float] | None = None,
        skip_empty: bool = False,
        counts: np.ndarray | None = None,
    ) -> list[StreamEvent]:
        """The events of ``slots``, their tokens read in one batch (``bounds``, ``ends``, ``skip_empty``: as
        :meth:`_end_segments` takes them; ``counts``: the streams' token counts if already read, greedy only).

        The tokens come as one host array (greedy: read from the token storage, hypotheses built only for the events
        with word timestamps), their texts in one batch. Greedy partials cost their new tokens, not the segment: only
        the tokens after those the previous partial said are read, and its text is extended (``TokenText.continued``).
        """
        if not slots:
            return []
        index = np.asarray(slots, dtype=np.int64)
        decoder = self.transcriber.decoder
        wants_words = [final or self._options[slot].partial_words for slot in slots]
        firsts = self._segment_token[index]
        # tokens of the segment the last partial said (on the host); a cut at bounds counts them all again
        said = np.zeros_like(firsts) if self._beam or bounds is not None else self._reported[index] - firsts
        if self._beam:
            hyps = decoder.hypotheses(slots, with_state=False)
            counts = np.array([0 if hyp is None else len(hyp.y_sequence) for hyp in hyps], dtype=np.int64)
            stops = np.maximum(counts, firsts)
            labels = np.zeros((len(slots), int((stops - firsts).max())), dtype=np.int64)
            times = np.zeros_like(labels) if bounds is not None else None
            for i, hyp in enumerate(hyps):  # row i: the tokens of the segment, left-aligned
                size = stops[i] - firsts[i]
                if size:
                    labels[i, :size] = np.asarray(hyp.y_sequence)[firsts[i] : stops[i]]
                    if times is not None:
                        times[i, :size] = np.asarray(hyp.timestamp)[firsts[i] : stops[i]]
        else:
            counts = decoder.token_counts(index) if counts is None else counts
            stops = np.maximum(counts, firsts)
            labels, times = decoder.token_rows(index, firsts + said, stops, with_timestamps=bounds is not None)
            words_of = [slot for slot, wants in zip(slots, wants_words, strict=True) if wants]
            built = dict(zip(words_of, decoder.hypotheses(words_of, with_state=False), strict=True)) if words_of else {}
            hyps = [built.get(slot) for slot in slots]
        sizes = stops - firsts
        if bounds is not None:  # tokens in time order: those before the bound lead
            for i in np.flatnonzero(sizes).tolist():
                sizes[i] = int((times[i, : sizes[i]] < bounds[i]).sum())
        keep = np.flatnonzero(sizes) if skip_empty else np.arange(len(slots))
        # the kept streams' new tokens, one run per stream, in one array; their texts extend what was said
        sizes, new = sizes[keep], sizes[keep] - said[keep]
        ids = labels[keep][np.arange(labels.shape[1]) < new[:, None]]
        kept = [slots[i] for i in keep.tolist()]
        befores = [self._said_ids[slot] if count else [] for slot, count in zip(kept, said[keep].tolist(), strict=True)]
        texts = self._token_text.continued([self._said_text[slot] for slot in kept], befores, ids, new.tolist())
        flat, offset = ids.tolist(), 0
        if ends is None:
            rate = self.front.settings.sample_rate
            if last:
                ends = (self.front.received_samples(index) / rate).tolist()
            else:  # the feature frames stepped (int64 products below 2**53: the same division as on ints)
                ends = (self.schedule.stepped[index] * self.front.settings.hop / rate).tolist()
        self._reported[index[keep]] = firsts[keep] + sizes
        stream_ids, segments = self._stream_of[index].tolist(), self._segment[index].tolist()
        starts, firsts, sizes, new = self._segment_start[index].tolist(), firsts.tolist(), sizes.tolist(), new.tolist()
        events = []
        for k, i in enumerate(keep.tolist()):
            slot, first, size = slots[i], firsts[i], sizes[k]
            fresh, offset = flat[offset : offset + new[k]], offset + new[k]
            if final or self._beam:  # a final ends the segment: the next one starts with nothing said
                token_ids = befores[k] + fresh
                if not self._beam:
                    self._said_ids[slot], self._said_text[slot] = [], ""
            else:  # what this partial says, kept for the next one (its own list: the event's is the caller's)
                said_ids = self._said_ids[slot]
                said_ids += fresh
                self._said_text[slot] = texts[k]
                token_ids = said_ids.copy() if self._options[slot].partial_token_ids else None
            if not wants_words[i]:
                words = None
            elif size:
                words = self._word_timestamps(hyps[i], first, first + size)
            else:
                words = []
            events.append(
                StreamEvent(
                    stream_id=stream_ids[i],
                    text=texts[k],
                    token_ids=token_ids,
                    words=words,
                    is_final=final,
                    is_last=last,
                    reason=(self._reason[slot] if last else EndReason.SEGMENT) if final else None,
                    segment=segments[i],
                    start=starts[i],
                    end=ends[i],
                )
            )
        return events

    def _stepped_seconds(self, slot: int) -> float:
        return int(self.schedule.stepped[slot]) * self.front.settings.hop / self.front.settings.sample_rate

    def _free(self, slot: int) -> None:
        self._cuts[slot].clear()
        del self._slot_of[int(self._stream_of[slot])]
        self._stream_of[slot] = -1
        self.inbox.drop(slot)
        self._options[slot] = None
        self.front.close(slot)
        self.transcriber.close(slot)

    # ---- checks --------------------------------------------------------------------------------------------
    def _refuse_while_stepping(self, action: str) -> None:
        """Only :meth:`push` may run inside ``poll(while_stepping=...)``: the cycle still reads the streams' state."""
        if self._stepping:
            raise RuntimeError(f"cannot {action} while a cycle steps: poll(while_stepping=...) may only push audio")

    def _live_slot(self, stream_id: Any, action: str, ending_ok: bool = False) -> int:
        """The slot of an open stream; a clear error for ids never opened and streams that ended."""
        if isinstance(stream_id, bool) or not isinstance(stream_id, (int, np.integer)):
            raise UnknownStreamError(stream_id, f"stream ids are ints, got {stream_id!r} ({type(stream_id).__name__})")
        slot = self._slot_of.get(int(stream_id))
        if slot is None:
            if 0 <= stream_id < self._next_id:
                raise StreamEndedError(
                    stream_id, f"cannot {action} stream {stream_id}: it has ended (closed, finished or timed out)"
                )
            raise UnknownStreamError(
                stream_id, f"cannot {action} stream {stream_id}: no such stream; open streams: {self._listing()}"
            )
        if self._ending[slot] and not ending_ok:
            why = "timed out" if self._reason[slot] is EndReason.IDLE_TIMEOUT else "was finished"
            raise StreamEndedError(
                stream_id, f"cannot {action} stream {stream_id}: it {why}; its final event comes from poll()"
            )
        return slot

    def _listing(self, limit: int = 16) -> str:
        ids = self.open_streams
        shown = ", ".join(map(str, ids[:limit])) or "none"
        return shown + (f", ... ({len(ids)} in all)" if len(ids) > limit else "")

    def _as_bytes(self, stream_id: int, slot: int, pcm: Any) -> bytes | memoryview:
        """The push's raw bytes, not copied (``bytes``, or an unsigned-byte view of a 1-D array of the stream's dtype,
        a ``bytearray`` or a ``memoryview``): :meth:`push` copies them into the inbox before it returns."""
        if type(pcm) is bytes:
            return pcm
        sample_format = self._format[slot].value
        if isinstance(pcm, np.ndarray):
            if pcm.ndim != 1:
                channels = f"{pcm.shape[1]} channels" if pcm.ndim == 2 else f"{pcm.ndim} dimensions"
                raise StreamError(
                    stream_id,
                    f"stream {stream_id}: audio must be mono, a 1-D array; got shape {pcm.shape} ({channels})",
                )
            expected = np.dtype("<i2" if sample_format == "int16" else "<f4")
            if pcm.dtype != expected:
                raise StreamError(
                    stream_id,
                    f"stream {stream_id}: an array of dtype {pcm.dtype} was pushed to a {sample_format} stream; "
                    f"valid: {expected} (or open the stream with StreamOptions(sample_format=...))",
                )
            if self._carry[slot]:  # an array's first sample would start inside the waiting one
                raise StreamError(
                    stream_id,
                    f"stream {stream_id}: {len(self._carry[slot])} byte(s) of a split sample wait for the rest; push "
                    "those bytes before pushing an array",
                )
            return memoryview(np.ascontiguousarray(pcm)).cast("B")
        if isinstance(pcm, (bytearray, memoryview)):
            view = memoryview(pcm)
            if not view.c_contiguous:
                raise StreamError(stream_id, f"stream {stream_id}: audio bytes must be contiguous")
            return view.cast("B")
        raise StreamError(
            stream_id,
            f"stream {stream_id}: audio must be bytes or a 1-D numpy array, got {type(pcm).__name__}",
        )

    def _check_finite(self, stream_id: int, slot: int, samples: bytes | memoryview) -> None:
        """Refuse NaN and infinite float32 samples, naming the first (its index counts from the stream's start)."""
        values = np.frombuffer(samples, dtype="<f4")
        if np.isfinite(values).all():
            return
        index = int(np.flatnonzero(~np.isfinite(values))[0])
        raise StreamError(
            stream_id,
            f"stream {stream_id}: non-finite sample {values[index]} at sample {self._samples[slot] + index}; "
            "audio must be finite",
        )

    def _check_endpointing(self, options: EndpointingOptions) -> None:
        """Utterance ends cut a stream's tokens where they were decoded; a beam search may still replace them."""
        if self._beam and options.enabled:
            raise ValueError(
                "endpointing (vad or a blank-run rule) needs decoding='greedy'; valid with decoding='beam': "
                "EndpointingOptions() (no endpointing)"
            )


def _endpointing_options(options: Any) -> EndpointingOptions:
    if not isinstance(options, EndpointingOptions):
        raise TypeError(f"endpointing must be an EndpointingOptions, got {type(options).__name__}")
    return options
