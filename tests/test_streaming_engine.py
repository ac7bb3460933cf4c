"""StreamingEngine (streaming/engine.py): PCM pushed in any pieces, at any time, by streams that come and go, gives
every stream the tokens, text and word timestamps of NeMo's cache-aware streaming of that stream alone: NeMo's
``CacheAwareStreamingAudioBuffer`` over the preprocessor's features of the whole file, then the encoder's
``cache_aware_stream_step`` and the model's decoding (``nemo_alone``, the streaming script's loop). NeMo's streaming
inference framework (``CacheAwareRNNTPipeline``) is compared in test_streaming_engine_pipeline.py."""

from __future__ import annotations

import copy
import dataclasses
import textwrap

import numpy as np
import pytest
import torch
from conftest import nemo_alone, tiny_streaming_model, whole_file_features
from nemo.collections.asr.parts.utils.timestamp_utils import process_timestamp_outputs

from fastdecode_lab import synthetic as S
from nemo_fastdecode.apps.comparison import as_int_list
from nemo_fastdecode.streaming import (
    CapacityError,
    EndpointingOptions,
    EndReason,
    StreamEndedError,
    StreamError,
    StreamingEngine,
    StreamingGeometry,
    StreamOptions,
    UnknownStreamError,
    split_features,
)
from nemo_fastdecode.streaming import engine as engine_module
from nemo_fastdecode.streaming.chunking import ChunkSchedule, FeatureQueue

pytestmark = pytest.mark.usefixtures("single_thread")

RATE = 16000
# samples per stream, around the chunk schedules of [16, 3] (a first chunk of 25 frames, then 32; a later chunk under
# 8 frames is dropped, as NeMo drops it) and [16, 1] (9, then 16): empty, under one frame, under a first chunk,
# exactly one, dropped and kept tails, a few seconds
LENGTHS = [0, 150, 1650, 4033, 9997, 17599, 41600, 20000]
# (preset, look-ahead): the hybrid RNN-T/CTC model and a pure RNN-T one
CASES = [("tiny-streaming", [16, 3]), ("tiny-rnnt-streaming", [16, 1])]


@pytest.fixture(scope="module")
def audio() -> list[np.ndarray]:
    """int16 PCM per stream (synthetic speech-like signals on the int16 grid)."""
    signals = S.synthetic_audio([max(n, RATE) / RATE for n in LENGTHS], seed=5)
    return [np.round(s[:n] * 32768).astype(np.int16) for s, n in zip(signals, LENGTHS, strict=True)]


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {preset: tiny_streaming_model(preset) for preset, _ in CASES}


def nemo_words(model, hyp) -> list[dict]:
    """NeMo's word timestamps of a hypothesis, as ``transcribe(timestamps=True)`` computes them."""
    hyp = model.decoding.compute_rnnt_timestamps(copy.copy(hyp), "word")
    (hyp,) = process_timestamp_outputs([hyp], model.encoder.subsampling_factor, model.cfg.preprocessor.window_stride)
    return hyp.timestamp["word"]


def references(model, att, audio) -> list[tuple[list[int], str, list[dict]]]:
    """(a): NeMo's streaming of each stream alone over its whole-file features: tokens, text, words."""
    model.encoder.set_default_att_context_size(att)
    out = []
    for pcm in audio:
        if len(pcm) < model.preprocessor.featurizer.hop_length:  # no feature frame: nothing to decode
            out.append(([], "", []))
            continue
        _, hyp, _ = nemo_alone(model, whole_file_features(model, pcm))
        out.append((as_int_list(hyp.y_sequence), hyp.text, nemo_words(model, hyp)))
    assert sum(len(ids) for ids, _, _ in out) > 0  # there is something to compare
    return out


@pytest.fixture(scope="module")
def cases(models, audio):
    return {preset: (models[preset], att, references(models[preset], att, audio)) for preset, att in CASES}


def check_final(event, reference, stream):
    ids, text, words = reference
    assert event.is_final and event.is_last and event.segment == 0, stream
    assert event.token_ids == ids, stream
    assert event.text == text, stream
    assert event.words == words, stream


# ----------------------------------------------------------------------------------------------
# exactness: random pushes of streams that come and go


