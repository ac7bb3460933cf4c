"""Fused transducer beam step: temperature, log-softmax over the vocabulary, top-k over non-blank tokens, blank appended.

One Triton program handles one row of ``logits [N, V]``: the row is read from memory once, and the max, the sum of
exponentials and the top-k selection happen in registers. Rows wider than ``MAX_SINGLE_BLOCK_V`` use a blocked
variant that walks the row in ``BLOCKED_BLOCK_V``-wide blocks with an online softmax (running max and rescaled
sum-exp) and a running top-k candidate set merged with every block, then finalises.

Semantics (kernel, launcher and :func:`log_softmax_topk_reference` agree exactly on ids, and on values up to
floating-point rounding):

- ``x = logits.float() * inv_t`` with ``inv_t = float32(1) / float32(temperature)``. This is what
  ``logits.float() / temperature`` computes on CUDA in PyTorch (division by a CPU scalar is a multiplication by
  its float32 reciprocal there), it is bit-identical on every backend, and for power-of-two temperatures it equals
  exact division. ``temperature == 1.0`` skips the scaling.
- ``logp = log_softmax(x)`` with the normaliser over ALL ``V`` entries, blank included.
- Columns ``0..k-1``: the ``k`` non-blank tokens with the largest ``x`` (so the largest ``logp``), in descending
  order, ties broken by the lower token id. Column ``k``: ``logp[blank_id]`` and ``blank_id``.
- ``k > V - 1`` (fewer non-blank tokens than ``k``): the columns past the ``V - 1`` real candidates hold value
  ``-inf`` and id ``-1``.

Non-finite inputs (after scaling; a float32 overflow of ``x * inv_t`` counts as ``+/-inf``):

- A ``-inf`` entry has ``logp = -inf``; it is chosen only after every finite entry (it can fill the top-k when the
  row has fewer than ``k`` finite non-blank entries), and among ``-inf`` entries the lower id goes first.
- A row containing NaN (anywhere, blank included), a row containing ``+inf``, and a row whose entries are all
  ``-inf`` has no finite normaliser: ALL its ``k + 1`` values are NaN (what ``torch.log_softmax`` returns for such
  rows). Its ids stay valid: selection ranks ``+inf`` first, then finite values, and NaN exactly like ``-inf``
  (ties, NaN-vs-``-inf`` included, go to the lower id).
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton
import triton.language as tl

__all__ = [
    "BLANK_PROB_EPS",
    "BLOCKED_BLOCK_V",
    "MAX_K",
    "MAX_SINGLE_BLOCK_V",
    "SUPPORTED_DTYPES",
    "launch_log_softmax_topk",
    "log_softmax_topk",
    "log_softmax_topk_fused",
    "log_softmax_topk_reference",
]

MAX_K = 16
# Widest row held in registers by one program (8192 fp32 = 16 values per thread at 16 warps).
MAX_SINGLE_BLOCK_V = 8192
# Block width of the blocked variant for wider rows.
BLOCKED_BLOCK_V = 4096
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_DTYPE_NAMES = "float32, bfloat16, float16"
# "No candidate" index in the kernels' min-reductions: above every valid column index, hence the V limit.
_MAX_V = 2**31 - 1
_NO_INDEX = tl.constexpr(_MAX_V)
# NeMo's clamp of p(blank) in the fused non-blank score log(1 - p(blank)) (topk_fusion_model's eps)
BLANK_PROB_EPS = 1e-2
_BLANK_PROB_EPS = tl.constexpr(BLANK_PROB_EPS)


def _single_block_kernel(
    logits_ptr,
    values_ptr,
    ids_ptr,
    V,
    blank_id,
    inv_temperature,
    stride_logits_row,
    stride_values_row,
    stride_ids_row,
    fusion_ptr,
    stride_fusion_row,
    alpha_sum,
    blank_scale,
    K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    OUT_BLOCK: tl.constexpr,
    APPLY_TEMPERATURE: tl.constexpr,
    FUSE: tl.constexpr,
    WEIGHTED_BLANK: tl.constexpr,
):
    """One row per program, the whole row in one block (V <= BLOCK_V).

    logits [N, V] (row stride ``stride_logits_row``, unit column stride) -> values [N, K+1] fp32, ids [N, K+1] int64.
    ``FUSE``: the non-blank log-probabilities get the fusion scores ``fusion [N, V-1]`` (blank last) and, with
    ``WEIGHTED_BLANK``, ``log(1 - p(blank)) * alpha_sum``; blank's is multiplied by ``blank_scale``; the top-k ranks
    these fused values (:func:`log_softmax_topk_fused`).
    """
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_V)
    in_row = offs < V
    x = tl.load(logits_ptr + row * stride_logits_row + offs, mask=in_row, other=float("-inf")).to(tl.float32)
    if APPLY_TEMPERATURE:
        x = x * inv_temperature
    # NaN ranks like -inf in the selection and poisons the normaliser (explicit: tl.max's NaN handling differs
    # between backends).
    is_nan = x != x
    nan_count = tl.sum(is_nan.to(tl.int32), axis=0)
    x = tl.where(is_nan, float("-inf"), x)

    row_max = tl.max(x, axis=0)
    max_is_finite = (row_max > float("-inf")) & (row_max < float("inf"))
    # A finite shift keeps exp() away from inf - inf; rows without a finite max get NaN below anyway.
    shift = tl.where(max_is_finite, row_max, 0.0)
    sum_exp = tl.sum(tl.exp(x - shift), axis=0)
    finite_lse = max_is_finite & (nan_count == 0)
    lse = tl.where(finite_lse, shift + tl.log(tl.where(finite_lse, sum_exp, 1.0)), float("nan"))
    blank_x = tl.sum(tl.where(offs == blank_id, x, 0.0), axis=0)
    blank_value = blank_x - lse
    if FUSE:
        # NeMo's late-pruning fusion (topk_fusion_model): logp + (log(1 - p(blank)) * alpha_sum + scores), in its order
        scores = tl.load(fusion_ptr + row * stride_fusion_row + offs, mask=offs < blank_id, other=0.0).to(tl.float32)
        if WEIGHTED_BLANK:
            p_blank = tl.minimum(tl.exp(blank_value), 1.0 - _BLANK_PROB_EPS)
            scores = tl.log(1.0 - p_blank) * alpha_sum + scores
            blank_value = blank_value * blank_scale
        keys = (x - lse) + scores
        keys = tl.where(keys != keys, float("-inf"), keys)  # a NaN row (no finite normaliser) ranks like -inf
        shift = 0.0
    else:
        keys = x  # ranked before the normaliser is subtracted: same order as the log-probabilities
        shift = lse

    cols = tl.arange(0, OUT_BLOCK)
    out_values = tl.full([OUT_BLOCK], float("-inf"), tl.float32)
    out_ids = tl.full([OUT_BLOCK], -1, tl.int64)
    # `live` (not a -inf sentinel) excludes blank, padding and taken entries, so genuine -inf entries stay eligible.
    live = in_row & (offs != blank_id)
    for j in tl.static_range(K):
        best = tl.max(tl.where(live, keys, float("-inf")), axis=0)
        idx = tl.min(tl.where(live & (keys == best), offs, _NO_INDEX), axis=0)
        found = idx < _NO_INDEX
        out_values = tl.where(cols == j, tl.where(found, best - shift, float("-inf")), out_values)
        out_ids = tl.where(cols == j, tl.where(found, idx, -1).to(tl.int64), out_ids)
        live = live & (offs != idx)
    if FUSE:
        out_values = out_values + (lse - lse)  # NaN where the row has no finite normaliser, else + 0
    out_values = tl.where(cols == K, blank_value, out_values)
    out_ids = tl.where(cols == K, blank_id, out_ids)
    out_mask = cols < K + 1
    tl.store(values_ptr + row * stride_values_row + cols, out_values, mask=out_mask)
    tl.store(ids_ptr + row * stride_ids_row + cols, out_ids, mask=out_mask)


def _blocked_kernel(
    logits_ptr,
    values_ptr,
    ids_ptr,
    V,
    blank_id,
    inv_temperature,
    stride_logits_row,
    stride_values_row,
    stride_ids_row,
    K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    OUT_BLOCK: tl.constexpr,
    APPLY_TEMPERATURE: tl.constexpr,
):
    """One row per program, walked in BLOCK_V-wide blocks: online softmax + running top-k, then finalise.

    logits [N, V] (row stride ``stride_logits_row``, unit column stride) -> values [N, K+1] fp32, ids [N, K+1] int64.
    """
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_logits_row
    slots = tl.arange(0, OUT_BLOCK)  # OUT_BLOCK >= K + 1
    # Running candidates (scaled logits and token ids), sorted descending; id -1 marks an empty slot.
    top_x = tl.full([OUT_BLOCK], float("-inf"), tl.float32)
    top_id = tl.full([OUT_BLOCK], -1, tl.int32)
    run_max = float("-inf")
    run_sum = 0.0  # sum of exp(x - run_max) while run_max is finite; 0 while it is -inf
    nan_count = 0
    blank_x = 0.0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        in_row = offs < V
        x = tl.load(row_ptr + offs, mask=in_row, other=float("-inf")).to(tl.float32)
        if APPLY_TEMPERATURE:
            x = x * inv_temperature
        is_nan = x != x
        nan_count += tl.sum(is_nan.to(tl.int32), axis=0)
        x = tl.where(is_nan, float("-inf"), x)
        blank_x += tl.sum(tl.where(offs == blank_id, x, 0.0), axis=0)

        # Online softmax: rescale the running sum to the new max. A non-finite max is replaced by 0 so that
        # exp() never sees inf - inf; such rows end up NaN in the finalisation.
        new_max = tl.maximum(run_max, tl.max(x, axis=0))
        shift = tl.where((new_max > float("-inf")) & (new_max < float("inf")), new_max, 0.0)
        run_sum = run_sum * tl.exp(run_max - shift) + tl.sum(tl.exp(x - shift), axis=0)
        run_max = new_max

        # Merge: K rounds of "take the max over block + running set, lowest id on ties". Ids are global, so the
        # tie-break is the same as over the whole row.
        live = in_row & (offs != blank_id)
        top_live = top_id >= 0
        new_x = tl.full([OUT_BLOCK], float("-inf"), tl.float32)
        new_id = tl.full([OUT_BLOCK], -1, tl.int32)
        for j in tl.static_range(K):
            best = tl.maximum(
                tl.max(tl.where(live, x, float("-inf")), axis=0),
                tl.max(tl.where(top_live, top_x, float("-inf")), axis=0),
            )
            idx = tl.minimum(
                tl.min(tl.where(live & (x == best), offs, _NO_INDEX), axis=0),
                tl.min(tl.where(top_live & (top_x == best), top_id, _NO_INDEX), axis=0),
            )
            found = idx < _NO_INDEX
            new_x = tl.where(slots == j, best, new_x)
            new_id = tl.where(slots == j, tl.where(found, idx, -1), new_id)
            live = live & (offs != idx)
            top_live = top_live & (top_id != idx)
        top_x = new_x
        top_id = new_id

    max_is_finite = (run_max > float("-inf")) & (run_max < float("inf"))
    finite_lse = max_is_finite & (nan_count == 0)
    lse = tl.where(finite_lse, run_max + tl.log(tl.where(finite_lse, run_sum, 1.0)), float("nan"))
    # Slot j is output column j; slot K is never filled by the merge and takes the blank.
    # An empty slot (k > V - 1) stores -inf / -1.
    values_row = values_ptr + row * stride_values_row
    ids_row = ids_ptr + row * stride_ids_row
    out_values = tl.where(top_id >= 0, top_x - lse, float("-inf"))
    out_values = tl.where(slots == K, blank_x - lse, out_values)
    out_ids = tl.where(slots == K, blank_id, top_id).to(tl.int64)
    tl.store(values_row + slots, out_values, mask=slots < K + 1)
    tl.store(ids_row + slots, out_ids, mask=slots < K + 1)


@functools.cache
def _jitted(interpret: bool) -> tuple[triton.runtime.JITFunction, triton.runtime.JITFunction]:
    """The two kernels, jitted lazily: triton.jit picks the interpreter from TRITON_INTERPRET at decoration time,
    so decorating at import would freeze whatever the environment was when this module was first imported."""
    del interpret  # cache key only
    return triton.jit(_single_block_kernel), triton.jit(_blocked_kernel)


def _interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=64)  # called on every launch; keeps tensor creation off the hot path
def _inv_temperature(temperature: float) -> float:
    """float32(1) / float32(temperature), as a Python float (exactly representable in float32)."""
    return (torch.ones((), dtype=torch.float32) / torch.tensor(float(temperature), dtype=torch.float32)).item()


def _num_warps(block_v: int) -> int:
    # About 8-16 values per thread; more warps only add cross-warp traffic to the 2k reductions.
    return max(4, min(16, block_v // 512))


def _check_inputs(logits: torch.Tensor, k: int, blank_id: int, temperature: float) -> None:
    """Raise ValueError (TypeError for a non-tensor) naming the bad value and the valid choices."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor [N, V], got {type(logits).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [N, V], got shape {tuple(logits.shape)}")
    if logits.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"logits dtype must be one of {_DTYPE_NAMES}, got {logits.dtype}")
    n, v = logits.shape
    if v < 1:
        raise ValueError(f"logits must have V >= 1 columns, got shape {tuple(logits.shape)}")
    if v >= _MAX_V:
        raise ValueError(f"V must be < 2**31 - 1, got {v}")
    if v > 1 and n > 0 and logits.stride(1) != 1:
        raise ValueError(
            f"logits must have unit stride along V (stride(1) == 1; any row stride is fine), got strides "
            f"{tuple(logits.stride())}; call .contiguous() first"
        )
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ValueError(f"k must be in 1..{MAX_K}, got {k!r}")
    if isinstance(blank_id, bool) or not isinstance(blank_id, int) or not 0 <= blank_id < v:
        raise ValueError(f"blank_id must be in [0, V) = [0, {v}), got {blank_id!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"temperature must be a finite float > 0, got {temperature!r}")
    t = float(temperature)
    # The kernel scales by the float32 reciprocal, which must be finite and non-zero too.
    if not (0 < t < float("inf") and 0 < _inv_temperature(t) < float("inf")):
        raise ValueError(f"temperature must be a finite float > 0 (float32 reciprocal finite), got {temperature!r}")


def _empty_outputs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = logits.shape[0]
    values = torch.empty((n, k + 1), dtype=torch.float32, device=logits.device)
    ids = torch.empty((n, k + 1), dtype=torch.int64, device=logits.device)
    return values, ids


def launch_log_softmax_topk(
    logits: torch.Tensor,
    k: int,
    blank_id: int,
    temperature: float,
    *,
    max_single_block_v: int = MAX_SINGLE_BLOCK_V,
    blocked_block_v: int = BLOCKED_BLOCK_V,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel of :func:`log_softmax_topk` on inputs that it has checked. The block-size and warp knobs
    exist for tests (to run the blocked variant on small rows) and benchmarks; block sizes must be powers of two."""
    n, v = logits.shape
    values, ids = _empty_outputs(logits, k)
    if n == 0:
        return values, ids
    single_block, blocked = _jitted(_interpreter_enabled())
    apply_temperature = float(temperature) != 1.0
    inv_t = _inv_temperature(float(temperature)) if apply_temperature else 1.0
    out_block = triton.next_power_of_2(k + 1)
    common = (logits, values, ids, v, blank_id, inv_t, logits.stride(0), values.stride(0), ids.stride(0))
    device_ctx = torch.cuda.device(logits.device) if logits.is_cuda else contextlib.nullcontext()
    with device_ctx:
        if v <= max_single_block_v:
            block_v = triton.next_power_of_2(v)
            single_block[(n,)](
                *common,
                logits,  # no fusion scores: FUSE=False never reads them
                0,
                0.0,
                1.0,
                K=k,
                BLOCK_V=block_v,
                OUT_BLOCK=out_block,
                APPLY_TEMPERATURE=apply_temperature,
                FUSE=False,
                WEIGHTED_BLANK=False,
                num_warps=num_warps or _num_warps(block_v),
            )
        else:
            blocked[(n,)](
                *common,
                K=k,
                BLOCK_V=blocked_block_v,
                OUT_BLOCK=out_block,
                APPLY_TEMPERATURE=apply_temperature,
                num_warps=num_warps or _num_warps(blocked_block_v),
            )
    return values, ids


def log_softmax_topk(
    logits: torch.Tensor,
    k: int,
    blank_id: int,
    temperature: float = 1.0,
    *,
    use_triton: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k non-blank log-probabilities plus the blank's, in one pass over each row.

    Args:
        logits: ``[N, V]`` float32 / bfloat16 / float16, any device; contiguous or row-strided
            (``stride(1) == 1``, ``stride(0) >= V``, e.g. the token part ``logits[:, :V]`` of TDT logits
            ``[N, V + num_durations]``).
        k: number of non-blank candidates, ``1..16``.
        blank_id: blank token index, ``[0, V)``.
        temperature: finite float ``> 0``; the logits are scaled by its float32 reciprocal (module docstring).
        use_triton: ``None`` (default) runs the Triton kernel for CUDA tensors and the torch reference otherwise;
            ``True`` forces the kernel (CUDA tensors, or any device with ``TRITON_INTERPRET=1``); ``False`` forces
            the reference.

    Returns:
        ``values [N, k+1] float32`` and ``ids [N, k+1] int64`` on ``logits.device``: columns ``0..k-1`` are the
        ``k`` best non-blank tokens in descending order (ties: lower id first), column ``k`` is the blank.
        Columns past ``V - 1`` candidates hold ``-inf`` / ``-1``. Rows with NaN, ``+inf`` or only ``-inf`` have
        all values NaN (ids still valid); see the module docstring for the full rule.

    Raises:
        ValueError: a bad shape, dtype, stride, ``k``, ``blank_id`` or ``temperature`` (the message names the bad
            value and the valid choices), or ``use_triton=True`` without CUDA or the Triton interpreter.
    """
    _check_inputs(logits, k, blank_id, temperature)
    if use_triton is None:
        use_triton = logits.is_cuda
    if not use_triton:
        return log_softmax_topk_reference(logits, k, blank_id, temperature)
    if not (logits.is_cuda or _interpreter_enabled()):
        raise ValueError(
            f"use_triton=True needs CUDA logits or TRITON_INTERPRET=1, got logits on {logits.device} "
            f"with TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', 'unset')}"
        )
    return launch_log_softmax_topk(logits, k, blank_id, temperature)


def log_softmax_topk_fused(
    logits: torch.Tensor, k: int, fusion_scores: torch.Tensor, alpha_sum: float, weighted_blank: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The beam step of a search with fusion models, NeMo's late pruning (``topk_fusion_model``), in one kernel.

    Each row's non-blank log-probabilities get ``fusion_scores`` and, with ``weighted_blank`` (NeMo's
    ``lm_weighted_full``), ``log(1 - min(p(blank), 1 - 1e-2)) * alpha_sum``; blank's log-probability is then
    multiplied by ``1 + alpha_sum``. Values agree with the torch ops of
    :meth:`~nemo_fastdecode.beam.fusion.BeamFusion.top_k` to float32 rounding (the normaliser is summed in another
    order, and ``log(1 - p)`` stands for ``log1p(-p)``).

    Args:
        logits: ``[N, V]`` float32 token logits (row-strided as in :func:`log_softmax_topk`), blank last
            (``V - 1``), ``V <= MAX_SINGLE_BLOCK_V``; CUDA, or any device with ``TRITON_INTERPRET=1``.
        k: non-blank candidates, ``1..16``.
        fusion_scores: ``[N, V - 1]`` the fusion models' weighted scores of every non-blank label, summed.
        alpha_sum: the models' weights summed (blank scoring).
        weighted_blank: ``lm_weighted_full`` (``True``) or ``no_score``.

    Returns:
        ``values [N, k+1] float32`` and ``ids [N, k+1] int64``: the ``k`` best fused non-blank labels (ties: lower
        id first), then blank.
    """
    _check_inputs(logits, k, logits.shape[-1] - 1, 1.0)
    n, v = logits.shape
    if logits.dtype != torch.float32 or fusion_scores.dtype != torch.float32:
        raise ValueError(
            f"the fused beam step needs float32 logits and scores, got {logits.dtype}, {fusion_scores.dtype}"
        )
    if v > MAX_SINGLE_BLOCK_V:
        raise ValueError(f"the fused beam step handles V <= {MAX_SINGLE_BLOCK_V} columns, got {v}")
    if fusion_scores.shape != (n, v - 1) or (v > 2 and fusion_scores.stride(1) != 1):
        raise ValueError(
            f"fusion_scores must be [N, V-1] = [{n}, {v - 1}] with unit column stride, got shape "
            f"{tuple(fusion_scores.shape)}, strides {tuple(fusion_scores.stride())}"
        )
    if not (logits.is_cuda or _interpreter_enabled()):
        raise ValueError(f"the fused beam step needs CUDA logits or TRITON_INTERPRET=1, got {logits.device}")
    values, ids = _empty_outputs(logits, k)
    if n == 0:
        return values, ids
    single_block, _ = _jitted(_interpreter_enabled())
    block_v = triton.next_power_of_2(v)
    device_ctx = torch.cuda.device(logits.device) if logits.is_cuda else contextlib.nullcontext()
    with device_ctx:
        single_block[(n,)](
            logits, values, ids, v, v - 1, 1.0, logits.stride(0), values.stride(0), ids.stride(0),
            fusion_scores, fusion_scores.stride(0), float(alpha_sum), 1.0 + float(alpha_sum),
            K=k, BLOCK_V=block_v, OUT_BLOCK=triton.next_power_of_2(k + 1), APPLY_TEMPERATURE=False,
            FUSE=True, WEIGHTED_BLANK=bool(weighted_blank), num_warps=_num_warps(block_v),
        )  # fmt: skip
    return values, ids


def log_softmax_topk_reference(
    logits: torch.Tensor, k: int, blank_id: int, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched torch implementation with the kernel's semantics (module docstring); also the CPU fallback.

    Its values are ``torch.log_softmax(x)`` entries, bit for bit (the kernel's agree up to float rounding).

    logits [N, V] -> values [N, k+1] float32, ids [N, k+1] int64. O(N V) plus tiny sorts of k elements per row.
    """
    _check_inputs(logits, k, blank_id, temperature)
    n, v = logits.shape
    device = logits.device
    if n == 0:
        return _empty_outputs(logits, k)
    x = logits.float()
    if float(temperature) != 1.0:
        x = x * _inv_temperature(float(temperature))
    # Values come from torch.log_softmax itself, so that on every device they are bit-identical to what NeMo's
    # beam search computes (``F.log_softmax`` then ``topk``); ``x - logsumexp(x)`` rounds differently. torch.logsumexp
    # gives NaN / +inf / -inf exactly for the rows the rule sends to NaN.
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    logp = torch.where(lse.isfinite(), torch.log_softmax(x, dim=-1), torch.full_like(x, float("nan")))
    keys = x.masked_fill(x.isnan(), float("-inf"))

    k_eff = min(k, v - 1)
    top_values = torch.full((n, k), float("-inf"), dtype=torch.float32, device=device)
    top_ids = torch.full((n, k), -1, dtype=torch.int64, device=device)
    if k_eff > 0:
        keys = torch.cat((keys[:, :blank_id], keys[:, blank_id + 1 :]), dim=1)  # [N, V-1], blank removed
        # torch.topk is not stable: use it only for the k-th largest key, then take every key above it and the
        # lowest-position keys equal to it.
        kth = keys.topk(k_eff, dim=-1).values[:, -1:]
        above = keys > kth
        at = keys == kth
        need = k_eff - above.sum(dim=-1, keepdim=True)
        taken = above | (at & (at.cumsum(dim=-1) <= need))
        # Exactly k_eff taken positions per row; distinct keys list them in ascending position order.
        positions = torch.arange(v - 1, device=device)
        pos = torch.where(taken, (v - 1) - positions, 0).topk(k_eff, dim=-1).indices
        # A stable descending sort of k_eff keys in ascending position order breaks ties by lower id.
        order = keys.gather(1, pos).sort(dim=-1, descending=True, stable=True).indices
        pos = pos.gather(1, order)
        sel_ids = pos + (pos >= blank_id).long()  # back to vocabulary ids
        top_values[:, :k_eff] = logp.gather(1, sel_ids)
        top_ids[:, :k_eff] = sel_ids
    blank_values = logp[:, blank_id : blank_id + 1]
    blank_ids = torch.full((n, 1), blank_id, dtype=torch.int64, device=device)
    return torch.cat((top_values, blank_values), dim=1), torch.cat((top_ids, blank_ids), dim=1)
