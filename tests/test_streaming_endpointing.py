"""End of utterance in the StreamingEngine (EndpointingOptions): NeMo's blank-run rule (streaming/endpointing.py)
against NeMo 3.0's ``RNNTGreedyEndpointing.detect_eou_near_pivot`` on ``CacheAwareRNNTPipeline``'s label buffer, and
the engine with it or with Silero VAD on: one final event per utterance where NeMo's rule / silero's state machine on
the stream alone ends one, the stream going on, the segments' tokens joined exactly the stream's tokens without
endpointing (NeMo's streaming alone); with everything off, exactly the events of an engine without the option."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
from conftest import nemo_alone, tiny_streaming_model, whole_file_features
from nemo.collections.asr.inference.streaming.endpointing.greedy.greedy_rnnt_endpointing import RNNTGreedyEndpointing
from nemo.collections.asr.inference.streaming.state.cache_aware_rnnt_state import CacheAwareRNNTStreamingState
from nemo.collections.asr.inference.utils.endpointing_utils import millisecond_to_frames
from omegaconf import open_dict

from fastdecode_lab import synthetic as S
from nemo_fastdecode.apps.comparison import as_int_list
from nemo_fastdecode.streaming import EndReason, StreamingEngine, StreamingGeometry, StreamOptions, split_features
from nemo_fastdecode.streaming.endpointing import blank_run_end
from nemo_fastdecode.streaming.events import EndpointingOptions
from nemo_fastdecode.streaming.vad import SileroNetwork

pytestmark = pytest.mark.usefixtures("single_thread")

RATE = 16000
ATT = [16, 3]
VOCAB = ["▁a", "b", "▁c", "d", "e"]  # NeMo asks whether a token starts a word: some do
BLANK = len(VOCAB)


# ----------------------------------------------------------------------------------------------
# NeMo's rule: the pipeline's label buffer and detect_eou_near_pivot, step after step


class NemoEndpointer:
    """What ``CacheAwareRNNTPipeline`` does per stream: a label buffer of ``H + residue`` frames (blank-filled at the
    stream's start), the step's labels shifted in, then ``detect_eou_near_pivot`` at its last frame."""

    def __init__(self, ms: int, residue: int, ms_per_frame: float, vocabulary: list[str]):
        self.ms, self.blank = ms, len(vocabulary)  # NeMo's blank: the last id
        self.endpointer = RNNTGreedyEndpointing(vocabulary, ms_per_frame, ms, residue_tokens_at_end=residue)
        self.state = CacheAwareRNNTStreamingState()
        self.state.setup_label_buffer(millisecond_to_frames(ms, math.ceil(ms_per_frame)) + residue, self.blank)

    def step(self, tokens: list[tuple[int, int]], first: int, frames: int) -> bool:
        """NeMo's ``cur_labels`` of a step over frames ``first .. first + frames - 1`` (blank, or the frame's last
        token) shifted in, then its decision."""
        labels = [self.blank] * frames
        for frame, token in tokens:
            if first <= frame < first + frames:
                labels[frame - first] = token
        self.state.update_label_buffer(labels)
        emissions = self.state.get_label_buffer()
        return self.endpointer.detect_eou_near_pivot(emissions, len(emissions) - 1, stop_history_eou=self.ms)[0]


def recent_frames(tokens: list[tuple[int, int]], k: int) -> list[int]:
    """Frames of the last ``k`` tokens, -1 where there are fewer (what BlankRunEndpointer gathers)."""
    frames = [frame for frame, _ in tokens[-k:]]
    return [-1] * (k - len(frames)) + frames


@pytest.mark.parametrize("residue", [0, 1, 2, 3])
def test_blank_run_rule_equals_nemo_detect_eou_near_pivot(residue):
    """Random emissions of many streams (bursts, runs of blanks, up to max_symbols tokens per frame, steps of a few
    frames), one decision per step for all streams at once, against NeMo's on each stream."""
    rng = np.random.default_rng(residue)
    streams, max_symbols, ms_per_frame = 40, 3, 80.0
    ms = rng.choice([1, 80, 81, 160, 240, 400], streams)
    nemo = [NemoEndpointer(int(m), residue, ms_per_frame, VOCAB) for m in ms]
    history = torch.tensor([int(millisecond_to_frames(int(m), ms_per_frame)) for m in ms])
    tokens: list[list[tuple[int, int]]] = [[] for _ in range(streams)]
    decoded = np.zeros(streams, dtype=np.int64)
    quiet = rng.uniform(0.3, 0.95, streams)  # share of blank frames
    fired = 0
    for _ in range(30):
        frames = rng.choice([1, 2, 4], streams)
        expected = []
        for s in range(streams):
            for frame in range(decoded[s], decoded[s] + frames[s]):
                emitted = 0 if rng.random() < quiet[s] else int(rng.integers(1, max_symbols + 1))
                tokens[s] += [(frame, int(rng.integers(0, BLANK))) for _ in range(emitted)]
            expected.append(nemo[s].step(tokens[s], decoded[s], frames[s]))
            decoded[s] += frames[s]
        recent = torch.tensor([recent_frames(t, max_symbols + 1) for t in tokens])
        ours = blank_run_end(recent, torch.from_numpy(decoded), history, torch.full((streams,), residue))
        assert ours.tolist() == expected
        fired += sum(expected)
    assert (fired > 50) == (residue >= 2)  # NeMo's rule fires only with 2 or more residue frames


