"""Fused beam-step kernel (log-softmax + top-k non-blank + blank) against a float64 reference.

Without CUDA the Triton kernels run under the Triton interpreter (TRITON_INTERPRET=1) on the CPU; every test that
checks the kernel forces the Triton path with ``use_triton=True`` (or calls the launcher directly).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from nemo_fastdecode.kernels import beam_topk  # noqa: E402
from nemo_fastdecode.kernels.beam_topk import (  # noqa: E402
    MAX_SINGLE_BLOCK_V,
    log_softmax_topk,
    log_softmax_topk_reference,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Values are computed in fp32 from the (exactly upcast) inputs in every dtype, so the error is the fp32 computation
# error; low-precision inputs get a little slack for their larger dynamic range per ulp of the reference.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-5, torch.float16: 2e-5}
INF = float("inf")
NAN = float("nan")


def reference_float64(
    logits: torch.Tensor, k: int, blank_id: int, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Straightforward float64 statement of the semantics: log_softmax in float64 over all V, then a stable
    descending sort of the non-blank entries (NaN ranked as -inf), padded with -inf / -1, blank appended."""
    x = logits.double().cpu() / temperature
    logp = torch.log_softmax(x, dim=-1)  # NaN rows, +inf rows and all -inf rows come out all NaN
    n, v = x.shape
    non_blank = torch.tensor([i for i in range(v) if i != blank_id], dtype=torch.int64)
    keys = x.masked_fill(x.isnan(), -INF)[:, non_blank]
    order = torch.sort(keys, dim=-1, descending=True, stable=True).indices[:, :k]
    ids = non_blank[order]
    values = logp.gather(1, ids)
    pad = k - ids.shape[1]
    values = torch.cat((values, torch.full((n, pad), -INF, dtype=torch.float64), logp[:, blank_id : blank_id + 1]), 1)
    ids = torch.cat((ids, torch.full((n, pad), -1, dtype=torch.int64), torch.full((n, 1), blank_id)), 1)
    return values, ids


def assert_matches(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor], dtype) -> None:
    values, ids = got
    want_values, want_ids = want
    assert values.dtype == torch.float32 and ids.dtype == torch.int64
    assert values.shape == want_values.shape and ids.shape == want_ids.shape
    assert values.device.type == DEVICE.type and ids.device.type == DEVICE.type
    torch.testing.assert_close(ids.cpu(), want_ids.cpu(), rtol=0, atol=0)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(values.cpu().double(), want_values.cpu().double(), rtol=tol, atol=tol, equal_nan=True)


def random_logits(n: int, v: int, dtype: torch.dtype, seed: int, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, v, generator=g) * scale).to(dtype).to(DEVICE)


def check_kernel(logits: torch.Tensor, k: int, blank_id: int, temperature: float = 1.0) -> None:
    """Triton path against the float64 reference, and the torch reference (CPU fallback) against both."""
    want = reference_float64(logits, k, blank_id, temperature)
    got = log_softmax_topk(logits, k, blank_id, temperature, use_triton=True)
    assert_matches(got, want, logits.dtype)
    ref = log_softmax_topk_reference(logits, k, blank_id, temperature)
    assert_matches(ref, want, logits.dtype)


# --- agreement with the float64 reference -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("k", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("v", [1, 2, 129, 1025])
def test_matches_float64_reference(v: int, k: int, dtype: torch.dtype) -> None:
    # Temperatures cycle over the cases; powers of two keep the scaled logits exact, so ids compare exactly.
    temperature = (0.5, 1.0, 2.0)[(v + k) % 3]
    logits = random_logits(3, v, dtype, seed=v * 100 + k)
    check_kernel(logits, k, blank_id=0, temperature=temperature)
    check_kernel(logits, k, blank_id=v - 1, temperature=temperature)


