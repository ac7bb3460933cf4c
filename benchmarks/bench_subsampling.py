"""The cache-aware subsampling of one streaming step (17 x 512 encoder shapes): NeMo's convolutions vs ours.

python benchmarks/bench_subsampling.py                         # 256 streams, 25 frames (pre-encode cache 9 + chunk 16)
python benchmarks/bench_subsampling.py --sweep --md /tmp/subsampling.md

Rows: NeMo's ``MaskedConvSequential`` (cuDNN, its masks and padding copies); ``CausalSubsampling`` with the
masked-ReLU kernel between NeMo's convolutions (the per-layer path); the fused path (``kernels/masked_depthwise.py``,
the ``tf32x3`` encoder's) with its default tiles; and, with ``--sweep``, the first stage's fused kernel alone by
tile and warps. Microseconds are ``triton.testing.do_bench_cudagraph`` medians; the error column is the largest
``|ours - NeMo|`` over ``max |NeMo|`` (cuDNN's TF32 off, so NeMo's side is fp32).
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--frames", type=int, default=25, help="input frames per stream (cache + chunk)")
    parser.add_argument("--channels", type=int, default=256, help="subsampling_conv_channels")
    parser.add_argument("--features", type=int, default=80, help="mel features")
    parser.add_argument("--sweep", action="store_true", help="also time the first stage's kernel by tile")
    parser.add_argument("--md", default=None, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_subsampling.py needs a CUDA GPU; nothing to do here.")
        return
    import triton.testing
    from nemo.collections.asr.parts.submodules.subsampling import ConvSubsampling

    from nemo_fastdecode.kernels.masked_depthwise import FirstConv, masked_depthwise_conv
    from nemo_fastdecode.streaming.subsampling import CausalSubsampling

    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    pre_encode = ConvSubsampling(
        "dw_striding", 8, feat_in=args.features, feat_out=512, conv_channels=args.channels,
        activation=torch.nn.ReLU(), is_causal=True,
    ).cuda().eval()  # fmt: skip
    x = torch.randn(args.streams, args.frames, args.features, device="cuda")
    lengths = torch.randint(args.frames // 2, args.frames + 1, (args.streams,), device="cuda")
    lengths[0] = args.frames
    x *= (torch.arange(args.frames, device="cuda")[None, :] < lengths[:, None])[:, :, None]  # as the window is
    per_layer = CausalSubsampling(pre_encode, use_triton=True, max_frames=args.frames)
    fused = CausalSubsampling(pre_encode, use_triton=True, max_frames=args.frames, fuse_convolutions=True)
    lines = [
        f"# Streaming subsampling on {torch.cuda.get_device_name(0)}",
        "",
        f"Command: `python benchmarks/bench_subsampling.py {' '.join(argv)}`; {args.streams} streams x "
        f"{args.frames} frames x {args.features} features, {args.channels} channels, fp32.",
        "",
        "| path | us | error vs NeMo |",
        "|---|---|---|",
    ]

    def row(name, fn, expected):
        us = triton.testing.do_bench_cudagraph(fn, rep=50) * 1e3
        error = ((fn() - expected).abs().max() / expected.abs().max()).item()
        lines.append(f"| {name} | {us:.1f} | {error:.1e} |")
        print(lines[-1], flush=True)

    with torch.inference_mode():
        expected, _ = pre_encode.conv(x, lengths)
        row("NeMo MaskedConvSequential", lambda: pre_encode.conv(x, lengths)[0], expected)
        row("per-layer (masked_relu_pad)", lambda: per_layer(x, lengths, input_masked=True)[0], expected)
        row("fused (masked_depthwise, default tiles)", lambda: fused(x, lengths, input_masked=True)[0], expected)
        if args.sweep:  # the first stage alone: first conv + masked ReLU + depthwise conv, by tile and warps
            first_conv, strided = fused.stages
            depthwise = strided[0][0]
            first = FirstConv(first_conv.weight, first_conv.bias, first_conv.stride[0], lengths)
            stage_lengths = fused.length_table.index_select(0, lengths)[:, 0].contiguous()

            def stage(**tile):
                return masked_depthwise_conv(
                    x, stage_lengths, depthwise.weight, depthwise.bias, depthwise.stride[0], first, **tile
                )

            reference = stage()
            row("first stage, default tiles", stage, reference)
            for block_c, block_p, warps in itertools.product((8, 16, 32, 64), (16, 32, 64, 128), (2, 4, 8)):
                if block_c * block_p > 4096 or block_c * block_p < 32 * warps:
                    continue
                tile = {"block_c": block_c, "block_p": block_p, "num_warps": warps}
                row(f"first stage {block_c} ch x {block_p} pos, {warps} warps", lambda t=tile: stage(**t), reference)
    if args.md:
        with open(args.md, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