# ----------------------------------------------------------------------------------------------
# the engine


@pytest.fixture(scope="module")
def model():
    """The tiny cache-aware RNN-T model with ``max_symbols=1``, its blank bias calibrated on its streaming encoder
    output of the test audio. (With random weights it otherwise emits bursts of ``max_symbols`` tokens on a few
    frames near a stream's start and little after: few blank runs to end and few tokens to cut.)"""
    model = S.build_synthetic_model("tiny-rnnt-streaming", seed=0)
    model.encoder.set_default_att_context_size(ATT)
    decoding = copy.deepcopy(model.cfg.decoding)
    with open_dict(decoding):
        decoding.greedy.max_symbols = 1
    model.change_decoding_strategy(decoding, verbose=False)
    audio = blank_run_audio() + vad_audio()
    encoded = [torch.cat(nemo_alone(model, whole_file_features(model, pcm))[0]).T[None] for pcm in audio]
    lengths = [torch.tensor([e.shape[2]]) for e in encoded]
    S.calibrate_blank_bias(model, encoded, lengths, 0.3, iterations=8, tolerance=0.05)
    return model


def to_pcm(audio: np.ndarray) -> np.ndarray:
    return np.round(audio * 32768).astype(np.int16)


def reference(model, pcm: np.ndarray) -> tuple[list[tuple[int, int]], list[int]]:
    """NeMo's streaming of the stream alone: its (frame, token) pairs and each step's encoder frames."""
    features = whole_file_features(model, pcm)
    outputs, hyp, _ = nemo_alone(model, features)
    chunks = split_features(features, StreamingGeometry.from_encoder(model.encoder))
    assert sum(c.shape[1] for c in chunks) == features.shape[1]  # no tail dropped: the last step ends the stream
    return list(zip(as_int_list(hyp.timestamp), as_int_list(hyp.y_sequence), strict=True)), [len(o) for o in outputs]


def run(
    engine: StreamingEngine,
    audio: list[np.ndarray],
    options: list[StreamOptions],
    seed: int,
    speech: list | None = None,
) -> list[list]:
    """All streams open, push random pieces and poll; finish when their audio is out. Each stream's events (and,
    into ``speech``, every poll's speech events)."""
    rng = np.random.default_rng(seed)
    ids = [engine.open(o) for o in options]
    sent = [0] * len(audio)
    events: dict[int, list] = {i: [] for i in ids}
    while engine.busy or any(sent[k] <= len(pcm) for k, pcm in enumerate(audio)):
        for k, pcm in enumerate(audio):
            if sent[k] < len(pcm) and rng.random() < 0.7:
                size = min(int(rng.integers(1, 8000)), len(pcm) - sent[k])
                engine.push(ids[k], pcm[sent[k] : sent[k] + size])
                sent[k] += size
            elif sent[k] == len(pcm):
                engine.finish(ids[k])
                sent[k] += 1
        for event in engine.poll():
            events[event.stream_id].append(event)
        if speech is not None:
            speech += engine.speech_events
    assert engine.open_streams == []
    return [events[i] for i in ids]


