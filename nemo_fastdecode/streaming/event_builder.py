"""The engine's events: each stream's segments, and the text, tokens and words of its partial and final events.

:class:`EventBuilder` keeps per slot the current segment (index, first token, start in seconds) and what the last
partial event said (tokens and text), so that a greedy partial reads only its new tokens from the device and extends
the text (``TokenText.continued``); a final event ends the segment, and the next one starts with nothing said.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from nemo_fastdecode.streaming.events import EndReason, StreamEvent

if TYPE_CHECKING:
    from nemo_fastdecode.streaming.chunking import ChunkSchedule
    from nemo_fastdecode.streaming.frontend import AudioFrontEnd
    from nemo_fastdecode.streaming.streams import StreamTable
    from nemo_fastdecode.streaming.token_text import TokenText
    from nemo_fastdecode.streaming.transcriber import StreamingTranscriber
    from nemo_fastdecode.streaming.word_timestamps import WordTimestamps

__all__ = ["EventBuilder"]


class EventBuilder:
    """Partial and final events of the streams in ``streams``, their tokens read from ``transcriber``'s decoder."""

    def __init__(
        self,
        streams: StreamTable,
        transcriber: StreamingTranscriber,
        front: AudioFrontEnd,
        schedule: ChunkSchedule,
        token_text: TokenText,
        word_timestamps: WordTimestamps,
        *,
        beam: bool,
    ):
        self.streams, self.transcriber, self.front, self.schedule = streams, transcriber, front, schedule
        self._token_text, self._word_timestamps, self._beam = token_text, word_timestamps, beam
        num_slots = streams.num_slots
        self.reported = np.zeros(num_slots, dtype=np.int64)  # tokens of the stream when its last event was built
        self.segment = np.zeros(num_slots, dtype=np.int64)
        self.segment_token = np.zeros(num_slots, dtype=np.int64)  # first token of the current segment
        self.segment_start = np.zeros(num_slots, dtype=np.float64)  # seconds
        # greedy: the current segment's tokens and text as the last partial event said them (its next event reads
        # only the newer tokens from the device and extends the text)
        self._said_ids: list[list[int]] = [[] for _ in range(num_slots)]
        self._said_text: list[str] = [""] * num_slots

    def open(self, slot: int) -> None:
        self.reported[slot] = 0
        self.segment[slot] = self.segment_token[slot] = 0
        self.segment_start[slot] = 0.0
        self._said_ids[slot], self._said_text[slot] = [], ""

    def stepped_seconds(self, slot: int) -> float:
        """Seconds of the stream's audio its transcript accounts for: the feature frames stepped."""
        return int(self.schedule.stepped[slot]) * self.front.settings.hop / self.front.settings.sample_rate

    def grew(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``[N]`` bool: the streams' token counts grew since their last event (one device read); with beam search,
        the best beam changed. And (greedy) the ``[N]`` token counts read, ``None`` with beam search."""
        if slots.size == 0:
            return np.zeros(0, dtype=bool), None
        if self._beam:
            return self.transcriber.decoder.changed(slots), None
        counts = self.transcriber.decoder.token_counts(slots)
        return counts > self.reported[slots], counts

    def end_segments(
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
        events = self.events(slots, final=True, last=False, bounds=bounds, ends=ends, skip_empty=skip_empty)
        for event in events:
            slot = self.streams.slot_of[event.stream_id]
            self.segment[slot] += 1
            self.segment_token[slot] += len(event.token_ids)
            self.segment_start[slot] = event.end
        return events

    def events(
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
        :meth:`end_segments` takes them; ``counts``: the streams' token counts if already read, greedy only).

        The tokens come as one host array (greedy: read from the token storage, hypotheses built only for the events
        with word timestamps), their texts in one batch. Greedy partials cost their new tokens, not the segment: only
        the tokens after those the previous partial said are read, and its text is extended (``TokenText.continued``).
        """
        if not slots:
            return []
        streams = self.streams
        index = np.asarray(slots, dtype=np.int64)
        decoder = self.transcriber.decoder
        wants_words = [final or streams.options[slot].partial_words for slot in slots]
        firsts = self.segment_token[index]
        # tokens of the segment the last partial said (on the host); a cut at bounds counts them all again
        said = np.zeros_like(firsts) if self._beam or bounds is not None else self.reported[index] - firsts
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
        self.reported[index[keep]] = firsts[keep] + sizes
        logprobs = self._logprobs(slots, keep, firsts[keep], sizes) if final and not self._beam else {}
        stream_ids, segments = streams.stream_of[index].tolist(), self.segment[index].tolist()
        starts, firsts, sizes, new = self.segment_start[index].tolist(), firsts.tolist(), sizes.tolist(), new.tolist()
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
                token_ids = said_ids.copy() if streams.options[slot].partial_token_ids else None
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
                    reason=(streams.reason[slot] if last else EndReason.SEGMENT) if final else None,
                    segment=segments[i],
                    start=starts[i],
                    end=ends[i],
                    logprobs=logprobs.get(k),
                )
            )
        return events

    def _logprobs(
        self, slots: list[int], keep: np.ndarray, firsts: np.ndarray, sizes: np.ndarray
    ) -> dict[int, list[tuple[str, float]]]:
        """Per kept event ``k`` of a stream that asked for them: its tokens' ``(piece, log-probability)`` (tokens
        ``firsts[k]`` to ``firsts[k] + sizes[k]`` of its slot; a sentencepiece ``▁`` as a space)."""
        asking = [k for k, i in enumerate(keep.tolist()) if self.streams.options[slots[i]].token_logprobs]
        if not asking:
            return {}
        index = np.asarray([slots[i] for i in keep[asking].tolist()], dtype=np.int64)
        starts, stops = firsts[asking], firsts[asking] + sizes[asking]
        decoder = self.transcriber.decoder
        labels, _ = decoder.token_rows(index, starts, stops)
        values = decoder.token_logprob_rows(index, starts, stops)
        out = {}
        for row, (k, size) in enumerate(zip(asking, sizes[asking].tolist(), strict=True)):
            pieces = [piece.replace("\u2581", " ") for piece in self._token_text.pieces(labels[row, :size])]
            out[k] = list(zip(pieces, values[row, :size].tolist(), strict=True))
        return out
