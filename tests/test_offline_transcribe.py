"""The offline path: length-sorted budgeted batches, audio read ahead, NeMo's transcribe on them; results equal
NeMo's own ``transcribe`` in the input order."""

import json

import numpy as np
import pytest
import torch

from fastdecode_lab import synthetic
from nemo_fastdecode.apps.models import apply_decoding
from nemo_fastdecode.offline import (
    FastTranscribeOptions,
    disable_fast_transcribe,
    enable_fast_transcribe,
    fast_path,
    fast_transcribe,
    plan_batches,
)
from nemo_fastdecode.offline.audio_batches import PrefetchedAudioBatches

# uneven lengths in no particular order, one shorter than 0.1 s
DURATIONS = [1.3, 0.05, 2.2, 0.7, 1.9, 0.4, 1.1]


def test_plan_batches_sorts_covers_and_respects_the_budget():
    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.integers(1, 1000, size=57)]
    batches = plan_batches(lengths, max_batch_size=8, max_batch_samples=2500)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))  # each utterance exactly once
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)
    for batch in batches:
        assert len(batch) <= 8
        assert len(batch) == 1 or len(batch) * lengths[batch[0]] <= 2500
    assert len(batches) < len(lengths)  # short utterances share batches
    assert plan_batches([5000, 10], max_batch_size=4, max_batch_samples=100) == [[0], [1]]  # over budget: alone
    assert plan_batches([3, 3, 3], max_batch_size=2) == [[0, 1], [2]]  # ties keep the input order


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"max_batch_size": 0}, "max_batch_size"), ({"max_batch_size": 2, "max_batch_samples": 0}, "max_batch_samples")],
)
def test_plan_batches_refuses_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_batches([1, 2], **kwargs)


@pytest.fixture(scope="module", params=["tiny-rnnt", "tiny-tdt", "tiny-hybrid"])
def model_and_files(request, tmp_path_factory, single_thread):
    model = synthetic.build_synthetic_model(request.param, seed=0)
    audio = synthetic.synthetic_audio(DURATIONS, seed=3)
    encoded, lengths = synthetic.encode(model, audio, batch_size=len(audio), device="cpu")
    synthetic.calibrate_blank_bias(model, encoded, lengths, 0.3, iterations=4, tolerance=0.05)
    apply_decoding(model, {"strategy": "fast_greedy"})
    paths = [str(p) for p in synthetic.write_wavs(audio, tmp_path_factory.mktemp(request.param))]
    return model, paths, audio


def _nemo(model, audio, **kwargs):
    hyps = type(model).transcribe(model, audio, batch_size=2, return_hypotheses=True, verbose=False, **kwargs)
    model.eval()
    return hyps[0] if isinstance(hyps, tuple) else hyps


def _same(ours, nemo, timestamps=False):
    assert len(ours) == len(nemo) == len(DURATIONS)
    assert sum(len(h.y_sequence) for h in nemo) > 0  # something to compare
    for a, b in zip(ours, nemo, strict=True):
        assert a.y_sequence.tolist() == b.y_sequence.tolist()
        assert a.text == b.text
        assert a.score == pytest.approx(b.score, rel=1e-5, abs=1e-4)
        if timestamps:
            assert a.timestamp["word"] == b.timestamp["word"]
            assert a.timestamp["char"] == b.timestamp["char"]


def test_fast_transcribe_equals_nemo_in_input_order(model_and_files):
    model, paths, audio = model_and_files
    options = FastTranscribeOptions(max_batch_seconds=3.0, threads=2, prefetch=1)  # several uneven batches
    ours = fast_transcribe(model, paths, 2, options=options, return_hypotheses=True)
    _same(ours, _nemo(model, paths))
    arrays = fast_transcribe(model, audio, 2, options=options, return_hypotheses=True)  # in-memory audio
    _same(arrays, _nemo(model, audio))


