"""Tests of the fused indexed-attention kernel (Triton path forced; interpreted on CPU)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import itertools  # noqa: E402
import math  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("triton")

from nemo_fastdecode.kernels.indexed_attention import (  # noqa: E402
    build_rel_pos_table,
    indexed_attention,
    indexed_attention_reference,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCES = {  # (atol, rtol) against a float64 reference
    torch.float32: (2e-5, 2e-5),
    torch.float16: (3e-3, 3e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


def _make_inputs(n, s, h, t, tq, d, dtype, *, seed=0, lengths=None, rel_pos=False, garbage=1.0):
    """Random q and caches; slot ids shuffled with a repeat; ragged lengths including 0 and T."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, h, tq, d, generator=g)
    k_cache = torch.randn(s, h, t, d, generator=g) * garbage
    v_cache = torch.randn(s, h, t, d, generator=g) * garbage
    slot_ids = torch.randperm(s, generator=g)[:n]
    if n >= 3:
        slot_ids[-1] = slot_ids[0]  # repeated slot (reads only: allowed)
    if lengths is None:
        lengths = torch.randint(0, t + 1, (n,), generator=g)
        lengths[0] = t
        if n >= 2:
            lengths[1] = 0
    lengths = torch.as_tensor(lengths, dtype=torch.int64)
    extra = {}
    if rel_pos:
        extra = {
            "pos_bias_u": torch.randn(h, d, generator=g) * 0.5,
            "pos_bias_v": torch.randn(h, d, generator=g) * 0.5,
            "pos_emb": torch.randn(h, 2 * t - 1, d, generator=g),
        }
    to = {"device": DEVICE, "dtype": dtype}
    return (
        q.to(**to),
        k_cache.to(**to),
        v_cache.to(**to),
        slot_ids.to(DEVICE),
        lengths.to(DEVICE),
        {key: value.to(**to) for key, value in extra.items()},
    )


def _reference64(q, k_cache, v_cache, slot_ids, lengths, extra, scale=None):
    return indexed_attention_reference(
        q.double(),
        k_cache.double(),
        v_cache.double(),
        slot_ids,
        lengths,
        scale,
        **{key: value.double() for key, value in extra.items()},
    )


def _assert_close(out, ref, dtype):
    atol, rtol = TOLERANCES[dtype]
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol)


# D x T over all combinations; H and Tq cycle so that every value meets several others.
_SHAPES = [
    (d, h, t, tq)
    for i, (d, t) in enumerate(itertools.product((16, 24, 64), (1, 7, 70, 130)))
    for h, tq in [((1, 3)[i % 2], (1, 4, 16)[i % 3]), ((3, 1)[i % 2], (16, 1, 4)[i % 3])]
]


@pytest.mark.parametrize(("d", "h", "t", "tq"), _SHAPES)
def test_matches_reference_fp32(d, h, t, tq):
    q, k_cache, v_cache, slot_ids, lengths, _ = _make_inputs(4, 5, h, t, tq, d, torch.float32, seed=d * t + tq)
    out = indexed_attention(q, k_cache, v_cache, slot_ids, lengths, use_triton=True)
    _assert_close(out, _reference64(q, k_cache, v_cache, slot_ids, lengths, {}), torch.float32)
    assert out[1].abs().max() == 0  # lengths[1] == 0 -> zeros


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("d", "h", "t", "tq"), [(24, 3, 70, 4), (64, 1, 130, 16), (16, 3, 7, 1)])
def test_dtypes(dtype, d, h, t, tq):
    q, k_cache, v_cache, slot_ids, lengths, _ = _make_inputs(3, 4, h, t, tq, d, dtype, seed=t)
    out = indexed_attention(q, k_cache, v_cache, slot_ids, lengths, use_triton=True)
    _assert_close(out, _reference64(q, k_cache, v_cache, slot_ids, lengths, {}), dtype)


