"""Cache-aware streaming for desynchronised streams vs NeMo's ``conformer_stream_step`` on each stream alone (CPU)."""

from __future__ import annotations

import math
import os
import random

import numpy as np
import pytest
import torch
from conftest import nemo_alone, tiny_streaming_model

from fastdecode_lab import synthetic as S
from fastdecode_lab.streaming_sim.nemo_path import NemoSlotStreamer
from nemo_fastdecode.apps.comparison import as_int_list
from nemo_fastdecode.greedy import hyps as hyps_module
from nemo_fastdecode.greedy.base import GreedyComputerBase
from nemo_fastdecode.greedy.state import BatchedGreedyState
from nemo_fastdecode.streaming import StreamingGeometry, StreamingTranscriber, split_features
from nemo_fastdecode.streaming.buckets import bucket_sizes
from nemo_fastdecode.streaming.decoding import SlotDecoder

pytestmark = pytest.mark.usefixtures("single_thread")

DURATIONS = [1.9, 0.75, 2.6, 1.25, 0.5, 1.6]  # seconds; staggered starts, different lengths
LOOKAHEADS = [[16, 1], [16, 3]]  # tiny-streaming's att_context_size list is [[16, 3], [16, 1], [16, 0]]


@pytest.fixture(scope="module")
def model():
    return tiny_streaming_model()


@pytest.fixture(scope="module")
def features(model):
    """One ``[feat_in, T]`` mel-feature tensor per stream (the whole utterance, as NeMo's buffer computes it)."""
    out = []
    with torch.inference_mode():
        for audio in S.synthetic_audio(DURATIONS, seed=11):
            signal = torch.from_numpy(audio)[None]
            feats, length = model.preprocessor(input_signal=signal, length=torch.tensor([signal.shape[1]]))
            out.append(feats[0, :, : int(length)].clone())
    return out


@pytest.fixture(scope="module", params=LOOKAHEADS, ids=lambda c: f"att{c[0]}-{c[1]}")
def reference(request, model, features):
    model.encoder.set_default_att_context_size(request.param)
    runs = [nemo_alone(model, f) for f in features]
    return request.param, runs


def relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours - ref).abs().max() / ref.abs().max().clamp_min(1e-12))


# ----------------------------------------------------------------------------------------------
# geometry


def test_split_features_is_nemo_chunk_schedule(model, features, reference):
    att, runs = reference
    model.encoder.set_default_att_context_size(att)
    geometry = StreamingGeometry.from_encoder(model.encoder)
    assert geometry.att_context_size == tuple(att) and geometry.out_frames == att[1] + 1
    for feats, (_, _, nemo_chunks) in zip(features, runs, strict=True):
        ours = split_features(feats, geometry)
        assert len(ours) == len(nemo_chunks)
        for step, (chunk, nemo_chunk) in enumerate(zip(ours, nemo_chunks, strict=True)):
            prefix = 0 if step == 0 else geometry.pre_encode_cache  # NeMo's chunk carries the pre-encode cache
            assert torch.equal(chunk, nemo_chunk[:, prefix:])
    assert bucket_sizes(6) == [1, 2, 4, 6] and bucket_sizes(1) == [1] and bucket_sizes(8) == [1, 2, 4, 8]


# ----------------------------------------------------------------------------------------------
# exactness: random interleavings of desynchronised streams


def run_interleaved(streamer, features, seed: int, max_open: int, hypotheses_share: float = 0.5):
    """Streams start staggered, step in random subsets (in random order), end and free their slots.

    A share ``hypotheses_share`` of the steps asks for the streams' hypotheses (``return_hypotheses``).

    Returns per stream: the encoder output of every step, the final tokens and frames, the text.
    """
    rng = random.Random(seed)
    geometry = streamer.geometry
    chunks = [split_features(f, geometry) for f in features]
    waiting = list(range(len(features)))
    slot_of: dict[int, int] = {}
    position = [0] * len(features)
    outputs: list[list[torch.Tensor]] = [[] for _ in features]
    finals = {}
    while waiting or slot_of:
        # join: staggered, while slots are free
        if waiting and len(slot_of) < max_open and (not slot_of or rng.random() < 0.5):
            stream = waiting.pop(0)
            slot_of[stream] = streamer.open()
        running = list(slot_of)
        stepping = [s for s in running if rng.random() < 0.7] or running[:1]
        rng.shuffle(stepping)
        with_hyps = rng.random() < hypotheses_share
        result = streamer.step(
            [slot_of[s] for s in stepping], [chunks[s][position[s]] for s in stepping], return_hypotheses=with_hyps
        )
        assert result.slots == [slot_of[s] for s in stepping]
        assert (result.hypotheses is not None) == with_hyps
        for row, stream in enumerate(stepping):
            outputs[stream].append(result.encoded[row, : int(result.encoded_lengths[row])])
            position[stream] += 1
            if with_hyps:  # partial transcript after the step: the stream's tokens so far
                assert as_int_list(result.hypotheses[row].y_sequence) == streamer.token_ids(slot_of[stream])
            if position[stream] == len(chunks[stream]):  # leave
                finals[stream] = streamer.flush(slot_of.pop(stream))
    return outputs, finals


