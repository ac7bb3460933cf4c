"""The WHILE bodies' temporaries must live in memory that the full graph owns (regression).

The bodies are captured on their own streams (``cudaStreamBeginCaptureToGraph``), whose capture ids differ
from the graph's own capture: PyTorch's allocator does not route them to the graph's private pool. Their
temporaries then came from the ordinary pool, were freed when the capture ended and released by the next
capture's ``empty_cache()``: on an H200 the streaming decoder of bucket 256 (captured before the buckets 512
and 1024) hit an illegal memory access at its first replay. The CPU test checks the capture's structure with
stand-ins for the CUDA pieces; the GPU test replays a graph after another capture released the cache.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from nemo_fastdecode.graphs import GraphMode, LoopPhases, TwoLevelLoop, cuda_api, two_level_loop, while_loop


def test_full_graph_bodies_allocate_from_a_pool_the_loop_keeps(monkeypatch):
    events: list[str] = []
    depth = {"pool": 0}

    class FakePool:
        pass

    @contextlib.contextmanager
    def use_mem_pool(pool, device=None):
        assert isinstance(pool, FakePool)
        depth["pool"] += 1
        yield
        depth["pool"] -= 1

    @contextlib.contextmanager
    def fake_while(flag):
        events.append(f"while({'pool' if depth['pool'] else 'no pool'})")
        yield

    @contextlib.contextmanager
    def nothing(*args, **kwargs):
        yield

    monkeypatch.setattr(torch.cuda, "MemPool", FakePool, raising=False)
    monkeypatch.setattr(torch.cuda, "use_mem_pool", use_mem_pool, raising=False)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: "graph")
    monkeypatch.setattr(two_level_loop, "capturing", nothing)
    monkeypatch.setattr(torch.cuda, "stream", nothing)
    monkeypatch.setattr(while_loop, "captured_while_loop", fake_while)
    monkeypatch.setattr(cuda_api, "set_condition_kernel", lambda index: None)

    def phase(name):
        return lambda: events.append(f"{name}({'pool' if depth['pool'] else 'no pool'})")

    flag = torch.zeros([], dtype=torch.bool)
    phases = LoopPhases(phase("before"), phase("start"), phase("step"), phase("end"), flag, flag.clone())
    loop = TwoLevelLoop(phases, GraphMode.FULL_GRAPH)
    assert loop._capture_full(stream=None) == "graph"
    # every body phase (and the inner loop) is captured with the body pool active; the part before the loop
    # belongs to the graph's own capture
    assert events == ["before(no pool)", "while(pool)", "start(pool)", "while(pool)", "step(pool)", "end(pool)"]
    assert isinstance(loop._body_pool, FakePool)  # kept as long as the graph


def test_full_graph_without_mem_pool_falls_back(monkeypatch):
    monkeypatch.delattr(torch.cuda, "MemPool", raising=False)
    monkeypatch.setattr(cuda_api, "set_condition_kernel", lambda index: None)
    flag = torch.zeros([], dtype=torch.bool)
    loop = TwoLevelLoop(LoopPhases.one_level(lambda: None, lambda: None, flag), GraphMode.FULL_GRAPH)
    with pytest.raises(RuntimeError, match="MemPool"):  # _capture turns this into no_while_graph
        loop._capture_full(stream=None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_full_graph_survives_a_later_capture_and_empty_cache():
    from conftest import ENCODER_DIM, make_networks

    from nemo_fastdecode.graphs.cuda_api import while_nodes_unavailable_reason
    from nemo_fastdecode.greedy.label_loop import LabelLoopGreedy

    if while_nodes_unavailable_reason(torch.device("cuda")):
        pytest.skip("no conditional nodes")
    vocab = 1024  # joint logits of 256 rows > 1 MB: a large-pool segment of their own, released by empty_cache()
    decoder, joint = make_networks(tdt=False, seed=0, vocab_size=vocab)
    decoder, joint = decoder.cuda().eval(), joint.cuda().eval()
    batch, frames = 256, 2
    torch.manual_seed(0)
    x = torch.randn(batch, frames, ENCODER_DIM, device="cuda")
    lengths = torch.full([batch], frames, device="cuda")
    eager = LabelLoopGreedy(decoder, joint, vocab, 10, graph_mode=GraphMode.EAGER)
    graphs = LabelLoopGreedy(decoder, joint, vocab, 10, graph_mode=GraphMode.FULL_GRAPH)
    expected = [h.y_sequence.tolist() for h in eager(x, lengths)]
    assert [h.y_sequence.tolist() for h in graphs(x, lengths)] == expected
    assert graphs.graph_mode is GraphMode.FULL_GRAPH
    # another capture (empty_cache() on entry) and fresh allocations filled with garbage
    other = torch.cuda.CUDAGraph()
    static = torch.zeros(16, device="cuda")
    with torch.cuda.graph(other):
        static.add_(1)
    garbage = [torch.full([1 << 20], -1e30, device="cuda") for _ in range(64)]
    for _ in range(3):
        assert [h.y_sequence.tolist() for h in graphs(x, lengths)] == expected
    torch.cuda.synchronize()
    del garbage