def test_enabled_model_transcribe_takes_the_fast_path_with_timestamps(model_and_files, monkeypatch):
    model, paths, _ = model_and_files
    if model.cfg.decoding.get("durations"):
        # NeMo's own char timestamps index past this synthetic TDT vocabulary (greedy_batch raises the same)
        pytest.skip("NeMo's char timestamps fail on the synthetic char TDT model")
    calls = []
    import nemo_fastdecode.offline.fast_path as module

    real = module.plan_batches
    monkeypatch.setattr(module, "plan_batches", lambda *a, **k: calls.append(a) or real(*a, **k))
    enable_fast_transcribe(model, FastTranscribeOptions(max_batch_seconds=4.0))
    try:
        ours = model.transcribe(paths, batch_size=2, timestamps=True, verbose=False)
        model.eval()
    finally:
        disable_fast_transcribe(model)
    assert len(calls) == 1  # it went through the fast path
    nemo = _nemo(model, paths, timestamps=True)
    assert sum(len(h.timestamp["word"]) for h in nemo) > 0
    _same(ours, nemo, timestamps=True)
    assert "transcribe" not in model.__dict__  # disabled: NeMo's own method again


def test_manifests_with_offsets_and_durations_equal_nemo(model_and_files, tmp_path):
    model, paths, _ = model_and_files
    manifest = tmp_path / "in.json"
    entries = [{"audio_filepath": p, "duration": d, "text": ""} for p, d in zip(paths, DURATIONS, strict=True)]
    entries[0].update(offset=0.2, duration=0.6)  # a clip out of a longer file, as NeMo reads it
    manifest.write_text("".join(json.dumps(e) + "\n" for e in entries))
    ours = fast_transcribe(
        model, str(manifest), 2, options=FastTranscribeOptions(max_batch_seconds=3.0), return_hypotheses=True
    )
    _same(ours, _nemo(model, str(manifest)))


def test_bad_inputs_are_named(model_and_files, tmp_path):
    model, paths, _ = model_and_files
    with pytest.raises(ValueError, match="empty"):
        fast_transcribe(model, [])
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF not really a wave file")
    with pytest.raises(ValueError, match="corrupt.wav"):
        fast_transcribe(model, [paths[0], str(corrupt)])
    with pytest.raises(ValueError, match="no samples"):
        fast_transcribe(model, [np.zeros(0, dtype=np.float32)])
    with pytest.raises(ValueError, match="mono"):
        fast_transcribe(model, [torch.zeros(2, 100)])
    with pytest.raises(ValueError, match="max_batch_seconds"):
        FastTranscribeOptions(max_batch_seconds=0)


def test_the_decoder_is_sized_once_for_the_whole_plan(model_and_files):
    model, paths, _ = model_and_files
    computer = model.decoding.decoding.computer
    fast_transcribe(model, paths, 2, options=FastTranscribeOptions(max_batch_seconds=3.0), return_hypotheses=True)
    batch, frames = computer._reserved
    assert batch >= 2 and frames >= 2.2 / 0.08  # the longest utterance's encoder frames (8x subsampling, 10 ms hop)
    computer.reserve(1, 1)  # never shrinks
    assert computer._reserved == (batch, frames)


def test_the_decoder_is_prepared_before_the_first_batch_is_asked_for(model_and_files, monkeypatch):
    model, paths, _ = model_and_files
    computer = model.decoding.decoding.computer
    events = []
    real_prepare, real_iterate = computer.prepare_reserved, PrefetchedAudioBatches.iterate
    monkeypatch.setattr(computer, "prepare_reserved", lambda *a: events.append(("prepare", a)) or real_prepare(*a))

    def iterate(loader):
        events.append(("first batch asked for", loader._started is not None))  # its reading already under way
        yield from real_iterate(loader)

    monkeypatch.setattr(PrefetchedAudioBatches, "iterate", iterate)
    ours = fast_transcribe(
        model, paths, 2, options=FastTranscribeOptions(max_batch_seconds=3.0), return_hypotheses=True
    )
    parameter = next(model.encoder.parameters())
    assert events == [("prepare", (parameter.device, parameter.dtype)), ("first batch asked for", True)]
    _same(ours, _nemo(model, paths))  # the one-frame decode before leaves no trace in the results


