"""The streaming encoder's GEMMs: cuBLAS fp32 (NeMo's) vs the 3xTF32 Triton kernel (``encoder_matmul=tf32x3``).

python benchmarks/bench_matmul.py                     # FastConformer 512-wide shapes, 32..2048 rows
python benchmarks/bench_matmul.py --sweep --md /tmp/matmul.md

Rows are streams x new frames per step (256 streams x 2 frames = 512 at [70, 1]). Columns: kernel microseconds
(``triton.testing.do_bench_cudagraph`` medians), TFLOP/s, and the largest error relative to float64 scaled by the
sum of |products| (what fp32 accumulation can promise). ``--sweep`` also times other tilings of the kernel.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch

SHAPES = [(512, 512), (2048, 512), (512, 2048), (1024, 512)]  # (N, K): attention / FF in, FF out, conv pw1


def scaled_error(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    expected = x.double() @ w.double().T
    return ((got.double() - expected).abs() / (x.double().abs() @ w.double().abs().T)).max().item()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[32, 128, 512, 2048])
    parser.add_argument("--sweep", action="store_true", help="also time other tilings")
    parser.add_argument("--split-k", type=int, nargs="+", default=[1], help="sweep: split-K values (depth >= 1024)")
    parser.add_argument("--shapes", default=None, help="only these N x K pairs, e.g. 512x2048,2048x512")
    parser.add_argument("--md", default=None, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_matmul.py needs a CUDA GPU; nothing to do here.")
        return
    import triton.testing

    from nemo_fastdecode.kernels import matmul

    g = torch.Generator(device="cuda").manual_seed(0)
    lines = [
        f"# Streaming encoder GEMMs on {torch.cuda.get_device_name(0)}",
        "",
        f"Command: `python benchmarks/bench_matmul.py {' '.join(argv)}`; x [M, K] @ W^T [K, N], fp32 in and out.",
        "",
        "| M | N | K | path | us | TFLOP/s | scaled error vs f64 |",
        "|---|---|---|---|---|---|---|",
    ]

    def row(m, n, k, name, fn, x, w):
        us = triton.testing.do_bench_cudagraph(fn, rep=50) * 1e3
        error = scaled_error(fn(), x, w)
        lines.append(f"| {m} | {n} | {k} | {name} | {us:.1f} | {2 * m * n * k / us / 1e6:.1f} | {error:.1e} |")
        print(lines[-1], flush=True)

    shapes = SHAPES if args.shapes is None else [tuple(map(int, p.split("x"))) for p in args.shapes.split(",")]
    for m, (n, k) in itertools.product(args.rows, shapes):
        x = torch.randn([m, k], device="cuda", generator=g)
        w = torch.randn([n, k], device="cuda", generator=g)
        with torch.inference_mode():
            for tf32 in (False, True):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                row(m, n, k, "cuBLAS " + ("tf32" if tf32 else "fp32"), lambda x=x, w=w: x @ w.T, x, w)
            torch.backends.cuda.matmul.allow_tf32 = False
            tiling = matmul.matmul_tiling(m, n, k)
            label = f"3xTF32 default ({tiling['block_m']}x{tiling['block_n']} w{tiling['num_warps']}"
            label += f" split {tiling['split_k']})"
            row(m, n, k, label, lambda x=x, w=w: matmul.linear(x, w), x, w)
            if args.sweep:
                for bm, bn, bk, warps, stages, split in itertools.product(
                    (32, 64, 128), (32, 64, 128), (32,), (4, 8), (3, 4), args.split_k
                ):
                    if bm * bn > 128 * 64 or (warps == 8 and bm * bn < 64 * 64) or (split > 1 and k < 1024):
                        continue

                    def fn(x=x, w=w, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, split=split):
                        return matmul.linear(x, w, block_m=bm, block_n=bn, block_k=bk, num_warps=warps,
                                             num_stages=stages, split_k=split)  # fmt: skip

                    row(m, n, k, f"3xTF32 {bm}x{bn}x{bk} w{warps} s{stages} split {split}", fn, x, w)
    report = "\n".join(lines) + "\n"
    if args.md:
        with open(args.md, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main(sys.argv[1:])