@pytest.mark.parametrize("length", [1, 63, 64, 65, 127, 128, 129])
def test_block_boundaries(length):
    # BLOCK_N is 64 for D <= 64: lengths on both sides of one and two blocks.
    q, k_cache, v_cache, slot_ids, lengths, _ = _make_inputs(
        2, 3, 1, 130, 4, 16, torch.float32, seed=length, lengths=[length, 130 - length]
    )
    out = indexed_attention(q, k_cache, v_cache, slot_ids, lengths, use_triton=True)
    _assert_close(out, _reference64(q, k_cache, v_cache, slot_ids, lengths, {}), torch.float32)


def test_never_reads_past_length_and_noncontiguous():
    n, s, h, t, tq, d = 3, 6, 3, 70, 16, 24
    g = torch.Generator().manual_seed(1)
    # NeMo layout: q is linear_q(x).view(N, Tq, H, D).transpose(1, 2); caches stored [S, T, H, D].
    q = torch.randn(n, tq, h, d, generator=g).to(DEVICE).transpose(1, 2)
    k_store = torch.full((s, t, h, d), float("nan"), device=DEVICE)
    v_store = torch.full((s, t, h, d), float("nan"), device=DEVICE)
    slot_ids = torch.tensor([4, 1, 4], device=DEVICE)
    lengths = torch.tensor([33, 70, 5], device=DEVICE)
    for slot, length in ((4, 33), (1, 70)):
        k_store[slot, :length] = torch.randn(length, h, d, generator=g).to(DEVICE)
        v_store[slot, :length] = torch.randn(length, h, d, generator=g).to(DEVICE)
    k_cache, v_cache = k_store.transpose(1, 2), v_store.transpose(1, 2)
    assert not q.is_contiguous() and not k_cache.is_contiguous()
    out = indexed_attention(q, k_cache, v_cache, slot_ids, lengths, use_triton=True)
    assert torch.isfinite(out).all()
    clean_k, clean_v = k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0)
    _assert_close(out, _reference64(q.contiguous(), clean_k, clean_v, slot_ids, lengths, {}), torch.float32)


