"""Where a stream's utterances end, in the engine's cycle: Silero VAD's speech ends, NeMo's blank-run rule.

Per slot, the stream's rules (:class:`~nemo_fastdecode.streaming.events.EndpointingOptions`). The VAD
(:class:`~nemo_fastdecode.streaming.vad.BatchedVAD`, on the front end's samples) reports speech starts and stops and
the points where silences were confirmed; each such *cut* waits until the decoder has passed its first encoder frame,
then the segment ends with the tokens before it. The blank-run rule
(:class:`~nemo_fastdecode.streaming.endpointing.BlankRunEndpointer`) ends the segment with every token so far.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from nemo_fastdecode.streaming.endpointing import BlankRunEndpointer
from nemo_fastdecode.streaming.events import EndpointingOptions, SpeechEvent, StreamEvent
from nemo_fastdecode.streaming.vad import BatchedVAD, SpeechEnds, SpeechMarks

if TYPE_CHECKING:
    from nemo_fastdecode.streaming.frontend import AudioFrontEnd
    from nemo_fastdecode.streaming.transcriber import StreamingTranscriber

__all__ = ["UtteranceEnds"]

_NEVER = np.iinfo(np.int64).max

#: ``end_segments(slots, bounds, ends, skip_empty)``: the final events of those streams' segments
EndSegments = Callable[..., list[StreamEvent]]


class UtteranceEnds:
    """The streams' endpointing rules and the VAD's cuts waiting for the decoder.

    Args:
        front: the engine's front end (the VAD reads its sample rings).
        transcriber: the engine's transcriber (the rules read its decoder).
        frame_samples: audio samples per encoder frame.
        ms_per_frame: milliseconds per encoder frame (NeMo's timestamps).
        vad: load Silero VAD now (else the first stream that asks for it loads it).
    """

    def __init__(
        self,
        front: AudioFrontEnd,
        transcriber: StreamingTranscriber,
        frame_samples: int,
        ms_per_frame: float,
        *,
        vad: bool,
    ):
        num_slots = transcriber.num_slots
        self.front, self.transcriber, self.device = front, transcriber, transcriber.device
        self._frame_samples = frame_samples
        self._blank_run = BlankRunEndpointer(num_slots, ms_per_frame, self.device)
        self.vad: BatchedVAD | None = BatchedVAD(front) if vad else None
        self.vad_on = np.zeros(num_slots, dtype=bool)
        self.endpointed = np.zeros(num_slots, dtype=bool)  # any rule on
        # the VAD's ends waiting for the decoder to pass them: (encoder frame, sample), oldest first
        self._cuts: list[list[tuple[int, int]]] = [[] for _ in range(num_slots)]
        self._next_cut = np.full(num_slots, _NEVER, dtype=np.int64)  # frame of the first cut

    def load(self, options: EndpointingOptions) -> None:
        """Load Silero VAD if ``options`` asks for it and it is not loaded yet."""
        if options.vad and self.vad is None:
            self.vad = BatchedVAD(self.front)

    def open(self, slot: int, options: EndpointingOptions) -> None:
        self.vad_on[slot], self.endpointed[slot] = options.vad, options.enabled
        if options.vad:
            self.vad.open(slot, options)
        self._blank_run.open(slot, options)
        self._cuts[slot].clear()
        self._next_cut[slot] = _NEVER

    def close(self, slot: int) -> None:
        self._cuts[slot].clear()

    def hear(
        self, slots: np.ndarray, flush: np.ndarray, stream_of: np.ndarray, segment: np.ndarray
    ) -> list[SpeechEvent]:
        """Run the VAD on the new samples of ``slots`` (``flush``: those that ended), after the front end's append
        and before the next one overwrites its rings; keep its speech ends as cuts. Returns its speech starts and
        stops (``stream_of``, ``segment``: per slot, the stream id and its current segment)."""
        vad = self.vad.process(slots, flush)
        events = self._speech_events(vad.marks, vad.ends, stream_of, segment)
        self._queue_cuts(vad.ends)
        return events

    def _speech_events(
        self, marks: SpeechMarks, ends: SpeechEnds, stream_of: np.ndarray, segment: np.ndarray
    ) -> list[SpeechEvent]:
        """The VAD's marks as :class:`SpeechEvent` s; ``segment``: the stream's current one, past the utterance ends
        still waiting for the decoder and those found earlier in this same call."""
        if marks.slots.size == 0:
            return []
        rate = self.front.settings.sample_rate
        events = []
        for slot, sample, started in zip(
            marks.slots.tolist(), marks.samples.tolist(), marks.started.tolist(), strict=True
        ):
            earlier = int(((ends.slots == slot) & (ends.ends < sample)).sum())
            events.append(
                SpeechEvent(
                    stream_id=int(stream_of[slot]),
                    started=bool(started),
                    seconds=sample / rate,
                    segment=int(segment[slot]) + len(self._cuts[slot]) + earlier,
                )
            )
        return events

    def _queue_cuts(self, ends: SpeechEnds) -> None:
        """Keep the VAD's speech ends until the decoder passes them: the first encoder frame at or after the sample
        where the silence was confirmed (tokens before it end the utterance), and that sample."""
        frames = -(-ends.decided // self._frame_samples)
        for slot, frame, sample in zip(ends.slots.tolist(), frames.tolist(), ends.decided.tolist(), strict=True):
            self._cuts[slot].append((frame, sample))
            self._next_cut[slot] = self._cuts[slot][0][0]

    def endpoint(
        self, slots: np.ndarray, done: np.ndarray, segment_token: np.ndarray, end_segments: EndSegments
    ) -> list[StreamEvent]:
        """Utterance ends of the streams that just stepped (``slots``, rules on): the VAD's ends the decoder has
        passed, oldest first, then NeMo's blank-run rule (not for ``done`` streams: their last event follows).
        ``segment_token``: per slot, the first token of the current segment (read after the VAD's ends moved it);
        ``end_segments`` builds the segments' final events (:meth:`EventBuilder.end_segments`)."""
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
                self._next_cut[slot] = self._cuts[slot][0][0] if self._cuts[slot] else _NEVER
            rate = self.front.settings.sample_rate
            bounds, ends = [frame for frame, _ in cuts], [sample / rate for _, sample in cuts]
            events += end_segments(slots[ready].tolist(), bounds, ends, skip_empty=True)
        quiet = (blank > 0) & (counts > segment_token[slots]) & ~np.isin(slots, done)
        return events + end_segments(slots[quiet].tolist())