class Driver:
    """Streams open while slots are free, push random pieces (bytes with odd counts and split samples, int16 or
    float32 arrays, empty pushes), poll at random, and end by ``finish`` (final from a poll) or ``close``."""

    KINDS = ["bytes", "int16", "float32", "float32-bytes"]

    def __init__(self, engine: StreamingEngine, audio: list[np.ndarray], seed: int):
        self.engine, self.audio = engine, audio
        self.rng = np.random.default_rng(seed)
        self.kinds = [self.KINDS[i % len(self.KINDS)] for i in range(len(audio))]
        self.payloads = [self._payload(pcm, kind) for pcm, kind in zip(audio, self.kinds, strict=True)]
        self.waiting = list(range(len(audio)))
        self.ids: dict[int, int] = {}  # stream index -> engine id
        self.sent = [0] * len(audio)
        self.finals: dict[int, object] = {}
        self.partials: dict[int, list] = {i: [] for i in range(len(audio))}
        self.refused = 0
        self.batches: list[int] = []  # streams per transcriber step
        step = engine.transcriber.step
        engine.transcriber.step = lambda slots, *args, **kwargs: (
            self.batches.append(len(slots)) or step(slots, *args, **kwargs)
        )

    @staticmethod
    def _payload(pcm: np.ndarray, kind: str):
        if kind == "bytes":
            return pcm.tobytes()
        if kind == "int16":
            return pcm
        floats = (pcm.astype(np.float32) / 32768).astype(np.float32)  # exactly NeMo's reading of the int16 file
        return floats.tobytes() if kind == "float32-bytes" else floats

    def _options(self, stream: int) -> StreamOptions:
        return StreamOptions(sample_format="int16" if self.kinds[stream] in ("bytes", "int16") else "float32")

    def poll(self) -> None:
        steps = len(self.batches)
        self._record(self.engine.poll())
        # one step per cycle for every stream that has a chunk, then again for those still behind (catching up)
        assert len(self.batches) - steps <= self.engine.max_chunks_per_cycle

    def _record(self, events) -> None:
        index = {engine_id: stream for stream, engine_id in self.ids.items()}
        for event in events:
            stream = index[event.stream_id]
            if event.is_last:
                self.finals[stream] = event
                del self.ids[stream]
            else:
                self.partials[stream].append(event)

    def run(self, poll_share: float = 0.7) -> None:
        engine, rng = self.engine, self.rng
        while self.waiting or self.ids:
            if self.waiting and rng.random() < 0.5:
                try:
                    self.ids[self.waiting[0]] = engine.open(self._options(self.waiting[0]))
                    self.waiting.pop(0)
                except CapacityError as error:  # every slot busy: try again later
                    assert error.capacity == engine.num_slots
                    self.refused += 1
            for stream, engine_id in list(self.ids.items()):
                if rng.random() < 0.3 or engine_id not in engine.open_streams:
                    continue
                payload = self.payloads[stream]
                if self.sent[stream] < len(payload):
                    size = int(rng.choice([0, 1, 2, 3, 5, 7, int(rng.integers(1, 6000))]))
                    engine.push(engine_id, payload[self.sent[stream] : self.sent[stream] + size])
                    self.sent[stream] += size
                elif rng.random() < 0.5:
                    self.finals[stream] = engine.close(engine_id)
                    del self.ids[stream]
                elif rng.random() < 0.5:
                    engine.finish(engine_id)
            if rng.random() < poll_share:
                self.poll()
        while engine.busy:
            self.poll()

    def check(self, refs) -> None:
        assert sorted(self.finals) == list(range(len(self.audio)))
        for stream, reference in enumerate(refs):
            final = self.finals[stream]
            check_final(final, reference, stream)
            assert final.reason is EndReason.END and final.end == len(self.audio[stream]) / RATE
            previous = 0
            for event in self.partials[stream]:  # partial events: the transcript grew, a prefix of the final one
                assert not event.is_final and event.words is None and event.reason is None
                assert previous < len(event.token_ids) and event.token_ids == final.token_ids[: len(event.token_ids)]
                assert event.text == self.engine.model.decoding.decode_ids_to_str(event.token_ids)
                previous = len(event.token_ids)
        assert self.engine.open_streams == [] and not self.engine.busy


