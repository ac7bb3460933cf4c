"""Where a greedy decoder's time goes on the GPU: kernels per decode, their durations, GPU-busy share.

python benchmarks/profile_decoder.py                         # rnnt-0.6b, 2 minutes of audio, our label and frame loops
python benchmarks/profile_decoder.py preset=tdt-0.6b seconds=300 out=/tmp/profile.md

For each strategy: wall time of one pass over the set, the sum of GPU kernel time inside it
(torch.profiler/CUPTI; kernels replayed from CUDA graphs included, not those inside WHILE nodes: profile the
``no_while_graph`` mode for those), their ratio (GPU busy share), the timeline's idle gaps between kernels and
the kernels they follow, and the kernels that take the most time. Where a label loop is profiled in both
``no_while_graph`` and ``full_graph`` mode, a last table sets per iteration the kernels' time (seen in the former)
beside the full graph's wall time (the same iterations), which shows what the WHILE graph spends beyond its kernels:

    python benchmarks/profile_decoder.py preset=tdt-0.6b seconds=600 'strategies=["fast_greedy_label_loop[no_while_graph]",
        "fast_greedy_label_loop[full_graph]","fast_greedy_label_loop[no_while_graph,fast_math]",
        "fast_greedy_label_loop[full_graph,fast_math]"]'

Run NeMo's WHILE-graph decoders elsewhere: profiling them crashed (illegal memory access) on an H200.
"""

from __future__ import annotations

import sys
import time

import torch
from omegaconf import OmegaConf

import nemo_fastdecode  # noqa: F401  (registers the strategies)
from fastdecode_lab.benchmarks.decoder import decoder_factories, prepare_synthetic_set
from fastdecode_lab.profiling import ITERATION_KERNEL, idle_gaps, per_iteration_lines, profile_pass
from nemo_fastdecode.apps.comparison import decode_all

DEFAULTS = {
    "preset": "rnnt-0.6b",
    "seconds": 120,
    "batch_size": 32,
    "max_symbols": 10,
    "strategies": [
        "fast_greedy_frame_loop[full_graph]",
        "fast_greedy_label_loop[full_graph]",
        "fast_greedy_label_loop[full_graph,unfused]",
        "fast_greedy_label_loop[eager]",
    ],
    "top": 12,
    "out": None,
}


def main(argv: list[str]) -> None:
    cfg = OmegaConf.merge(OmegaConf.create(DEFAULTS), OmegaConf.from_dotlist(argv))
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model, _, batches, _, rate = prepare_synthetic_set(cfg.preset, cfg.seconds, cfg.batch_size, cfg.max_symbols)
    factories = decoder_factories(model, cfg.max_symbols)
    lines = [
        f"# Decoder profile on {torch.cuda.get_device_name(0)}",
        "",
        f"Command: `python benchmarks/profile_decoder.py {' '.join(argv)}`",
        "",
        f"{cfg.preset}, {cfg.seconds} s of audio, batch {cfg.batch_size}, {len(batches)} batches, {rate:.3f} tokens/frame.",
    ]
    walls: dict[str, float] = {}
    iteration_kernels: dict[str, tuple[int, int, float]] = {}  # no_while_graph rows: (iterations, launches, us)
    for name in cfg.strategies:
        decoder = factories[name]()
        decode_all(decoder, batches)  # warm-up: capture graphs, compile kernels
        torch.cuda.synchronize()
        start = time.perf_counter()
        decode_all(decoder, batches)
        torch.cuda.synchronize()
        unprofiled = time.perf_counter() - start
        timeline: list[tuple[str, float, float]] = []
        wall, kernels = profile_pass(decoder, batches, timeline)
        gaps = idle_gaps(timeline)
        busy = sum(total for _, total in kernels.values()) * 1e-6
        launches = sum(count for count, _ in kernels.values())
        walls[name] = unprofiled
        iterations = kernels.get(ITERATION_KERNEL, (0, 0.0))[0]
        if "[no_while_graph" in name and iterations:
            iteration_kernels[name] = (iterations, launches, busy * 1e6)
        lines += [
            "",
            f"## {name}",
            "",
            f"wall {unprofiled:.3f} s (profiled {wall:.3f} s); kernel time {busy:.3f} s = {busy / wall:.0%} GPU busy; "
            f"{launches} kernels, {1e6 * busy / max(launches, 1):.1f} us each on average",
            "",
            f"timeline: busy {gaps.busy_us / 1e3:.1f} ms; idle between kernels (gaps < 50 us) "
            f"{gaps.short_gaps_us / 1e3:.1f} ms over {gaps.short_gaps} gaps; longer idle {gaps.long_gaps_us / 1e3:.1f} "
            "ms. Most idle time follows: "
            + "; ".join(f"`{kernel[:60]}` {total / 1e3:.1f} ms ({count})" for kernel, total, count in gaps.before[:5]),
            "",
            "| kernel | count | total ms | mean us |",
            "|---|---|---|---|",
        ]
        for kernel, (count, total) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[: cfg.top]:
            lines.append(f"| `{kernel}` | {count} | {total / 1e3:.1f} | {total / count:.1f} |")
    lines += per_iteration_lines(walls, iteration_kernels)
    report = "\n".join(lines) + "\n"
    print(report)
    if cfg.out:
        with open(cfg.out, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main(sys.argv[1:])