@pytest.mark.parametrize("pad_to_bucket", [True, False], ids=["padded-buckets", "exact-size"])
def test_interleaved_streams_match_nemo_alone(model, features, reference, pad_to_bucket):
    att, runs = reference
    streamer = StreamingTranscriber(model, num_slots=4, att_context_size=att, pad_to_bucket=pad_to_bucket)
    outputs, finals = run_interleaved(streamer, features, seed=len(att) + att[1] + pad_to_bucket, max_open=4)
    for stream, (nemo_outputs, nemo_hyp, _) in enumerate(runs):
        assert len(outputs[stream]) == len(nemo_outputs)
        for ours, ref in zip(outputs[stream], nemo_outputs, strict=True):
            assert ours.shape == ref.shape
            assert relative_error(ours, ref) <= 1e-4
        final = finals[stream]
        assert as_int_list(final.hypothesis.y_sequence) == as_int_list(nemo_hyp.y_sequence)
        assert as_int_list(final.hypothesis.timestamp) == as_int_list(nemo_hyp.timestamp)
        assert final.text == model.decoding.decode_ids_to_str(as_int_list(nemo_hyp.y_sequence))
    assert sum(len(as_int_list(h.y_sequence)) for _, h, _ in runs) > 0  # the comparison is not vacuous
    assert streamer.open_slots == []
    # the streams outlived the attention window: their ring buffers wrapped (the oldest frames were dropped)
    assert int(streamer.slots.ring_start[: streamer.slots.num_slots].max()) > 0


def test_steps_run_the_decoder_once_and_build_no_hypotheses(model, features, reference, monkeypatch):
    """Slot-state decoding: one batched decoder call per step, no Python objects per stream until asked."""
    att, runs = reference
    streamer = StreamingTranscriber(model, num_slots=4, att_context_size=att, pad_to_bucket=True)
    streamer.decoder = SlotDecoder(model, 4, token_capacity=2)  # tiny token storage: it must grow
    counts = {"step": 0, "decode": 0, "hypothesis": 0, "split": 0}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(streamer, "step", counting("step", streamer.step))
    monkeypatch.setattr(
        GreedyComputerBase, "decode_with_state", counting("decode", GreedyComputerBase.decode_with_state)
    )
    monkeypatch.setattr(hyps_module, "Hypothesis", counting("hypothesis", hyps_module.Hypothesis))
    monkeypatch.setattr(BatchedGreedyState, "split", counting("split", BatchedGreedyState.split))
    _, finals = run_interleaved(streamer, features, seed=5, max_open=4, hypotheses_share=0.0)
    assert counts["decode"] == counts["step"] > len(features)
    assert counts["hypothesis"] == counts["split"] == len(features)  # only flush builds them, once per stream
    assert streamer.decoder.token_capacity > 2
    on_gpu = next(model.parameters()).is_cuda  # graphs per bucket on the GPU; one eager computer on the CPU
    assert sorted(streamer.decoder.computers) == ([1, 2, 4] if on_gpu else [0])
    for stream, (_, nemo_hyp, _) in enumerate(runs):
        assert as_int_list(finals[stream].hypothesis.y_sequence) == as_int_list(nemo_hyp.y_sequence)
        assert as_int_list(finals[stream].hypothesis.timestamp) == as_int_list(nemo_hyp.timestamp)


def test_token_rows_are_the_hypotheses_tokens_between_starts_and_stops(model, features):
    """Events read windows of the token storage instead of hypotheses: the same tokens and frames."""
    streamer = StreamingTranscriber(model, num_slots=3, att_context_size=[16, 1])
    slots = [streamer.open() for _ in range(3)]
    for chunks in zip(*(split_features(f, streamer.geometry)[:4] for f in features[:3]), strict=True):
        streamer.step(slots, list(chunks))
    decoder = streamer.decoder
    hyps = decoder.hypotheses(slots)
    counts = decoder.token_counts(np.array(slots))
    assert counts.tolist() == [len(h.y_sequence) for h in hyps] and counts.min() > 3  # tokens to compare
    rng = np.random.default_rng(0)
    for _ in range(5):
        starts = rng.integers(0, counts + 1)
        stops = rng.integers(starts, counts + 1)
        labels, times = decoder.token_rows(np.array(slots), starts, stops, with_timestamps=True)
        for i, hyp in enumerate(hyps):
            size = stops[i] - starts[i]
            assert labels[i, :size].tolist() == as_int_list(hyp.y_sequence)[starts[i] : stops[i]]
            assert times[i, :size].tolist() == as_int_list(hyp.timestamp)[starts[i] : stops[i]]
    labels, times = decoder.token_rows(np.array(slots), counts, counts)
    assert labels.shape == (3, 0) and times is None


def test_warm_up_prepares_every_bucket_before_the_first_step(model, features):
    streamer = StreamingTranscriber(model, num_slots=5, att_context_size=[16, 1], pad_to_bucket=True)
    times = streamer.warm_up()
    assert times.encoder_seconds > 0 and times.decoder_seconds > 0
    assert times.total_seconds == times.encoder_seconds + times.decoder_seconds
    encoder_buckets = dict(streamer.runner._buckets)
    assert sorted(encoder_buckets) == streamer.runner.sizes == [1, 2, 4, 5]
    computers = dict(streamer.decoder.computers)
    dummy = streamer.decoder.dummy_slot
    assert int(streamer.decoder.counts[dummy]) == 0 and not streamer.decoder.decoded(dummy)
    slots = [streamer.open() for _ in range(3)]
    first, later = split_features(features[0], streamer.geometry)[:2]
    streamer.step(slots, [first] * 3)
    streamer.step(slots[:1], [later])
    streamer.step(slots[:2], [later] * 2)
    # nothing new was allocated (on a GPU: captured) during the steps
    assert streamer.runner._buckets == encoder_buckets and streamer.decoder.computers == computers
    eager = StreamingTranscriber(model, num_slots=2, att_context_size=[16, 1])
    assert eager.warm_up().total_seconds == 0.0  # exact-size eager steps: nothing to warm up


def test_nemo_slot_path_matches_nemo_alone(model, features, reference):
    """The benchmark's baseline (NeMo with gather/scatter over slots), one stream per call, is NeMo itself."""
    att, runs = reference
    model.encoder.set_default_att_context_size(att)
    nemo = NemoSlotStreamer(model, num_slots=3)
    geometry = nemo.geometry
    chunks = [split_features(f, geometry) for f in features[:3]]
    slots = [nemo.open() for _ in chunks]
    for step in range(max(len(c) for c in chunks)):
        for stream in reversed(range(3)):  # one stream per call, out of order
            if step < len(chunks[stream]):
                nemo.step([slots[stream]], [chunks[stream][step]])
    for stream, slot in enumerate(slots):
        assert as_int_list(nemo.flush(slot).y_sequence) == as_int_list(runs[stream][1].y_sequence)