@pytest.mark.parametrize(("preset", "seed"), [(CASES[0][0], 0), (CASES[1][0], 1)])
def test_any_pushes_of_streams_that_come_and_go_give_nemo_streaming_alone(cases, audio, preset, seed):
    model, att, refs = cases[preset]
    engine = StreamingEngine(model, num_slots=3, att_context_size=att, max_cycle_seconds=0.25)
    driver = Driver(engine, audio, seed)
    driver.run()
    driver.check(refs)
    assert driver.refused > 0  # more streams than slots: some waited for a free slot
    assert max(driver.batches) > 1  # streams at different positions stepped together
    assert sum(len(p) for p in driver.partials.values()) > 0


def test_one_push_per_stream_and_one_poll_per_push_also_match(cases, audio):
    """The other extreme: whole files pushed at once (many cycles of backlog), then drained by polls."""
    model, att, refs = cases[CASES[1][0]]
    engine = StreamingEngine(model, num_slots=len(audio), att_context_size=att)
    ids = [engine.open() for _ in audio]
    for stream_id, pcm in zip(ids, audio, strict=True):
        engine.push(stream_id, pcm)
        engine.finish(stream_id)
    finals = {}
    while engine.busy:
        finals.update({e.stream_id: e for e in engine.poll() if e.is_last})
    for stream, stream_id in enumerate(ids):
        check_final(finals[stream_id], refs[stream], stream)


def finish_and_check(engine, ids, refs):
    """Finish every stream, drain the engine, and check each final against NeMo's streaming of its file alone."""
    for stream_id in ids:
        engine.finish(stream_id)
    finals = {}
    while engine.busy:
        finals.update({e.stream_id: e for e in engine.poll() if e.is_last})
    assert sum(len(finals[i].token_ids) for i in ids) > 0  # there is something to compare
    for stream, stream_id in enumerate(ids):
        check_final(finals[stream_id], refs[stream], stream)


