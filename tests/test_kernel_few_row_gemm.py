"""The few-row IEEE-fp32 GEMM (:mod:`nemo_fastdecode.kernels.few_row_gemm`), a CUDA C kernel.

It has no CPU form (Triton's interpreter runs Triton only): the kernel tests are marked ``gpu`` and compare it with
float64 and with its torch reference on a GPU; the CPU tests cover what runs without one (the transposed weight
layout, tiling checks, the clear errors, and the exact predictor falling back to Triton's IEEE kernel).
"""

from __future__ import annotations

import pytest
import torch

from nemo_fastdecode.kernels import few_row_gemm


def test_transposed_weight_pads_columns_to_float4():
    weight = torch.arange(30, dtype=torch.float32).reshape(5, 6)  # N = 5, K = 6
    transposed = few_row_gemm.transposed_weight(weight)
    assert transposed.shape == (6, 8)
    assert torch.equal(transposed[:, :5], weight.T)
    assert not transposed[:, 5:].any()


def test_every_chosen_tiling_is_valid():
    for rows in (1, 7, 32, 33, 64, 65, 128, 256):
        for n_out in (5, 640, 1030, 2560):
            tiling = few_row_gemm.choose_tiling(rows, n_out)
            assert tiling in few_row_gemm.TILINGS
            few_row_gemm.check_tiling(tiling)


@pytest.mark.parametrize("tiling", [(3, 1, 4), (8, 4, 33), (8, 8, 20), (8, 0, 4)])
def test_bad_tiling_is_refused_with_the_rules(tiling):
    with pytest.raises(ValueError, match=r"tiling .*column groups must divide 32"):
        few_row_gemm.check_tiling(tiling)


def test_cpu_operands_are_refused_with_the_reason():
    x, weight = torch.zeros([4, 8]), torch.zeros([3, 8])
    out = torch.zeros([4, 3])
    assert "not CUDA" in few_row_gemm.unsupported_reason(x, few_row_gemm.transposed_weight(weight), out)
    with pytest.raises(ValueError, match="few_row_gemm.linear: device cpu is not CUDA"):
        few_row_gemm.linear(x, few_row_gemm.transposed_weight(weight), None, out)


def test_exact_predictor_without_cuda_keeps_no_transposed_copies():
    """Off CUDA the exact predictor's products stay on Triton's IEEE kernel (run by the interpreter in CI)."""
    from conftest import make_networks

    from nemo_fastdecode.prediction import ExactPredictor

    decoder, joint = make_networks(seed=1, pred_layers=2)
    predictor = ExactPredictor(decoder, joint)
    predictor.prepare(torch.float32)
    assert predictor._transposed == {}


def _operands(rows, n_out, depth, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn([rows, depth], device="cuda", generator=g)
    weight = torch.randn([n_out, depth], device="cuda", generator=g) / depth**0.5
    bias = torch.randn([n_out], device="cuda", generator=g)
    return x, weight, bias


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 5, 32, 33, 64, 100, 256])
@pytest.mark.parametrize("n_out", [3, 640, 1030, 2560])
@pytest.mark.parametrize("depth", [4, 64, 640, 644])
def test_matches_float64(rows, n_out, depth):
    x, weight, bias = _operands(rows, n_out, depth, seed=rows + n_out + depth)
    out = torch.full([rows, n_out], float("nan"), device="cuda")
    few_row_gemm.linear(x, few_row_gemm.transposed_weight(weight), bias, out)
    expected = x.double() @ weight.double().T + bias.double()
    assert expected.abs().max() > 0.1  # something to compare
    # fp32 sums of `depth` products: a few ulps of the row's largest terms
    scale = (x.double().abs() @ weight.double().abs().T).max()
    assert ((out.double() - expected).abs().max() / scale).item() < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("tiling", few_row_gemm.TILINGS + ((4, 2, 8), (32, 1, 4)))
def test_every_tiling_matches_the_reference(tiling):
    rows, n_out, depth = 48, 1030, 640
    x, weight, bias = _operands(rows, n_out, depth, seed=7)
    out = torch.empty([rows, n_out], device="cuda")
    few_row_gemm.linear(x, few_row_gemm.transposed_weight(weight), bias, out, tiling=tiling)
    expected = few_row_gemm.linear_reference(x, weight, bias, torch.empty_like(out))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_residual_in_place_and_row_mask():
    """``out = residual + x @ W^T`` in place on the masked rows (the exact predictor's deeper-layer gates); the other
    rows keep their values bit for bit."""
    rows, n_out, depth = 32, 2560, 640
    x, weight, _ = _operands(rows, n_out, depth, seed=11)
    gates = torch.randn([rows, n_out], device="cuda")
    before = gates.clone()
    mask = torch.arange(rows, device="cuda") % 3 != 0
    few_row_gemm.linear(x, few_row_gemm.transposed_weight(weight), None, gates, residual=gates, row_mask=mask)
    expected = few_row_gemm.linear_reference(x, weight, None, before.clone(), residual=before, row_mask=mask)
    assert not torch.equal(gates[mask], before[mask])  # the masked rows moved
    torch.testing.assert_close(gates, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(gates[~mask], before[~mask])


@pytest.mark.gpu
def test_same_sums_for_any_row_count_up_to_64_and_on_every_run():
    """Each output's order of additions depends on neither the row count (up to 64, one tiling family) nor the run:
    a look-ahead window's logits equal the single-frame look's bit for bit."""
    x, weight, bias = _operands(64, 1030, 640, seed=3)
    weight_t = few_row_gemm.transposed_weight(weight)
    window = few_row_gemm.linear(x, weight_t, bias, torch.empty([64, 1030], device="cuda"))
    single = few_row_gemm.linear(x[:32].contiguous(), weight_t, bias, torch.empty([32, 1030], device="cuda"))
    again = few_row_gemm.linear(x, weight_t, bias, torch.empty([64, 1030], device="cuda"))
    assert torch.equal(window[:32], single)
    assert torch.equal(window, again)


@pytest.mark.gpu
def test_captured_in_a_cuda_graph():
    x, weight, bias = _operands(32, 640, 640, seed=5)
    weight_t = few_row_gemm.transposed_weight(weight)
    out = torch.zeros([32, 640], device="cuda")
    few_row_gemm.prepare(x.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        few_row_gemm.linear(x, weight_t, bias, out)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(out, few_row_gemm.linear_reference(x, weight, bias, torch.empty_like(out)))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "change,match",
    [
        ("rows", "more than MAX_ROWS"),
        ("depth", "multiple of 4"),
        ("dtype", "float32 operands only"),
        ("out_columns", "out has 9 columns"),
        ("residual", "residual must be"),
        ("mask", "row_mask must be"),
    ],
)
def test_bad_operands_are_refused(change, match):
    rows = few_row_gemm.MAX_ROWS + 1 if change == "rows" else 8
    depth = 6 if change == "depth" else 8
    x = torch.randn([rows, depth], device="cuda", dtype=torch.float64 if change == "dtype" else torch.float32)
    weight_t = few_row_gemm.transposed_weight(torch.randn([5, depth], device="cuda"))
    out = torch.empty([rows, 9 if change == "out_columns" else 5], device="cuda")  # N_pad is 8
    residual = torch.empty([rows, 6], device="cuda") if change == "residual" else None
    mask = torch.ones([rows + 1 if change == "mask" else rows], dtype=torch.bool, device="cuda")
    with pytest.raises(ValueError, match=match):
        few_row_gemm.linear(x, weight_t, None, out, residual=residual, row_mask=mask)
