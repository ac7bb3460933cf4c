"""fast_greedy on networks NeMo's own model tests build: either NeMo's ``greedy_batch`` hypotheses, or a clear refusal.

NeMo's ``test_asr_rnnt_encdec_model.py`` decodes with a prediction network and a joint that have no parameters
(hand-written ``AbstractRNNTDecoder`` / ``AbstractRNNTJoint``), and ``test_asr_hybrid_rnnt_ctc_model_char.py`` with
``blank_index`` one below the joint's last token output. Here the same situations are built from small modules:

* networks without parameters decode as NeMo's label and frame loops do (tokens, timestamps, scores, alignments,
  confidence);
* a prediction network for which NeMo's frame loop starts utterances otherwise than ours (NeMo's test decoder:
  ``predict(None, None)`` is not ``predict(blank, initialize_state())``) is refused by our frame loop, naming
  ``loop_labels=True`` and ``greedy_batch``; our label loop starts as NeMo's and decodes it as NeMo does;
* a ``blank_index`` that is not the joint's last token output (NeMo then emits the outputs past it as labels) is
  refused, naming ``greedy_batch``; so is a prediction network with ``blank_as_pad=False``.

Baseline: NeMo's ``GreedyBatchedRNNTInfer``, no CUDA graphs, fp32 on the CPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import HIDDEN, TDT_DURATIONS, VOCAB_SIZE, make_networks, random_encoder_output
from nemo.collections.asr.modules import RNNTDecoder
from nemo.collections.asr.modules.rnnt_abstract import AbstractRNNTDecoder, AbstractRNNTJoint
from nemo.collections.asr.parts.submodules.rnnt_greedy_decoding import GreedyBatchedRNNTInfer
from test_greedy_exactness import assert_same_hypotheses
from test_greedy_records import assert_same_records

from nemo_fastdecode.greedy import base as greedy_base
from nemo_fastdecode.greedy import frame_loop
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer

pytestmark = pytest.mark.usefixtures("single_thread")

TINY_VOCAB = 4  # labels 0..3, blank 4
TINY_BLANK = TINY_VOCAB
LOOPS = [False, True]
LOOP_IDS = ["frame-loop", "label-loop"]
RECORDS = {
    "none": {},
    "alignments": {"preserve_alignments": True},
    "confidence": {"preserve_frame_confidence": True},
}


class ParameterlessDecoder(AbstractRNNTDecoder):
    """A prediction network without parameters, with NeMo's LSTM state layout ``(h, c)``, each ``[1, B, V + 1]``.

    Each label adds its one-hot to the decaying ``h`` (blank is padding: no input); the output penalises the labels
    in ``h`` and favours blank by what ``c`` has accumulated, so that labels come in short runs between blanks.
    Every start NeMo's loops use is the same one here (zero input, zero state), as for NeMo's ``RNNTDecoder``. The
    state operations are ``RNNTDecoder``'s (same layout), so NeMo's label loop and ``malsd_batch`` run on it too.
    """

    batch_aggregate_states_beam = RNNTDecoder.batch_aggregate_states_beam
    batch_replace_states_mask = RNNTDecoder.batch_replace_states_mask
    batch_replace_states_all = RNNTDecoder.batch_replace_states_all
    batch_split_states = RNNTDecoder.batch_split_states
    batch_unsplit_states = RNNTDecoder.batch_unsplit_states
    clone_state = RNNTDecoder.clone_state
    batch_copy_states = RNNTDecoder.batch_copy_states
    mask_select_states = RNNTDecoder.mask_select_states

    def __init__(self, vocab_size: int = TINY_VOCAB):
        super().__init__(vocab_size=vocab_size, blank_idx=vocab_size, blank_as_pad=True)

    def initialize_state(self, y: torch.Tensor) -> list[torch.Tensor]:
        zeros = torch.zeros([1, y.shape[0], self.vocab_size + 1], dtype=torch.float32, device=y.device)
        return [zeros, zeros.clone()]

    def predict(self, y=None, state=None, add_sos=False, batch_size=None):
        if batch_size is None:
            batch_size = y.shape[0] if y is not None else state[0].shape[1]
        if state is None:
            state = self.initialize_state(torch.zeros([batch_size]))
        h, c = state
        step = torch.zeros_like(h)
        if y is not None:
            step = F.one_hot(y[:, -1], self.vocab_size + 1).to(h.dtype)[None]
            step[..., self.blank_idx] = 0.0  # blank as padding: a zero input
        h = 0.5 * h + step
        c = 0.5 * c + h
        output = torch.cat([-h[..., : self.vocab_size], 2.0 * c.sum(dim=-1, keepdim=True)], dim=-1)
        return output.transpose(0, 1), (h, c)

    def score_hypothesis(self, hypothesis, cache):
        raise NotImplementedError("not used by batched decoding")

    def batch_select_state(self, batch_states, idx: int):
        return [[s[:, idx] for s in batch_states]]


class SosDifferentDecoder(ParameterlessDecoder):
    """As NeMo's test decoder: ``predict(None, None)`` (NeMo's frame-loop ``<SOS>``) is not the start of
    ``predict(blank, initialize_state())`` (ours, and NeMo's label loop's)."""

    def predict(self, y=None, state=None, add_sos=False, batch_size=None):
        output, state = super().predict(y, state, add_sos, batch_size)
        if y is None:  # NeMo's <SOS> favours blank
            output = output + 10.0 * F.one_hot(torch.tensor(self.blank_idx), self.vocab_size + 1).to(output.dtype)
        return output, state


class ParameterlessJoint(AbstractRNNTJoint):
    """A joint without parameters: encoder frame (``V + 1`` features) plus prediction output; no normalisation."""

    def __init__(self, num_outputs: int = TINY_VOCAB + 1):
        super().__init__()
        self.num_outputs = num_outputs

    @property
    def num_classes_with_blank(self) -> int:
        return self.num_outputs

    @property
    def num_extra_outputs(self) -> int:
        return 0

    def project_encoder(self, encoder_output: torch.Tensor) -> torch.Tensor:
        return encoder_output

    def project_prednet(self, prednet_output: torch.Tensor) -> torch.Tensor:
        return prednet_output

    def joint_after_projection(self, f: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return f.unsqueeze(dim=2) + g.unsqueeze(dim=1)


def tiny_encoder_output(lengths=(20, 3, 14, 0, 20), seed: int = 5, blank_bias: float = -0.3):
    """``[B, V + 1, T]`` random frames for the parameterless joint (blank feature shifted) and their lengths."""
    generator = torch.Generator().manual_seed(seed)
    x = 2.0 * torch.randn(len(lengths), TINY_VOCAB + 1, max(lengths), generator=generator)
    x[:, TINY_BLANK] += blank_bias
    return x, torch.tensor(lengths)


def nemo_greedy(decoder, joint, blank_index, max_symbols, loop_labels, **options):
    return GreedyBatchedRNNTInfer(
        decoder, joint, blank_index, max_symbols_per_step=max_symbols, loop_labels=loop_labels,
        use_cuda_graph_decoder=False, **options,
    )  # fmt: skip


def fast_greedy(decoder, joint, blank_index, max_symbols, loop_labels, **options):
    return FastGreedyBatchedInfer(
        decoder, joint, blank_index, max_symbols_per_step=max_symbols, loop_labels=loop_labels, **options
    )


def emitted_per_frame(hyps) -> list[int]:
    """How many labels each (row, frame) that has labels emitted: the setups check that bursts and blanks occur."""
    counts = []
    for hyp in hyps:
        counts += torch.unique_consecutive(torch.as_tensor(hyp.timestamp), return_counts=True)[1].tolist()
    return counts


# ----- networks without parameters ---------------------------------------------------------------------------
@pytest.mark.parametrize("records", RECORDS.values(), ids=RECORDS.keys())
@pytest.mark.parametrize("max_symbols", [1, 5])
@pytest.mark.parametrize("loop_labels", LOOPS, ids=LOOP_IDS)
def test_parameterless_networks_decode_like_nemo(loop_labels, max_symbols, records):
    decoder, joint = ParameterlessDecoder(), ParameterlessJoint()
    assert next(decoder.parameters(), None) is None and next(joint.parameters(), None) is None
    x, lengths = tiny_encoder_output()
    expected = nemo_greedy(decoder, joint, TINY_BLANK, max_symbols, loop_labels, **records)(
        encoder_output=x, encoded_lengths=lengths
    )[0]
    per_frame = emitted_per_frame(expected)
    assert 0 < len(per_frame) < int(lengths.sum()), "setup: frames with labels and frames without"
    if max_symbols > 1:
        assert max(per_frame) > 1, "setup: a frame with several labels"
    actual = fast_greedy(decoder, joint, TINY_BLANK, max_symbols, loop_labels, **records)(
        encoder_output=x, encoded_lengths=lengths
    )[0]
    assert_same_hypotheses(expected, actual)
    if records:
        assert_same_records(expected, actual, blank=TINY_BLANK)


@pytest.mark.parametrize("loop_labels", LOOPS, ids=LOOP_IDS)
def test_parameterless_networks_decode_with_the_fused_step_kernels(loop_labels):
    """The Triton step kernels (CUDA's default path; here in the interpreter) on networks without parameters."""
    decoder, joint = ParameterlessDecoder(), ParameterlessJoint()
    x, lengths = tiny_encoder_output(lengths=(9, 4, 0, 7))
    expected = nemo_greedy(decoder, joint, TINY_BLANK, 3, loop_labels)(encoder_output=x, encoded_lengths=lengths)[0]
    assert sum(len(h.y_sequence) for h in expected) > 0, "setup: the decoders should emit labels"
    actual = fast_greedy(decoder, joint, TINY_BLANK, 3, loop_labels, fused_kernels=True, graph_mode="eager")(
        encoder_output=x, encoded_lengths=lengths
    )[0]
    assert_same_hypotheses(expected, actual)


def test_parameterless_networks_continue_partial_hypotheses_like_one_pass():
    """Chunk by chunk (``partial_hypotheses``) as in one pass: the state of a decoder without parameters carries."""
    decoder, joint = ParameterlessDecoder(), ParameterlessJoint()
    x, lengths = tiny_encoder_output(lengths=(20, 20, 20))
    decode = fast_greedy(decoder, joint, TINY_BLANK, 3, loop_labels=True)
    whole = decode(encoder_output=x, encoded_lengths=lengths)[0]
    assert all(len(h.y_sequence) > 0 for h in whole), "setup: every row should emit labels"
    partial = None
    for start in range(0, 20, 8):
        chunk = x[:, :, start : start + 8].contiguous()
        partial = decode(
            encoder_output=chunk, encoded_lengths=torch.full([3], chunk.shape[-1]), partial_hypotheses=partial
        )[0]
    for row, (one_pass, chunked) in enumerate(zip(whole, partial, strict=True)):
        assert chunked.y_sequence.tolist() == one_pass.y_sequence.tolist(), f"row {row}"
        assert list(map(int, chunked.timestamp)) == list(map(int, one_pass.timestamp)), f"row {row}"


# ----- a prediction network NeMo's frame loop starts otherwise ----------------------------------------------------
def test_frame_loop_start_probe_accepts_nemo_prediction_networks():
    networks = [make_networks(pred_layers=layers)[0] for layers in (1, 2)]
    networks += [make_networks(context_size=context)[0] for context in (1, 2, 3)]
    networks.append(ParameterlessDecoder())
    for decoder in networks:
        decoder.train()  # a model in training builds its decoding so; the probe runs in eval mode
        blank = decoder.blank_idx
        assert frame_loop.start_mismatch(decoder, blank) is None, type(decoder).__name__
        assert decoder.training, "the probe restores the training flag"


def test_frame_loop_refuses_a_decoder_nemo_starts_otherwise(monkeypatch):
    decoder, joint = SosDifferentDecoder(), ParameterlessJoint()
    x, lengths = tiny_encoder_output()
    expected = nemo_greedy(decoder, joint, TINY_BLANK, 5, False)(encoder_output=x, encoded_lengths=lengths)[0]
    assert sum(len(h.y_sequence) for h in expected) > 0, "setup: NeMo's frame loop should emit labels"
    with pytest.raises(ValueError, match=r"predict\(None, None\).*loop_labels=True.*greedy_batch"):
        fast_greedy(decoder, joint, TINY_BLANK, 5, loop_labels=False)
    # why: started as ours starts, the frame loop would not find NeMo's hypotheses
    monkeypatch.setattr(frame_loop, "start_mismatch", lambda decoder, blank_index: None)
    unchecked = fast_greedy(decoder, joint, TINY_BLANK, 5, loop_labels=False)(
        encoder_output=x, encoded_lengths=lengths
    )[0]
    assert [h.y_sequence.tolist() for h in unchecked] != [h.y_sequence.tolist() for h in expected]


@pytest.mark.parametrize("records", RECORDS.values(), ids=RECORDS.keys())
def test_label_loop_decodes_that_decoder_like_nemo(records):
    """NeMo's label loop starts from ``predict(blank, initialize_state())`` as ours: same hypotheses and records."""
    decoder, joint = SosDifferentDecoder(), ParameterlessJoint()
    x, lengths = tiny_encoder_output()
    expected = nemo_greedy(decoder, joint, TINY_BLANK, 5, True, **records)(encoder_output=x, encoded_lengths=lengths)[0]
    assert sum(len(h.y_sequence) for h in expected) > 0, "setup: the decoders should emit labels"
    actual = fast_greedy(decoder, joint, TINY_BLANK, 5, True, **records)(encoder_output=x, encoded_lengths=lengths)[0]
    assert_same_hypotheses(expected, actual)
    if records:
        assert_same_records(expected, actual, blank=TINY_BLANK)


# ----- blank_index not the joint's last token output ----------------------------------------------------------------
def test_nemo_emits_the_outputs_past_a_blank_that_is_not_last(monkeypatch):
    """NeMo's greedy_batch takes the joint's outputs past ``blank_index`` as labels; ours picks among outputs up to
    the blank, so it refuses the layout instead of returning other hypotheses."""
    decoder, joint = make_networks(seed=3, blank_bias=0.9)
    blank = VOCAB_SIZE - 1
    x, lengths = random_encoder_output(4, 24, seed=4)
    expected = nemo_greedy(decoder, joint, blank, 5, True)(encoder_output=x, encoded_lengths=lengths)[0]
    assert any(VOCAB_SIZE in h.y_sequence.tolist() for h in expected), "setup: NeMo emits the output past the blank"
    monkeypatch.setattr(greedy_base, "check_blank_is_last_token", lambda joint, blank_index, num_durations: None)
    unchecked = fast_greedy(decoder, joint, blank, 5, True)(encoder_output=x, encoded_lengths=lengths)[0]
    assert all(VOCAB_SIZE not in h.y_sequence.tolist() for h in unchecked)


@pytest.mark.parametrize("records", RECORDS.values(), ids=RECORDS.keys())
@pytest.mark.parametrize("kind,loop_labels", [("rnnt", False), ("rnnt", True), ("tdt", True)])
def test_blank_not_last_token_is_refused(kind, loop_labels, records):
    tdt = kind == "tdt"
    decoder, joint = make_networks(tdt=tdt)
    durations = {"durations": TDT_DURATIONS, "include_duration": True} if tdt else {}
    num_outputs = VOCAB_SIZE + 1 + (len(TDT_DURATIONS) if tdt else 0)
    assert joint.num_classes_with_blank == num_outputs
    x, lengths = random_encoder_output(2, 6, seed=4)
    # the last token output decodes; one below it is refused, naming the values and NeMo's strategy
    hyps = fast_greedy(decoder, joint, VOCAB_SIZE, 5, loop_labels, **durations, **records)(
        encoder_output=x, encoded_lengths=lengths
    )[0]
    assert len(hyps) == 2
    last = VOCAB_SIZE
    message = rf"{num_outputs} outputs.*last token output is {last}, got blank_index={last - 1}.*greedy_batch"
    with pytest.raises(ValueError, match=message):
        fast_greedy(decoder, joint, VOCAB_SIZE - 1, 5, loop_labels, **durations, **records)


def test_a_joint_that_does_not_report_its_outputs_is_not_checked():
    """``AbstractRNNTJoint.num_classes_with_blank`` raises NotImplementedError: nothing to check against."""

    class SilentJoint(ParameterlessJoint):
        num_classes_with_blank = AbstractRNNTJoint.num_classes_with_blank

    decoder, joint = ParameterlessDecoder(), SilentJoint()
    with pytest.raises(NotImplementedError):
        _ = joint.num_classes_with_blank
    x, lengths = tiny_encoder_output(lengths=(6, 4))
    # NeMo's frame loop does not ask either (its label loop does)
    expected = nemo_greedy(decoder, joint, TINY_BLANK, 3, False)(encoder_output=x, encoded_lengths=lengths)[0]
    assert sum(len(h.y_sequence) for h in expected) > 0, "setup: the decoders should emit labels"
    actual = fast_greedy(decoder, joint, TINY_BLANK, 3, False)(encoder_output=x, encoded_lengths=lengths)[0]
    assert_same_hypotheses(expected, actual)


# ----- blank_as_pad=False ----------------------------------------------------------------------------------------------
def test_blank_as_pad_false_is_refused():
    decoder = RNNTDecoder({"pred_hidden": HIDDEN, "pred_rnn_layers": 1}, VOCAB_SIZE, blank_as_pad=False)
    _, joint = make_networks()
    x, lengths = random_encoder_output(2, 6, seed=4)
    expected = nemo_greedy(decoder, joint, VOCAB_SIZE, 3, True)(encoder_output=x, encoded_lengths=lengths)[0]
    assert len(expected) == 2, "NeMo's greedy_batch decodes it (its masked frame loop)"
    with pytest.raises(ValueError, match="blank_as_pad=True.*RNNTDecoder has blank_as_pad=False.*greedy_batch"):
        fast_greedy(decoder, joint, VOCAB_SIZE, 3, True)
