"""``FastGreedyBatchedInfer.decoding_computer`` follows NeMo's label-looping computer contract.

Driven exactly as NeMo 3.0's ``BufferedRNNTPipeline.stateful_transcribe_step`` drives
``model.decoding.decoding.decoding_computer`` (``merge_to_batched_state`` of the streams' items, ``None`` for new
streams; the chunk; ``split_batched_state``; the right context from the same state), against NeMo's
``GreedyBatchedRNNTLabelLoopingComputer`` / ``GreedyBatchedTDTLabelLoopingComputer`` on the same chunks.
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import ENCODER_DIM, TDT_DURATIONS, VOCAB_SIZE, make_networks, random_encoder_output
from nemo.collections.asr.parts.submodules.rnnt_greedy_decoding import GreedyBatchedRNNTInfer, GreedyBatchedTDTInfer
from nemo.collections.asr.parts.submodules.transducer_decoding.batched_hyps import BatchedHyps
from nemo.collections.asr.parts.submodules.transducer_decoding.label_looping_base import BatchedLabelLoopingState
from nemo.collections.asr.parts.utils.rnnt_utils import batched_hyps_to_hypotheses
from test_greedy_exactness import REALISTIC_BIAS, assert_same_hypotheses, baseline, ours
from test_greedy_fusion import boosting_tree
from test_greedy_nemo_state import assert_same_state

from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer

MAX_TIME = 10  # encoder frames per step: the chunk, then the right context
# streams decoded in each step (order changes, streams join with no state, pause and end)
STEPS = [[0, 1], [0, 1, 2], [2, 0], [1, 2, 3], [3, 1], [2, 3, 1]]
ALGORITHMS = [("rnnt", True), ("rnnt", False), ("tdt", True)]
IDS = ["rnnt-label", "rnnt-frame", "tdt-label"]


def nemo_computer(kind: str, decoder, joint, graphs: bool = False):
    """NeMo's label-looping computer (max_symbols 3), with or without its CUDA graphs."""
    return baseline(kind, decoder, joint, 3, loop_labels=True, use_cuda_graph_decoder=graphs).decoding_computer


def fast_computer(kind: str):
    """Our decoding computer on networks that emit about 0.3 labels per frame."""
    decoder, joint = make_networks(tdt=kind == "tdt", seed=3, blank_bias=REALISTIC_BIAS[kind])
    return ours(kind, decoder, joint, 3).decoding_computer


def pipeline_step(
    computer, stream_states: list, encs: torch.Tensor, enc_lens_chunk, enc_lens, biasing_ids=None, copy_state=False
):
    """``BufferedRNNTPipeline.stateful_transcribe_step``'s use of the computer (NeMo 3.0); ``biasing_ids [B]``: the
    streams' trees in the computer's ``biasing_multi_model`` (-1: none), given to the chunk and its right context.
    ``copy_state``: the right context continues from a copy of the chunk's state (NeMo's eager loop writes the fusion
    states of the state it continues in place, and the split items are views of them).

    ``encs [B, D, T]``: the chunk's frames then its right context; returns the merged hypotheses (chunk + right
    context) and the states after the chunk (``split_batched_state``: NeMo's CUDA-graph computer gives more items
    than streams, its padding rows; the pipeline zips them with its streams).
    """
    batched_rnnt_states = None
    if any(state is not None for state in stream_states):
        batched_rnnt_states = computer.merge_to_batched_state(list(stream_states))
    encs_dim_last = encs.transpose(1, 2)
    with torch.inference_mode(), torch.no_grad():
        hyps_chunk, batched_state = computer(
            encs_dim_last, enc_lens_chunk, batched_rnnt_states, multi_biasing_ids=biasing_ids
        )
    best_hyps = batched_hyps_to_hypotheses(hyps_chunk, batch_size=enc_lens.shape[0])
    states = computer.split_batched_state(batched_state)
    # right context: shifted to the start, decoded from the state after the chunk (not kept)
    _, max_time, feat_dim = encs_dim_last.shape
    shift_indices = torch.arange(max_time, device=encs.device)[None, :] + enc_lens_chunk[:, None]
    shift_indices = torch.where(shift_indices < max_time, shift_indices, torch.zeros_like(shift_indices))
    shifted = torch.gather(encs_dim_last, dim=1, index=shift_indices[:, :, None].expand(-1, -1, feat_dim))
    if copy_state:
        batched_state = computer.merge_to_batched_state(list(states))
    with torch.inference_mode(), torch.no_grad():
        hyps_rc, _ = computer(shifted, enc_lens - enc_lens_chunk, batched_state, multi_biasing_ids=biasing_ids)
    for hyp, hyp_rc in zip(best_hyps, batched_hyps_to_hypotheses(hyps_rc, batch_size=enc_lens.shape[0]), strict=True):
        hyp.merge_(hyp_rc)
    return best_hyps, states


