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
    from nemo_fastdecode.streaming import EngineConfig, StreamingEngine
    from nemo_fastdecode.apps.trained_models import example_entries, trained_model_path

    model = ASRModel.restore_from(str(trained_model_path("trained-streaming"))).eval()
    engine = StreamingEngine(model, EngineConfig(num_slots=4, idle_timeout_seconds=30.0))
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

Input: each stream's format and rate are its :class:`~nemo_fastdecode.streaming.events.StreamOptions`: int16,
float32, G.711 mu-law or A-law samples, at the model's rate or one of
:data:`~nemo_fastdecode.streaming.frontend.INPUT_RATES` (8 to 48 kHz), resampled on the device in the front end as
``scipy.signal.resample_poly`` does on the whole stream. Everything after the front end (features, chunks, VAD, events'
times) runs in the model's time base; a stream at another rate transcribes as its ``resample_poly``'d audio at the
model's rate would (tests/test_streaming_engine_formats.py).

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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from nemo_fastdecode.streaming.chunking import ChunkSchedule, FeatureQueue
from nemo_fastdecode.streaming.config import EngineConfig, check_endpointing, endpointing_options
from nemo_fastdecode.streaming.cycle import EngineCycle
from nemo_fastdecode.streaming.event_builder import EventBuilder
from nemo_fastdecode.streaming.events import (
    BoostingOptions,
    EndReason,
    SpeechEvent,
    StreamEvent,
    StreamingEngineError,
    StreamOptions,
)
from nemo_fastdecode.streaming.frontend import AudioFrontEnd
from nemo_fastdecode.streaming.inbox import AudioInbox
from nemo_fastdecode.streaming.pcm import PcmInput
from nemo_fastdecode.streaming.streams import StreamTable
from nemo_fastdecode.streaming.token_text import TokenText
from nemo_fastdecode.streaming.transcriber import StreamingTranscriber, WarmUpTimes
from nemo_fastdecode.streaming.utterance_ends import UtteranceEnds
from nemo_fastdecode.streaming.word_timestamps import WordTimestamps

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

__all__ = ["StreamingEngine"]