def test_scale_and_bias_u_without_rel_pos():
    q, k_cache, v_cache, slot_ids, lengths, extra = _make_inputs(3, 4, 3, 70, 4, 24, torch.float32, rel_pos=True)
    extra = {"pos_bias_u": extra["pos_bias_u"]}
    out = indexed_attention(q, k_cache, v_cache, slot_ids, lengths, 0.3, use_triton=True, **extra)
    _assert_close(out, _reference64(q, k_cache, v_cache, slot_ids, lengths, extra, 0.3), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("d", "h", "t", "tq"), [(24, 3, 70, 16), (64, 1, 7, 4), (16, 3, 130, 1), (24, 1, 70, 33), (16, 1, 140, 70)]
)
def test_rel_pos_matches_reference(dtype, d, h, t, tq):
    lengths = [t, 0, max(tq - 1, 0), t // 2] if t >= 4 else [t, 0, 1, t]  # includes lengths < Tq
    q, k_cache, v_cache, slot_ids, lengths, extra = _make_inputs(
        4, 5, h, t, tq, d, dtype, seed=d + t, lengths=lengths, rel_pos=True
    )
    out = indexed_attention(q, k_cache, v_cache, slot_ids, lengths, use_triton=True, **extra)
    _assert_close(out, _reference64(q, k_cache, v_cache, slot_ids, lengths, extra), dtype)


def test_rel_shift_reference_matches_explicit_distances():
    # The reference's gather against a direct definition: score term = (q + v) . p[c - (qpos - kpos)].
    q, k_cache, v_cache, slot_ids, lengths, extra = _make_inputs(
        2, 3, 1, 7, 4, 16, torch.float64, lengths=[7, 5], rel_pos=True
    )
    ref = indexed_attention_reference(q, k_cache, v_cache, slot_ids, lengths, **extra)
    c = (extra["pos_emb"].shape[1] - 1) // 2
    for i in range(2):
        length, slot = int(lengths[i]), int(slot_ids[i])
        k, v = k_cache[slot, 0, :length], v_cache[slot, 0, :length]
        scores = torch.empty(4, length, dtype=torch.float64, device=q.device)
        for tt, j in itertools.product(range(4), range(length)):
            qpos = length - 4 + tt
            ac = (q[i, 0, tt] + extra["pos_bias_u"][0]) @ k[j]
            bd = (q[i, 0, tt] + extra["pos_bias_v"][0]) @ extra["pos_emb"][0, c - (qpos - j)]
            scores[tt, j] = (ac + bd) / math.sqrt(16)
        torch.testing.assert_close(ref[i, 0], torch.softmax(scores, -1) @ v)


@pytest.mark.parametrize("use_pytorch_sdpa", [False, True])
def test_rel_pos_matches_nemo_rel_position_mha(use_pytorch_sdpa):
    mha_mod = pytest.importorskip("nemo.collections.asr.parts.submodules.multi_head_attention")
    torch.manual_seed(0)
    h, d, tq, left = 3, 24, 4, 10
    d_model = h * d
    b, s, t = 4, 6, left + tq + 3  # cache slots have slack beyond left context + chunk
    mha = mha_mod.RelPositionMultiHeadAttention(
        n_head=h, n_feat=d_model, dropout_rate=0.0, pos_bias_u=None, pos_bias_v=None, use_pytorch_sdpa=use_pytorch_sdpa
    ).eval()
    with torch.no_grad():
        mha.pos_bias_u.normal_(0.0, 0.5)
        mha.pos_bias_v.normal_(0.0, 0.5)
    mha.cache_drop_size = 0
    pos_enc = mha_mod.RelPositionalEncoding(d_model=d_model, dropout_rate=0.0, max_len=64)
    pos_enc.extend_pe(64, device=torch.device("cpu"), dtype=torch.float32)

    chunk = torch.randn(b, tq, d_model)
    cache = torch.randn(b, left, d_model)  # right-aligned left context, the first (left - valid) frames invalid
    valid = torch.tensor([left, 0, 3, 7])
    key_idx = torch.arange(left + tq)
    mask = (key_idx[None, None, :] < (left - valid)[:, None, None]).expand(b, tq, left + tq)  # True = masked
    _, pos_emb = pos_enc(chunk, cache_len=left)
    with torch.no_grad():
        expected, _ = mha(query=chunk, key=chunk, value=chunk, mask=mask, pos_emb=pos_emb, cache=cache)

        # Same step through slot caches: each stream's frames left-aligned in its slot, garbage after.
        k_cache = torch.full((s, h, t, d), float("nan"))
        v_cache = torch.full((s, h, t, d), float("nan"))
        slot_ids = torch.tensor([5, 0, 3, 1])
        lengths = valid + tq
        for i in range(b):
            frames = torch.cat([cache[i, left - int(valid[i]) :], chunk[i]])  # [lengths[i], d_model]
            k_cache[slot_ids[i], :, : lengths[i]] = mha.linear_k(frames).view(-1, h, d).transpose(0, 1)
            v_cache[slot_ids[i], :, : lengths[i]] = mha.linear_v(frames).view(-1, h, d).transpose(0, 1)
        q = mha.linear_q(chunk).view(b, tq, h, d).transpose(1, 2)
        for pe in (pos_enc(chunk, cache_len=t - tq)[1], pos_enc.pe):  # 2T-1 rows, or the whole buffer
            table = build_rel_pos_table(pe, mha.linear_pos, h)
            out = indexed_attention(
                q.to(DEVICE),
                k_cache.to(DEVICE),
                v_cache.to(DEVICE),
                slot_ids.to(DEVICE),
                lengths.to(DEVICE),
                pos_bias_u=mha.pos_bias_u.to(DEVICE),
                pos_bias_v=mha.pos_bias_v.to(DEVICE),
                pos_emb=table.to(DEVICE),
                use_triton=True,
            ).cpu()
            got = mha.linear_out(out.transpose(1, 2).reshape(b, tq, d_model))
            rel_err = (got - expected).norm() / expected.norm()
            assert rel_err < 1e-4, f"relative error {rel_err:.3g} against NeMo RelPositionMultiHeadAttention"
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_cpu_fallback_matches_kernel():
    q, k_cache, v_cache, slot_ids, lengths, extra = _make_inputs(3, 4, 3, 70, 4, 24, torch.float32, rel_pos=True)
    for kwargs in ({}, extra):
        fast = indexed_attention(q, k_cache, v_cache, slot_ids, lengths, use_triton=True, **kwargs)
        fallback = indexed_attention(q, k_cache, v_cache, slot_ids, lengths, use_triton=False, **kwargs)
        torch.testing.assert_close(fast, fallback, atol=2e-5, rtol=2e-5)
    if not q.is_cuda:  # use_triton=None picks the reference on CPU
        auto = indexed_attention(q, k_cache, v_cache, slot_ids, lengths, **extra)
        torch.testing.assert_close(auto, fallback)


@pytest.mark.parametrize("use_triton", [True, False])
def test_out_written_in_any_layout(use_triton):
    """``out=``: a [N, Tq, H, D] buffer viewed [N, H, Tq, D] (the encoder's layout for its output projection)."""
    q, k_cache, v_cache, slot_ids, lengths, extra = _make_inputs(3, 4, 3, 70, 4, 24, torch.float32, rel_pos=True)
    expected = indexed_attention(q, k_cache, v_cache, slot_ids, lengths, use_triton=use_triton, **extra)
    n, h, tq, d = q.shape
    buffer = torch.full((n, tq, h, d), float("nan"), device=q.device)
    result = indexed_attention(
        q, k_cache, v_cache, slot_ids, lengths, use_triton=use_triton, out=buffer.transpose(1, 2), **extra
    )
    assert result.data_ptr() == buffer.data_ptr()
    assert torch.equal(buffer.transpose(1, 2), expected)
    with pytest.raises(ValueError, match=r"out must be a torch.float32 tensor of q's shape \(3, 3, 4, 24\)"):
        indexed_attention(q, k_cache, v_cache, slot_ids, lengths, out=buffer, **extra)


def test_empty_batch_and_unchecked_values_are_memory_safe():
    q, k_cache, v_cache, slot_ids, lengths, _ = _make_inputs(3, 4, 1, 7, 4, 16, torch.float32)
    empty = indexed_attention(q[:0], k_cache, v_cache, slot_ids[:0], lengths[:0], use_triton=True)
    assert empty.shape == (0, 1, 4, 16)
    bad_slots = torch.tensor([-1, 9, 2], device=DEVICE)
    long = torch.tensor([3, 3, 99], device=DEVICE)
    out = indexed_attention(q, k_cache, v_cache, bad_slots, long, use_triton=True, check_values=False)
    assert out[:2].abs().max() == 0  # invalid slot -> zeros
    clamped = torch.tensor([3, 3, 7], device=DEVICE)
    _assert_close(out[2:], _reference64(q, k_cache, v_cache, bad_slots.clamp(0, 3), clamped, {})[2:], torch.float32)


def _bad_input_cases():
    q, k_cache, v_cache, slot_ids, lengths, extra = _make_inputs(3, 4, 3, 7, 4, 16, torch.float32, rel_pos=True)
    dev = {"device": DEVICE}
    base = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "slot_ids": slot_ids, "lengths": lengths}
    return [
        ({"slot_ids": torch.tensor([0, 1, 4], **dev)}, ValueError, r"slot_ids\[2\] = 4 is out of range.*\[0, 4\)"),
        ({"slot_ids": torch.tensor([0, -2, 9], **dev)}, ValueError, r"slot_ids\[1\] = -2 is out of range"),
        ({"lengths": torch.tensor([0, 8, 1], **dev)}, ValueError, r"lengths\[1\] = 8 is out of range.*\[0, 7\]"),
        ({"lengths": torch.tensor([-1, 0, 1], **dev)}, ValueError, r"lengths\[0\] = -1 is out of range"),
        ({"lengths": lengths[:2]}, ValueError, r"lengths must have shape \[N\] = \(3,\)"),
        ({"slot_ids": slot_ids.float()}, TypeError, r"slot_ids dtype torch.float32 is not supported.*int32"),
        ({"k_cache": k_cache.half()}, TypeError, r"k_cache dtype torch.float16 must equal q dtype torch.float32"),
        ({"q": q.double(), "k_cache": k_cache.double(), "v_cache": v_cache.double()}, TypeError, r"float64.*valid"),
        ({"v_cache": v_cache[:, :, :5]}, ValueError, r"v_cache shape .* must equal k_cache shape"),
        ({"q": q[:, :2]}, ValueError, r"does not match q"),
        ({"q": q[0]}, ValueError, r"q must be \[N, H, Tq, D\]"),
        ({"k_cache": k_cache.to("meta")}, ValueError, r"k_cache is on meta"),
        ({"pos_emb": extra["pos_emb"][:, :12]}, ValueError, r"P = 12 rows; valid: an odd P >= 2 \* T - 1 = 13"),
        ({"pos_emb": extra["pos_emb"].half()}, TypeError, r"pos_emb dtype torch.float16 must equal q dtype"),
        ({"pos_bias_v": extra["pos_bias_v"]}, ValueError, r"pos_bias_v is only used with the relative term"),
        ({"pos_bias_u": extra["pos_bias_u"][:1]}, ValueError, r"pos_bias_u must be \[H, D\] = \(3, 16\)"),
    ], base