# ----------------------------------------------------------------------------------------------
# slots and errors


@pytest.fixture(scope="module")
def streamer(model):
    return StreamingTranscriber(model, num_slots=3, att_context_size=[16, 1])


def test_open_close_reuse(streamer, features):
    g = streamer.geometry
    a, b = streamer.open(), streamer.open()
    assert (a, b) == (0, 1) and streamer.open_slots == [0, 1]
    first = split_features(features[0], g)
    streamer.step([a], [first[0]])
    streamer.step([b, a], [first[0], first[1]])
    assert streamer.text(a) == streamer.model.decoding.decode_ids_to_str(as_int_list(streamer.hypothesis(a).y_sequence))
    streamer.close(a)
    assert streamer.open() == a  # reused, emptied: behaves as a new stream
    again = streamer.step([a], [first[0]], return_hypotheses=True)
    fresh = StreamingTranscriber(streamer.model, num_slots=1, att_context_size=[16, 1])
    alone = fresh.step([fresh.open()], [first[0]], return_hypotheses=True)
    assert relative_error(again.encoded, alone.encoded) <= 1e-5
    assert as_int_list(again.hypotheses[0].y_sequence) == as_int_list(alone.hypotheses[0].y_sequence)
    c = streamer.open()
    with pytest.raises(RuntimeError, match="all 3 slots are in use"):
        streamer.open()
    result = streamer.flush(c)
    assert result.slot == c and result.hypothesis is None and result.text == ""
    for slot in (a, b):
        streamer.close(slot)


def test_streams_opened_between_steps_are_emptied_together(streamer, features):
    """Slots opened between two steps are emptied in one reset before the step reads them: reused slots then behave
    as new streams."""
    g = streamer.geometry
    first = split_features(features[0], g)
    a, b = streamer.open(), streamer.open()
    streamer.step([a, b], [first[0], first[0]])
    streamer.step([a, b], [first[1], first[1]])
    assert streamer.token_ids(a)  # the slots hold a stream's state to empty
    streamer.close(a)
    streamer.close(b)
    resets, reset_ = [], streamer.slots.reset_
    streamer.slots.reset_ = lambda rows: (resets.append(rows.tolist()), reset_(rows))
    try:
        assert [streamer.open(), streamer.open()] == [a, b] and not resets  # emptied when first read, not here
        again = streamer.step([b, a], [first[0], first[0]], return_hypotheses=True)
    finally:
        del streamer.slots.reset_
    assert resets == [[a, b]]
    fresh = StreamingTranscriber(streamer.model, num_slots=1, att_context_size=[16, 1])
    alone = fresh.step([fresh.open()], [first[0]], return_hypotheses=True)
    for row in range(2):
        assert relative_error(again.encoded[row], alone.encoded[0]) <= 1e-5
        assert as_int_list(again.hypotheses[row].y_sequence) == as_int_list(alone.hypotheses[0].y_sequence)
    for slot in (a, b):
        streamer.close(slot)


def test_bad_slot_ids(streamer, features):
    chunk = split_features(features[0], streamer.geometry)[0]
    slot = streamer.open()
    try:
        with pytest.raises(ValueError, match=r"slot id 7 is out of range; valid slot ids: 0\.\.2"):
            streamer.step([7], [chunk])
        with pytest.raises(ValueError, match=r"slot id -1 is out of range"):
            streamer.step([-1], [chunk])
        with pytest.raises(ValueError, match=rf"cannot step slot 2: it is not open; open slots: {slot}"):
            streamer.step([2], [chunk])
        with pytest.raises(ValueError, match=rf"slot id {slot} is repeated in slot_ids \[{slot}, {slot}\]"):
            streamer.step([slot, slot], [chunk, chunk])
        with pytest.raises(TypeError, match="slot ids must be ints, got '0'"):
            streamer.step(["0"], [chunk])
        with pytest.raises(TypeError, match="slot ids must be ints, got True"):
            streamer.step([True], [chunk])
        with pytest.raises(ValueError, match=r"slot id 7 is out of range"):  # an integer array: the same checks
            streamer.step(np.array([7]), [chunk])
        with pytest.raises(ValueError, match=rf"slot id {slot} is repeated"):
            streamer.step(np.array([slot, slot]), [chunk, chunk])
        with pytest.raises(ValueError, match="cannot step slot 2: it is not open"):
            streamer.step(np.array([2], dtype=np.int32), [chunk])
        with pytest.raises(ValueError, match="slot_ids is empty"):
            streamer.step([], [])
        with pytest.raises(ValueError, match="cannot close slot 2: it is not open"):
            streamer.close(2)
        with pytest.raises(ValueError, match="cannot flush slot 1: it is not open"):
            streamer.flush(1)
    finally:
        streamer.close(slot)