@pytest.mark.gpu
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_the_graphs_prepared_up_front_are_the_ones_the_batches_run(tmp_path, bf16, monkeypatch):
    """On a GPU the decoder's graphs are captured once, before the first batch, in the precision the batches then
    decode in (under autocast too): no batch allocates or captures again, and a later call decodes only its
    batches."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = synthetic.build_synthetic_model("tiny-tdt", seed=0, device="cuda").eval()
    apply_decoding(model, {"strategy": "fast_greedy"})
    computer = model.decoding.decoding.computer
    paths = [str(p) for p in synthetic.write_wavs(synthetic.synthetic_audio(DURATIONS, seed=3), tmp_path)]
    plans = []
    real_plan = fast_path.plan_batches
    monkeypatch.setattr(fast_path, "plan_batches", lambda *a, **k: plans.append(real_plan(*a, **k)) or plans[-1])
    prepared = []
    real_prepare = computer.prepare_reserved
    computer.prepare_reserved = lambda *a: real_prepare(*a) or prepared.append((computer._buffers, computer._loop))
    options = FastTranscribeOptions(max_batch_seconds=3.0)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        ours = fast_transcribe(model, paths, 2, options=options, return_hypotheses=True)
    assert sum(len(h.y_sequence) for h in ours) > 0
    assert len(prepared) == 1 and prepared[0][1] is not None  # graphs made up front...
    assert prepared[0] == (computer._buffers, computer._loop)  # ...and the batches ran on them
    assert computer._buffers.batch_size == computer._reserved[0] and computer._buffers.max_time >= computer._reserved[1]
    decodes = []
    real_decode = computer._decode
    computer._decode = lambda *a, **k: decodes.append(True) or real_decode(*a, **k)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        again = fast_transcribe(model, paths, 2, options=options, return_hypotheses=True)
    assert len(decodes) == len(plans[-1]) > 1  # a later call decodes its batches only: the graphs are kept
    assert [h.y_sequence.tolist() for h in again] == [h.y_sequence.tolist() for h in ours]


def test_reading_started_early_gives_the_same_batches():
    rng = np.random.default_rng(1)
    audio = [rng.standard_normal(n).astype(np.float32) for n in (500, 120, 900, 40, 300)]
    batches = [[2, 0], [4, 1], [3]]
    lengths = [len(a) for a in audio]
    plain = list(PrefetchedAudioBatches(audio, batches, 16000, threads=2, prefetch=1))
    assert [b.shape for b, _ in plain] == [(2, 900), (2, 300), (1, 40)]
    wrong = list(lengths)
    wrong[2] += 7  # a header that disagrees with what is read: the buffer is made again at the right width
    for expected in (lengths, wrong):
        loader = PrefetchedAudioBatches(audio, batches, 16000, threads=2, prefetch=1, expected_lengths=expected)
        loader.start()
        early = list(loader)
        assert len(early) == len(plain)
        for (a, la), (b, lb) in zip(early, plain, strict=True):
            assert torch.equal(a, b) and torch.equal(la, lb)
        assert len(list(loader)) == len(plain)  # a second pass reads again
    loader = PrefetchedAudioBatches(audio, batches, 16000, expected_lengths=lengths)
    loader.start()
    loader.close()  # a reading never taken over stops; the next pass starts afresh
    assert len(list(loader)) == len(plain)
    with pytest.raises(ValueError, match="expected_lengths has 2 entries for 5"):
        PrefetchedAudioBatches(audio, batches, 16000, expected_lengths=[1, 2])


def test_long_lived_objects_leave_the_garbage_collector_once_per_process(model_and_files, monkeypatch):
    model, paths, _ = model_and_files
    freezes = []
    monkeypatch.setattr(fast_path.gc, "freeze", lambda: freezes.append(True))
    monkeypatch.setattr(fast_path, "_frozen_once", False)  # as in a new process
    assert fast_transcribe(model, paths[:2], 2, options=FastTranscribeOptions(freeze_gc=False))
    assert freezes == []
    for _ in range(2):
        assert fast_transcribe(model, paths[:2], 2)
    assert freezes == [True]


def test_transcribe_script_offline_path_writes_the_same_manifest(tmp_path):
    from nemo_fastdecode.apps.transcribe import resolve_config, run

    audio_dir = tmp_path / "wavs"
    synthetic.write_wavs(synthetic.synthetic_audio([0.9, 0.3, 1.6], seed=5), audio_dir)
    manifests = []
    for offline in (False, True):
        out = tmp_path / f"out_{offline}.jsonl"
        cfg = {"audio_dir": str(audio_dir), "output_filename": str(out), "offline_path": offline, "cuda": -1}
        assert not run(resolve_config(cfg), progress=False, log=lambda _: None).failed
        manifests.append([json.loads(line) for line in out.read_text().splitlines()])
    assert len(manifests[0]) == 3 and any(r["pred_text"] for r in manifests[0])
    assert manifests[0] == manifests[1]


def test_decoding_option_routes_transcribe_and_override_config(model_and_files, monkeypatch):
    model, paths, _ = model_and_files
    calls = []
    import nemo_fastdecode.offline.fast_path as module

    real = module.plan_batches
    monkeypatch.setattr(module, "plan_batches", lambda *a, **k: calls.append(a) or real(*a, **k))
    apply_decoding(model, {"strategy": "fast_greedy", "greedy": {"offline_batching": True}})
    try:
        plain = model.transcribe(paths, batch_size=2, return_hypotheses=True, verbose=False)
        model.eval()
        override = model.get_transcribe_config()  # as NeMo's transcribe_speech.py passes its options
        override.batch_size, override.return_hypotheses, override.verbose = 2, True, False
        overridden = model.transcribe(paths, override_config=override)
        model.eval()
    finally:
        apply_decoding(model, {"strategy": "fast_greedy", "greedy": {"offline_batching": False}})
    assert len(calls) == 2  # both calls took the offline path
    nemo = _nemo(model, paths)
    _same(plain, nemo)
    _same(overridden, nemo)
    model.transcribe(paths[:2], batch_size=2, verbose=False)
    model.eval()
    assert len(calls) == 2  # the option off: NeMo's transcribe again


@pytest.mark.parametrize("section", ["greedy", "beam"])
def test_decoding_keys_route_fast_beam_too_and_bring_the_fast_encoder(model_and_files, monkeypatch, section):
    model, paths, _ = model_and_files
    entered = []
    import nemo_fastdecode.offline.fast_path as module

    real = module.fast_encoder

    def spy(m):
        entered.append(m)
        return real(m)

    monkeypatch.setattr(module, "fast_encoder", spy)
    strategy = {"greedy": "fast_greedy", "beam": "fast_beam"}[section]
    keys = {"offline_batching": True, "fast_encoder": True} | ({"beam_size": 2} if section == "beam" else {})
    apply_decoding(model, {"strategy": strategy, section: keys})
    try:
        fused = model.transcribe(paths, batch_size=2, return_hypotheses=True, verbose=False)
        model.eval()
        apply_decoding(model, {"strategy": strategy, section: {"fast_encoder": False}})
        unfused = model.transcribe(paths, batch_size=2, return_hypotheses=True, verbose=False)
        model.eval()
    finally:
        apply_decoding(model, {"strategy": strategy, section: {"offline_batching": False, "fast_encoder": False}})
    assert entered == [model]  # the offline path ran both times, the fused encoder the first time only

    def tokens(hyps):
        return [(h[0] if isinstance(h, list) else h).y_sequence.tolist() for h in hyps]  # beam: n-best lists

    assert len(fused) == len(paths) and any(tokens(fused))
    assert tokens(fused) == tokens(unfused)  # fp32: the fused encoder differs by rounding only
    with pytest.raises(ValueError, match="fast_encoder: true runs on the offline path: set offline_batching: true"):
        apply_decoding(model, {"strategy": strategy, section: {"fast_encoder": True}})


@pytest.mark.gpu
def test_thirty_minutes_of_audio_in_one_file_on_the_gpu(tmp_path, exact_fp32):
    """A 30-minute file beside a 50 ms one, through the offline path on a GPU: the same tokens as NeMo's transcribe
    of each file alone (fp32, full attention of the tiny model), and no out-of-memory failure. The 30-minute file is
    over the padded-audio budget, so the plan gives it a batch of its own; NeMo batching it with the short file would
    pad it and round differently, which over 22,500 frames of a random model's near-ties moves a few tokens."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = synthetic.build_synthetic_model("tiny-rnnt", seed=0, device="cuda").eval()
    audio = synthetic.synthetic_audio([1800.0, 0.05], seed=4)
    encoded, lengths = synthetic.encode(model, synthetic.synthetic_audio([5.0, 3.0]), batch_size=2, device="cuda")
    synthetic.calibrate_blank_bias(model, encoded, lengths, 0.3, iterations=4, tolerance=0.05)
    apply_decoding(model, {"strategy": "fast_greedy"})
    paths = [str(p) for p in synthetic.write_wavs(audio, tmp_path)]
    ours = fast_transcribe(model, paths, 2, return_hypotheses=True)
    nemo = [_nemo(model, [path])[0] for path in paths]
    assert len(nemo[0].y_sequence) > 1000  # 30 minutes of emissions to compare
    for a, b in zip(ours, nemo, strict=True):
        assert a.y_sequence.tolist() == b.y_sequence.tolist() and a.text == b.text