def test_a_pushed_buffer_may_be_reused_as_soon_as_push_returns(cases, audio):
    """push copies the audio into the engine's inbox before it returns: a client that refills one bytearray, one
    numpy array or one memoryview for every piece (as a socket reader does) still gets NeMo's tokens."""
    model, att, refs = cases[CASES[1][0]]
    engine = StreamingEngine(model, num_slots=len(audio), att_context_size=att)
    ids = [engine.open() for _ in audio]
    piece = 1001  # odd byte counts: split samples wait in the engine as a copy too
    buffers = {"bytearray": bytearray(piece), "array": np.zeros(piece // 2, dtype=np.int16)}
    for offset in range(0, max(len(pcm) for pcm in audio) * 2, piece):
        for stream, (stream_id, pcm) in enumerate(zip(ids, audio, strict=True)):
            data = pcm.tobytes()[offset : offset + piece]
            if not data:
                continue
            kind = ("bytearray", "memoryview", "array")[stream % 3]
            if kind == "array" and len(data) % 2 == 0 and offset % 2 == 0:
                array = buffers["array"][: len(data) // 2]
                array[:] = np.frombuffer(data, dtype=np.int16)
                engine.push(stream_id, array)
                array[:] = 12345  # overwritten before the engine ever steps
            else:  # the same bytearray object refilled (a full piece), or a view of it
                buffer = buffers["bytearray"]
                buffer[: len(data)] = data
                pushed = buffer if len(data) == piece and kind == "bytearray" else memoryview(buffer)[: len(data)]
                engine.push(stream_id, pushed)
                buffer[:] = b"\x7f" * len(buffer)
        engine.poll()
    finish_and_check(engine, ids, refs)


def test_push_many_is_push_in_order(cases, audio):
    """A server's batch of pushes (push_many): int16 pieces of any byte count (split samples), float32 streams and
    empty pieces, several per stream, interleaved; the finals equal NeMo's as with one push() per piece."""
    model, att, refs = cases[CASES[1][0]]
    engine = StreamingEngine(model, num_slots=len(audio), att_context_size=att)
    kinds = ["int16" if i % 3 else "float32" for i in range(len(audio))]
    data = [
        pcm.tobytes() if kind == "int16" else (pcm.astype(np.float32) / 32768).astype("<f4").tobytes()
        for pcm, kind in zip(audio, kinds, strict=True)
    ]
    ids = [engine.open(StreamOptions(sample_format=kind)) for kind in kinds]
    rng, sent = np.random.default_rng(3), [0] * len(audio)
    while any(s < len(d) for s, d in zip(sent, data, strict=True)):
        pieces, who = [], []
        for stream in rng.integers(0, len(audio), 12).tolist():
            size = int(rng.choice([0, 1, 3, 4, 2560, 4001]))
            pieces.append(data[stream][sent[stream] : sent[stream] + size])
            sent[stream] += len(pieces[-1])
            who.append(ids[stream])
        bounds = np.cumsum([0] + [len(piece) for piece in pieces])
        assert engine.push_many(who, b"".join(pieces), bounds[:-1], bounds[1:]) == len(who)
        engine.poll()
    finish_and_check(engine, ids, refs)


def test_push_many_stops_at_the_first_refused_push(cases):
    model, att, _ = cases[CASES[1][0]]
    engine = StreamingEngine(model, num_slots=3, att_context_size=att)
    a, b, c = engine.open(), engine.open(), engine.open()
    engine.finish(b)
    bounds = np.arange(0, 5 * 320, 320)  # four pieces of 160 samples
    applied = engine.push_many([a, c, b, a], bytes(4 * 320), bounds[:-1], bounds[1:])
    assert applied == 2  # b was finished: its push and the one after it are not applied
    assert engine.inbox.pending_bytes.tolist() == [320, 0, 320]  # slots 0, 1, 2: the lowest free, in order
    with pytest.raises(StreamEndedError, match=f"stream {b}"):
        engine.push(b, bytes(320))


@pytest.mark.parametrize("max_chunks", [1, 3])
def test_decoded_seconds_grows_by_the_chunks_of_a_cycle_and_is_the_partial_events_end(cases, audio, max_chunks):
    """A stream far behind (2.6 s pushed at once) steps ``max_chunks_per_cycle`` chunks in each cycle (one, or
    catching up three at a time); its partial events end where its decoder is; the final is NeMo's either way."""
    model, att, refs = cases[CASES[1][0]]
    engine = StreamingEngine(model, num_slots=1, att_context_size=att, max_chunks_per_cycle=max_chunks)
    g = engine.geometry
    stream = engine.open()
    engine.push(stream, audio[6])  # 2.6 s at once: many chunks wait
    seen = [engine.decoded_seconds(stream)]
    while engine.busy:
        events = [e for e in engine.poll() if not e.is_final]
        seen.append(engine.decoded_seconds(stream))
        assert all(e.end == seen[-1] for e in events)
        if len(seen) > 3:
            break
    frames = [g.first_chunk + (k * max_chunks - 1) * g.chunk for k in range(1, 4)]
    assert seen[:4] == [0.0, *(f / 100 for f in frames)]
    engine.finish(stream)
    finals = []
    while engine.busy:
        finals += [e for e in engine.poll() if e.is_last]
    check_final(finals[0], refs[6], 6)
    with pytest.raises(StreamEndedError):
        engine.decoded_seconds(stream)


def test_streams_with_endpointing_step_one_chunk_a_cycle_while_the_others_catch_up(cases, audio):
    """Catching up is for streams without utterance-end rules: one with NeMo's blank-run rule steps one chunk a cycle
    (its ends are decided chunk by chunk), one without steps several; both end with NeMo's tokens."""
    model, att, refs = cases[CASES[1][0]]
    engine = StreamingEngine(model, num_slots=2, att_context_size=att, max_chunks_per_cycle=3)
    plain = engine.open()
    ruled = engine.open(StreamOptions(endpointing=EndpointingOptions(blank_run_ms=800.0)))
    for stream in (plain, ruled):
        engine.push(stream, audio[6])
    engine.poll()
    g = engine.geometry
    assert engine.decoded_seconds(plain) == (g.first_chunk + 2 * g.chunk) / 100
    assert engine.decoded_seconds(ruled) == g.first_chunk / 100
    for stream in (plain, ruled):
        engine.finish(stream)
    events = {plain: [], ruled: []}
    while engine.busy:
        for event in engine.poll():
            events[event.stream_id].append(event)
    check_final(events[plain][-1], refs[6], 6)
    said = [e for e in events[ruled] if e.is_final]  # its segments joined are the stream's tokens
    assert [t for e in said for t in e.token_ids] == refs[6][0]


def test_max_chunks_per_cycle_is_checked(cases):
    model, att, _ = cases[CASES[1][0]]
    for bad in (0, -1, 2.0, None):
        with pytest.raises(ValueError, match="max_chunks_per_cycle must be an int >= 1, got"):
            StreamingEngine(model, num_slots=1, att_context_size=att, max_chunks_per_cycle=bad)


# ----------------------------------------------------------------------------------------------
# bad input: a clear error for the stream at fault, nothing lost for the others


def test_bad_input_leaves_the_other_streams_exact(cases, audio):
    model, att, refs = cases[CASES[0][0]]
    now = [0.0]
    engine = StreamingEngine(model, num_slots=3, att_context_size=att, idle_timeout_seconds=5.0, clock=lambda: now[0])
    good = [6, 5]  # two streams pushed in odd-sized byte pieces throughout
    ids = [engine.open() for _ in good]
    blobs = [audio[i].tobytes() for i in good]
    sent = [0, 0]
    bad = engine.open(StreamOptions(sample_format="float32"))

    def push_good(rounds: int) -> None:
        for _ in range(rounds):
            for k, stream_id in enumerate(ids):
                engine.push(stream_id, blobs[k][sent[k] : sent[k] + 1601])  # odd: every other push splits a sample
                sent[k] += 1601
            engine.poll()

    push_good(3)
    floats = np.linspace(-0.5, 0.5, 800, dtype=np.float32)
    engine.push(bad, floats.tobytes()[:7])  # 1 sample and 3 bytes: the rest of the sample comes next
    with pytest.raises(StreamError, match=rf"stream {bad}: 3 byte\(s\) of a split sample wait for the rest"):
        engine.push(bad, floats[1:])
    for value, name in ((np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")):
        broken = floats.copy()
        broken[123] = value
        with pytest.raises(StreamError, match=rf"stream {bad}: non-finite sample {name} at sample 123; audio must"):
            engine.push(bad, broken.tobytes()[7:])  # completes the split sample, then sample 123 is bad
    engine.push(bad, floats.tobytes()[7:])  # the refused pushes changed nothing: this completes sample 1
    broken[123] = np.nan
    with pytest.raises(StreamError, match=rf"stream {bad}: non-finite sample nan at sample 923"):
        engine.push(bad, broken)  # an array: samples 800 on
    with pytest.raises(StreamError, match=rf"stream {bad}: an array of dtype int16 was pushed to a float32 stream"):
        engine.push(bad, np.zeros(10, dtype=np.int16))
    with pytest.raises(StreamError, match=r"audio must be mono, a 1-D array; got shape \(10, 2\) \(2 channels\)"):
        engine.push(bad, np.zeros((10, 2), dtype=np.float32))
    with pytest.raises(StreamError, match=r"audio must be bytes or a 1-D numpy array, got list"):
        engine.push(bad, [0.0] * 10)
    with pytest.raises(StreamError, match=r"an array of dtype float64 was pushed to a float32 stream"):
        engine.push(bad, np.zeros(10))
    engine.push(bad, b"")  # empty pushes are fine
    engine.push(bad, np.zeros(0, dtype=np.float32))
    with pytest.raises(UnknownStreamError, match=rf"cannot push audio to stream 99: no such stream; open streams: "
                       rf"{ids[0]}, {ids[1]}, {bad}"):  # fmt: skip
        engine.push(99, b"\0\0")
    with pytest.raises(UnknownStreamError, match=r"stream ids are ints, got 'a' \(str\)"):
        engine.push("a", b"\0\0")
    with pytest.raises(CapacityError, match=r"all 3 stream slots are in use") as refused:
        engine.open()
    assert refused.value.capacity == 3 and isinstance(refused.value, RuntimeError)
    push_good(2)
    # the float stream ends mid-sample: its dangling bytes are dropped with a warning naming it
    engine.push(bad, b"\0\0")
    with pytest.warns(UserWarning, match=rf"stream {bad} ends with 2 byte\(s\) of an incomplete float32 sample"):
        final = engine.close(bad)
    assert final.is_last and final.end == 800 / RATE
    for options, message in (
        (
            StreamOptions(sample_rate=8001),
            r"sample rate 8001 Hz is not supported; valid: 8000, 11025, .*, 48000 Hz \(the model runs at 16000 Hz",
        ),
        (StreamOptions(channels=2), r"2 channels are not supported; valid: 1 \(mono\)"),
        (
            StreamOptions(sample_format="ulaw"),
            r"sample format 'ulaw' is not supported; valid: 'int16', 'float32', 'mulaw', 'alaw'",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            engine.open(options)
    with pytest.raises(StreamEndedError, match=rf"cannot push audio to stream {bad}: it has ended"):
        engine.push(bad, floats)
    with pytest.raises(StreamEndedError, match=rf"cannot close stream {bad}: it has ended"):
        engine.close(bad)
    # a stream that stops pushing forever: the idle timeout ends it in a poll, its final event comes, the slot frees
    quiet = engine.open()
    engine.push(quiet, audio[3][:2000])
    push_good(2)
    now[0] += 4.0
    engine.push(quiet, audio[3][2000:])
    now[0] += 4.0  # 4 s since its last push: not yet
    push_good(1)
    assert quiet in engine.open_streams
    now[0] += 1.5  # the good streams pushed just now; the quiet one 5.5 s ago
    events = engine.poll()
    while quiet in engine.open_streams:  # its remaining frames may take a few cycles
        events += engine.poll()
    timed_out = [e for e in events if e.stream_id == quiet]
    assert [e.reason for e in timed_out] == [EndReason.IDLE_TIMEOUT] and timed_out[0].is_last
    check_final(timed_out[0], refs[3], "idle stream")
    assert quiet not in engine.open_streams
    with pytest.raises(StreamEndedError, match=rf"cannot push audio to stream {quiet}: it has ended"):
        engine.push(quiet, b"\0\0")
    assert engine.open() not in ids  # its slot serves a new stream
    # the good streams: the rest, then their finals are exact
    for k, stream_id in enumerate(ids):
        engine.push(stream_id, blobs[k][sent[k] :])
        final = engine.close(stream_id)
        check_final(final, refs[good[k]], good[k])


def test_finish_then_push_is_refused_and_the_final_comes_from_poll(cases, audio):
    model, att, refs = cases[CASES[0][0]]
    engine = StreamingEngine(model, num_slots=2, att_context_size=att)
    a = engine.open()
    engine.push(a, audio[4])
    engine.finish(a)
    engine.finish(a)  # again: nothing
    with pytest.raises(StreamEndedError, match=rf"cannot push audio to stream {a}: it was finished; its final"):
        engine.push(a, audio[4])
    assert engine.text(a) == "" and engine.token_ids(a) == []
    events = []
    while engine.busy:
        events += engine.poll()
    assert [e.is_last for e in events if e.is_final] == [True]
    check_final(events[-1], refs[4], 4)
    empty = engine.open()
    final = engine.close(empty)  # no audio at all: an empty final event
    assert (final.text, final.token_ids, final.words, final.end) == ("", [], [], 0.0)


def test_abort_frees_the_slot_at_once_without_an_event_and_the_others_stay_exact(cases, audio):
    """A client that goes away mid-chunk: its stream is dropped now (no final), the slot reused at once."""
    model, att, refs = cases[CASES[0][0]]
    engine = StreamingEngine(model, num_slots=2, att_context_size=att)
    kept, dropped = engine.open(), engine.open()
    engine.push(kept, audio[6][:9000])
    engine.push(dropped, audio[5][:7001])  # waiting audio and a split sample
    engine.poll()
    engine.push(dropped, audio[5][7001:9000])
    engine.finish(dropped)  # an ending stream aborts too
    engine.abort(dropped)
    assert engine.open_streams == [kept]
    with pytest.raises(StreamEndedError, match=rf"cannot push audio to stream {dropped}: it has ended"):
        engine.push(dropped, audio[5][:10])
    with pytest.raises(StreamEndedError):
        engine.abort(dropped)
    again = engine.open()  # the freed slot, a fresh stream
    engine.push(again, audio[4])
    engine.push(kept, audio[6][9000:])
    engine.finish(kept)
    engine.finish(again)
    events = []
    while engine.busy:
        events += engine.poll()
    finals = {e.stream_id: e for e in events if e.is_final}
    assert sorted(finals) == [kept, again] and all(e.stream_id != dropped for e in events)
    check_final(finals[kept], refs[6], 6)
    check_final(finals[again], refs[4], 4)
    assert engine.open_streams == []


def test_end_segment_is_a_final_event_mid_stream(cases, audio):
    """The endpointing hook: a final event for the tokens so far, the stream goes on; segments add up."""
    model, att, refs = cases[CASES[0][0]]
    engine = StreamingEngine(model, num_slots=1, att_context_size=att)
    stream = engine.open(StreamOptions(partial_words=True))
    pcm = audio[6]
    segments, partials = [], []
    for k, piece in enumerate(np.array_split(pcm, 40)):
        engine.push(stream, piece)
        partials += engine.poll()
        if k in (14, 19):  # this random model emits in bursts: after the first and the second one
            segments.append(engine.end_segment(stream))
    segments.append(engine.close(stream))
    assert [(e.segment, e.is_final, e.is_last) for e in segments] == [
        (0, True, False),
        (1, True, False),
        (2, True, True),
    ]
    assert [e.reason for e in segments] == [EndReason.SEGMENT, EndReason.SEGMENT, EndReason.END]
    assert segments[0].start == 0.0 and segments[1].start == segments[0].end and segments[2].start == segments[1].end
    ids, _, _ = refs[6]
    assert sum((e.token_ids for e in segments), []) == ids and segments[0].token_ids and segments[1].token_ids
    assert partials and all(e.words is not None for e in partials)  # partial_words
    for event in segments[1:]:  # word timestamps count from the stream's start: after the segment's start
        assert all(word["start"] >= event.start for word in event.words)
    assert engine.open_streams == []


def test_pushes_while_the_cycle_steps_feed_the_next_cycle_exactly(cases, audio):
    """``poll(while_stepping=...)``: audio pushed there (as a server's pushes overlap the GPU's step) waits for the
    next cycle, and the transcripts are NeMo's; every other method is refused there, leaving the streams as they were.
    """
    model, att, refs = cases[CASES[0][0]]
    engine = StreamingEngine(model, num_slots=2, att_context_size=att)
    streams = {engine.open(): 6, engine.open(): 4}
    pieces = {stream: np.array_split(audio[k], 30) for stream, k in streams.items()}
    refused: list[str] = []

    def push_next() -> None:
        waiting = [stream for stream in streams if pieces[stream]]
        for stream in waiting:
            engine.push(stream, pieces[stream].pop(0))
        stream = next(iter(streams))
        for call in (engine.open, lambda: engine.finish(stream), lambda: engine.abort(stream),
                     lambda: engine.end_segment(stream), lambda: engine.close(stream), engine.poll):  # fmt: skip
            with pytest.raises(RuntimeError, match="while a cycle steps") as error:
                call()
            refused.append(str(error.value))

    for stream in streams:
        engine.push(stream, pieces[stream].pop(0))
    stepped_with_pushes, events = 0, []
    while any(pieces.values()):
        waiting = sum(len(p) for p in pieces.values())
        events += engine.poll(while_stepping=push_next)
        assert sum(len(p) for p in pieces.values()) < waiting  # pushed inside the cycle
        stepped_with_pushes += engine.busy
    for stream in streams:
        engine.finish(stream)
    while engine.busy:
        events += engine.poll()
    assert stepped_with_pushes > 5 and len(refused) > 30
    finals = {e.stream_id: e for e in events if e.is_final}
    assert sorted(finals) == sorted(streams)
    for stream, k in streams.items():
        check_final(finals[stream], refs[k], k)


def test_partials_without_token_ids_say_the_same_text(cases, audio):
    """Two streams of the same audio in the same cycles, one opened with ``partial_token_ids=False``: its partial
    events are the other's with ``token_ids`` None (across a segment end too), its finals the same."""
    model, att, refs = cases[CASES[0][0]]
    engine = StreamingEngine(model, num_slots=2, att_context_size=att)
    full, lean = engine.open(), engine.open(StreamOptions(partial_token_ids=False))
    events: dict[int, list] = {full: [], lean: []}
    for k, piece in enumerate(np.array_split(audio[6], 40)):
        for stream in (full, lean):
            engine.push(stream, piece)
        for event in engine.poll():
            events[event.stream_id].append(event)
        if k == 14:
            for stream in (full, lean):
                events[stream].append(engine.end_segment(stream))
    for stream in (full, lean):
        events[stream].append(engine.close(stream))
    partials = [e for e in events[full] if not e.is_final]
    assert {e.segment for e in partials} == {0, 1}  # partials in both segments to compare
    assert [dataclasses.replace(e, stream_id=lean, token_ids=None if not e.is_final else e.token_ids) for e in
            events[full]] == events[lean]  # fmt: skip
    assert all(e.token_ids is None for e in events[lean] if not e.is_final)
    assert sum((e.token_ids for e in events[lean] if e.is_final), []) == refs[6][0]


# ----------------------------------------------------------------------------------------------
# the parts: chunk schedule and feature queue


@pytest.mark.parametrize("att", [[16, 3], [16, 1], [16, 0]])
def test_chunk_schedule_cuts_frames_as_nemo_cuts_the_whole_stream(models, att):
    model = models[CASES[0][0]]
    model.encoder.set_default_att_context_size(att)
    g = StreamingGeometry.from_encoder(model.encoder)
    rng = np.random.default_rng(len(att) + att[1])
    for total in [0, 1, g.first_chunk - 1, g.first_chunk, g.first_chunk + g.min_last_chunk - 1, 100, 101, 137]:
        schedule = ChunkSchedule(g, num_slots=2)
        schedule.reset(1)
        cut, arrived = [], 0
        while not schedule.done(np.array([1]))[0]:
            if arrived < total:
                new = min(int(rng.integers(0, 40)), total - arrived)
                schedule.add(np.array([1]), np.array([new]))
                arrived += new
                if arrived == total:
                    schedule.end(np.array([1]))
            elif total == 0:
                schedule.end(np.array([1]))
            slots, lengths = schedule.next_chunks(np.array([0, 1]))
            assert slots.tolist() in ([], [1])
            cut += lengths.tolist()
            schedule.advance(slots, lengths)
        whole = split_features(torch.zeros(g.feat_in, total), g)
        assert cut == [c.shape[1] for c in whole], total


def test_feature_queue_keeps_each_slot_in_order_across_the_ring_end():
    queue = FeatureQueue(num_slots=3, features=2, capacity=5, device=torch.device("cpu"))
    frames = {0: torch.arange(40.0).reshape(2, 20), 2: -torch.arange(40.0).reshape(2, 20)}
    written = {0: 0, 2: 0}
    read = {0: 0, 2: 0}
    for counts in ([3, 2], [1, 3], [4, 0], [2, 4]):
        slots = np.array([0, 2])
        starts = np.array([written[0], written[2]])
        packed = torch.cat([frames[s][:, written[s] : written[s] + c] for s, c in zip([0, 2], counts, strict=True)], 1)
        queue.write(slots, starts, np.array(counts), packed)
        for s, c in zip([0, 2], counts, strict=True):
            written[s] += c
        lengths = np.array([written[0] - read[0], written[2] - read[2]])
        keep = lengths > 0
        out = queue.read(slots[keep], np.array([read[0], read[2]])[keep], lengths[keep])
        for row, s in enumerate(slots[keep].tolist()):
            n = written[s] - read[s]
            assert torch.equal(out[row, :, :n], frames[s][:, read[s] : written[s]])
            read[s] = written[s]


def test_module_example_runs(monkeypatch, capsys):
    """The module docstring's example, as written."""
    block = engine_module.__doc__.split("::\n\n", 1)[1]
    lines = []
    for line in block.splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line)
    namespace: dict = {}
    exec(textwrap.dedent("\n".join(lines)), namespace)
    out = capsys.readouterr().out
    assert namespace["final"].text and f"reference: {namespace['example']['text']}" in out  # real words came out


# ----------------------------------------------------------------------------------------------
# GPU: CUDA graphs


@pytest.mark.gpu
def test_cuda_graphs_give_nemo_streaming_alone_on_the_gpu(audio, exact_fp32):
    """On CUDA, as in production: the front end's kernels, CUDA graphs per batch-size bucket (warmed up first), the
    captured decoder step; against NeMo's streaming of each stream alone on the same GPU (fp32, TF32 off)."""
    preset, att = CASES[0]
    model = tiny_streaming_model(preset).cuda().eval()
    refs = references(model, att, audio)
    engine = StreamingEngine(model, num_slots=3, att_context_size=att, use_cuda_graphs=True)
    assert engine.transcriber.runner.use_graphs
    engine.warm_up()
    driver = Driver(engine, audio, seed=2)
    driver.run()
    driver.check(refs)