def test_bad_chunks(streamer, features):
    g = streamer.geometry
    chunks = split_features(features[0], g)
    slot = streamer.open()
    try:
        with pytest.raises(ValueError, match=r"got 2 chunks for 1 slot ids"):
            streamer.step([slot], [chunks[0], chunks[1]])
        with pytest.raises(
            ValueError,
            match=rf"shape \(80, {g.chunk}\); valid: \[80, T\] with 1 <= T <= {g.first_chunk} "
            r"\(a stream's first chunk\)",
        ):
            streamer.step([slot], [chunks[1]])
        with pytest.raises(ValueError, match=r"shape \(64, 9\); valid: \[80, T\]"):
            streamer.step([slot], [torch.zeros(64, 9)])
        with pytest.raises(ValueError, match=r"shape \(80, 0\); valid: \[80, T\] with 1 <= T"):
            streamer.step([slot], [torch.zeros(80, 0)])
        with pytest.raises(TypeError, match=r"chunk 0 \(slot .*\) has dtype torch.int64; valid: torch.float32"):
            streamer.step([slot], [torch.zeros(80, 9, dtype=torch.long)])
        with pytest.raises(TypeError, match="must be a torch.Tensor, got list"):
            streamer.step([slot], [[0.0] * 9])
        with pytest.raises(ValueError, match=r"one \[N, feat_in, T\] tensor, got shape \(80, 9\)"):
            streamer.step([slot], chunks[0])
        streamer.step([slot], chunks[0][None])  # a [N, F, T] tensor is accepted
        with pytest.raises(ValueError, match=rf"1 <= T <= {g.chunk} \(a stream's chunk\)"):
            streamer.step([slot], [torch.zeros(80, g.chunk + 1)])
    finally:
        streamer.close(slot)


def test_one_batch_tensor_equals_the_list_of_chunks(model, features):
    """A ``[N, feat_in, T]`` tensor (a server that batches its chunks) skips the per-chunk packing, same results."""
    results = []
    for as_tensor in (False, True):
        streamer = StreamingTranscriber(model, num_slots=2, att_context_size=[16, 1])
        slots = [streamer.open() for _ in range(2)]
        for step in range(3):
            chunks = [split_features(f, streamer.geometry)[step] for f in features[:2]]
            width = min(c.shape[1] for c in chunks)
            chunks = [c[:, :width] for c in chunks]
            result = streamer.step(slots, torch.stack(chunks) if as_tensor else chunks)
            results.append((result.encoded, result.encoded_lengths))
    half = len(results) // 2
    for (a, a_len), (b, b_len) in zip(results[:half], results[half:], strict=True):
        assert torch.equal(a_len, b_len) and torch.equal(a, b)


def test_packed_chunks_with_lengths_equal_the_list_of_chunks(model, features):
    """One ``[N, feat_in, T]`` tensor with each row's length (first, full and last chunks mixed, NaN after each
    row's length: never read) gives what the list of those chunks gives."""
    results = []
    for packed in (False, True):
        streamer = StreamingTranscriber(model, num_slots=3, att_context_size=[16, 1])
        g = streamer.geometry
        chunks = [split_features(f, g) for f in features[:3]]
        slots = [streamer.open() for _ in chunks]
        for step in range(max(map(len, chunks))):
            rows = [i for i in range(3) if step < len(chunks[i])][::-1]
            batch = [chunks[i][step] for i in rows]
            if packed:
                lengths = [c.shape[1] for c in batch]
                tensor = torch.full((len(rows), g.feat_in, g.chunk), float("nan"))
                for row, chunk in enumerate(batch):
                    tensor[row, :, : chunk.shape[1]] = chunk
                result = streamer.step([slots[i] for i in rows], tensor, lengths=np.array(lengths))
            else:
                result = streamer.step([slots[i] for i in rows], batch)
            results.append((result.encoded, result.encoded_lengths))
        results.append([streamer.token_ids(slot) for slot in slots])
    half = len(results) // 2
    assert results[half - 1] == results[-1] and sum(map(len, results[-1])) > 0
    for (a, a_len), (b, b_len) in zip(results[: half - 1], results[half:-1], strict=True):
        assert torch.equal(a_len, b_len) and torch.equal(a, b)
    streamer = StreamingTranscriber(model, num_slots=1, att_context_size=[16, 1])
    slot = streamer.open()
    g = streamer.geometry
    with pytest.raises(ValueError, match=rf"length {g.chunk} of row 0 \(slot 0\) is out of range; valid: 1 <= T <= "
                       rf"{g.first_chunk} \(a stream's first chunk"):  # fmt: skip
        streamer.step([slot], torch.zeros(1, g.feat_in, g.chunk), lengths=[g.chunk])
    with pytest.raises(ValueError, match=r"length 0 of row 0"):
        streamer.step([slot], torch.zeros(1, g.feat_in, 4), lengths=[0])
    with pytest.raises(ValueError, match=r"with 2 lengths for 1 slot ids"):
        streamer.step([slot], torch.zeros(1, g.feat_in, 4), lengths=[1, 2])
    with pytest.raises(ValueError, match=r"with lengths, chunks must be one \[N, feat_in, T\] tensor"):
        streamer.step([slot], [torch.zeros(g.feat_in, 4)], lengths=[4])


def test_bad_configuration(model, monkeypatch):
    with pytest.raises(ValueError, match=r"att_context_size=\[16, 2\] is not one of .*valid: \[\[16, 3\], \[16, 1\]"):
        StreamingTranscriber(model, num_slots=2, att_context_size=[16, 2])
    with pytest.raises(ValueError, match="num_slots must be a positive int, got 0"):
        StreamingTranscriber(model, num_slots=0)
    with pytest.raises(ValueError, match=r"dtype torch.int32 is not supported; valid: torch.float32"):
        StreamingTranscriber(model, num_slots=1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"matmul_precision must be one of \('fp32', 'tf32x3', 'tf32'\), got 'fp16'"):
        StreamingTranscriber(model, num_slots=1, encoder_matmul="fp16")
    with pytest.raises(ValueError, match=r"matmul_precision='tf32x3' needs fp32 compute, got torch.bfloat16"):
        StreamingTranscriber(model, num_slots=1, dtype=torch.bfloat16, encoder_matmul="tf32x3")
    if not next(model.parameters()).is_cuda:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        with pytest.raises(ValueError, match=r"'tf32x3' runs a Triton kernel: needs CUDA .* got device cpu"):
            StreamingTranscriber(model, num_slots=1, encoder_matmul="tf32x3")
        monkeypatch.undo()
    offline = S.build_synthetic_model("tiny-rnnt", seed=0)
    with pytest.raises(ValueError, match=r"att_context_style='regular' \(valid: 'chunked_limited'\)"):
        StreamingTranscriber(offline, num_slots=1)