def step_inputs(step: int, batch_size: int, device: str = "cpu"):
    """Random frames; per row a chunk of 0-6 frames and a right context of 0-4 (zeros included)."""
    rng = random.Random(step)
    generator = torch.Generator().manual_seed(step)
    encs = torch.randn(batch_size, ENCODER_DIM, MAX_TIME, generator=generator)
    chunk = torch.tensor([rng.choice([0, 3, 6, 6]) for _ in range(batch_size)])
    right = torch.tensor([rng.choice([0, 2, 4]) for _ in range(batch_size)])
    return encs.to(device), chunk.to(device), (chunk + right).to(device)


@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=IDS)
def test_driven_like_buffered_rnnt_pipeline_it_matches_nemos_computer(kind, loop_labels):
    decoder, joint = make_networks(tdt=kind == "tdt", seed=5, blank_bias=REALISTIC_BIAS[kind] - 0.3, pred_layers=2)
    computers = {
        "nemo": nemo_computer(kind, decoder, joint),
        "fast": ours(kind, decoder, joint, 3, loop_labels).decoding_computer,
    }
    states = {name: {} for name in computers}  # per stream: its split item after the last step
    emitted = 0
    for step, streams in enumerate(STEPS):
        encs, enc_lens_chunk, enc_lens = step_inputs(step, len(streams))
        results = {}
        for name, computer in computers.items():
            results[name] = pipeline_step(
                computer, [states[name].get(s) for s in streams], encs, enc_lens_chunk, enc_lens
            )
            states[name].update(zip(streams, results[name][1], strict=False))
        (nemo_hyps, nemo_states), (fast_hyps, fast_states) = results["nemo"], results["fast"]
        assert len(fast_states) == len(streams)
        assert_same_hypotheses(nemo_hyps, fast_hyps)
        for expected, actual in zip(nemo_states, fast_states, strict=True):
            # a new stream starts from the <SOS> state computed with the batch it decodes in (as decoding it from
            # scratch does); NeMo's merge computes it for a batch of 1: fp32 rounding apart until it emits
            assert_same_state(expected, actual, bitwise=False)
        emitted += sum(len(h.y_sequence) for h in fast_hyps)
    assert emitted > 0


def test_stateless_prediction_networks_match_nemos_batched_state():
    """NeMo 3.0 splits a stateless state wrongly (test_greedy_stateless): its computer is continued from its batched
    state here, ours through split and merge as the pipeline does."""
    decoder, joint = make_networks(seed=3, blank_bias=0.5, context_size=2)
    nemo, fast = nemo_computer("rnnt", decoder, joint), ours("rnnt", decoder, joint, 3).decoding_computer
    nemo_state, fast_states, emitted = None, [None] * 3, 0
    for step in range(4):
        encs, enc_lens_chunk, enc_lens = step_inputs(step, 3)
        with torch.inference_mode():
            nemo_batched, nemo_state = nemo(encs.transpose(1, 2), enc_lens_chunk, nemo_state)
        fast_hyps, fast_states = pipeline_step(fast, fast_states, encs, enc_lens_chunk, enc_lens_chunk)
        assert_same_hypotheses(batched_hyps_to_hypotheses(nemo_batched, batch_size=3), fast_hyps)
        assert torch.equal(fast.merge_to_batched_state(fast_states).predictor_states[0], nemo_state.predictor_states[0])
        emitted += sum(len(h.y_sequence) for h in fast_hyps)
    assert emitted > 0


def fields(state: BatchedLabelLoopingState) -> list[torch.Tensor]:
    tensors = [*state.predictor_states, state.predictor_outputs, state.labels, state.decoded_lengths]
    return tensors + ([state.time_jumps] if state.time_jumps is not None else [])


