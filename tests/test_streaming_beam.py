"""Beam search in the streaming engine (``StreamingEngine(..., decoding="beam", beam_size=K)``).

Reference: NeMo 3.0's cache-aware streaming of each stream alone with ``malsd_batch`` continued across chunks
(:func:`~nemo_fastdecode.apps.streaming_reference.nemo_alone_beam`): NeMo's ``CacheAwareStreamingAudioBuffer`` over
the preprocessor's features of the whole file, the encoder's ``cache_aware_stream_step``, every chunk's frames into
NeMo's ``ModifiedALSDBatched{RNNT,TDT}Computer`` (``BeamBatched*Infer.decoding_computer``, torch path) with the
previous chunk's ``prev_batched_state``, the chunks joined with ``BatchedBeamHyps.flatten_`` / ``merge_(...,
is_chunk_continuation=True, boundary_prev_ptr=...)`` and the best beam by ``to_hyps_list(score_norm=True)``. NeMo's
own streaming paths (``conformer_stream_step``, ``CacheAwareRNNTPipeline``) refuse ``malsd_batch`` with partial
hypotheses (checked below), so that computer-level continuation is NeMo's only beam search across chunks.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch
from conftest import nemo_alone, whole_file_features
from omegaconf import open_dict
from test_streaming_engine import CASES, Driver, audio, models, nemo_words  # noqa: F401 (fixtures)

from nemo_fastdecode.apps.comparison import as_int_list
from nemo_fastdecode.apps.streaming_reference import nemo_alone_beam
from nemo_fastdecode.streaming import EndpointingOptions, StreamingEngine, StreamOptions, beam_decoding

pytestmark = pytest.mark.usefixtures("single_thread")

BEAM = 4


def beam_references(model, att, signals, beam_size=BEAM):
    """NeMo's beam search across chunks of each stream alone: (token ids, text, words); and greedy's token ids."""
    model.encoder.set_default_att_context_size(att)
    out, greedy = [], []
    for pcm in signals:
        if len(pcm) < model.preprocessor.featurizer.hop_length:  # no feature frame: nothing to decode
            out.append(([], "", []))
            greedy.append([])
            continue
        feats = whole_file_features(model, pcm)
        hyp = nemo_alone_beam(model, feats, beam_size)
        if hyp is None:
            out.append(([], "", []))
        else:
            hyp.text = model.decoding.decode_ids_to_str(as_int_list(hyp.y_sequence))
            out.append((as_int_list(hyp.y_sequence), hyp.text, nemo_words(model, hyp)))
        _, greedy_hyp, _ = nemo_alone(model, feats)
        greedy.append([] if greedy_hyp is None else as_int_list(greedy_hyp.y_sequence))
    return out, greedy


@pytest.fixture(scope="module")
def beam_cases(models, audio):  # noqa: F811
    cases = {}
    for preset, att in CASES:
        refs, greedy = beam_references(models[preset], att, audio)
        cases[preset] = (models[preset], att, refs, greedy)
    return cases


class BeamDriver(Driver):
    def check(self, refs) -> None:
        assert sorted(self.finals) == list(range(len(self.audio)))
        for stream, (ids, text, words) in enumerate(refs):
            final = self.finals[stream]
            assert final.is_final and final.is_last and final.segment == 0, stream
            assert final.token_ids == ids, stream
            assert final.text == text, stream
            assert final.words == words, stream
        assert self.engine.open_streams == [] and not self.engine.busy


@pytest.mark.parametrize(("preset", "seed"), [(CASES[0][0], 0), (CASES[1][0], 1)])
def test_streams_that_come_and_go_give_nemo_beam_search_alone(beam_cases, audio, preset, seed):  # noqa: F811
    model, att, refs, greedy = beam_cases[preset]
    assert sum(len(ids) for ids, _, _ in refs) > 0  # there is something to compare
    assert any(ids != g for (ids, _, _), g in zip(refs, greedy, strict=True)), "setup: beam should differ from greedy"
    engine = StreamingEngine(
        model, num_slots=3, att_context_size=att, max_cycle_seconds=0.25, decoding="beam", beam_size=BEAM
    )
    driver = BeamDriver(engine, audio, seed)
    driver.run()
    driver.check(refs)
    assert driver.refused > 0  # more streams than slots: some waited for a free slot
    assert max(driver.batches) > 1  # streams at different positions stepped together
    # partial events: the best beam so far, sent when it changed
    partials = [p for stream in driver.partials.values() for p in stream]
    assert partials
    for events in driver.partials.values():
        for before, after in zip(events, events[1:], strict=False):
            assert before.token_ids != after.token_ids


def test_partial_events_are_the_best_beam_so_far(beam_cases, audio):  # noqa: F811
    """After every cycle, the partial event of a stream is NeMo's best beam over the chunks decoded so far."""
    model, att, _, _ = beam_cases[CASES[1][0]]
    engine = StreamingEngine(model, num_slots=1, att_context_size=att, decoding="beam", beam_size=BEAM)
    pcm = audio[6]
    stream = engine.open()
    engine.push(stream, pcm)
    feats = whole_file_features(model, pcm)
    g = engine.geometry
    checked = 0
    while True:
        events = engine.poll()
        decoded = round(engine.decoded_seconds(stream) * 100)  # feature frames stepped so far
        partial = [e for e in events if not e.is_final]
        if partial:
            # NeMo alone over the features stepped so far: its chunks are the same up to there
            cut = feats[:, :decoded]
            hyp = nemo_alone_beam(model, cut, BEAM) if decoded >= g.first_chunk else None
            assert hyp is not None
            assert partial[-1].token_ids == as_int_list(hyp.y_sequence)
            checked += 1
        if checked >= 3 or not engine.busy:
            break
    assert checked >= 2


