"""The 3xTF32 GEMM kernel (kernels/matmul.py) against a float64 reference; interpreted on the CPU."""

from __future__ import annotations

import pytest
import torch

from nemo_fastdecode.kernels import matmul
from nemo_fastdecode.kernels.tf32x3 import stream_split_k_counters

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def random(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def close_to_float64(got, x, weight, bias, rtol=2e-6):
    expected = x.double() @ weight.double().T + (bias.double() if bias is not None else 0)
    # relative to the size of the products summed (a sum near zero has no relative accuracy)
    scale = (x.double().abs() @ weight.double().abs().T).clamp(min=1e-30)
    error = ((got.double() - expected).abs() / scale).max().item()
    assert error < rtol, f"max scaled error {error:.2e}"


@pytest.mark.parametrize(
    "rows,n_out,depth,overrides",
    [
        (1, 5, 3, {}),
        (7, 33, 17, {}),
        (70, 130, 96, {}),  # odd tiles
        (70, 130, 96, {"block_m": 16, "block_n": 16, "block_k": 16}),  # many tiles, grouped program order
        (300, 64, 40, {"block_m": 32, "block_n": 32}),
        (7, 33, 17, {"split_k": 2, "block_k": 16}),  # the second split holds one depth element
        (70, 130, 96, {"block_m": 16, "block_n": 16, "block_k": 16, "split_k": 4}),
    ],
    ids=["1x5x3", "7x33x17", "70x130x96", "70x130x96-small-tiles", "300x64x40", "split-2", "split-4"],
)
@pytest.mark.parametrize("with_bias", [True, False])
def test_matches_float64(rows, n_out, depth, overrides, with_bias):
    x, weight = random(rows, depth, seed=rows), random(n_out, depth, seed=n_out)
    bias = random(n_out, seed=1) if with_bias else None
    got = matmul.linear(x, weight, bias, **overrides)
    assert got.shape == (rows, n_out) and got.dtype == torch.float32
    close_to_float64(got, x, weight, bias)


def test_split_k_is_deterministic_and_leaves_its_counters_at_zero():
    x, weight, bias = random(40, 300), random(50, 300, seed=1), random(50, seed=2)
    first = matmul.linear(x, weight, bias, split_k=3, block_m=16, block_n=16)
    again = matmul.linear(x, weight, bias, split_k=3, block_m=16, block_n=16)
    assert torch.equal(first, again)
    assert not stream_split_k_counters(x.device).any()
    close_to_float64(first, x, weight, bias)


def test_leading_dims_and_strided_input():
    x = random(3, 10, 24).transpose(0, 1)  # [10, 3, 24], not contiguous
    weight, bias = random(40, 24, seed=2), random(40, seed=3)
    got = matmul.linear(x, weight, bias)
    assert got.shape == (10, 3, 40)
    close_to_float64(got.reshape(-1, 40), x.reshape(-1, 24), weight, bias)
    assert torch.allclose(got, matmul.linear_reference(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_out_and_row_mask_write_in_place():
    """``out``: written and returned; ``row_mask``: only its rows are written (the decoder's masked state update)."""
    x, weight, bias = random(3, 5, 24, seed=2), random(40, 24, seed=3), random(40, seed=4)
    out = torch.full([3, 5, 40], 7.0, device=DEVICE)
    mask = torch.arange(15, device=DEVICE) % 3 == 0
    got = matmul.linear(x, weight, bias, out=out, row_mask=mask, swish=True, block_m=16, block_n=16)
    assert got is out
    expected = matmul.linear_reference(x, weight, bias, out=torch.full_like(out, 7.0), row_mask=mask, swish=True)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert (out.view(15, 40)[~mask] == 7.0).all() and not (out.view(15, 40)[mask] == 7.0).any()
    with pytest.raises(ValueError, match=r"out must be \[..., N\] = \(3, 5, 40\)"):
        matmul.linear(x, weight, out=out[..., :-1])
    with pytest.raises(ValueError, match="row_mask cannot be combined with row_stats or scatter"):
        matmul.linear(x, weight, row_mask=mask, row_stats=True)


def test_empty_rows_and_zero_depth():
    weight, bias = random(6, 4), random(6, seed=1)
    assert matmul.linear(random(0, 4), weight, bias).shape == (0, 6)
    got = matmul.linear(random(3, 0), random(6, 0), bias)
    assert torch.equal(got, bias.expand(3, 6))


def test_tensor_cores_only_where_they_won_the_sweep():
    assert matmul.tensor_cores_win(512, 2048, 512) and matmul.tensor_cores_win(32, 512, 2048)
    assert not matmul.tensor_cores_win(32, 512, 512)
    assert (
        matmul.matmul_tiling(512, 512, 2048)["split_k"] == 4 and matmul.matmul_tiling(2048, 512, 2048)["split_k"] == 1
    )


def test_bad_inputs_are_named():
    x, weight = random(4, 8), random(5, 8)
    with pytest.raises(ValueError, match="x must be float32, got torch.float64"):
        matmul.linear(x.double(), weight)
    with pytest.raises(ValueError, match=r"shapes disagree: x \(4, 8\) \[..., K\], weight \(5, 7\)"):
        matmul.linear(x, random(5, 7))
    with pytest.raises(ValueError, match=r"bias \(4,\) \[N\]"):
        matmul.linear(x, weight, random(4))
    with pytest.raises(ValueError, match="precision must be one of .*'tf32x3'.*got 'fp16'"):
        matmul.linear(x, weight, precision="fp16")
    if DEVICE.type == "cuda":
        with pytest.raises(ValueError, match="weight is on cpu"):
            matmul.linear(x, weight.cpu())


@pytest.mark.parametrize("overrides", [{}, {"split_k": 3, "block_m": 16, "block_n": 16, "block_k": 16}])
@pytest.mark.parametrize("swish,with_residual", [(True, False), (False, True), (True, True)])
def test_epilogue_swish_and_scaled_residual(overrides, swish, with_residual):
    """A Conformer feed-forward's elementwise work in the GEMM: ``residual + 0.5 * swish(x @ W^T + b)``."""
    x, weight, bias = random(2, 35, 40, seed=4), random(33, 40, seed=5), random(33, seed=6)
    residual = random(2, 35, 33, seed=7) if with_residual else None
    got = matmul.linear(x, weight, bias, swish=swish, residual=residual, residual_scale=0.5, **overrides)
    expected = matmul.linear_reference(x, weight, bias, swish=swish, residual=residual, residual_scale=0.5)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    plain = matmul.linear_reference(x, weight, bias)
    assert not torch.allclose(got, plain, rtol=1e-3, atol=1e-3)  # the epilogue did something
    if with_residual:
        with pytest.raises(ValueError, match=r"residual must be \[..., N\]"):
            matmul.linear(x, weight, bias, residual=residual[..., :-1])


@pytest.mark.parametrize(
    "overrides",
    [{}, {"block_m": 16, "block_n": 16, "block_k": 16}, {"block_n": 32, "split_k": 4, "block_k": 16}],
    ids=["default", "small-tiles", "split-4"],
)
def test_row_stats_of_the_output(overrides):
    """``row_stats``: per-tile (mean, M2) of the output after its epilogue, merged into each row's mean and var."""
    rows, n_out, depth = 37, 70, 48  # odd: a partial row tile and a narrower last column tile
    x, weight, residual = random(rows, depth, seed=1), random(n_out, depth, seed=2), random(rows, n_out, seed=3)
    y, stats = matmul.linear(x, weight, random(n_out, seed=4), residual=residual + 5.0, row_stats=True, **overrides)
    var, mean = torch.var_mean(y.double(), dim=1, correction=0)
    got_mean, got_var = stats.mean_var(n_out)
    torch.testing.assert_close(got_mean, mean, rtol=1e-6, atol=1e-6)  # a row mean near 5: the offset is kept
    torch.testing.assert_close(got_var, var, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("split_k", [1, 4])
def test_layer_norm_of_the_input_from_its_row_stats(split_k):
    """A GEMM over ``layer_norm(h)`` where ``h`` (far from zero mean) was written by a GEMM that kept its row
    statistics: the same as torch's LayerNorm then the product, with no normalised copy of ``h``."""
    rows, d_model, n_out = 45, 40, 52
    x, w1 = random(rows, 24, seed=5), random(d_model, 24, seed=6)
    h, stats = matmul.linear(x, w1, residual=random(rows, d_model, seed=7) * 3 + 7.0, row_stats=True, block_n=16)
    norm = torch.nn.LayerNorm(d_model, eps=1e-5).to(DEVICE)
    with torch.no_grad():
        norm.weight.copy_(random(d_model, seed=8))
        norm.bias.copy_(random(d_model, seed=9))
    w2, b2 = random(n_out, d_model, seed=10), random(n_out, seed=11)
    fused = matmul.linear(
        h, w2, b2, layer_norm=matmul.LayerNormInput(stats, norm.weight, norm.bias, norm.eps), split_k=split_k,
        block_k=16,
    )  # fmt: skip
    with torch.no_grad():
        expected = matmul.linear_reference(h, w2, b2, layer_norm=norm)
        close_to_float64(fused, norm(h), w2, b2, rtol=2e-5)  # the normalised rows agree with torch's to ~1e-6
    torch.testing.assert_close(fused, expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"layer_norm stats are \(45, 3, 2\), x is \[45, 24\]"):
        matmul.linear(x, w1, layer_norm=matmul.LayerNormInput(stats, norm.weight, norm.bias, norm.eps))
    with pytest.raises(ValueError, match="row_stats / layer_norm need a non-empty product"):
        matmul.linear(x[:0], w1, row_stats=True)


@pytest.mark.parametrize("overrides", [{}, {"split_k": 3, "block_m": 16, "block_n": 16, "block_k": 16}])
def test_scatter_writes_the_last_columns_into_each_rows_cache_place(overrides):
    """A q-k-v projection that writes k and v straight into a cache ``[slots, positions, 2 * d]`` at each row's
    (slot, position), as ``index_put_`` does, and returns q only; rows past the batch's real ones all write into
    one dummy place."""
    rows, depth, d = 37, 24, 12  # q, k, v of width d
    x, weight, bias = random(rows, depth, seed=1), random(3 * d, depth, seed=2), random(3 * d, seed=3)
    cache = torch.full([6, 9, 2 * d], -7.0, device=DEVICE)
    g = torch.Generator().manual_seed(4)
    places = torch.randperm(5 * 9, generator=g)[:rows]  # distinct (slot, position) pairs in slots 0..4
    slot, pos = (places // 9).to(DEVICE), (places % 9).to(DEVICE)
    slot[30:], pos[30:] = 5, 0  # padding rows: the dummy slot
    expected_cache = cache.clone()
    y = matmul.linear_reference(x, weight, bias, swish=True)
    expected_cache.index_put_((slot[:30], pos[:30]), y[:30, d:])
    offsets = slot * cache.stride(0) + pos * cache.stride(1)
    q = matmul.linear(x, weight, bias, swish=True, scatter=matmul.ColumnScatter(d, cache, offsets), **overrides)
    assert q.shape == (rows, d)
    torch.testing.assert_close(q, y[:, :d], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cache[:5], expected_cache[:5], rtol=1e-5, atol=1e-6)  # untouched places keep -7
    # the torch path of the same scatter (CPU / off the kernel) agrees
    torch_cache = torch.full_like(cache, -7.0)
    torch.testing.assert_close(matmul.ColumnScatter(d, torch_cache, offsets).apply(y), y[:, :d])
    torch.testing.assert_close(torch_cache[:5], expected_cache[:5])


def test_scatter_bad_arguments_are_named():
    x, weight = random(4, 8), random(6, 8)
    cache = torch.zeros([3, 4], device=DEVICE)
    offsets = torch.zeros(4, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="scatter cannot be combined with residual or row_stats"):
        matmul.linear(x, weight, row_stats=True, scatter=matmul.ColumnScatter(2, cache, offsets))
    with pytest.raises(ValueError, match=r"scatter.start must be in \[0, 6\], got 7"):
        matmul.linear(x, weight, scatter=matmul.ColumnScatter(7, cache, offsets))
    with pytest.raises(ValueError, match="scatter.row_offsets must be int64 \\[4\\]"):
        matmul.linear(x, weight, scatter=matmul.ColumnScatter(2, cache, offsets[:3]))
    with pytest.raises(ValueError, match="scatter.target must be a contiguous float32 tensor"):
        matmul.linear(x, weight, scatter=matmul.ColumnScatter(2, cache.double(), offsets))