def all_equal(tensors: list[torch.Tensor], others: list[torch.Tensor]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(tensors, others, strict=True))


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_previous_state_is_never_written_and_results_own_their_memory(kind):
    computer = fast_computer(kind)
    encs, lengths, _ = step_inputs(0, 3)
    with torch.inference_mode():
        hyps, state = computer(encs.transpose(1, 2), lengths)
        state_before, transcript_before = [t.clone() for t in fields(state)], hyps.transcript.clone()
        again, _ = computer(encs.flip(0).transpose(1, 2), lengths.flip(0), state)
    assert all_equal(fields(state), state_before)
    assert torch.equal(hyps.transcript, transcript_before) and hyps.transcript.data_ptr() != again.transcript.data_ptr()
    assert int(hyps.current_lengths.sum()) > 0


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_a_previous_state_of_more_rows_gives_its_first_rows(kind):
    """NeMo's CUDA-graph computer returns its padded batch; the next call gets that state with a smaller batch."""
    computer = fast_computer(kind)
    encs, lengths, _ = step_inputs(1, 5)
    with torch.inference_mode():
        _, padded = computer(encs.transpose(1, 2), lengths)
        rows = computer.merge_to_batched_state(computer.split_batched_state(padded)[:3])
        more, more_state = computer(encs[:3].transpose(1, 2), lengths[:3], padded)
        exact, exact_state = computer(encs[:3].transpose(1, 2), lengths[:3], rows)
    assert more.transcript.shape[0] == 3
    assert_same_hypotheses(batched_hyps_to_hypotheses(exact), batched_hyps_to_hypotheses(more))
    assert all_equal(fields(more_state), fields(exact_state))
    with pytest.raises(ValueError, match="prev_batched_state has 3 rows for a batch of 5"):
        computer(encs.transpose(1, 2), lengths, rows)


def test_merge_of_new_streams_is_the_state_after_sos_and_keeps_the_list():
    computer = fast_computer("tdt")
    items = [None, None]
    merged = computer.merge_to_batched_state(items)
    fresh = computer.computer.initial_state(2, torch.device("cpu"), torch.float32)
    assert items == [None, None]  # NeMo's merge replaces the Nones in the caller's list
    assert all(torch.allclose(a, b) for a, b in zip(fields(merged), fields(fresh), strict=True))
    assert merged.labels.tolist() == [VOCAB_SIZE] * 2 and merged.time_jumps.tolist() == [0, 0]


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_reset_state_by_mask_matches_nemo(kind):
    fast = fast_computer(kind)
    nemo = nemo_computer(kind, fast.computer.decoder, fast.computer.joint)
    encs, _, _ = step_inputs(2, 3)
    lengths = torch.tensor([6, 6, 4])
    with torch.inference_mode():
        _, nemo_state = nemo(encs.transpose(1, 2), lengths)
        _, fast_state = fast(encs.transpose(1, 2), lengths)
        mask = torch.tensor([True, False, True])
        nemo.reset_state_by_mask(nemo_state, mask)
        assert fast.reset_state_by_mask(fast_state, mask) is fast_state
    assert int(fast_state.decoded_lengths[1]) == int(lengths[1]) > 0
    assert all_equal(fields(nemo_state), fields(fast_state))


def test_no_biasing_and_no_fusion():
    decoder, joint = make_networks(seed=3, blank_bias=REALISTIC_BIAS["rnnt"])
    computer = FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, 3).decoding_computer
    assert computer.per_stream_biasing_enabled is False and computer.biasing_multi_model is None
    assert not computer.has_fusion_models() and computer.max_symbols == 3
    encs, lengths, _ = step_inputs(3, 2)
    with torch.inference_mode():
        hyps, _ = computer(encs.transpose(1, 2), lengths, multi_biasing_ids=torch.tensor([-1, -1]))
        assert isinstance(hyps, BatchedHyps)
        with pytest.raises(ValueError, match="enable_per_stream_biasing=true"):
            computer(encs.transpose(1, 2), lengths, multi_biasing_ids=torch.tensor([-1, 0]))


def test_per_stream_biasing_is_refused_with_frame_looping_and_with_confidence():
    decoder, joint = make_networks(seed=3, blank_bias=REALISTIC_BIAS["rnnt"])
    with pytest.raises(ValueError, match="enable_per_stream_biasing=True needs loop_labels=True"):
        FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, 3, loop_labels=False, enable_per_stream_biasing=True)
    with pytest.raises(ValueError, match="per-stream biasing with alignments or confidence"):
        FastGreedyBatchedInfer(decoder, joint, VOCAB_SIZE, 3, enable_per_stream_biasing=True, preserve_alignments=True)