def step_in_turn(transcriber, feats, streams: list[int], seed: int, slots: int = 2, boosting=None) -> dict:
    """Streams stepped chunk by chunk through ``slots`` slots of ``transcriber`` (opened as slots free up, each step
    a random subset of the live ones, each slot reused; ``boosting``: each stream's phrases or ``None``); returns each
    stream's final hypothesis."""
    from nemo_fastdecode.streaming import split_features

    waiting = list(streams)
    live: dict[int, tuple[int, list]] = {}  # slot -> (stream, chunks left)
    got = {}
    rng = np.random.default_rng(seed)
    while waiting or live:
        while waiting and len(live) < slots:
            stream = waiting.pop(0)
            slot = transcriber.open(boosting=None if boosting is None else boosting[stream])
            live[slot] = (stream, list(split_features(feats[stream], transcriber.geometry)))
        stepped = [slot for slot in live if rng.random() < 0.7] or list(live)[:1]
        transcriber.step(stepped, [live[slot][1].pop(0) for slot in stepped])
        for slot in stepped:
            stream, left = live[slot]
            if not left:
                got[stream] = transcriber.flush(slot).hypothesis
                del live[slot]
    return got


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")]),
    ],
)
def test_tdt_streams_in_few_slots_give_nemo_beam_search_alone(audio, monkeypatch, device):  # noqa: F811
    """TDT (``ModifiedALSDBatchedTDTComputer``, beams jumping past a chunk's end): streams stepped in turn through two
    slots of the transcriber, at different positions, each slot reused; tokens, timestamps and durations of each
    stream's best beam equal NeMo's beam search across chunks of that stream alone (on CUDA: with CUDA graphs, warmed
    up, and the Triton beam kernels, against NeMo's torch path on the same GPU). The transcripts' storage starts at
    one label per beam, so it grows (doubling) while streams hold beams."""
    monkeypatch.setattr(beam_decoding, "INITIAL_TOKEN_CAPACITY", 1)
    from conftest import tiny_streaming_model

    from nemo_fastdecode.streaming import StreamingTranscriber

    model = tiny_streaming_model("tiny-tdt-streaming").to(device)
    att = [16, 1]
    model.encoder.set_default_att_context_size(att)
    streams = [i for i, pcm in enumerate(audio) if len(pcm) >= 4000]
    feats = {i: whole_file_features(model, audio[i]) for i in streams}
    expected, greedy = {}, {}
    for i in streams:
        hyp = nemo_alone_beam(model, feats[i], BEAM)
        expected[i] = (as_int_list(hyp.y_sequence), as_int_list(hyp.timestamp), as_int_list(hyp.token_duration))
        greedy[i] = as_int_list(nemo_alone(model, feats[i])[1].y_sequence)
    assert sum(len(e[0]) for e in expected.values()) > 0
    assert any(expected[i][0] != greedy[i] for i in streams), "setup: beam should differ from greedy"
    # padded to the batch-size buckets (padding rows: no frames) and warmed up on the dummy slot, as with CUDA graphs
    transcriber = StreamingTranscriber(
        model, 2, att_context_size=att, decoding="beam", beam_size=BEAM, pad_to_bucket=True
    )
    assert transcriber.warm_up().decoder_seconds > 0
    got = {
        stream: (as_int_list(hyp.y_sequence), as_int_list(hyp.timestamp), as_int_list(hyp.token_duration))
        for stream, hyp in step_in_turn(transcriber, feats, streams, seed=3).items()
    }
    assert got == expected
    assert transcriber.decoder._capacity >= max(len(e[0]) for e in expected.values()) > 1


