"""The GPU kernels of one streaming decoder step, with the greedy loop run eagerly so that every kernel is seen.

python benchmarks/profile_streaming_decoder.py                  # 256 streams, the fixed step's first later chunk
python benchmarks/profile_streaming_decoder.py fast_math=true
python benchmarks/profile_streaming_decoder.py config=streaming streams=2 slots=3   # any config, streams, slots

In the captured decoder the loop's body sits inside a conditional WHILE node, which CUPTI does not see. Here the
same streams step their first chunk, then one later chunk (the fixed step's first, in the random model's emission
burst) is decoded with graphs off under torch.profiler: the kernels' total GPU time per look of the loop is what
a captured iteration cannot go below; the rest of a captured iteration is launch latency between its nodes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from fastdecode_lab import streaming_sim as simulation
from nemo_fastdecode.streaming.transcriber import StreamingTranscriber

DEFAULTS = {"config": "streaming_hybrid_17x512", "streams": 256, "slots": 1024}
BENCHMARK = ["max_stream_seconds=4", "encoder_matmul=tf32x3"]  # as the streaming benchmark runs (overridable)
CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "streaming"


def main(argv: list[str]) -> None:
    options, cfg, setup, plans = simulation.compose_streams(CONFIGS, DEFAULTS, [*BENCHMARK, *argv])
    streamer = StreamingTranscriber(
        setup.model, options.slots, dtype=setup.dtype, use_cuda_graphs=False, fast_math=cfg.fast_math,
        encoder_matmul=cfg.encoder_matmul,
    )  # fmt: skip
    slots = [streamer.open() for _ in plans]
    streamer.step(slots, [plan.chunks[0] for plan in plans])
    activities = [torch.profiler.ProfilerActivity.CPU]
    if setup.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profile = torch.profiler.profile(activities=activities)
    decode = streamer.decoder.decode

    def profiled(*args, **kwargs):
        if setup.device.type == "cuda":
            torch.cuda.synchronize()
        with profile:
            decode(*args, **kwargs)
            if setup.device.type == "cuda":
                torch.cuda.synchronize()

    streamer.decoder.decode = profiled
    before = int(streamer.decoder.counts.sum())
    streamer.step(slots, simulation.fixed_step_chunks(plans, 0))
    tokens = int(streamer.decoder.counts.sum()) - before
    events = profile.key_averages()
    gpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(e.self_device_time_total for e in gpu)
    print(
        f"{options.streams} streams, fast_math={cfg.fast_math}: one decoder step, {tokens} tokens emitted, loop eager"
    )
    print(f"GPU kernels: {sum(e.count for e in gpu)} launches, {total_us / 1e3:.3f} ms in total")
    for e in sorted(gpu, key=lambda e: -e.self_device_time_total)[:20]:
        print(f"  {e.self_device_time_total:9.1f} us {e.count:5d}x  {e.key[:110]}")


if __name__ == "__main__":
    main(sys.argv[1:])
