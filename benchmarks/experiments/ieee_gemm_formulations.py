"""IEEE-fp32 GEMMs at the greedy decoder's per-step shapes, three ways in Triton, swept wide, against cuBLAS fp32.

python benchmarks/experiments/ieee_gemm_formulations.py /tmp/out/ieee_gemm.txt [workers]

Shapes (H = 640): the LSTM gates at 32 rows (640 -> 2560), the prediction projection at 32 rows (640 -> 640), the
TDT joint on a two-frame window at batch 32 (64 rows, 640 -> 1030). Formulations:

- ``dot``: ``matmul.linear(precision="ieee")`` (``tl.dot`` on the CUDA cores: output tile [rows, columns]);
- ``swap``: the same product with the weight as ``tl.dot``'s left operand (output tile [columns, rows]), so that
  wide column tiles become the long side of the product;
- ``outer``: rank-1 updates, one depth index at a time, from a transposed weight copy ``W^T [K, N]`` (each update
  reads one contiguous weight row and one column of ``x``; no shared-memory staging).

All split the depth over programs with ``tf32x3.split_k_total`` (partials added in split order). Phase 1 compiles
every variant in ``workers`` processes (Triton's disk cache); phase 2 times them one at a time in this process
(``triton.testing.do_bench_cudagraph`` medians, microseconds) and checks each against float64.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import sys
import time

import torch
import triton
import triton.language as tl
import triton.testing

from nemo_fastdecode.kernels import matmul
from nemo_fastdecode.kernels.tf32x3 import and_flag, depth_share, split_k_counters, split_k_total

H = 640
SHAPES = {"gates": (32, 2560), "proj": (32, 640), "window_joint": (64, 1030)}


@triton.jit
def _swap_kernel(x_ptr, w_ptr, b_ptr, out_ptr, partial_ptr, counter_ptr, rows, n_out, depth,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):  # fmt: skip
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok, m_ok = offs_n < n_out, offs_m < rows
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    start, end = depth_share(depth, BLOCK_K, SPLIT_K)
    for k0 in range(start, end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < end
        w = tl.load(w_ptr + offs_n[:, None] * depth + ks[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        xt = tl.load(x_ptr + offs_m[None, :] * depth + ks[:, None], mask=m_ok[None, :] & k_ok[:, None], other=0.0)
        acc += tl.dot(w, xt, input_precision="ieee")
    mask = n_ok[:, None] & m_ok[None, :]
    offsets = offs_m[None, :] * n_out + offs_n[:, None]
    if SPLIT_K > 1:
        acc, last = split_k_total(acc, partial_ptr, rows * n_out, offsets, mask, counter_ptr, SPLIT_K)
        mask = and_flag(mask, last)
    acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0)[:, None]
    tl.store(out_ptr + offsets, acc, mask=mask)


@triton.jit
def _outer_kernel(x_ptr, wt_ptr, b_ptr, out_ptr, partial_ptr, counter_ptr, rows, n_out, depth,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, UNROLL: tl.constexpr):  # fmt: skip
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = offs_m < rows, offs_n < n_out
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    start, end = depth_share(depth, UNROLL, SPLIT_K)
    for k0 in range(start, end, UNROLL):
        for j in tl.static_range(UNROLL):
            k = k0 + j
            xk = tl.load(x_ptr + offs_m * depth + k, mask=m_ok & (offs_m * 0 + k < end), other=0.0)
            wk = tl.load(wt_ptr + k * n_out + offs_n, mask=n_ok & (offs_n * 0 + k < end), other=0.0)
            acc += xk[:, None] * wk[None, :]
    mask = m_ok[:, None] & n_ok[None, :]
    offsets = offs_m[:, None] * n_out + offs_n[None, :]
    if SPLIT_K > 1:
        acc, last = split_k_total(acc, partial_ptr, rows * n_out, offsets, mask, counter_ptr, SPLIT_K)
        mask = and_flag(mask, last)
    acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    tl.store(out_ptr + offsets, acc, mask=mask)


def configs(shape: str) -> list[tuple]:
    rows, n = SHAPES[shape]
    out = []
    bms = [32] if rows <= 32 else [32, 64]
    for bm, bn, bk, nw, sk, st in itertools.product(bms, [32, 64, 128, 256], [16, 32, 64], [2, 4, 8],
                                                   [1, 2, 4, 8], [3]):  # fmt: skip
        per_thread = bm * bn / (32 * nw)
        if 4 <= per_thread <= 128 and bn <= max(16, triton.next_power_of_2(n)) and bk * sk <= 2 * H:
            out.append(("dot", bm, bn, bk, nw, sk, st))
    for bm, bn, bk, nw, sk, st in itertools.product(bms, [32, 64, 128, 256], [16, 32], [2, 4, 8], [1, 2, 4, 8],
                                                   [3]):  # fmt: skip
        per_thread = bm * bn / (32 * nw)
        if 8 <= per_thread <= 128 and bk * sk <= 2 * H:
            out.append(("swap", bm, bn, bk, nw, sk, st))
    for bm, bn, nw, sk, un in itertools.product(bms, [32, 64, 128, 256], [1, 2, 4, 8], [2, 4, 8, 16], [8]):
        per_thread = bm * bn / (32 * nw)
        if 8 <= per_thread <= 128:
            out.append(("outer", bm, bn, un, nw, sk, 1))
    return out


class Problem:
    def __init__(self, shape: str):
        rows, n = SHAPES[shape]
        g = torch.Generator(device="cuda").manual_seed(0)
        self.x = torch.randn([rows, H], device="cuda", generator=g)
        self.w = torch.randn([n, H], device="cuda", generator=g) * 0.05
        self.wt = self.w.T.contiguous()
        self.b = torch.randn([n], device="cuda", generator=g)
        self.out = torch.empty([rows, n], device="cuda")
        self.partials = torch.empty([16, rows, n], device="cuda")
        self.counters = split_k_counters(torch.device("cuda"))
        self.ref = self.x.double() @ self.w.double().T + self.b.double()

    def launcher(self, cfg: tuple):
        kind, bm, bn, bk, nw, sk, st = cfg
        rows, depth = self.x.shape
        n = self.w.shape[0]
        if kind == "dot":
            opts = dict(block_m=bm, block_n=bn, block_k=bk, num_warps=nw, num_stages=st, split_k=sk)
            return lambda: matmul.linear(self.x, self.w, self.b, "ieee", out=self.out, counters=self.counters, **opts)
        if kind == "swap":
            grid = (triton.cdiv(n, bn), triton.cdiv(rows, bm), sk)
            return lambda: _swap_kernel[grid](self.x, self.w, self.b, self.out, self.partials, self.counters, rows, n,
                                              depth, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=nw,
                                              num_stages=st)  # fmt: skip
        grid = (triton.cdiv(n, bn), triton.cdiv(rows, bm), sk)
        return lambda: _outer_kernel[grid](self.x, self.wt, self.b, self.out, self.partials, self.counters, rows, n,
                                           depth, BLOCK_M=bm, BLOCK_N=bn, SPLIT_K=sk, UNROLL=bk, num_warps=nw,
                                           num_stages=st)  # fmt: skip


def _compile(job: tuple[str, list[tuple]]) -> int:
    shape, cfgs = job
    problem = Problem(shape)
    ok = 0
    for cfg in cfgs:
        try:
            problem.launcher(cfg)()
            ok += 1
        except Exception:  # noqa: BLE001  (a variant the compiler rejects)
            pass
    torch.cuda.synchronize()
    return ok


def main(path: str, workers: int) -> None:
    lines: list[str] = []

    def log(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    torch.backends.cuda.matmul.allow_tf32 = False
    log(f"# IEEE-fp32 GEMM formulations, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"Triton {triton.__version__}; do_bench_cudagraph medians in us")  # fmt: skip
    t0 = time.time()
    jobs = [(s, c[i::workers]) for s in SHAPES for c in [configs(s)] for i in range(workers)]
    with mp.get_context("spawn").Pool(workers) as pool:
        compiled = sum(pool.map(_compile, jobs))
    log(f"# compiled {compiled} variants in {time.time() - t0:.0f} s")
    for shape in SHAPES:
        problem = Problem(shape)
        x, w, b = problem.x, problem.w, problem.b
        t_cublas = triton.testing.do_bench_cudagraph(lambda: torch.addmm(b, x, w.T, out=problem.out), rep=20) * 1e3
        tiling = matmul.decoder_tiling(x.shape[0], split_k=True)
        t_tf = triton.testing.do_bench_cudagraph(
            lambda: matmul.linear(x, w, b, "tf32x3", out=problem.out, **tiling), rep=20) * 1e3  # fmt: skip
        log(f"{shape} {tuple(x.shape)} -> {w.shape[0]}: cublas fp32 {t_cublas:.2f}, tf32x3 {t_tf:.2f}")
        results = []
        for cfg in configs(shape):
            try:
                fn = problem.launcher(cfg)
                problem.out.zero_()
                fn()
                torch.cuda.synchronize()
                err = ((problem.out.double() - problem.ref).abs().max() / problem.ref.abs().max()).item()
                t = triton.testing.do_bench_cudagraph(fn, rep=10) * 1e3
            except Exception:  # noqa: BLE001
                continue
            results.append((t, cfg, err))
        for kind in ("dot", "swap", "outer"):
            ranked = sorted(r for r in results if r[1][0] == kind)
            for t, cfg, err in ranked[:6]:
                log(f"  {kind} {cfg[1:]} (bm, bn, bk|unroll, warps, split, stages): {t:.2f} us, rel err {err:.1e}")
        log(f"  worst error over all variants: {max(r[2] for r in results):.1e}; {len(results)} timed")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 14)