def test_beam_refuses_what_it_does_not_support(beam_cases):
    model, att, _, _ = beam_cases[CASES[1][0]]
    with pytest.raises(ValueError, match=r"decoding='nbest' is not supported; valid: 'greedy', 'beam'"):
        StreamingEngine(model, num_slots=1, att_context_size=att, decoding="nbest")
    with pytest.raises(ValueError, match=r"beam_size must be a positive int, got 0"):
        StreamingEngine(model, num_slots=1, att_context_size=att, decoding="beam", beam_size=0)
    with pytest.raises(ValueError, match=r"fast_math=True needs decoding='greedy'"):
        StreamingEngine(model, num_slots=1, att_context_size=att, decoding="beam", fast_math=True)
    with pytest.raises(ValueError, match=r"endpointing \(vad or a blank-run rule\) needs decoding='greedy'"):
        StreamingEngine(
            model, num_slots=1, att_context_size=att, decoding="beam", endpointing=EndpointingOptions(blank_run_ms=500)
        )
    engine = StreamingEngine(model, num_slots=1, att_context_size=att, decoding="beam", beam_size=BEAM)
    with pytest.raises(ValueError, match=r"endpointing \(vad or a blank-run rule\) needs decoding='greedy'"):
        engine.open(StreamOptions(endpointing=EndpointingOptions(blank_run_ms=500)))
    assert engine.open_streams == []  # nothing was opened by the refusals
    stream = engine.open()
    with pytest.raises(ValueError, match=rf"stream {stream}: end_segment needs decoding='greedy'"):
        engine.end_segment(stream)


