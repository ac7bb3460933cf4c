"""The precision a decode runs in follows the NeMo decoder it replaces (:func:`decode_precision`).

NeMo's label-looping greedy and ``malsd_batch`` decoders with their CUDA graphs (their default on a GPU) turn autocast
off and decode in the joint's parameters' dtype; its frame loop and its loops without graphs keep the caller's
autocast. The GPU side of this is ``tests/test_precision_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch
from conftest import ENCODER_DIM, make_networks
from test_beam_exactness import fast_beam
from test_greedy_exactness import ours

from nemo_fastdecode.prediction import decode_precision

CUDA = torch.device("cuda")


def test_like_nemo_graphs_turns_autocast_off_and_takes_the_parameters_dtype():
    x = torch.randn(2, 3, 4, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        context, decoded = decode_precision(x, fast_math=False, like_nemo_graphs=True, parameter_dtype=torch.float32)
        with context:
            assert not torch.is_autocast_enabled("cpu")
        assert decoded.dtype == torch.float32 and torch.equal(decoded, x.float())
        context, decoded = decode_precision(x, fast_math=False, like_nemo_graphs=False, parameter_dtype=torch.float32)
        with context:
            assert torch.is_autocast_enabled("cpu")  # the caller's autocast, as NeMo's eager loops run in it
        assert decoded is x
        context, decoded = decode_precision(x, fast_math=True, like_nemo_graphs=False, parameter_dtype=torch.bfloat16)
        with context:
            assert not torch.is_autocast_enabled("cpu")
        assert decoded.dtype == torch.float32  # fast math: float32 whatever the weights


def test_greedy_follows_nemos_graph_precision_only_where_nemo_runs_its_graphs():
    decoder, joint = make_networks()
    label_loop = ours("rnnt", decoder, joint, 3)
    assert not label_loop.computer.keeps_caller_autocast(CUDA)  # NeMo's label loop + graphs: autocast off
    assert label_loop.computer.keeps_caller_autocast(torch.device("cpu"))  # NeMo's eager loop on the CPU
    assert ours("rnnt", decoder, joint, 3, use_cuda_graph_decoder=False).computer.keeps_caller_autocast(CUDA)
    assert ours("rnnt", decoder, joint, 3, loop_labels=False).computer.keeps_caller_autocast(CUDA)  # frame loop
    label_loop.disable_cuda_graphs()  # NeMo does this around training and validation: its eager loop then
    assert label_loop.computer.keeps_caller_autocast(CUDA)
    label_loop.maybe_enable_cuda_graphs()
    assert not label_loop.computer.keeps_caller_autocast(CUDA)
    assert not ours("rnnt", decoder, joint, 3, fast_math=True).computer.keeps_caller_autocast(torch.device("cpu"))


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_greedy_and_beam_on_the_cpu_keep_the_callers_autocast(kind):
    """On the CPU NeMo's loops run eagerly under the caller's autocast: so do ours (the encoder output unchanged)."""
    decoder, joint = make_networks(tdt=kind == "tdt")
    x = torch.randn(2, 5, ENCODER_DIM)
    for computer in (ours(kind, decoder, joint, 3).computer, fast_beam(kind, decoder, joint, 2, 3).computer):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            context, decoded = computer._decode_precision(x)
            with context:
                assert torch.is_autocast_enabled("cpu")
        assert decoded is x