@pytest.mark.parametrize(
    ("v", "k", "dtype", "temperature"),
    [
        (4097, 16, torch.float32, 1.0),
        (4097, 2, torch.bfloat16, 0.5),
        (MAX_SINGLE_BLOCK_V, 8, torch.float16, 2.0),  # widest single-block row
        (MAX_SINGLE_BLOCK_V + 1, 16, torch.float32, 0.5),  # first blocked row: last block holds one entry
        (MAX_SINGLE_BLOCK_V + 1, 1, torch.bfloat16, 1.0),
        (20000, 4, torch.float16, 2.0),  # several blocks, ragged last one
    ],
)
def test_large_vocabularies_both_variants(v: int, k: int, dtype: torch.dtype, temperature: float) -> None:
    logits = random_logits(2, v, dtype, seed=v + k)
    check_kernel(logits, k, blank_id=v - 1, temperature=temperature)
    check_kernel(logits[:1], k, blank_id=0, temperature=temperature)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0, 0.7, 1.3])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_temperature(temperature: float, dtype: torch.dtype) -> None:
    logits = random_logits(3, 129, dtype, seed=7)
    got = log_softmax_topk(logits, 4, 5, temperature, use_triton=True)
    # Any temperature: kernel and torch reference scale identically (float32 reciprocal), so ids are identical.
    ref = log_softmax_topk_reference(logits, 4, 5, temperature)
    assert_matches(got, ref, dtype)
    # Against float64 division the values agree to rounding.
    want_values, _ = reference_float64(logits, 4, 5, temperature)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got[0].cpu().double(), want_values, rtol=tol, atol=tol)


def test_temperature_sharpens_and_flattens() -> None:
    logits = random_logits(1, 129, torch.float32, seed=3)
    hot, _ = log_softmax_topk(logits, 1, 0, 2.0, use_triton=True)
    cold, _ = log_softmax_topk(logits, 1, 0, 0.5, use_triton=True)
    assert cold[0, 0] > hot[0, 0]  # a lower temperature puts more mass on the best token


@pytest.mark.parametrize(
    ("v", "block_v", "k", "dtype"),
    [
        (129, 32, 16, torch.float32),  # 5 blocks, the last one holds a single entry
        (1025, 256, 7, torch.bfloat16),
        (300, 512, 1, torch.float16),  # one partial block
    ],
)
def test_blocked_variant_on_small_rows(v: int, block_v: int, k: int, dtype: torch.dtype) -> None:
    """The blocked (online softmax + running top-k) variant, forced on small rows with small blocks."""
    # Rounded logits make exact ties, within and across blocks.
    logits = random_logits(2, v, torch.float32, seed=v + k).round().to(dtype)
    for blank_id in (0, 40, v - 1):
        want = reference_float64(logits, k, blank_id, 2.0)
        got = beam_topk.launch_log_softmax_topk(
            logits, k, blank_id, 2.0, max_single_block_v=16, blocked_block_v=block_v
        )
        assert_matches(got, want, dtype)


# --- layout ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_row_strided_input(dtype: torch.dtype) -> None:
    wide = random_logits(6, 1025 + 37, dtype, seed=11)
    logits = wide[::2, 5 : 5 + 1025]  # stride(0) = 2 * 1062, non-zero storage offset
    assert not logits.is_contiguous() and logits.stride(1) == 1
    got = log_softmax_topk(logits, 8, 3, use_triton=True)
    assert_matches(got, reference_float64(logits, 8, 3), dtype)
    assert_matches(got, log_softmax_topk(logits.contiguous(), 8, 3, use_triton=True), dtype)


@pytest.mark.parametrize("use_blocked", [False, True])
def test_tdt_token_part_ignores_duration_logits(use_blocked: bool) -> None:
    """TDT joints emit [N, V + num_durations]; the caller passes logits[:, :V] and durations have no influence."""
    v, num_durations = 1025, 5
    joint = random_logits(3, v + num_durations, torch.float32, seed=5)
    joint[:, v:] = 1e4  # would dominate both the top-k and the normaliser if they were read
    tokens = joint[:, :v]
    assert tokens.stride(0) == v + num_durations
    if use_blocked:
        got = beam_topk.launch_log_softmax_topk(tokens, 8, v - 1, 1.0, max_single_block_v=16, blocked_block_v=256)
    else:
        got = log_softmax_topk(tokens, 8, v - 1, use_triton=True)
    assert int(got[1].max()) < v
    assert_matches(got, reference_float64(tokens.contiguous(), 8, v - 1), torch.float32)
    # Probabilities over the token part sum to at most 1: the duration logits are not in the normaliser.
    assert float(got[0].exp().sum(dim=1).max()) <= 1.0 + 1e-5


# --- non-finite values, ties, small vocabularies --------------------------------------------------------------------