@pytest.mark.parametrize("case", range(16))
def test_bad_inputs_raise_with_clear_message(case):
    cases, base = _bad_input_cases()
    override, error, match = cases[case]
    kwargs = {**base, **override}
    args = [kwargs.pop(name) for name in ("q", "k_cache", "v_cache", "slot_ids", "lengths")]
    with pytest.raises(error, match=match):
        indexed_attention(*args, use_triton=True, **kwargs)


def test_bad_input_case_count():
    assert len(_bad_input_cases()[0]) == 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("d", "h", "t", "tq", "rel_pos"), [(24, 3, 72, 2, True), (16, 1, 130, 4, False), (64, 2, 7, 1, True)]
)
def test_ring_buffer_starts_equal_the_rolled_plain_layout(dtype, d, h, t, tq, rel_pos):
    """key_starts: logical key j at (start + j) mod T, the same result as the plain cache rolled by -start."""
    q, k_cache, v_cache, slot_ids, lengths, extra = _make_inputs(4, 5, h, t, tq, d, dtype, seed=t + d, rel_pos=rel_pos)
    g = torch.Generator().manual_seed(t)
    starts = torch.randint(0, t, (4,), generator=g).to(DEVICE)
    starts[0] = t - 1  # the window wraps around the end of the slot
    # the plain layout of each stream's slot, written into a ring at its start (repeated slots share a start)
    starts[-1] = starts[0] if slot_ids[-1] == slot_ids[0] else starts[-1]
    ring_k, ring_v = k_cache.clone(), v_cache.clone()
    for i in range(4):
        slot, shift = int(slot_ids[i]), int(starts[i])
        ring_k[slot] = torch.roll(k_cache[slot], shifts=shift, dims=1)
        ring_v[slot] = torch.roll(v_cache[slot], shifts=shift, dims=1)
    expected = _reference64(q, k_cache, v_cache, slot_ids, lengths, extra)
    for use_triton in (True, False):
        out = indexed_attention(q, ring_k, ring_v, slot_ids, lengths, use_triton=use_triton, key_starts=starts, **extra)
        _assert_close(out, expected, dtype)


def test_ring_buffer_starts_are_checked():
    q, k_cache, v_cache, slot_ids, lengths, _ = _make_inputs(3, 4, 1, 9, 2, 16, torch.float32)
    with pytest.raises(ValueError, match=r"key_starts\[1\] = 9 is out of range; valid: \[0, 9\)"):
        indexed_attention(q, k_cache, v_cache, slot_ids, lengths, key_starts=torch.tensor([0, 9, 1], device=DEVICE))
    with pytest.raises(TypeError, match="key_starts dtype torch.float32"):
        indexed_attention(q, k_cache, v_cache, slot_ids, lengths, key_starts=torch.zeros(3, device=DEVICE))