@pytest.mark.parametrize("use_triton", [False, True], ids=["torch", "triton"])
def test_bf16_caches_run_close_to_fp32(model, features, use_triton, monkeypatch):
    """bf16 compute (autocast, bf16 caches) stays close to fp32; with Triton (its interpreter here) the subsampling
    runs fused in fp32 (autocast off around it), without it NeMo's module runs in bf16."""
    from nemo_fastdecode.streaming import subsampling as streaming_subsampling

    if use_triton and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 for the Triton kernels on the CPU")
    fused = []
    masked_depthwise_conv = streaming_subsampling.masked_depthwise_conv
    monkeypatch.setattr(
        streaming_subsampling, "masked_depthwise_conv", lambda *a: fused.append(a[0].dtype) or masked_depthwise_conv(*a)
    )
    g_chunks = split_features(features[2], StreamingTranscriber(model, 1, att_context_size=[16, 1]).geometry)
    outputs = {}
    for dtype in (torch.float32, torch.bfloat16):
        streamer = StreamingTranscriber(
            model, num_slots=1, att_context_size=[16, 1], dtype=dtype, decode=False, use_triton=use_triton
        )
        slot = streamer.open()
        outputs[dtype] = torch.cat([streamer.step([slot], [c]).encoded[0].float() for c in g_chunks[:6]])
        assert outputs[dtype].numel() > 0
        assert streamer.slots.keys.dtype == dtype
    assert relative_error(outputs[torch.bfloat16], outputs[torch.float32]) < 0.1
    # fused (bf16 with Triton only): one strided stage per kernel call, on fp32 activations
    assert fused == ([torch.float32] * len(fused) if use_triton else []) and (len(fused) > 0) == use_triton


@pytest.mark.parametrize("encoder_matmul", ["fp32", "tf32x3", "tf32x3-mixed"])
def test_triton_kernel_path_matches_nemo_alone(model, features, reference, encoder_matmul, monkeypatch):
    """The encoder with the Triton indexed-attention kernel (its CPU interpreter here), padded buckets; with
    ``tf32x3`` its GEMMs (and their Swish / residual epilogues) on the Triton 3xTF32 kernel too; ``-mixed``: only
    the widening GEMMs there, the others on cuBLAS with the epilogue in torch (what small buckets do)."""
    mixed = encoder_matmul.endswith("-mixed")
    encoder_matmul = encoder_matmul.removesuffix("-mixed")
    from nemo_fastdecode.kernels import matmul
    from nemo_fastdecode.streaming import encoder as streaming_encoder

    gemms, convs = [], []
    linear = matmul.linear
    monkeypatch.setattr(matmul, "linear", lambda *args, **kwargs: gemms.append(kwargs) or linear(*args, **kwargs))
    from nemo_fastdecode.streaming import subsampling as streaming_subsampling

    relu_pads, depthwise_convs = [], []
    fused_relu_pad = streaming_subsampling.masked_relu_pad
    monkeypatch.setattr(streaming_subsampling, "masked_relu_pad", lambda *a: relu_pads.append(1) or fused_relu_pad(*a))
    fused_depthwise = streaming_subsampling.masked_depthwise_conv
    monkeypatch.setattr(
        streaming_subsampling,
        "masked_depthwise_conv",
        lambda *a: depthwise_convs.append(a[-1] is not None) or fused_depthwise(*a),
    )
    fused_conv = streaming_encoder.glu_depthwise_conv_step
    monkeypatch.setattr(streaming_encoder, "glu_depthwise_conv_step", lambda *a: convs.append(1) or fused_conv(*a))
    # tiny shapes: the kernel anyway (mixed: for widening GEMMs only, d_model -> 4 d_model or 2 d_model)
    monkeypatch.setattr(matmul, "tensor_cores_win", lambda rows, n_out, depth: n_out > depth or not mixed)
    att, runs = reference
    if att != [16, 1]:
        pytest.skip("one look-ahead is enough for the (slow) Triton interpreter")
    pytest.importorskip("triton")
    if not next(model.parameters()).is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs the model on CUDA or TRITON_INTERPRET=1")
    streamer = StreamingTranscriber(model, num_slots=3, att_context_size=att, use_triton=True, pad_to_bucket=True,
                                    encoder_matmul=encoder_matmul)  # fmt: skip
    chunks = [split_features(f, streamer.geometry)[:4] for f in features[:3]]
    slots = [streamer.open() for _ in range(3)]
    order = [[0], [1, 0], [2, 0, 1], [1, 2], [0, 2, 1], [2]]  # staggered, out of order, subsets
    position = [0, 0, 0]
    for streams in order:
        result = streamer.step([slots[s] for s in streams], [chunks[s][position[s]] for s in streams])
        for row, s in enumerate(streams):
            ref = runs[s][0][position[s]]
            assert relative_error(result.encoded[row, : int(result.encoded_lengths[row])], ref) <= 1e-4
            position[s] += 1
    # feed-forwards 2 x 2, attention: q k v stacked in one GEMM and out, pointwise convolutions 2 (mixed: the
    # widening ones: feed-forwards' first, q k v, the first pointwise convolution)
    on_kernels = encoder_matmul != "fp32"
    assert all(kw.get("precision") == encoder_matmul for kw in gemms)
    gemms_per_layer = 4 if mixed else 8
    out = model.encoder.pre_encode.out  # the subsampling's output Linear, on the kept frames: one GEMM per step
    gemms_per_step = len(model.encoder.layers) * gemms_per_layer + (out.out_features > out.in_features or not mixed)
    assert len(gemms) == (len(order) * gemms_per_step if on_kernels else 0)
    # tf32x3: per layer, the two feed-forwards' Swish and the four residual additions ride on the GEMMs
    layers_run = len(order) * len(model.encoder.layers) if on_kernels else 0
    assert sum(bool(kw.get("swish")) for kw in gemms) == layers_run * 2
    # ... and the q-k-v GEMM writes k and v straight into the slots' caches (its epilogue scatter)
    assert sum(kw.get("scatter") is not None for kw in gemms) == layers_run
    assert sum(kw.get("residual") is not None for kw in gemms) == layers_run * (0 if mixed else 4)
    # tf32x3: the attention's, convolution's and second feed-forward's layer norms ride on the GEMM after them,
    # with row statistics kept by the residual GEMM before them (both GEMMs on the kernel: not in mixed)
    assert sum(kw.get("row_stats", False) for kw in gemms) == layers_run * (0 if mixed else 3)
    # ... and the first feed-forward's from the previous layer's norm_out (a kernel that keeps its row statistics)
    first_layers = len(order) if on_kernels else 0
    fused_norms = (layers_run - first_layers) + (0 if mixed else 3 * layers_run)
    assert sum(kw.get("layer_norm") is not None for kw in gemms) == fused_norms
    # tf32x3: the subsampling's ReLUs (with masks and paddings) are fused, one per convolution stage and step
    stages = int(math.log2(model.encoder.pre_encode.subsampling_factor))
    # each step: the first convolution inside the first depthwise kernel, one kernel per strided stage, the last ReLU;
    # fp32 (NeMo's convolutions, per layer): one masked ReLU per stage
    assert len(relu_pads) == len(order) * (1 if on_kernels else stages)
    assert depthwise_convs == ([True] + [False] * (stages - 2)) * (len(order) if on_kernels else 0)
    # tf32x3: the convolution module between its GEMMs is one fused kernel per layer and step
    assert len(convs) == (len(order) * len(model.encoder.layers) if on_kernels else 0)