def nonfinite_rows(v: int) -> torch.Tensor:
    """Rows exercising the documented rule; blank is column 2."""
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(11, v, generator=g) * 3
    rows[0, 50] = NAN  # NaN in a non-blank -> all values NaN, ids rank NaN like -inf
    rows[1, 2] = NAN  # NaN in the blank
    rows[2, 60] = INF  # +inf -> all values NaN, the +inf token ranks first
    rows[3, [7, 90]] = INF  # two +inf: lower id first
    rows[4, :] = -INF  # all -inf -> NaN values, ids 0, 1, 3, ... (lowest first, blank skipped)
    rows[5, :] = -INF  # only three finite non-blank tokens: -inf tokens fill the rest, lowest id first
    rows[5, [100, 4, 70]] = torch.tensor([1.0, 2.0, 1.0])
    rows[6, 2] = -INF  # blank -inf: its value is -inf, the rest is an ordinary row
    rows[7, [0, 1, 3, 4]] = -INF  # -inf entries are never chosen before finite ones
    rows[8, :] = -INF  # NaN and -inf tie (both rank as -inf): lower id first
    rows[8, [9, 5]] = NAN
    rows[9, [10, 40]] = torch.tensor([INF, NAN])  # +inf and NaN together
    rows[10, 1::2] = -INF  # half the row -inf, rest ordinary
    return rows


@pytest.mark.parametrize(
    ("variant", "dtype"),
    [("single", torch.float32), ("single", torch.bfloat16), ("single", torch.float16), ("blocked", torch.float32)],
    ids=str,
)
def test_nonfinite_rows(variant: str, dtype: torch.dtype) -> None:
    logits = nonfinite_rows(129).to(dtype).to(DEVICE)
    want = reference_float64(logits, 8, 2)
    if variant == "single":
        got = log_softmax_topk(logits, 8, 2, use_triton=True)
    else:
        got = beam_topk.launch_log_softmax_topk(logits, 8, 2, 1.0, max_single_block_v=16, blocked_block_v=64)
    assert_matches(got, want, dtype)
    assert_matches(log_softmax_topk_reference(logits, 8, 2), want, dtype)
    values, ids = (t.cpu() for t in got)
    for row in (0, 1, 2, 3, 4, 8, 9):
        assert values[row].isnan().all(), row
    assert ids[2, 0] == 60 and ids[3, :2].tolist() == [7, 90]
    assert ids[4, :8].tolist() == [0, 1, 3, 4, 5, 6, 7, 8]
    assert ids[5, :8].tolist() == [4, 70, 100, 0, 1, 3, 5, 6]
    assert values[5, :3].isfinite().all() and (values[5, 3:8] == -INF).all()
    assert values[6, 8] == -INF and values[6, :8].isfinite().all()
    assert not set(ids[7, :8].tolist()) & {0, 1, 3, 4}
    assert ids[8, :8].tolist() == [0, 1, 3, 4, 5, 6, 7, 8]
    assert ids[9, 0] == 10


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_exact_ties_lowest_id_first(dtype: torch.dtype) -> None:
    v = 129
    logits = torch.zeros(4, v)
    logits[1] = torch.arange(v) % 3  # ties in groups of 43
    logits[2, [120, 17, 64, 3]] = 5.0  # a four-way tie at the top, listed out of order
    logits[3] = torch.randint(-2, 3, (v,), generator=torch.Generator().manual_seed(1)).float()
    logits = logits.to(dtype).to(DEVICE)
    want = reference_float64(logits, 16, 2)
    got = log_softmax_topk(logits, 16, 2, use_triton=True)
    assert_matches(got, want, dtype)
    ids = got[1].cpu()
    assert ids[0, :16].tolist() == [0, 1] + list(range(3, 17))  # all equal: lowest ids, blank skipped
    assert ids[1, :4].tolist() == [5, 8, 11, 14]  # value 2 at ids 2 (blank), 5, 8, ...
    assert ids[2, :4].tolist() == [3, 17, 64, 120]


@pytest.mark.parametrize("use_triton", [True, False])
def test_fewer_candidates_than_k(use_triton: bool) -> None:
    logits = torch.tensor([[0.0, 1.0], [3.0, -1.0]], device=DEVICE)
    values, ids = log_softmax_topk(logits, 4, 1, use_triton=use_triton)
    assert ids.cpu().tolist() == [[0, -1, -1, -1, 1], [0, -1, -1, -1, 1]]
    assert (values[:, 1:4] == -INF).all()
    torch.testing.assert_close(values[:, [0, 4]], torch.log_softmax(logits, dim=-1))
    values, ids = log_softmax_topk(logits[:, :1], 2, 0, use_triton=use_triton)  # V = 1: blank only
    assert ids.cpu().tolist() == [[-1, -1, 0], [-1, -1, 0]]
    assert values.cpu().tolist() == [[-INF, -INF, 0.0], [-INF, -INF, 0.0]]