def nemo_biasing_infer(kind: str, decoder, joint):
    """NeMo's label-looping Infer (max_symbols 3, no CUDA graphs) with per-stream biasing."""
    common = dict(max_symbols_per_step=3, use_cuda_graph_decoder=False, enable_per_stream_biasing=True)
    if kind == "tdt":
        return GreedyBatchedTDTInfer(
            decoder, joint, VOCAB_SIZE, durations=TDT_DURATIONS, include_duration=True, **common
        )
    return GreedyBatchedRNNTInfer(decoder, joint, VOCAB_SIZE, loop_labels=True, **common)


def check_per_stream_biasing(kind: str, device: str = "cpu", graph_mode: str = "auto") -> None:
    """NeMo's computer and ours with ``enable_per_stream_biasing=True`` on the same schedule (see
    :func:`test_per_stream_biasing_matches_nemos_computer`)."""
    decoder, joint = (m.to(device) for m in make_networks(tdt=kind == "tdt", seed=1, blank_bias=REALISTIC_BIAS[kind]))
    nemo = nemo_biasing_infer(kind, decoder, joint).decoding_computer
    infer = ours(kind, decoder, joint, 3, graph_mode=graph_mode, enable_per_stream_biasing=True)
    fast = infer.decoding_computer
    assert fast.per_stream_biasing_enabled and fast.has_fusion_models() and not fast.has_fusion_models(False)
    assert type(fast.biasing_multi_model) is type(nemo.biasing_multi_model)
    assert infer._drop_captured_graphs in fast.biasing_multi_model.reallocation_callbacks

    def add(tree, alpha: float) -> int:
        (model_id,) = {c.biasing_multi_model.add_model(tree, alpha=alpha) for c in (nemo, fast)}
        return model_id

    stream_ids = {0: add(boosting_tree(), 2.0), 1: -1}
    stream_ids[2] = stream_ids[0]
    runs = {"nemo": (nemo, True), "fast": (fast, True), "unboosted": (fast, False)}
    states = {name: {} for name in runs}
    changed, emitted = 0, 0
    for step, streams in enumerate(STEPS):
        if 3 in streams and 3 not in stream_ids:  # a tree added after decoding started (graphs captured)
            stream_ids[3] = add(boosting_tree(((4, 4, 6), (2, 8))), 3.5)
        encs, enc_lens_chunk, enc_lens = step_inputs(step, len(streams), device)
        ids = torch.tensor([stream_ids[s] for s in streams], device=device)
        results = {}
        for name, (computer, boosted) in runs.items():
            stream_states = [states[name].get(s) for s in streams]
            results[name] = pipeline_step(
                computer, stream_states, encs, enc_lens_chunk, enc_lens, ids if boosted else None, copy_state=True
            )
            states[name].update(zip(streams, results[name][1], strict=False))
        emitted += sum(len(h.y_sequence) for h in results["fast"][0])
        changed += sum(
            list(a.y_sequence) != list(b.y_sequence)
            for a, b in zip(results["fast"][0], results["unboosted"][0], strict=True)
        )
        assert_same_hypotheses(results["nemo"][0], results["fast"][0], with_durations=kind == "tdt")
        for expected, actual in zip(results["nemo"][1], results["fast"][1], strict=True):
            assert_same_state(expected, actual, bitwise=False)
    assert emitted > 0 and changed > 0, "no tokens, or boosting changes nothing: the comparison could not fail"


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_per_stream_biasing_matches_nemos_computer(kind):
    """``enable_per_stream_biasing=True``: the same trees added to each computer's ``biasing_multi_model`` (one after
    decoding started), streams with different trees and none, driven chunk by chunk as NeMo's buffered pipeline
    drives them (right context from a copy of the chunk's state, see :func:`pipeline_step`): NeMo's tokens,
    timestamps and scores. The same computer without ids is unboosted."""
    check_per_stream_biasing(kind)


@pytest.mark.gpu
@pytest.mark.usefixtures("exact_fp32")
@pytest.mark.parametrize("mode", ["full_graph", "no_while_graph"])
@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_per_stream_biasing_in_graph_modes_matches_nemos_computer_on_gpu(kind, mode):
    """As on the CPU, ours in each graph mode (the multi-model's Triton advance captured) against NeMo's computer
    without its CUDA graphs (see :func:`test_graph_modes_match_nemos_computer_on_gpu`)."""
    check_per_stream_biasing(kind, "cuda", mode)