def alone_without_endpointing(model, pcm: np.ndarray, max_cycle_seconds: float, stream_id: int) -> list:
    """The stream's events from an engine without the option, alone (events do not depend on the other streams).
    Both engines step one chunk a cycle: streams that catch up several chunks a cycle would have their partials
    where this run's random pushes left them behind, not where the other run's did."""
    engine = StreamingEngine(
        model, num_slots=1, att_context_size=ATT, max_cycle_seconds=max_cycle_seconds, max_chunks_per_cycle=1
    )
    (events,) = run(engine, [pcm], [StreamOptions()], seed=7)
    return [dataclasses.replace(event, stream_id=stream_id) for event in events]


def check_segments(events: list, tokens: list[tuple[int, int]], decoding) -> list[int]:
    """The stream's events: segments in order, each final once, partials within it, the last one last; their tokens
    joined are the stream's, each event's text the text of its tokens (``decoding``: the model's). Returns the token
    count at each mid-stream final."""
    finals = [e for e in events if e.is_final]
    assert [e.segment for e in finals] == list(range(len(finals)))
    assert [e.is_last for e in finals] == [False] * (len(finals) - 1) + [True]
    assert all(e.reason is EndReason.SEGMENT for e in finals[:-1]) and finals[-1].reason is EndReason.END
    assert sum((e.token_ids for e in finals), []) == [token for _, token in tokens]
    assert all(e.token_ids for e in finals[:-1])  # a segment without tokens is not finalised mid-stream
    for previous, event in zip(finals, finals[1:], strict=False):
        assert event.start == previous.end
    for event in events:  # partial events belong to the segment that is open
        assert event.text == decoding.decode_ids_to_str(event.token_ids)
        if not event.is_final:
            final = finals[event.segment]
            assert event.token_ids == final.token_ids[: len(event.token_ids)]
    return np.cumsum([len(e.token_ids) for e in finals[:-1]]).tolist()


def blank_run_audio() -> list[np.ndarray]:
    return [to_pcm(a) for a in S.synthetic_audio([3.1, 2.4, 2.0], seed=9)]


def test_blank_run_ends_utterances_where_nemo_does(model):
    """Three streams: two with NeMo's rule (two settings), one with everything off (its events: an engine's without
    the option). The cuts: where NeMo's rule fires on NeMo's labels of the stream alone, at every step but the
    stream's last (its last event follows there)."""
    audio = blank_run_audio()
    rules = [EndpointingOptions(blank_run_ms=80), EndpointingOptions(blank_run_ms=160, residue_tokens_at_end=3), None]
    engine = StreamingEngine(model, num_slots=3, att_context_size=ATT, max_cycle_seconds=0.3, max_chunks_per_cycle=1)
    events = run(engine, audio, [StreamOptions(endpointing=r) for r in rules], seed=0)
    assert events[2] == alone_without_endpointing(model, audio[2], 0.3, events[2][0].stream_id)
    ms_per_frame = model.cfg.preprocessor.window_stride * model.encoder.subsampling_factor * 1000
    cuts = 0
    for k, rule in enumerate(rules[:2]):
        tokens, frames = reference(model, audio[k])
        nemo = NemoEndpointer(rule.blank_run_ms, rule.residue_tokens_at_end, ms_per_frame, model.joint.vocabulary)
        expected, decoded = [], 0
        for step, count in enumerate(frames):
            fires = nemo.step(tokens, decoded, count)
            decoded += count
            emitted = sum(frame < decoded for frame, _ in tokens)
            if fires and step < len(frames) - 1 and emitted > (expected[-1] if expected else 0):
                expected.append(emitted)
        assert check_segments(events[k], tokens, model.decoding) == expected, k
        cuts += len(expected)
    assert cuts >= 4


