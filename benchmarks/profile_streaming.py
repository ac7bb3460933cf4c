"""Where a streaming step's time goes on the GPU: the kernels of N streams stepping together (ours only).

python benchmarks/profile_streaming.py                                   # 17 x 512 hybrid, [70, 1], 256 of 1024 slots
python benchmarks/profile_streaming.py config=streaming_rnnt_0.6b streams=128 top=30 fast_math=true
python benchmarks/profile_streaming.py encoder_matmul=tf32x3                # the opt-in 3xTF32 encoder GEMMs

Builds the model and streams as ``scripts/streaming.py --config-name <config>`` does, warms our path up, then
profiles ``repeats`` fixed-batch steps (torch.profiler/CUPTI) and prints the kernels by total GPU time, then (GPU)
the timeline's busy time, its idle gaps between kernels and the kernels they follow.
This is how the per-step window copy of the attention caches was found (replaced by ring buffers).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from fastdecode_lab import profiling as comparison
from fastdecode_lab import streaming_sim as simulation

DEFAULTS = {"config": "streaming_hybrid_17x512", "streams": 256, "slots": 1024, "repeats": 3, "top": 25}
CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "streaming"
SHORT_GAP_US = 50.0  # idle stretches shorter than this are launch gaps between a step's kernels


def main(argv: list[str]) -> None:
    options, cfg, setup, plans = simulation.compose_streams(CONFIGS, DEFAULTS, argv)
    path = simulation.fast_path(
        setup.model, options.slots, setup.dtype, cfg.use_cuda_graphs, cfg.fast_math, cfg.encoder_matmul,
        cfg.capture_decoder_step,
    )  # fmt: skip
    warm = simulation.time_fixed_steps(path, plans, options.streams, options.repeats, setup.device).ms
    activities = [torch.profiler.ProfilerActivity.CPU]
    if setup.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profile = torch.profiler.profile(activities=activities)
    step_ms = simulation.time_fixed_steps(path, plans, options.streams, options.repeats, setup.device, profile).ms
    sort_by = "cuda_time_total" if setup.device.type == "cuda" else "cpu_time_total"
    print(f"{path.name}: {options.streams} streams stepping together, step {warm:.2f} ms ({step_ms:.2f} ms profiled)")
    print(f"(the profile holds {options.repeats} such steps only: divide its totals by {options.repeats})")
    print(profile.key_averages().table(sort_by=sort_by, row_limit=options.top, max_name_column_width=90))
    if setup.device.type == "cuda":
        print_idle_gaps(comparison.kernel_intervals(profile), options.repeats)


def print_idle_gaps(kernels: list[tuple[str, float, float]], steps: int) -> None:
    """The GPU's busy and idle time per step, and the kernels after which the graph waits longest."""
    gaps = comparison.idle_gaps(kernels, short_us=SHORT_GAP_US)
    print(
        f"GPU timeline per step: busy {gaps.busy_us / steps / 1e3:.3f} ms; idle between kernels (gaps < "
        f"{SHORT_GAP_US:.0f} us) {gaps.short_gaps_us / steps / 1e3:.3f} ms over {gaps.short_gaps / steps:.0f} gaps; "
        f"longer idle (host work, synchronisation) {gaps.long_gaps_us / steps / 1e3:.3f} ms"
    )
    print("kernels followed by the most idle time (per step: us, gaps):")
    for name, total, count in gaps.before:
        print(f"  {total / steps:8.1f} us {count / steps:6.1f}  {name[:100]}")
    print("longer idle stretches, by the kernels around them (per step: us, stretches). Kernels inside conditional")
    print("WHILE nodes are not seen: a greedy loop's body shows as idle around its graph. Host gaps may read larger")
    print("than unprofiled (a 0.5 ms gap before the encoder graph was not in unprofiled steps): the breakdown script")
    print("(benchmarks/streaming_step_breakdown.py) times the phases without the profiler:")
    for before, after, total, count in gaps.long_between:
        print(f"  {total / steps:8.1f} us {count / steps:6.1f}  {before[:60]}  ->  {after[:60]}")


if __name__ == "__main__":
    main(sys.argv[1:])