@pytest.mark.gpu
@pytest.mark.usefixtures("exact_fp32")
@pytest.mark.parametrize("mode", ["full_graph", "no_while_graph"])
@pytest.mark.parametrize("kind,loop_labels", ALGORITHMS, ids=IDS)
def test_graph_modes_match_nemos_computer_on_gpu(kind, loop_labels, mode):
    """NeMo's computer on the GPU against ours in each graph mode.

    NeMo's computer runs without its CUDA graphs: with them, NeMo 3.0.0 fails this schedule with an illegal memory
    access in its full graph's replay (on an H100, at the first right-context call, before ours runs at all).
    """
    decoder, joint = (m.cuda() for m in make_networks(tdt=kind == "tdt", seed=5, blank_bias=REALISTIC_BIAS[kind] - 0.3))
    computers = {
        "nemo": nemo_computer(kind, decoder, joint, graphs=False),
        "fast": ours(kind, decoder, joint, 3, loop_labels, graph_mode=mode).decoding_computer,
    }
    states = {name: {} for name in computers}
    for step, streams in enumerate(STEPS):
        encs, enc_lens_chunk, enc_lens = step_inputs(step, len(streams), device="cuda")
        results = {}
        for name, computer in computers.items():
            results[name] = pipeline_step(
                computer, [states[name].get(s) for s in streams], encs, enc_lens_chunk, enc_lens
            )
            states[name].update(zip(streams, results[name][1], strict=False))
        assert_same_hypotheses(results["nemo"][0], results["fast"][0])


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_partial_hypotheses_name_their_trees_as_in_nemos_infer(kind, caplog):
    """The infer's forward reads each row's tree from its partial hypothesis' ``biasing_cfg.multi_model_id`` (NeMo's
    cache-aware pipeline passes them so): NeMo's Infer's hypotheses; a request without an id is skipped with a
    warning, as NeMo skips it."""
    from nemo.collections.asr.parts.context_biasing import BoostingTreeModelConfig
    from nemo.collections.asr.parts.context_biasing.biasing_multi_model import BiasingRequestItemConfig
    from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis

    decoder, joint = make_networks(tdt=kind == "tdt", seed=1, blank_bias=REALISTIC_BIAS[kind])
    nemo_infer = nemo_biasing_infer(kind, decoder, joint)
    fast_infer = ours(kind, decoder, joint, 3, enable_per_stream_biasing=True)
    ids = {
        infer.decoding_computer.biasing_multi_model.add_model(boosting_tree(), alpha=3.0)
        for infer in (nemo_infer, fast_infer)
    }
    (tree_id,) = ids

    def requests(multi_model_id):
        cfg = BoostingTreeModelConfig(key_phrases_list=["x"])
        return BiasingRequestItemConfig(boosting_model_cfg=cfg, multi_model_id=multi_model_id)

    encs, lengths = random_encoder_output(4, 24, seed=3, lengths=[24, 20, 24, 13])
    results = {}
    for name, infer in (("nemo", nemo_infer), ("fast", fast_infer), ("plain", fast_infer)):
        if name == "plain":
            partial = None
        else:
            partial = [Hypothesis.empty_with_biasing_cfg(requests(tree_id)), None, None, None]
            partial[2] = Hypothesis.empty_with_biasing_cfg(requests(None))  # requested, not in the multi-model
            partial[3] = Hypothesis.empty_with_biasing_cfg(requests(tree_id))
        with caplog.at_level("WARNING"), torch.inference_mode():
            results[name] = infer(encoder_output=encs, encoded_lengths=lengths, partial_hypotheses=partial)[0]
    assert "Boosting tree requested in index 2, not compiled, skipping" in caplog.text
    tokens = {name: [list(map(int, h.y_sequence)) for h in hyps] for name, hyps in results.items()}
    assert any(tokens["fast"]) and tokens["fast"] != tokens["plain"], "boosting changes nothing: cannot fail"
    assert tokens["fast"][1:3] == tokens["plain"][1:3]
    # durations not compared: merging into an empty partial hypothesis (NeMo's merge_, both) leaves them None
    assert_same_hypotheses(results["nemo"], results["fast"])
