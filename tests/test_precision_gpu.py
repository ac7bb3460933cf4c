"""On a GPU, in each precision context, ``fast_greedy`` and ``fast_beam`` return what the NeMo decoder they replace
returns there, in its default configuration.

NeMo's defaults on a GPU are ``greedy_batch`` with the label loop and CUDA graphs, and ``malsd_batch`` with CUDA
graphs. Both turn autocast off and decode in the dtype of the joint's parameters: float32 under bf16 autocast with
float32 weights, bf16 with bf16 weights (``model.to(torch.bfloat16)``). No TF32 flag is touched here: both sides run
PyTorch's defaults, as a user's process does.

Marked ``gpu``: skipped on machines without CUDA (CI); run on a GPU host with ``pytest -m gpu``.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import make_networks, random_encoder_output
from test_beam_exactness import as_tuples, fast_beam, nemo_malsd
from test_greedy_exactness import REALISTIC_BIAS, as_lists, baseline, ours

pytestmark = pytest.mark.gpu
PRECISIONS = ["fp32", "bf16_autocast", "bf16_weights"]
LENGTHS = [64, 3, 0, 61, 40, 1, 64, 25, 8, 33, 64, 50]
# no row of length 0 for beam search: NeMo's RNN-T malsd_batch decodes such a row's padding (README, Exactness)
BEAM_LENGTHS = [64, 3, 2, 61, 40, 1, 64, 25, 8, 33, 64, 50]


def networks_and_inputs(kind: str, precision: str, seed: int, lengths: list[int] = LENGTHS):
    """The networks, a ragged batch of encoder outputs and the context to decode in, for ``precision``."""
    decoder, joint = make_networks(tdt=kind == "tdt", seed=seed, blank_bias=REALISTIC_BIAS[kind] - 0.3, pred_layers=2)
    decoder, joint = decoder.cuda(), joint.cuda()
    x, lengths = random_encoder_output(len(lengths), max(lengths), seed=seed + 1, lengths=lengths, device="cuda")
    context = contextlib.nullcontext()
    if precision == "bf16_weights":
        decoder, joint, x = decoder.to(torch.bfloat16), joint.to(torch.bfloat16), x.to(torch.bfloat16)
    elif precision == "bf16_autocast":
        context = torch.autocast("cuda", dtype=torch.bfloat16)
    return decoder, joint, x, lengths, context


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_greedy_default_returns_nemos_default_in_each_precision(kind, precision):
    decoder, joint, x, lengths, context = networks_and_inputs(kind, precision, seed=40)
    nemo = baseline(kind, decoder, joint, 10, loop_labels=True, use_cuda_graph_decoder=True)
    fast = ours(kind, decoder, joint, 10)
    for call in range(2):  # the second call replays the captured graphs
        with context:
            expected = nemo(encoder_output=x, encoded_lengths=lengths)[0]
            actual = fast(encoder_output=x, encoded_lengths=lengths)[0]
        assert sum(len(h.y_sequence) for h in expected) > 0, "setup: the networks should emit tokens"
        for row, (e, a) in enumerate(zip(expected, actual, strict=True)):
            # NeMo's batched TDT loop may record a later step's duration for a row: tokens and frames here
            assert as_lists(a, False) == as_lists(e, False), f"call {call}, row {row}"
            assert float(a.score) == pytest.approx(float(e.score), rel=1e-6, abs=1e-6), f"call {call}, row {row}"


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_beam_default_returns_malsd_batch_default_in_each_precision(kind, precision):
    decoder, joint, x, lengths, context = networks_and_inputs(kind, precision, seed=50, lengths=BEAM_LENGTHS)
    nemo = nemo_malsd(kind, decoder, joint, 4, 10, allow_cuda_graphs=True)  # NeMo's default
    fast = fast_beam(kind, decoder, joint, 4, 10)
    with context:
        expected = as_tuples(nemo(encoder_output=x, encoded_lengths=lengths)[0], False)
        actual = as_tuples(fast(encoder_output=x, encoded_lengths=lengths)[0], False)
    assert sum(len(tokens) for tokens, *_ in expected) > 0, "setup: the networks should emit tokens"
    assert [t[:3] for t in actual] == [t[:3] for t in expected]
    assert [t[3] for t in actual] == pytest.approx([t[3] for t in expected], rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_bf16_encoder_output_into_a_float32_joint_decodes_its_float32_values(kind):
    """NeMo's default raises on this mismatch in its encoder projection; ours decodes the float32 values, the result
    NeMo gives for the same outputs in float32."""
    decoder, joint, x, lengths, _ = networks_and_inputs(kind, "fp32", seed=60)
    rounded = x.to(torch.bfloat16)
    nemo = baseline(kind, decoder, joint, 10, loop_labels=True, use_cuda_graph_decoder=True)
    expected = nemo(encoder_output=rounded.float(), encoded_lengths=lengths)[0]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        actual = ours(kind, decoder, joint, 10)(encoder_output=rounded, encoded_lengths=lengths)[0]
    assert sum(len(h.y_sequence) for h in expected) > 0, "setup: the networks should emit tokens"
    assert [as_lists(a, False) for a in actual] == [as_lists(e, False) for e in expected]