@pytest.mark.gpu
@pytest.mark.parametrize("encoder_matmul", ["fp32", "tf32x3", "tf32"])
def test_cuda_graph_step_matches_nemo_alone_on_the_gpu(features, encoder_matmul, monkeypatch):
    """On CUDA, the step as it runs in production: a CUDA graph per bucket, the Triton kernels (tf32x3: every GEMM
    on the 3xTF32 kernel with its fused layer norms and epilogues), against NeMo's stream step of each stream alone
    on the same GPU: encoder outputs within 1e-4, identical tokens. cuDNN's TF32 is off on both sides (fp32).
    ``tf32`` (single TF32 products, 10-bit mantissas) is held to 1e-2 and its tokens are not required to agree."""
    from nemo_fastdecode.kernels import matmul

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(matmul, "tensor_cores_win", lambda rows, n_out, depth: True)  # tiny shapes: the kernel
    gpu_model = tiny_streaming_model().cuda().eval()
    att = [16, 1]
    gpu_model.encoder.set_default_att_context_size(att)
    streams = [f.cuda() for f in features[:3]]
    runs = [nemo_alone(gpu_model, f) for f in streams]
    capture = encoder_matmul != "fp32"  # the decoder step graphs (default) on two variants, eager on one
    streamer = StreamingTranscriber(gpu_model, num_slots=3, att_context_size=att, encoder_matmul=encoder_matmul,
                                    capture_decoder_step=capture)  # fmt: skip
    assert streamer.runner.use_graphs
    streamer.warm_up()
    assert streamer.decoder.captured_batch_sizes == (streamer.runner.sizes if capture else [])
    # captured: every step's decoding replays the graphs around the greedy loop (no eager decode_with_state)
    eager_decodes = []
    decode_with_state = GreedyComputerBase.decode_with_state
    monkeypatch.setattr(
        GreedyComputerBase, "decode_with_state", lambda *a: eager_decodes.append(1) or decode_with_state(*a)
    )
    chunks = [split_features(f, streamer.geometry) for f in streams]
    slots = [streamer.open() for _ in streams]
    position, errors = [0, 0, 0], []
    order = [[0], [1, 0], [2, 0, 1], [1, 2], [0, 2, 1], [2]] + [[0, 1, 2]] * max(len(c) for c in chunks)
    for group in order:
        group = [s for s in group if position[s] < len(chunks[s])]  # streams that still have chunks
        if not group:
            continue
        result = streamer.step([slots[s] for s in group], [chunks[s][position[s]] for s in group])
        for row, s in enumerate(group):
            ref = runs[s][0][position[s]]
            error = relative_error(result.encoded[row, : int(result.encoded_lengths[row])], ref)
            assert error <= (1e-2 if encoder_matmul == "tf32" else 1e-4)
            errors.append(error)
            position[s] += 1
    assert bool(eager_decodes) != capture
    if encoder_matmul == "tf32":  # single TF32 products do lose bits: not the fp32 path under another name
        assert max(errors) > 1e-6
        return
    assert sum(len(run[1].y_sequence) for run in runs) > 0, "test setup should emit tokens"
    for s, slot in enumerate(slots):
        assert as_int_list(streamer.flush(slot).hypothesis.y_sequence) == as_int_list(runs[s][1].y_sequence)


