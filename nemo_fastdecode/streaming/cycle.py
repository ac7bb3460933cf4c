"""One cycle of the streaming engine over its streams: audio in, features, one batched step, events out.

1. every stream's waiting audio (at most one cycle's, and only while fewer than a chunk of its frames wait to be
   stepped) goes into the front end in one copy; the front end computes the new feature frames of all streams
   (ended streams: their last frames); the VAD reads the new samples;
2. ONE transcriber step advances every stream that has a chunk (streams behind by more than a chunk step again, up to
   ``max_chunks_per_cycle`` times);
3. events: utterance ends, a partial event for every stream whose transcript grew, a final event for every stream
   that is over (its slot is freed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from nemo_fastdecode.streaming.events import SpeechEvent, StreamEvent

if TYPE_CHECKING:
    from nemo_fastdecode.streaming.chunking import ChunkSchedule, FeatureQueue
    from nemo_fastdecode.streaming.event_builder import EventBuilder
    from nemo_fastdecode.streaming.frontend import AudioFrontEnd
    from nemo_fastdecode.streaming.inbox import AudioInbox
    from nemo_fastdecode.streaming.pcm import PcmInput
    from nemo_fastdecode.streaming.streams import StreamTable
    from nemo_fastdecode.streaming.transcriber import StreamingTranscriber
    from nemo_fastdecode.streaming.utterance_ends import UtteranceEnds

__all__ = ["EngineCycle"]


class EngineCycle:
    """The engine's cycle over its parts (see the module docstring).

    Args:
        max_chunks_per_cycle: most chunks one stream steps in a cycle.
        cycle_samples: most samples of one stream fed to the front end per cycle, at the model's rate (a stream at
            another rate gets as many seconds of its own samples).
        max_chunk: frames of the schedule's largest chunk (a stream is fed while fewer than this many wait).
        end_frames: ``[F, S]`` float32 columns of the preprocessor's ``pad_value``: with them, each stream's last
            feature frame is followed by one masked frame (NeMo's streaming script); ``None``: no such frame.
        free: frees a slot whose stream's final event was built.
    """

    def __init__(
        self,
        streams: StreamTable,
        pcm: PcmInput,
        inbox: AudioInbox,
        front: AudioFrontEnd,
        schedule: ChunkSchedule,
        queue: FeatureQueue,
        transcriber: StreamingTranscriber,
        utterances: UtteranceEnds,
        events: EventBuilder,
        *,
        max_chunks_per_cycle: int,
        cycle_samples: int,
        max_chunk: int,
        end_frames: torch.Tensor | None,
        free: Callable[[int], None],
    ):
        self.streams, self.pcm, self.inbox, self.front = streams, pcm, inbox, front
        self.schedule, self.queue, self.transcriber = schedule, queue, transcriber
        self.utterances, self.events = utterances, events
        self.max_chunks_per_cycle, self._cycle_samples, self._max_chunk = max_chunks_per_cycle, cycle_samples, max_chunk
        self._end_frames, self._free = end_frames, free
        self.speech_events: list[SpeechEvent] = []
        """The VAD's speech starts and stops found by the cycles since the engine last reset this list."""

    def run(
        self, members: np.ndarray, endpoint: bool = True, while_stepping: Callable[[], None] | None = None
    ) -> list[StreamEvent]:
        """Feed, compute features, step and report the streams in ``members`` (``[S]`` bool); ``endpoint``: end
        utterances where the streams' rules say so; ``while_stepping``: called once the step is queued, before its
        results are read back (it may only push audio)."""
        streams, pcm, schedule, utterances = self.streams, self.pcm, self.schedule, self.utterances
        streams.refuse_while_stepping("poll")
        live = members & streams.live
        # 1. audio in: one copy for every stream fed; features for every stream (ended ones: their last frames)
        feed = live & (self.inbox.pending_bytes > 0) & (schedule.backlog < self._max_chunk)
        fed = np.flatnonzero(feed)  # each takes at most one cycle's audio; the rest waits
        # a cycle's samples at the model's rate, in each stream's own rate and bytes
        staged = self.inbox.take(fed, self.front.input_samples(fed, self._cycle_samples) * pcm.itemsize[fed])
        if staged is not None:
            self.front.append_staged(staged)
        flush = live & streams.ending & (self.inbox.pending_bytes == 0) & ~streams.flushed
        for slot in np.flatnonzero(flush).tolist():
            pcm.drop_split_sample(slot, int(streams.stream_of[slot]))
        out = self.front.features(flush=np.flatnonzero(flush))
        streams.flushed |= flush
        heard = live & utterances.vad_on & (feed | flush)  # the VAD reads the rings before the next append
        if heard.any():
            self.speech_events += utterances.hear(
                np.flatnonzero(heard), np.flatnonzero(flush & heard), streams.stream_of, self.events.segment
            )
        self.queue.write(out.slots, out.starts, out.counts, out.features)
        schedule.add(out.slots, out.counts)
        if self._end_frames is not None and out.ended.size:
            self._append_end_frames(out.ended)
        schedule.end(out.ended)
        if (schedule.backlog > self.queue.capacity).any():  # the feed policy above rules this out
            raise RuntimeError("a stream's waiting feature frames overflowed the engine's feature queue")
        # 2. one step of every stream that has a chunk; those with another one waiting step again (catching up)
        stepped, lengths = schedule.next_chunks(np.flatnonzero(live))
        again = stepped
        for _ in range(self.max_chunks_per_cycle):
            if again.size == 0:
                break
            batch = self.queue.read(again, schedule.stepped[again], lengths)
            self.transcriber.step(again, batch, lengths=lengths)
            schedule.advance(again, lengths)
            again, lengths = schedule.next_chunks(again[~(utterances.endpointed[again] | utterances.vad_on[again])])
        if while_stepping is not None:
            streams.stepping = True
            try:
                while_stepping()
            finally:
                streams.stepping = False
        # 3. events: utterance ends, partial for the streams whose tokens grew, final for the streams that are over
        ending = np.flatnonzero(live & streams.flushed)
        done = ending[schedule.done(ending)]
        builder = self.events
        if endpoint:
            rules_on = stepped[utterances.endpointed[stepped]]
            events = utterances.endpoint(rules_on, done, builder.segment_token, builder.end_segments)
        else:
            events = []
        stepped = np.setdiff1d(stepped, done, assume_unique=True)
        grew, counts = builder.grew(stepped)
        counts = None if counts is None else counts[grew]
        events += builder.events(stepped[grew].tolist(), final=False, last=False, counts=counts)
        events += builder.events(done.tolist(), final=True, last=True)
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