class StreamingEngine:
    """Cache-aware streaming ASR for up to ``config.num_slots`` streams at once: raw PCM in, transcripts out.

    Args:
        model: a NeMo transducer model with a cache-aware streaming FastConformer encoder and NeMo's mel
            preprocessor (``normalize: NA``); put in eval mode.
        config: the engine's options (:class:`~nemo_fastdecode.streaming.config.EngineConfig`: slots, look-ahead,
            precision, decoding, fusion, endpointing, timeouts), or just the number of slots, the other options then
            given as keywords (``StreamingEngine(model, 4, idle_timeout_seconds=30.0)`` builds
            ``EngineConfig(num_slots=4, idle_timeout_seconds=30.0)``; ``num_slots=4`` as a keyword works too).
        clock: seconds, monotonic (injectable for tests).

    Its parts, one concern each: :class:`~nemo_fastdecode.streaming.streams.StreamTable` (stream ids, slots,
    lifecycle), :class:`~nemo_fastdecode.streaming.pcm.PcmInput` (what a push may carry),
    :class:`~nemo_fastdecode.streaming.inbox.AudioInbox` (pushed audio in pinned memory),
    :class:`~nemo_fastdecode.streaming.cycle.EngineCycle` (one step over all streams),
    :class:`~nemo_fastdecode.streaming.utterance_ends.UtteranceEnds` (endpointing) and
    :class:`~nemo_fastdecode.streaming.event_builder.EventBuilder` (segments and the events' text).
    """

    def __init__(
        self,
        model: ASRModel,
        config: EngineConfig | int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        **options: Any,
    ):
        self.config = config = EngineConfig.from_options(config, **options)
        num_slots = config.num_slots
        self.max_chunks_per_cycle = config.max_chunks_per_cycle
        self.endpointing = config.endpointing_options
        self._beam = config.decoding == "beam"
        self.transcriber = StreamingTranscriber(
            model,
            num_slots,
            att_context_size=config.att_context_size,
            dtype=config.torch_dtype,
            use_cuda_graphs=config.use_cuda_graphs,
            max_symbols=config.max_symbols,
            fast_math=config.fast_math,
            encoder_matmul=config.encoder_matmul,
            phrase_boosting=config.phrase_boosting,
            decoding=config.decoding,
            beam_size=config.beam_size,
            ngram_lm_model=config.ngram_lm_model,
            ngram_lm_alpha=config.ngram_lm_alpha,
        )
        self.model, self.num_slots = model, num_slots
        self.device = self.transcriber.device
        self.geometry = g = self.transcriber.geometry
        self.front = AudioFrontEnd(
            model.preprocessor,
            num_slots,
            self.device,
            max_push_seconds=config.max_cycle_seconds,
            cuda_graphs=config.use_cuda_graphs,
        )
        s = self.front.settings
        if s.features != g.feat_in:
            raise ValueError(f"the preprocessor makes {s.features} features per frame; the encoder takes {g.feat_in}")
        self.idle_timeout_seconds = config.idle_timeout_seconds
        self.masked_end_frame = config.masked_end_frame
        cycle_samples = math.floor(config.max_cycle_seconds * s.sample_rate)
        max_chunk = max(g.first_chunk, g.chunk)
        # a stream is fed only while less than a chunk waits, then gets one cycle of frames (+ its flush's last ones,
        # + the masked end frame)
        capacity = max_chunk + cycle_samples // s.hop + 4 + int(config.masked_end_frame)
        self.schedule = ChunkSchedule(g, num_slots)
        self.queue = FeatureQueue(num_slots, g.feat_in, capacity, self.device)
        end_frames = None
        if config.masked_end_frame:  # one column per slot: every stream ending in a cycle gets its frame in one write
            pad_value = float(model.preprocessor.featurizer.pad_value)
            end_frames = torch.full((g.feat_in, num_slots), pad_value, dtype=torch.float32, device=self.device)
        preprocessor_cfg = model.cfg.get("preprocessor", {}) or {}
        window_stride = float(preprocessor_cfg.get("window_stride", s.hop / s.sample_rate))  # NeMo's timestamps
        token_text = TokenText(model.decoding)
        self.streams = StreamTable(num_slots, clock)
        self.pcm = PcmInput(num_slots)
        self.inbox = AudioInbox(num_slots, self.device)  # pushed bytes, in pinned memory until a cycle takes them
        self.event_builder = EventBuilder(
            self.streams,
            self.transcriber,
            self.front,
            self.schedule,
            token_text,
            WordTimestamps(token_text, g.subsampling_factor, window_stride),
            beam=self._beam,
        )
        self.utterances = UtteranceEnds(
            self.front,
            self.transcriber,
            frame_samples=g.subsampling_factor * s.hop,
            ms_per_frame=window_stride * g.subsampling_factor * 1000,
            vad=self.endpointing.vad,
        )
        self.cycle = EngineCycle(
            self.streams,
            self.pcm,
            self.inbox,
            self.front,
            self.schedule,
            self.queue,
            self.transcriber,
            self.utterances,
            self.event_builder,
            max_chunks_per_cycle=config.max_chunks_per_cycle,
            cycle_samples=cycle_samples,
            max_chunk=max_chunk,
            end_frames=end_frames,
            free=lambda slot: self._free(slot),  # looked up at each call (a profiler may wrap it)
        )

    @property
    def speech_events(self) -> list[SpeechEvent]:
        """The VAD's speech starts and stops found by the last :meth:`poll` (streams with ``vad`` on), per stream in
        time order; replaced at every poll."""
        return self.cycle.speech_events

    @property
    def _stepping(self) -> bool:
        """Inside ``poll(while_stepping=...)``: only :meth:`push` may run."""
        return self.streams.stepping

    # ---- streams -------------------------------------------------------------------------------------------
    @property
    def open_streams(self) -> list[int]:
        """Ids of the streams that hold a slot (including those ended whose final event is still to come)."""
        return self.streams.open_streams

    def open(self, options: StreamOptions | None = None) -> int:
        """Start a stream; returns its id (never reused).

        ``options.boosting``: the stream's own phrases to boost (NeMo's per-stream boosting tree fused into its greedy
        decoding or beam search); a cycle in which no stream with phrases steps runs the plain decoder.

        Raises:
            CapacityError: every slot holds a stream.
            ValueError: options the front end cannot take (rate, channels, sample format), or phrases the model cannot
                boost, naming the value.
        """
        self.streams.refuse_while_stepping("open a stream")
        options = StreamOptions() if options is None else options
        if not isinstance(options, StreamOptions):
            raise TypeError(f"options must be a StreamOptions, got {type(options).__name__}")
        endpointing = self.endpointing if options.endpointing is None else endpointing_options(options.endpointing)
        check_endpointing(self.config.decoding, endpointing)
        slot = self.streams.free_slot()
        if options.token_logprobs and self.config.decoding != "greedy":
            raise ValueError(
                f"token_logprobs needs greedy decoding; this engine decodes with {self.config.decoding!r} (valid: "
                "token_logprobs=False, or an engine with decoding='greedy')"
            )
        if options.boosting is not None:
            if not isinstance(options.boosting, BoostingOptions):
                raise TypeError(f"boosting must be a BoostingOptions, got {type(options.boosting).__name__}")
            self.transcriber.check_boosting(options.boosting)  # the tree is built before anything changes
        self.utterances.load(endpointing)  # the first stream that asks for the VAD loads it
        self.front.open(
            slot, sample_rate=options.sample_rate, channels=options.channels, sample_format=options.sample_format
        )  # checks the options before anything changes
        transcriber_slot = self.transcriber.open(boosting=options.boosting, token_logprobs=options.token_logprobs)
        assert transcriber_slot == slot, "the engine and its transcriber take the lowest free slot alike"
        stream_id = self.streams.add(slot, options)
        self.schedule.reset(slot)
        self.inbox.drop(slot)
        self.pcm.open(slot, options.sample_format)
        self.event_builder.open(slot)
        self.utterances.open(slot, endpointing)
        return stream_id

    def push(self, stream_id: int, pcm: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Queue audio of one stream for the next cycles (any length, at any time): its whole samples are copied
        at once into the engine's pinned :attr:`inbox`, so the caller may reuse its buffer when this returns.

        Args:
            stream_id: an open stream.
            pcm: raw bytes in the stream's ``sample_format`` (any byte count: a sample split between pushes is put
                together), or a 1-D numpy array of its dtype (int16, float32, uint8 for G.711). Empty pushes only count as activity
                for the idle timeout.

        Raises:
            UnknownStreamError / StreamEndedError: an id never opened / a stream closed, finished or timed out.
            StreamError: not audio, more than one channel, the wrong dtype, a non-finite float sample (named with its
                index). Nothing is queued then, and no other stream is affected.
        """
        slot = self.streams.live_slot(stream_id, "push audio to")
        samples = self.pcm.whole_samples(stream_id, slot, pcm)  # every check passed
        self.streams.last_push[slot] = self.streams.clock()
        if len(samples):
            self.inbox.write(slot, samples)

    def push_many(
        self, stream_ids: Sequence[int], audio: bytes | memoryview, starts: np.ndarray, stops: np.ndarray
    ) -> int:
        """:meth:`push` of ``audio[starts[i]:stops[i]]`` to ``stream_ids[i]`` for each ``i``, in order; the int16 and
        G.711 pushes of whole samples go in together (one copy into the inbox when they are adjacent in ``audio``, the
        counts updated in arrays). A server applies a network batch of pushes this way.

        Returns how many pushes were applied: all, or the index of the first that :meth:`push` refuses (it and the
        later ones are not applied; push it alone for its error).
        """
        count = len(stream_ids)
        streams, carry = self.streams, self.pcm.carry
        slot_of = streams.slot_of
        slots = np.fromiter((slot_of.get(i, -1) for i in stream_ids), dtype=np.int64, count=count)
        starts, stops = np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)
        # together: open, not ending, int16 or G.711, whole samples, no split sample waiting
        simple = self.pcm.batchable(slots)
        simple[simple] = ~streams.ending[slots[simple]]
        itemsize = self.pcm.itemsize[np.maximum(slots, 0)]
        simple &= (stops - starts) % itemsize == 0
        done = 0
        while done < count:
            run = count if simple[done:].all() else done + int(np.argmin(simple[done:]))
            if run > done:
                together = slots[done:run]
                self.inbox.write_many(together, audio, starts[done:run], stops[done:run])
                np.add.at(self.pcm.samples, together, (stops[done:run] - starts[done:run]) // itemsize[done:run])
                streams.last_push[together] = streams.clock()
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
        self.streams.refuse_while_stepping("finish a stream")
        slot = self.streams.live_slot(stream_id, "finish", ending_ok=True)
        if not self.streams.ending[slot]:
            self.streams.end(slot, EndReason.END)

    def close(self, stream_id: int) -> StreamEvent:
        """End the stream now: its remaining audio is stepped (the front end's last frames, the last partial chunk),
        and its final event is returned (not emitted by :meth:`poll`); the slot is free afterwards.

        The stream steps alone here, chunk after chunk; a server that ends many streams at once batches them with
        :meth:`finish` instead (or :meth:`abort` to drop it without a final event).
        """
        self.streams.refuse_while_stepping("close a stream")
        slot = self.streams.live_slot(stream_id, "close", ending_ok=True)
        self.finish(stream_id)
        members = np.zeros(self.num_slots, dtype=bool)
        members[slot] = True
        while True:  # each cycle feeds, flushes or steps it: it ends
            for event in self.cycle.run(members, endpoint=False):  # one event returned: no segment is split off
                if event.is_last:
                    return event

    def abort(self, stream_id: int) -> None:
        """Drop the stream now: its waiting audio and frames are discarded, no final event is built, and the slot is
        free at once (a client that went away; a server that discards a buffer). Its id is ended."""
        self.streams.refuse_while_stepping("abort a stream")
        self._free(self.streams.live_slot(stream_id, "abort", ending_ok=True))

    def end_segment(self, stream_id: int) -> StreamEvent:
        """The final event of the stream's current segment, now; the stream goes on (the endpointing hook).

        The event has the tokens since the previous segment (``is_final``, not ``is_last``, reason
        :attr:`EndReason.SEGMENT`); audio, caches and decoder state continue, and later events carry the next
        segment's tokens only, and its index. Audio pushed but not yet stepped belongs to the next segment.
        """
        self.streams.refuse_while_stepping("end a segment")
        slot = self.streams.live_slot(stream_id, "end a segment of")
        if self._beam:
            raise ValueError(
                f"stream {stream_id}: end_segment needs decoding='greedy' (a beam search may still replace the "
                "tokens a segment would keep); with decoding='beam' a stream has one segment"
            )
        (event,) = self.event_builder.end_segments([slot])
        return event

    def text(self, stream_id: int) -> str:
        """The stream's whole transcript so far (all segments)."""
        return self.transcriber.text(self.streams.live_slot(stream_id, "read", ending_ok=True))

    def token_ids(self, stream_id: int) -> list[int]:
        """The stream's token ids so far (all segments)."""
        return self.transcriber.token_ids(self.streams.live_slot(stream_id, "read", ending_ok=True))

    def decoded_seconds(self, stream_id: int) -> float:
        """Seconds of the stream's audio its transcript accounts for now: the feature frames stepped (the ``end`` of a
        partial event built now). It grows by one chunk per cycle that steps the stream."""
        return self.event_builder.stepped_seconds(self.streams.live_slot(stream_id, "read", ending_ok=True))

    def warm_up(self) -> WarmUpTimes:
        """Capture every CUDA graph now (:meth:`StreamingTranscriber.warm_up`) and launch every variant of the audio
        front end's kernels (:meth:`AudioFrontEnd.warm_up`, while no stream is open), before the first stream: a
        kernel compiled under load stalls every stream."""
        self.front.warm_up()
        return self.transcriber.warm_up()

    @property
    def busy(self) -> bool:
        """Whether a :meth:`poll` now has work: audio to feed, a chunk to step or a stream to end."""
        live = self.streams.live
        steps, _ = self.schedule.next_chunks(np.flatnonzero(live))
        return bool((live & ((self.inbox.pending_bytes > 0) | self.streams.ending)).any() or steps.size)

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
        live = self.streams.live
        if self.idle_timeout_seconds is not None:
            self.streams.end_idle(self.idle_timeout_seconds)
        self.cycle.speech_events = []
        return self.cycle.run(live, while_stepping=while_stepping)

    def _free(self, slot: int) -> None:
        self.utterances.close(slot)
        self.streams.remove(slot)
        self.inbox.drop(slot)
        self.front.close(slot)
        self.transcriber.close(slot)