def test_tf32_encoder_asks_the_kernels_for_single_tf32_products(model, monkeypatch):
    """``encoder_matmul=tf32`` is the tf32x3 path with ``precision="tf32"`` on every GEMM (the interpreter computes
    either in fp32, so the accuracy is the GPU test's; here: the request reaches the kernel)."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 on the CPU")
    from nemo_fastdecode.kernels import matmul

    calls = []
    linear = matmul.linear
    monkeypatch.setattr(matmul, "linear", lambda *args, **kwargs: calls.append(kwargs) or linear(*args, **kwargs))
    monkeypatch.setattr(matmul, "tensor_cores_win", lambda rows, n_out, depth: True)
    step = StreamingTranscriber(model, num_slots=1, encoder_matmul="tf32").encoder_step
    feed_forward = model.encoder.layers[0].feed_forward1
    x = torch.randn(2, 3, feed_forward.linear1.in_features)
    with torch.inference_mode():
        y = step._linear(feed_forward.linear1, x)
    assert [kw["precision"] for kw in calls] == ["tf32"]
    torch.testing.assert_close(y, feed_forward.linear1(x), rtol=1e-5, atol=1e-5)


def test_captured_decoder_parts_launch_no_host_copies_or_syncs(model):
    """What SlotDecoder captures around the greedy loop must be device work only: a CUDA graph capture refuses a
    copy from pageable host memory (``counts[dummy] = 0`` was one: a host scalar lifted and copied) and cannot
    hold a synchronisation. Checked on the CPU by the ops the parts dispatch."""
    from torch.utils._python_dispatch import TorchDispatchMode

    forbidden = ("aten.lift_fresh", "aten._local_scalar_dense", "aten.nonzero", "aten.item")

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    decoder = SlotDecoder(model, num_slots=4)
    batch = 4
    encoded = torch.randn(batch, 3, model.encoder._feat_out)
    lengths, slot_ids = torch.tensor([3, 2, 0, 0]), torch.tensor([0, 1, 4, 4])
    computer = decoder._computer(batch)
    with torch.inference_mode():
        decoder.decode([0, 1], encoded, lengths, slot_ids)  # buffers allocated, as before a capture
        with Recorder() as load_ops:
            rows, buffers, loop = decoder._load_step(computer, encoded, lengths, slot_ids)
        loop.run()
        with Recorder() as finish_ops:
            decoder._finish_step(computer, buffers, batch, lengths, slot_ids, rows)
    for ops in (load_ops.seen, finish_ops.seen):
        assert ops and not [op for op in ops if op.startswith(forbidden)]
    # the CPU has no CUDA graphs: nothing is captured, decode stays eager
    assert not decoder.capture_step(encoded, lengths, slot_ids) and decoder.captured_batch_sizes == []
    # and the recorder does see such a copy where there is one
    with torch.inference_mode(), Recorder() as host_copy:
        decoder.counts[decoder.dummy_slot] = 0
    assert any(op.startswith("aten.lift_fresh") for op in host_copy.seen)


@pytest.mark.gpu
def test_captured_decoder_step_equals_eager_decoding_and_survives_storage_growth(exact_fp32, monkeypatch):
    """SlotDecoder's graphs around the greedy loop (fed through static tensors, as the encoder buckets feed them)
    against an eager SlotDecoder fed the same chunks: identical tokens, timestamps, scores and states, also
    after the token storage grows (the graphs are then captured again)."""
    gpu_model = tiny_streaming_model().cuda().eval()
    captured = SlotDecoder(gpu_model, num_slots=4, token_capacity=8)
    eager = SlotDecoder(gpu_model, num_slots=4, token_capacity=8, use_cuda_graphs=False)
    batch, frames, dim = 4, 3, gpu_model.encoder._feat_out
    encoded = torch.zeros(batch, frames, dim, device="cuda")
    lengths = torch.zeros(batch, dtype=torch.long, device="cuda")
    slot_ids = torch.full((batch,), captured.dummy_slot, dtype=torch.long, device="cuda")
    assert captured.capture_step(encoded, lengths, slot_ids)
    from nemo_fastdecode.streaming import decoding as streaming_decoding

    replays = []
    replay = streaming_decoding._StepGraphs.replay
    monkeypatch.setattr(streaming_decoding._StepGraphs, "replay", lambda self: replays.append(1) or replay(self))
    for slot in range(4):
        captured.reset(slot)
        eager.reset(slot)
    rng, g = random.Random(3), torch.Generator().manual_seed(3)
    capacity, grown_steps = captured.token_capacity, 0
    for step in range(12):
        storage = captured.labels.data_ptr()
        if step == 6:  # storage growth between steps: the captured graphs write stale memory, so capture again
            captured._grow(2 * captured.token_capacity)
        rows = rng.sample(range(4), rng.randint(1, 3))
        x = 2 * torch.randn(batch, frames, dim, generator=g)
        chunk = torch.tensor([rng.randint(0, frames) for _ in rows] + [0] * (batch - len(rows)))
        ids = torch.tensor(rows + [captured.dummy_slot] * (batch - len(rows)))
        encoded.copy_(x)
        lengths.copy_(chunk)
        slot_ids.copy_(ids)
        captured.decode(rows, encoded, lengths, slot_ids)
        eager.decode(rows, x.cuda(), chunk.cuda(), ids.cuda())
        grown_steps += captured.labels.data_ptr() != storage
    # a step in which the storage grew runs eagerly (and captures again); every other step replays the graphs
    assert captured.token_capacity > capacity and len(replays) == 12 - grown_steps and len(replays) >= 6
    assert sum(len(eager.token_ids(slot)) for slot in range(4)) > 0
    for slot in range(4):
        assert captured.token_ids(slot) == eager.token_ids(slot)
        ours, theirs = captured.hypothesis(slot), eager.hypothesis(slot)
        assert ours.timestamp.tolist() == theirs.timestamp.tolist() and ours.score == pytest.approx(theirs.score)
    for a, b in zip(captured.state.predictor_states, eager.state.predictor_states, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_stacked_qkv_projection_is_the_three_projections(model):
    """One GEMM for q, k and v (tf32x3 path): its output is [q, k, v] of the layer; mismatched projections keep
    three GEMMs."""
    import copy

    from nemo_fastdecode.streaming.encoder import stacked_qkv_projection

    attn = model.encoder.layers[0].self_attn
    x = torch.randn(3, 5, attn.linear_q.in_features, device=attn.linear_q.weight.device)
    with torch.no_grad():
        stacked = stacked_qkv_projection(attn)(x)
        expected = torch.cat([attn.linear_q(x), attn.linear_k(x), attn.linear_v(x)], dim=-1)
    torch.testing.assert_close(stacked, expected, rtol=1e-6, atol=1e-6)
    without_bias = copy.deepcopy(attn)
    without_bias.linear_k.bias = None
    assert stacked_qkv_projection(without_bias) is None


def test_fused_convolution_only_for_nemo_default_module(model):
    """Layer norm (NeMo's streaming models) or batch norm, Swish, a kernel matching the cache: the fused kernel's
    weights; any other shape keeps the torch path."""
    import copy

    from nemo_fastdecode.streaming.encoder import fused_conv_weights

    conv = copy.deepcopy(model.encoder.layers[0].conv)
    channels, cache = conv.depthwise_conv.weight.shape[0], conv.depthwise_conv.weight.shape[-1] - 1
    weight, bias, scale, shift, eps = fused_conv_weights(conv, cache)
    assert isinstance(conv.batch_norm, torch.nn.LayerNorm) and eps == conv.batch_norm.eps
    assert torch.equal(scale, conv.batch_norm.weight) and weight.shape == (channels, cache + 1)
    batch_norm = torch.nn.BatchNorm1d(channels).eval()
    batch_norm.running_mean.uniform_(-1, 1), batch_norm.running_var.uniform_(0.5, 2)
    conv.batch_norm = batch_norm
    _, _, scale, shift, eps = fused_conv_weights(conv, cache)
    x = torch.randn(2, channels, 5)
    assert eps is None
    torch.testing.assert_close(x * scale[:, None] + shift[:, None], batch_norm(x), rtol=1e-5, atol=1e-5)
    assert fused_conv_weights(conv, cache + 1) is None  # the kernel does not match the cache
    conv.activation = torch.nn.ReLU()
    assert fused_conv_weights(conv, cache) is None


def test_fast_math_decoding_agrees_with_nemo_alone(model, features, reference):
    """Opt-in fast math in the slot decoder: same tokens as NeMo on these streams (no near-ties here)."""
    from nemo_fastdecode.prediction import FastMathPredictor

    att, runs = reference
    streamer = StreamingTranscriber(model, num_slots=4, att_context_size=att, fast_math=True)
    _, finals = run_interleaved(streamer, features, seed=11, max_open=4)
    assert all(isinstance(c.fast_predictor, FastMathPredictor) for c in streamer.decoder.computers.values())
    for stream, (_, nemo_hyp, _) in enumerate(runs):
        assert as_int_list(finals[stream].hypothesis.y_sequence) == as_int_list(nemo_hyp.y_sequence)


def test_fp32_step_runs_pointwise_convolutions_as_gemms(model, features, reference, monkeypatch):
    """The fp32 encoder step calls no Conv1d module (cuDNN runs a kernel-size-1 Conv1d over a few frames per stream
    many times slower than the same GEMM) and subsamples through ``CausalSubsampling``; its outputs stay NeMo's."""
    from nemo_fastdecode.streaming import subsampling as streaming_subsampling

    conv1d_calls, subsampling_calls = [], []
    conv1d_forward = torch.nn.Conv1d.forward
    monkeypatch.setattr(torch.nn.Conv1d, "forward", lambda self, x: conv1d_calls.append(1) or conv1d_forward(self, x))
    call = streaming_subsampling.CausalSubsampling.__call__
    monkeypatch.setattr(
        streaming_subsampling.CausalSubsampling,
        "__call__",
        lambda self, *a, **k: subsampling_calls.append(1) or call(self, *a, **k),
    )
    att, runs = reference
    streamer = StreamingTranscriber(model, num_slots=2, att_context_size=att)
    assert isinstance(streamer.encoder_step.subsampling, streaming_subsampling.CausalSubsampling)
    chunks = [split_features(f, streamer.geometry)[:3] for f in features[:2]]
    slots = [streamer.open() for _ in chunks]
    for position in range(3):
        result = streamer.step(slots, [c[position] for c in chunks])
        for row, stream in enumerate(range(2)):
            ours = result.encoded[row, : int(result.encoded_lengths[row])]
            assert ours.numel() > 0
            assert relative_error(ours, runs[stream][0][position]) <= 1e-4
    assert subsampling_calls and not conv1d_calls


@pytest.mark.gpu
def test_bf16_cuda_graph_step_subsamples_in_fp32_and_stays_close_to_nemo(features):
    """bf16 compute on CUDA as it runs in production (graphs, Triton): the subsampling fused in fp32 inside the
    autocast region, encoder outputs close to NeMo's fp32 stream step of each stream alone."""
    from nemo_fastdecode.streaming.subsampling import CausalSubsampling

    gpu_model = tiny_streaming_model().cuda().eval()
    att = [16, 1]
    gpu_model.encoder.set_default_att_context_size(att)
    streams = [f.cuda() for f in features[:2]]
    runs = [nemo_alone(gpu_model, f) for f in streams]
    streamer = StreamingTranscriber(gpu_model, num_slots=2, att_context_size=att, dtype=torch.bfloat16)
    assert streamer.runner.use_graphs
    subsampling = streamer.encoder_step.subsampling
    assert isinstance(subsampling, CausalSubsampling) and subsampling.fuse_convolutions
    streamer.warm_up()
    chunks = [split_features(f, streamer.geometry) for f in streams]
    slots = [streamer.open() for _ in streams]
    for position in range(min(len(c) for c in chunks)):
        result = streamer.step(slots, [c[position] for c in chunks])
        for row in range(2):
            ours = result.encoded[row, : int(result.encoded_lengths[row])].float()
            assert ours.numel() > 0
            assert relative_error(ours, runs[row][0][position]) < 0.1