@pytest.mark.parametrize("use_triton", [True, False])
def test_empty_batch(use_triton: bool) -> None:
    values, ids = log_softmax_topk(torch.empty(0, 1025, device=DEVICE), 4, 0, use_triton=use_triton)
    assert values.shape == (0, 5) and values.dtype == torch.float32
    assert ids.shape == (0, 5) and ids.dtype == torch.int64
    assert values.device.type == DEVICE.type and ids.device.type == DEVICE.type


def test_reference_batched_against_float64() -> None:
    """The torch reference (CPU fallback) on a larger batch: bf16 inputs make many exact ties."""
    logits = random_logits(32, 1025, torch.bfloat16, seed=2, scale=1.0)
    for k in (1, 16):
        for blank_id in (0, 511, 1024):
            assert_matches(
                log_softmax_topk_reference(logits, k, blank_id), reference_float64(logits, k, blank_id), logits.dtype
            )


def test_default_dispatch() -> None:
    logits = random_logits(3, 129, torch.float32, seed=4)
    default = log_softmax_topk(logits, 4, 0)
    assert_matches(default, log_softmax_topk(logits, 4, 0, use_triton=False), torch.float32)
    assert_matches(default, log_softmax_topk(logits, 4, 0, use_triton=True), torch.float32)


# --- errors ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("logits", "k", "blank_id", "temperature", "match"),
    [
        (torch.zeros(2, 3, 4), 2, 0, 1.0, r"logits must be 2-D \[N, V\], got shape \(2, 3, 4\)"),
        (torch.zeros(5), 2, 0, 1.0, r"logits must be 2-D \[N, V\], got shape \(5,\)"),
        (torch.zeros(2, 8).double(), 2, 0, 1.0, r"one of float32, bfloat16, float16, got torch.float64"),
        (torch.zeros(2, 8, dtype=torch.int32), 2, 0, 1.0, r"dtype must be one of .*, got torch.int32"),
        (torch.zeros(2, 0), 2, 0, 1.0, r"V >= 1 columns, got shape \(2, 0\)"),
        (torch.zeros(8, 4).t(), 2, 0, 1.0, r"unit stride along V .* got strides \(1, 4\)"),
        (torch.zeros(2, 8), 20, 0, 1.0, r"k must be in 1..16, got 20"),
        (torch.zeros(2, 8), 0, 0, 1.0, r"k must be in 1..16, got 0"),
        (torch.zeros(2, 8), 2.0, 0, 1.0, r"k must be in 1..16, got 2.0"),
        (torch.zeros(2, 8), True, 0, 1.0, r"k must be in 1..16, got True"),
        (torch.zeros(2, 1025), 2, 1025, 1.0, r"blank_id must be in \[0, V\) = \[0, 1025\), got 1025"),
        (torch.zeros(2, 8), 2, -1, 1.0, r"blank_id must be in \[0, V\) = \[0, 8\), got -1"),
        (torch.zeros(2, 8), 2, 0, 0.0, r"temperature must be a finite float > 0 .*got 0.0"),
        (torch.zeros(2, 8), 2, 0, -1.0, r"temperature must be a finite float > 0 .*got -1.0"),
        (torch.zeros(2, 8), 2, 0, INF, r"temperature must be a finite float > 0 .*got inf"),
        (torch.zeros(2, 8), 2, 0, NAN, r"temperature must be a finite float > 0 .*got nan"),
        (torch.zeros(2, 8), 2, 0, 1e-300, r"temperature must be a finite float > 0 .*got 1e-300"),
        (torch.zeros(2, 8), 2, 0, "1.0", r"temperature must be a finite float > 0, got '1.0'"),
    ],
)
@pytest.mark.parametrize("use_triton", [True, False])
def test_bad_inputs_name_the_value(logits, k, blank_id, temperature, match: str, use_triton: bool) -> None:
    with pytest.raises(ValueError, match=match):
        log_softmax_topk(logits.to(DEVICE), k, blank_id, temperature, use_triton=use_triton)
    with pytest.raises(ValueError, match=match):
        log_softmax_topk_reference(logits.to(DEVICE), k, blank_id, temperature)


def test_non_tensor_logits() -> None:
    with pytest.raises(TypeError, match="logits must be a torch.Tensor"):
        log_softmax_topk([[0.0, 1.0]], 1, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour")
def test_forced_triton_on_cpu_needs_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="use_triton=True needs CUDA logits or TRITON_INTERPRET=1"):
        log_softmax_topk(torch.zeros(2, 8), 2, 0, use_triton=True)