def test_nemo_streaming_paths_refuse_malsd_batch_with_partial_hypotheses(beam_cases, audio):  # noqa: F811
    """Why the reference continues NeMo's computer: NeMo's streaming decode with ``malsd_batch`` refuses to continue."""
    model, att, _, _ = beam_cases[CASES[1][0]]
    decoding = model.cfg.decoding
    try:
        cfg = decoding.copy()
        with open_dict(cfg):
            cfg.strategy = "malsd_batch"
            cfg.beam.beam_size = BEAM
        model.change_decoding_strategy(cfg, verbose=False)
        encoded = torch.zeros([1, model.encoder._feat_out, 4])
        with pytest.raises(NotImplementedError, match="Partial hypotheses"):
            model.decoding.rnnt_decoder_predictions_tensor(
                encoder_output=encoded, encoded_lengths=torch.tensor([4]), partial_hypotheses=[None]
            )
    finally:
        model.change_decoding_strategy(decoding, verbose=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("preset", [CASES[0][0], CASES[1][0]])
def test_beam_on_cuda_with_graphs_gives_nemo_beam_search_alone(audio, preset):  # noqa: F811
    """On the GPU, with CUDA graphs (warmed up) and the Triton beam kernels: NeMo's reference on the same GPU."""
    from conftest import tiny_streaming_model

    att = dict(CASES)[preset]
    model = tiny_streaming_model(preset).cuda()
    refs, _ = beam_references(model, att, audio)
    assert sum(len(ids) for ids, _, _ in refs) > 0
    engine = StreamingEngine(model, num_slots=3, att_context_size=att, max_cycle_seconds=0.25, decoding="beam")
    engine.warm_up()
    driver = BeamDriver(engine, audio, seed=2)
    driver.run()
    mismatched = [s for s, (ids, _, _) in enumerate(refs) if driver.finals[s].token_ids != ids]
    assert not mismatched, f"streams {mismatched} differ from NeMo's beam search on this GPU"
    assert np.all([driver.finals[s].text == refs[s][1] for s in range(len(refs))])


# ----------------------------------------------------------------------------------------------
# through the server: ServeConfig(decoding="beam")


def test_server_with_beam_search_gives_nemo_beam_search_alone(beam_cases, audio):  # noqa: F811
    """Two clients at once on 127.0.0.1, one item each: each completed transcript and its words are NeMo's beam search
    across chunks of that audio alone."""
    from test_serve import RATE, ServerThread, run, words_of

    from nemo_fastdecode.apps.loadtest.client import COMPLETED, connect_session, receive_until
    from nemo_fastdecode.serve.config import ServeConfig

    preset, att = CASES[0]
    model, _, refs, greedy = beam_cases[preset]
    streams = [6, 4]
    assert all(refs[i][0] for i in streams) and any(refs[i][0] != greedy[i] for i in streams)
    server = ServerThread(model, slots=2, att_context_size=att, decoding="beam", beam_size=BEAM)
    try:

        async def client(pcm):
            ws, _ = await connect_session(server.url, rate=RATE)
            async with ws:
                # beam search keeps no token log-probabilities: asking for them is refused, naming the field
                include = {
                    "type": "session.update",
                    "session": {"include": ["item.input_audio_transcription.logprobs"]},
                }
                await ws.send(json.dumps(include))
                refused = json.loads(await ws.recv())
                assert refused["error"]["param"] == "session.include" and "greedy" in refused["error"]["message"]
                for start in range(0, len(pcm), 3200):
                    await ws.send(pcm[start : start + 3200].tobytes())
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                return await receive_until(ws, lambda e: e["type"] == COMPLETED, 60)

        async def clients():
            return await asyncio.gather(*(client(audio[i]) for i in streams))

        results = run(clients(), 120)
    finally:
        server.stop()
    deltas = []
    for i, events in zip(streams, results, strict=True):
        assert not [e for e in events if e["type"] == "error"], events
        final = events[-1]
        assert final["transcript"] == refs[i][1]
        assert words_of(final["words"]) == words_of(refs[i][2])
        deltas += [e for e in events if e["type"].endswith(".delta")]
    # partials: the best beam's text so far (a short item sent at once may be decoded in one cycle: its final alone)
    assert deltas and all(e["text"] for e in deltas)
    with pytest.raises(ValueError, match=r"vad: true needs decoding: greedy"):
        ServeConfig(decoding="beam", vad=True)
    with pytest.raises(ValueError, match=r"decoding='nbest' is not supported; valid: 'greedy', 'beam'"):
        ServeConfig(decoding="nbest")


# ----------------------------------------------------------------------------------------------
# scripts/streaming.py: StreamingConfig(decoding="beam")


def test_streaming_script_runs_our_path_with_beam_search(tmp_path):
    from fastdecode_lab import streaming_sim as sim

    lines: list[str] = []
    result = sim.run(
        {
            "model": "tiny-streaming",
            "num_streams": 4,
            "num_slots": 2,
            "max_stream_seconds": 1.6,
            "stagger_seconds": 0.5,
            "output_dir": str(tmp_path),
            "cuda": -1,
            "att_context_size": [16, 1],
            "decoding": "beam",
            "beam_size": BEAM,
            "compare_nemo": False,
            "fixed_step_repeats": 0,
        },
        log=lines.append,
    )
    (ours,) = result.paths
    assert ours.name == f"nemo_fastdecode (eager, beam search ({BEAM} beams))"
    assert ours.chunks > 0 and sum(len(r["pred_text"]) for r in result.transcripts) > 0
    # with beam search NeMo's side is the untimed reference check (nemo_beam_reference_streams), not a timed path
    assert sim.resolve_config({"decoding": "beam"}).compare_nemo is True
    with pytest.raises(ValueError, match=r"fast_math=True needs decoding='greedy'"):
        sim.resolve_config({"decoding": "beam", "compare_nemo": False, "fast_math": True})
