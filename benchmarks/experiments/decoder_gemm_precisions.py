"""The greedy decoder's per-step GEMMs by precision: cuBLAS fp32, the 3xTF32 kernel and the IEEE-fp32 kernel.

python benchmarks/experiments/decoder_gemm_precisions.py /tmp/out/gemms.json   # also writes gemms.txt

Parakeet sizes (H = 640, V + 1 = 1025) at 32 and 128 rows: the joint's output layer, the prediction projection and
the LSTM's recurrent gates (``nemo_fastdecode.kernels.matmul.linear``, IEEE tilings swept, the best kept with its
largest error against float64); the joint on look-ahead windows of 2-16 frames; one LSTM step (cuDNN against
``lstm_step.lstm_cell_step`` with the recurrent GEMM inside, both precisions swept, and the cell alone with the
recurrent gates given). Times are ``triton.testing.do_bench_cudagraph`` medians in microseconds.
"""

import itertools
import json
import sys

import torch
import triton.testing

from nemo_fastdecode.kernels import lstm_step, matmul

torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
out_lines = []


def log(s):
    print(s, flush=True)
    out_lines.append(s)


def bench(fn):
    return triton.testing.do_bench_cudagraph(fn, rep=40) * 1000.0


g = torch.Generator(device="cuda").manual_seed(0)
H = 640
results = {}
for B in [32, 128]:
    x = torch.randn([B, H], device="cuda", generator=g)
    for name, n in [("joint", 1025), ("proj", 640), ("gates", 2560)]:
        w = torch.randn([n, H], device="cuda", generator=g) * 0.05
        bias = torch.randn([n], device="cuda", generator=g)
        out = torch.empty([B, n], device="cuda")
        ref = x.double() @ w.double().T + bias.double()
        t_cublas = bench(lambda: torch.addmm(bias, x, w.T, out=out))
        log(f"B={B} {name} n={n}: cublas fp32 {t_cublas:.2f} us")
        base = matmul.decoder_tiling(B, split_k=(name != "joint"))
        t_tf = bench(lambda: matmul.linear(x, w, bias, "tf32x3", out=out, **base))
        log(f"  tf32x3 {base}: {t_tf:.2f} us")
        best = (1e9, None)
        for bm, bn, bk, nw, sk in itertools.product([32, 64], [16, 32, 64], [32, 64], [2, 4], [1, 4, 8]):
            if bm > max(B, 32):
                continue
            opts = dict(block_m=bm, block_n=bn, block_k=bk, num_warps=nw, num_stages=3, split_k=sk)
            try:
                t = bench(lambda: matmul.linear(x, w, bias, "ieee", out=out, **opts))
            except Exception:  # noqa: BLE001  (a tiling the compiler rejects)
                continue
            err = (out.double() - ref).abs().max().item()
            if t < best[0]:
                best = (t, opts, err)
        log(f"  ieee best {best[1]}: {best[0]:.2f} us  max err {best[2]:.2e}")
        results[f"{B}_{name}"] = {"cublas": t_cublas, "tf32x3": t_tf, "ieee": best[0], "ieee_opts": best[1]}
    # window joint rows: B*W
    for W in [2, 4, 8, 16]:
        rows = B * W
        if rows > 1024:
            continue
        xw = torch.randn([rows, H], device="cuda", generator=g)
        w = torch.randn([1025, H], device="cuda", generator=g) * 0.05
        bias = torch.randn([1025], device="cuda", generator=g)
        out = torch.empty([rows, 1025], device="cuda")
        t_cublas = bench(lambda: torch.addmm(bias, xw, w.T, out=out))
        best = (1e9, None)
        for bn, bk, nw in itertools.product([16, 32, 64], [64], [2, 4]):
            opts = dict(block_m=32 if B <= 32 else 64, block_n=bn, block_k=bk, num_warps=nw, num_stages=3, split_k=1)
            try:
                t = bench(lambda: matmul.linear(xw, w, bias, "ieee", out=out, **opts))
            except Exception:  # noqa: BLE001
                continue
            if t < best[0]:
                best = (t, opts)
        log(f"B={B} window W={W} rows={rows}: cublas {t_cublas:.2f} us, ieee best {best[1]} {best[0]:.2f} us")
        results[f"{B}_window{W}"] = {"cublas": t_cublas, "ieee": best[0], "ieee_opts": best[1]}
    # LSTM: cuDNN one step vs cell kernel with recurrent gates given
    lstm = torch.nn.LSTM(H, H, 1).cuda()
    xe = torch.randn([1, B, H], device="cuda", generator=g)
    h0 = torch.randn([1, B, H], device="cuda", generator=g)
    c0 = torch.randn([1, B, H], device="cuda", generator=g)
    t_cudnn = bench(lambda: lstm(xe, (h0, c0)))
    table = torch.randn([1025, 4 * H], device="cuda", generator=g)
    labels = torch.randint(0, 1025, [B], device="cuda", generator=g)
    rg = torch.randn([B, 4 * H], device="cuda", generator=g)
    ho, co = torch.empty([B, H], device="cuda"), torch.empty([B, H], device="cuda")
    whh = lstm.weight_hh_l0.detach()
    t_cell = bench(
        lambda: lstm_step.lstm_cell_step(table, labels, None, None, None, None, c0[0], ho, co, recurrent_gates=rg)
    )
    res = {}
    for prec in ["tf32x3", "ieee"]:
        best = (1e9, None)
        for bb, bh, nw, bk in itertools.product([32, 64], [4, 8, 16], [2, 4], [32, 64]):
            if bb > max(B, 32):
                continue
            try:
                t = bench(
                    lambda: lstm_step.lstm_cell_step(
                        table,
                        labels,
                        None,
                        None,
                        h0[0],
                        whh,
                        c0[0],
                        ho,
                        co,
                        prec,
                        block_b=bb,
                        block_h=bh,
                        num_warps=nw,
                        block_k=bk,
                    )
                )
            except Exception:  # noqa: BLE001
                continue
            if t < best[0]:
                best = (t, dict(block_b=bb, block_h=bh, num_warps=nw, block_k=bk))
        res[prec] = best
    log(
        f"B={B} LSTM step: cudnn {t_cudnn:.2f} us; cell only (gates given) {t_cell:.2f} us; cell+hh tf32x3 "
        f"{res['tf32x3'][0]:.2f} {res['tf32x3'][1]}; cell+hh ieee {res['ieee'][0]:.2f} {res['ieee'][1]}"
    )
    results[f"{B}_lstm"] = {"cudnn": t_cudnn, "cell": t_cell, "tf32x3": res["tf32x3"], "ieee": res["ieee"]}

log(torch.cuda.get_device_name(0))
with open(sys.argv[1], "w") as f:
    json.dump(results, f, indent=1)
with open(sys.argv[1].replace(".json", ".txt"), "w") as f:
    f.write("\n".join(out_lines) + "\n")
