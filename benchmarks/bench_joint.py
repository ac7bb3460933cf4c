"""One greedy joint evaluation (frame gather, hidden layer, output layer, best token) three ways, as CUDA graphs.

(Until commit 8b10cbf it also timed an opt-in Triton joint kernel, GEMM + argmax fused; it was no faster than
cuBLAS + the fused steps at B = 32 and 3x slower at B = 128 on an H200, so it was removed.)

python benchmarks/bench_joint.py                      # Parakeet sizes: H = 640, V + 1 = 1025, B = 8..128
python benchmarks/bench_joint.py --md /tmp/joint.md

- ``torch``: index + add + relu + Linear (cuBLAS) + ``max`` (what NeMo's decoders launch);
- ``fused steps`` (default): Triton gather/add/relu, cuBLAS Linear, Triton row argmax (bit-identical to torch);
- ``fused steps, padded N``: the output layer padded to a multiple of 64 rows (aligned cuBLAS kernels);
  the last column says whether its scores and labels are bit-identical to the unpadded GEMM's.
Times are ``triton.testing.do_bench_cudagraph`` medians (kernel time, no host launch overhead).
"""

from __future__ import annotations

import argparse
import sys

import torch


def time_batch(batch: int, linear: torch.nn.Linear, num_tokens: int, g: torch.Generator) -> str:
    """One Markdown row: the three joint paths at batch size ``batch``."""
    import triton.testing

    from nemo_fastdecode.kernels.best_token import best_token
    from nemo_fastdecode.kernels.joint_hidden import joint_hidden

    hidden_size = linear.in_features
    enc = torch.randn([batch, 50, hidden_size], device="cuda", generator=g)
    pred = torch.randn([batch, 1, hidden_size], device="cuda", generator=g)
    times = torch.randint(0, 50, [batch], device="cuda", generator=g)
    rows = torch.arange(batch, device="cuda")
    hidden = torch.empty([batch, hidden_size], device="cuda")
    token_out = torch.empty([batch], device="cuda"), torch.empty([batch], dtype=torch.long, device="cuda")

    def torch_path():
        return linear(torch.relu(enc[rows, times] + pred[:, 0])).max(dim=-1)

    def fused_steps():
        joint_hidden(enc, times, pred, hidden, fused=True)
        return best_token(linear(hidden), num_tokens, *token_out, fused=True)

    # cuBLAS with the output layer padded to a multiple of 64 rows: aligned (vectorised) GEMM kernels
    padded = torch.nn.Linear(hidden_size, -(-num_tokens // 64) * 64, device="cuda")
    with torch.no_grad():
        padded.weight.zero_()
        padded.bias.zero_()
        padded.weight[:num_tokens] = linear.weight
        padded.bias[:num_tokens] = linear.bias

    def fused_steps_padded():
        joint_hidden(enc, times, pred, hidden, fused=True)
        return best_token(padded(hidden), num_tokens, *token_out, fused=True)

    with torch.inference_mode():
        paths = (torch_path, fused_steps, fused_steps_padded)
        us = [triton.testing.do_bench_cudagraph(fn, rep=50) * 1e3 for fn in paths]
        reference_scores, reference = torch_path()
        padded_scores, padded_labels = fused_steps_padded()
        padded_same = torch.equal(padded_labels, reference) and torch.equal(padded_scores, reference_scores)
    return f"| {batch} | {us[0]:.1f} | {us[1]:.1f} | {us[2]:.1f} | {'yes' if padded_same else 'no'} |"


def time_windows(batch: int, window: int, linear: torch.nn.Linear, g: torch.Generator) -> list[str]:
    """Markdown rows: fast_math's joint output layer on a look-ahead window's ``B * W`` hidden rows, tiled as for
    ``B`` rows (block_b, block_k) with several column widths and warp counts; each row says whether its logits
    equal the default tiling's (``matmul.decoder_tiling``: block_n 16, ``batch_tiling``'s warps) bit for bit."""
    import triton.testing

    from nemo_fastdecode.kernels import matmul

    hidden = torch.randn([batch * window, linear.in_features], device="cuda", generator=g)
    weight, bias = linear.weight.detach(), linear.bias.detach()
    tiling = matmul.decoder_tiling(batch)
    reference = matmul.linear(hidden, weight, bias, **tiling)
    rows = []
    with torch.inference_mode():
        for block_n in (16, 32, 64):
            for num_warps in (2, 4):
                out = torch.empty_like(reference)

                def run(options=tiling | {"block_n": block_n, "num_warps": num_warps}, out=out):
                    matmul.linear(hidden, weight, bias, out=out, **options)

                run()
                us = triton.testing.do_bench_cudagraph(run, rep=50) * 1e3
                same = "yes" if torch.equal(out, reference) else "no"
                rows.append(f"| {batch} | {window} | {block_n} | {num_warps} | {us:.1f} | {same} |")
    return rows


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=640)
    parser.add_argument("--tokens", type=int, default=1025, help="V + 1 (blank included)")
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 32, 64, 128])
    parser.add_argument("--windows", type=int, nargs="*", default=[1, 4, 16], help="look-ahead frames (fast_math)")
    parser.add_argument("--md", default=None, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_joint.py needs a CUDA GPU; nothing to do here.")
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(0)
    linear = torch.nn.Linear(args.hidden, args.tokens, device="cuda")
    lines = [
        f"# Greedy joint step on {torch.cuda.get_device_name(0)}",
        "",
        f"Command: `python benchmarks/bench_joint.py {' '.join(argv)}`; H={args.hidden}, V+1={args.tokens}, fp32.",
        "",
        "| B | torch us | fused steps us | fused steps, padded N us | padded bit-identical |",
        "|---|---|---|---|---|",
    ]
    lines += [time_batch(batch, linear, args.tokens, g) for batch in args.batch]
    if args.windows:
        lines += ["", "fast_math joint output layer on B * W rows, tiled as for B rows:", "",
                  "| B | W | block_n | warps | us | bit-identical to block_n 16 |", "|---|---|---|---|---|---|"]  # fmt: skip
        for window in args.windows:
            lines += time_windows(32, window, linear, g)
    report = "\n".join(lines) + "\n"
    print(report)
    if args.md:
        with open(args.md, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main(sys.argv[1:])
