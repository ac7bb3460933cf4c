"""One prediction-network step (embedding, LSTM, projection) exact vs fast math, as CUDA graphs.

python benchmarks/bench_prediction.py                 # Parakeet sizes: H = 640, V + 1 = 1025, B = 8..128, 1-2 layers
python benchmarks/bench_prediction.py --sweep --md /tmp/prediction.md

- ``exact``: ``decoder.predict`` (cuDNN LSTM) + ``joint.project_prednet`` (cuBLAS), what NeMo and the exact
  ``fast_greedy`` run;
- ``fast math``: :class:`nemo_fastdecode.prediction.FastMathPredictor` (label table + 3xTF32 Triton kernels).
The error columns are the largest absolute difference of the projected output from a float64 evaluation.
``--sweep`` also times the kernels' block sizes (for choosing the defaults).
Times are ``triton.testing.do_bench_cudagraph`` medians (kernel time, no host launch overhead).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import sys

import torch


def build(hidden: int, tokens: int, layers: int):
    from nemo.collections.asr.modules import RNNTDecoder, RNNTJoint

    torch.manual_seed(0)
    decoder = RNNTDecoder(
        prednet={"pred_hidden": hidden, "pred_rnn_layers": layers, "dropout": 0.0},
        vocab_size=tokens - 1,
        blank_as_pad=True,
    )
    joint = RNNTJoint(
        jointnet={"encoder_hidden": 1024, "pred_hidden": hidden, "joint_hidden": hidden, "activation": "relu"},
        num_classes=tokens - 1,
    )
    return decoder.cuda().eval(), joint.cuda().eval()


def float64_output(decoder, joint, labels, states) -> torch.Tensor:
    """The projected output in float64, on copies (the timed modules keep their fp32 parameters)."""
    lstm = copy.deepcopy(decoder.prediction["dec_rnn"].lstm).double()
    x = decoder.prediction["embed"].weight.double()[labels][None]
    out, _ = lstm(x, tuple(s.double() for s in states))
    return copy.deepcopy(joint.pred).double()(out[0])


def time_case(batch: int, layers: int, args, sweep: bool) -> list[str]:
    import triton.testing

    from nemo_fastdecode.kernels import lstm_step, matmul, tf32x3
    from nemo_fastdecode.prediction import FastMathPredictor

    decoder, joint = build(args.hidden, args.tokens, layers)
    g = torch.Generator(device="cuda").manual_seed(1)
    labels = torch.randint(0, args.tokens, [batch], device="cuda", generator=g)
    states = [0.5 * torch.randn([layers, batch, args.hidden], device="cuda", generator=g) for _ in range(2)]
    predictor = FastMathPredictor(decoder, joint)
    predictor.refresh()

    def exact():
        out, new_states, *_ = decoder.predict(labels[:, None], states, add_sos=False, batch_size=batch)
        return joint.project_prednet(out)[:, 0]

    def fast():
        return predictor.step(labels, states, fused=True)[0][:, 0]

    recurrent = torch.empty([layers, batch, 4 * args.hidden], device="cuda")

    def fast_precomputed():  # the step after the label loop's parallel branch computed the recurrent gates
        return predictor.step(labels, states, fused=True, recurrent_gates=recurrent)[0][:, 0]

    with torch.inference_mode():
        reference = float64_output(decoder, joint, labels, states)
        predictor.recurrent_gates(states, recurrent, fused=True)
        errors = [(fn() - reference).abs().max().item() for fn in (exact, fast, fast_precomputed)]
        us = [triton.testing.do_bench_cudagraph(fn, rep=50) * 1e3 for fn in (exact, fast, fast_precomputed)]
        branch_us = (
            triton.testing.do_bench_cudagraph(lambda: predictor.recurrent_gates(states, recurrent, fused=True), rep=50)
            * 1e3
        )
        rows = [f"| {batch} | {layers} | {us[0]:.1f} | {us[1]:.1f} | {us[0] / us[1]:.2f}x | {errors[0]:.1e} | "
                f"{errors[1]:.1e} | {us[2]:.1f} (+ {branch_us:.1f} in parallel) | {errors[2]:.1e} |"]  # fmt: skip
        if not sweep:
            return rows
        w = predictor._weights
        h, c = states
        h_out, c_out = torch.empty_like(h[0]), torch.empty_like(c[0])
        counters = tf32x3.split_k_counters(h.device)
        row_blocks = [matmul.batch_tiling(batch)[0]]
        # layer 0 (label table + h @ W_hh, depth H), a deeper layer (x @ W_ih + h @ W_hh, depth 2H), and both with
        # h @ W_hh precomputed (the label loop's parallel branch)
        g = torch.randn([batch, 4 * args.hidden], device="cuda")
        inputs = {
            "cell0": (w["table"], labels, None, None, h[0], w["weight_hh_0"], None),
            "cell1": (w["table"][0], None, h[0], w["weight_hh_0"], h[0], w["weight_hh_0"], None),
            "cell0 precomputed": (w["table"], labels, None, None, None, None, g),
            "cell1 precomputed": (w["table"][0], None, h[0], w["weight_hh_0"], None, None, g),
        }
        for (name, args_), block_b, block_h, block_k, warps in itertools.product(
            inputs.items(), row_blocks, (4, 8), (32, 64), (2, 4)
        ):
            bias, index, x, wx, h_in, wh, gates = args_

            def cell(bias=bias, index=index, x=x, wx=wx, h_in=h_in, wh=wh, gates=gates, block_b=block_b,
                     block_h=block_h, block_k=block_k, warps=warps):  # fmt: skip
                lstm_step.lstm_cell_step(bias, index, x, wx, h_in, wh, c[0], h_out, c_out, recurrent_gates=gates,
                                         block_b=block_b, block_h=block_h, block_k=block_k, num_warps=warps)  # fmt: skip

            t = triton.testing.do_bench_cudagraph(cell, rep=20) * 1e3
            rows.append(f"| {batch} | {name} block_b={block_b} block_h={block_h} block_k={block_k} warps={warps} | "
                        f"{t:.1f} | | | | | | |")  # fmt: skip
        # the projection (H -> H_joint) and a layer's recurrent GEMM (H -> 4H, the label loop's parallel branch)
        linears = {"projection": (w["projection_weight"], w["projection_bias"]),
                   "recurrent": (w["weight_hh_0"], w["no_gate_bias"])}  # fmt: skip
        for (name, (weight, bias)), block_b, block_n, block_k, warps, split_k in itertools.product(
            linears.items(), row_blocks, (16, 32), (32, 64), (2, 4), (1, 2, 4, 8)
        ):
            out = torch.empty([batch, weight.shape[0]], device="cuda")

            def run(weight=weight, bias=bias, out=out, block_b=block_b, block_n=block_n, block_k=block_k, warps=warps,
                    split_k=split_k):  # fmt: skip
                matmul.linear(h_out, weight, bias, out=out, split_k=split_k, counters=counters, block_m=block_b,
                              block_n=block_n, block_k=block_k, num_warps=warps, num_stages=4)  # fmt: skip

            t = triton.testing.do_bench_cudagraph(run, rep=20) * 1e3
            rows.append(f"| {batch} | {name} block_b={block_b} block_n={block_n} block_k={block_k} warps={warps} "
                        f"split_k={split_k} | {t:.1f} | | | | | | |")  # fmt: skip
    return rows


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=640)
    parser.add_argument("--tokens", type=int, default=1025, help="V + 1 (blank included)")
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sweep", action="store_true", help="also time block sizes (layer 0, one layer)")
    parser.add_argument("--md", default=None, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_prediction.py needs a CUDA GPU; nothing to do here.")
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    lines = [
        f"# Prediction-network step on {torch.cuda.get_device_name(0)}",
        "",
        f"Command: `python benchmarks/bench_prediction.py {' '.join(argv)}`; H={args.hidden}, V+1={args.tokens}, fp32.",
        "",
        "| B | layers | exact us | fast math us | speed-up | exact max err | fast math max err | fast math after the "
        "recurrent branch us | its max err |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for batch, layers in itertools.product(args.batch, args.layers):
        lines += time_case(batch, layers, args, sweep=args.sweep and layers == 1)
    report = "\n".join(lines) + "\n"
    print(report)
    if args.md:
        with open(args.md, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main(sys.argv[1:])
