"""The few-row IEEE-fp32 GEMM (:mod:`nemo_fastdecode.kernels.few_row_gemm`) at the decoders' per-step shapes, every
tiling, against cuBLAS fp32, Triton's IEEE ``tl.dot`` (the exact predictor's tilings) and the 3xTF32 kernel.

python benchmarks/bench_few_row_gemm.py out.txt      # on a GPU, about a minute

Shapes (K = 640): the LSTM gates at 32 rows (-> 2560), the prediction projection (-> 640), the TDT joint on a
two-frame window at batch 32 (64 rows -> 1030) and the RNN-T joint on a four-frame window (128 rows -> 1025). Times
are ``triton.testing.do_bench_cudagraph`` medians (us); errors are relative to float64. The fastest few tilings per
shape are printed, with the one :func:`~nemo_fastdecode.kernels.few_row_gemm.choose_tiling` picks.
"""

from __future__ import annotations

import functools
import itertools
import sys

import torch
import triton
import triton.testing

from nemo_fastdecode.kernels import few_row_gemm, matmul
from nemo_fastdecode.kernels.tf32x3 import split_k_counters
from nemo_fastdecode.prediction import ExactPredictor

SHAPES = {"gates": (32, 2560), "proj": (32, 640), "window_joint": (64, 1030), "rnnt_window_joint": (128, 1025)}
DEPTH = 640


def bench(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=20) * 1e3


def main(path: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    lines = []

    def log(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    log(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; medians in us")
    for name, (m, n) in SHAPES.items():
        sweep(name, m, n, log)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def sweep(name: str, m: int, n: int, log) -> None:
    """Every tiling of one shape, and the three other GEMMs on it."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn([m, DEPTH], device="cuda", generator=g)
    w = torch.randn([n, DEPTH], device="cuda", generator=g) / 25
    b = torch.randn([n], device="cuda", generator=g)
    out = torch.empty([m, n], device="cuda")
    exact = x.double() @ w.double().T + b.double()
    counters = split_k_counters(x.device)
    ieee_tiling = ExactPredictor._tiling(None, m, n)
    t_cublas = bench(lambda: torch.addmm(b, x, w.T, out=out))
    t_triton = bench(lambda: matmul.linear(x, w, b, "ieee", out=out, counters=counters, **ieee_tiling))
    t_tf32x3 = bench(lambda: matmul.linear(x, w, b, "tf32x3", out=out, counters=counters,
                                           **matmul.decoder_tiling(m)))  # fmt: skip
    log(f"{name} ({m}, {DEPTH}) -> {n}: cublas fp32 {t_cublas:.2f}, triton ieee {t_triton:.2f}, "
        f"tf32x3 {t_tf32x3:.2f}")  # fmt: skip
    wt = few_row_gemm.transposed_weight(w)
    results = []
    for tiling in itertools.product((4, 8, 16, 32), (1, 2, 4, 8), (2, 4, 8, 16, 20)):
        try:
            few_row_gemm.check_tiling(tiling)
        except ValueError:
            continue
        if (32 // tiling[0]) * tiling[1] > m:
            continue
        out.zero_()
        few_row_gemm.linear(x, wt, b, out, tiling=tiling)
        error = ((out.double() - exact).abs().max() / exact.abs().max()).item()
        seconds = bench(functools.partial(few_row_gemm.linear, x, wt, b, out, tiling=tiling))
        results.append((seconds, tiling, error))
    results.sort()
    chosen = few_row_gemm.choose_tiling(m, n)
    for seconds, tiling, error in results[:6] + [r for r in results if r[1] == chosen]:
        mark = "  (chosen)" if tiling == chosen else ""
        log(f"  few_row_gemm {tiling} (column groups, rows per thread, slices): {seconds:.2f} us, "
            f"rel err {error:.1e}{mark}")  # fmt: skip
    log(f"  worst error {max(r[2] for r in results):.1e} over {len(results)} tilings")


if __name__ == "__main__":
    main(sys.argv[1])