def vad_audio() -> list[np.ndarray]:
    """Voiced utterances with pauses of 0.2-0.7 s between them (int16)."""
    voiced = S.synthetic_voiced_audio([0.9, 0.6, 0.8, 0.7, 0.6, 0.8], seed=6)
    gap = [np.zeros(round(s * RATE), dtype=np.float32) for s in (0.25, 0.7, 0.5, 0.2)]
    streams = [
        np.concatenate([gap[0], voiced[0], gap[1], voiced[1], gap[2], voiced[2], gap[1], voiced[5][:7001]]),
        np.concatenate([voiced[3], gap[2], voiced[4], gap[3]]),
    ]
    return [to_pcm(s) for s in streams]


def silero_cuts(pcm: np.ndarray, options: EndpointingOptions) -> list[int]:
    """The samples where silero, on the stream alone, confirms the silence that ends each of its speech segments."""
    silero_vad = pytest.importorskip("silero_vad")
    threads = torch.get_num_threads()
    model = silero_vad.load_silero_vad()
    torch.set_num_threads(threads)
    audio = torch.from_numpy(pcm.astype(np.float32) / 32768)
    raw = silero_vad.get_speech_timestamps(
        audio, model, options.vad_threshold, min_silence_duration_ms=options.min_silence_ms, speech_pad_ms=0,
        min_speech_duration_ms=options.min_speech_ms,
    )  # fmt: skip
    window, min_silence = 512, RATE * options.min_silence_ms / 1000
    # the silence starts at window end // 512 and is confirmed ceil(min_silence / 512) windows later
    return [(s["end"] // window + math.ceil(min_silence / window) + 1) * window for s in raw if s["end"] < len(pcm)]


def test_vad_ends_one_utterance_per_speech_segment_and_the_stream_goes_on(model):
    """Silero VAD on (engine-wide) for two streams, off for a third (its events: an engine's without the option). A
    cut per speech segment silero ends on the stream alone, once the decoder has passed the confirming window: the
    tokens before it, the segment's end there."""
    options = EndpointingOptions(vad=True, min_silence_ms=300)
    audio = vad_audio()
    audio.append(to_pcm(S.synthetic_audio([1.5], seed=2)[0]))
    engine = StreamingEngine(
        model, num_slots=3, att_context_size=ATT, max_cycle_seconds=0.4, endpointing=options, max_chunks_per_cycle=1
    )
    off = StreamOptions(endpointing=EndpointingOptions())
    events = run(engine, audio, [StreamOptions(), StreamOptions(), off], seed=1)
    assert events[2] == alone_without_endpointing(model, audio[2], 0.4, events[2][0].stream_id)
    cuts = 0
    for k in range(2):
        tokens, frames = reference(model, audio[k])
        samples_per_frame = model.encoder.subsampling_factor * model.preprocessor.featurizer.hop_length
        expected, ends = [], []
        for sample in silero_cuts(audio[k], options):
            bound = -(-sample // samples_per_frame)  # the first encoder frame at or after it
            emitted = sum(frame < bound for frame, _ in tokens)
            if bound <= sum(frames) and emitted > (expected[-1] if expected else 0):
                expected.append(emitted)
                ends.append(sample / RATE)
        assert check_segments(events[k], tokens, model.decoding) == expected, k
        assert [e.end for e in events[k] if e.is_final and not e.is_last] == ends
        cuts += len(expected)
    assert cuts >= 3


def test_speech_events_are_silero_starts_and_stops_on_each_stream_alone(model):
    """Two streams with the VAD on: every speech start and stop of silero's state machine on the stream alone (no
    minimum speech length, no padding), in order, with the index of the segment the speech belongs to."""
    options = EndpointingOptions(vad=True, min_silence_ms=300, min_speech_ms=0)
    audio = vad_audio()
    engine = StreamingEngine(model, num_slots=2, att_context_size=ATT, max_cycle_seconds=0.4, endpointing=options)
    speech: list = []
    events = run(engine, audio, [StreamOptions(), StreamOptions()], seed=4, speech=speech)
    silero_vad = pytest.importorskip("silero_vad")
    threads = torch.get_num_threads()
    silero = silero_vad.load_silero_vad()
    torch.set_num_threads(threads)
    marks = 0
    for k, pcm in enumerate(audio):
        stream_id = events[k][0].stream_id
        raw = silero_vad.get_speech_timestamps(
            torch.from_numpy(pcm.astype(np.float32) / 32768), silero, options.vad_threshold,
            min_silence_duration_ms=options.min_silence_ms, speech_pad_ms=0, min_speech_duration_ms=0,
        )  # fmt: skip
        expected = []
        for s in raw:
            expected.append((True, s["start"] / RATE))
            if s["end"] < len(pcm):  # silence ended it (else the stream's end did: no stop)
                expected.append((False, s["end"] / RATE))
        ours = [e for e in speech if e.stream_id == stream_id]
        assert len(expected) >= 2, k  # something to compare
        assert [(e.started, e.seconds) for e in ours] == expected, k
        # a stop's segment is the one its utterance end finalises
        finals = [e for e in events[k] if e.is_final and not e.is_last]
        stops = [e for e in ours if not e.started]
        assert [e.segment for e in stops][: len(finals)] == [e.segment for e in finals]
        assert all(e.start <= stop.seconds <= e.end for e, stop in zip(finals, stops, strict=False))
        marks += len(ours)
    assert marks >= 6


def test_options_are_checked():
    for kwargs, message in (
        ({"vad_threshold": 1.5}, r"vad_threshold=1.5 is not a probability"),
        ({"min_silence_ms": -1}, r"min_silence_ms=-1; valid: a finite number of ms >= 0"),
        ({"blank_run_ms": 0}, r"blank_run_ms=0; valid: ms > 0, or None \(off\)"),
        ({"residue_tokens_at_end": -1}, r"residue_tokens_at_end=-1; valid: int >= 0"),
    ):
        with pytest.raises(ValueError, match=message):
            EndpointingOptions(**kwargs)
    with pytest.warns(UserWarning, match=r"never ends an utterance with fewer than 2 residue tokens"):
        EndpointingOptions(blank_run_ms=800, residue_tokens_at_end=0)
    assert not EndpointingOptions().enabled and EndpointingOptions().neg_threshold == 0.35
    with pytest.raises(ValueError, match=r"vad_threshold='high' is not a probability; valid: 0 to 1"):
        EndpointingOptions(vad_threshold="high")
    with pytest.raises(TypeError, match=r"endpointing must be an EndpointingOptions, got dict"):
        StreamingEngine(S.build_synthetic_model("tiny-rnnt-streaming", seed=0), 1, endpointing={"vad": True})
    # silero has networks for 16 and 8 kHz only: other rates are refused naming both
    with pytest.raises(ValueError, match=r"Silero VAD runs at \[8000, 16000\] Hz; this model's audio is 22050 Hz"):
        SileroNetwork(22050, torch.device("cpu"))


@pytest.mark.gpu
def test_vad_and_blank_run_on_the_gpu(exact_fp32):
    """On CUDA with graphs: both rules at once, the segments' tokens joined equal NeMo's streaming alone."""
    model = tiny_streaming_model("tiny-rnnt-streaming").cuda().eval()
    model.encoder.set_default_att_context_size(ATT)
    audio = vad_audio()
    options = EndpointingOptions(vad=True, min_silence_ms=300, blank_run_ms=160)
    engine = StreamingEngine(model, num_slots=2, att_context_size=ATT, endpointing=options)
    engine.warm_up()
    events = run(engine, audio, [StreamOptions()] * 2, seed=3)
    for k, pcm in enumerate(audio):
        tokens, _ = reference(model, pcm)
        check_segments(events[k], tokens, model.decoding)
