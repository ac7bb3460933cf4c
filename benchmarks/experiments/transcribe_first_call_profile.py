"""Where the offline path's first ``model.transcribe`` call spends the time a later call does not: a host profile.

python benchmarks/experiments/transcribe_first_call_profile.py --model rnnt-0.6b --calibration trained

Builds the benchmark's synthetic model and files (:func:`fastdecode_lab.benchmarks.transcribe.prepared`: a
short warm-up ``transcribe`` of other audio with NeMo's decoder first), switches to ``fast_greedy`` with the offline
path, then times and profiles (cProfile, the calling thread) the first call and ``--later`` more. Run it twice on one
machine: the first run fills Triton's on-disk cache (its C launchers and kernels), the second profiles what every
later process sees, which is the benchmark's "first call in a new process". Prints each call's seconds and the
functions with the largest cumulative time. ``--stages``: each call's seconds per stage as well (the benchmark's
:func:`~fastdecode_lab.benchmarks.transcribe.stage_timer`, the GPU synchronised around each stage) and the
seconds spent sizing the decoder's captured graphs for the call's plan (``_reserve_decoder``).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import time

import torch
from first_call_set import add_set_arguments, synthetic_set

import nemo_fastdecode  # noqa: F401  (registers the strategies)
from fastdecode_lab.benchmarks import transcribe as bench
from nemo_fastdecode.apps.models import apply_decoding
from nemo_fastdecode.apps.timing import synchronize
from nemo_fastdecode.offline import enable_fast_transcribe, fast_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_set_arguments(parser, model="rnnt-0.6b")
    parser.add_argument("--later", type=int, default=2, help="later calls profiled after the first")
    parser.add_argument("--top", type=int, default=40, help="functions listed per call")
    parser.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    parser.add_argument("--stages", action="store_true", help="also time each call per stage")
    parser.add_argument(
        "--torch-profiler",
        action="store_true",
        help="profile with torch.profiler instead of cProfile (CUDA API calls: allocation, module loads, capture)",
    )
    args = parser.parse_args()
    test_set = synthetic_set(args, bf16=not args.fp32)
    with bench.prepared(test_set) as (model, paths, _):
        device = next(model.parameters()).device
        # the strategy switch and the offline path, outside the timing as in the benchmark (printed apart)
        synchronize(device)
        start = time.perf_counter()
        apply_decoding(model, {"strategy": "fast_greedy", "greedy": {"max_symbols": test_set.max_symbols}})
        enable_fast_transcribe(model)
        synchronize(device)
        warm_up = getattr(model.decoding.decoding, "warm_up_seconds", None)
        print(
            f"=== {args.model} strategy switch: {time.perf_counter() - start:.3f} s (the decoder's warm-up in it: "
            f"{'none' if warm_up is None else f'{warm_up:.3f} s'})",
            flush=True,
        )
        reserve = fast_path._reserve_decoder
        reserve_seconds: list[float] = []

        def timed_reserve(*reserve_args):
            synchronize(device)
            reserve_start = time.perf_counter()
            reserve(*reserve_args)
            synchronize(device)
            reserve_seconds.append(time.perf_counter() - reserve_start)

        fast_path._reserve_decoder = timed_reserve
        for call in range(1 + args.later):
            profile = TorchProfile() if args.torch_profiler else cProfile.Profile()
            reserve_seconds.clear()
            stage_timer = bench.stage_timer(model, device) if args.stages else contextlib.nullcontext({})
            with stage_timer as stages:
                synchronize(device)
                start = time.perf_counter()
                profile.enable()
                bench._transcribe(model, paths, args.batch_size, "bf16_autocast" if test_set.bf16 else "fp32")
                synchronize(device)
                profile.disable()
                seconds = time.perf_counter() - start
            label = "first call" if call == 0 else f"later call {call}"
            split = ", ".join(f"{k} {v:.3f} s" for k, v in stages.items())
            print(
                f"=== {args.model} {label}: {seconds:.3f} s (sizing the decoder: {sum(reserve_seconds):.3f} s"
                f"{'; ' + split if split else ''})",
                flush=True,
            )
            if isinstance(profile, TorchProfile):
                print(profile.table(args.top), flush=True)
            else:
                out = io.StringIO()
                pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(args.top)
                print(out.getvalue(), flush=True)


class TorchProfile:
    """torch.profiler with cProfile's enable/disable: host ops and CUDA runtime calls, by self host time."""

    def __init__(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        self.profiler = torch.profiler.profile(activities=activities)

    def enable(self) -> None:
        self.profiler.__enter__()

    def disable(self) -> None:
        self.profiler.__exit__(None, None, None)

    def table(self, top: int) -> str:
        return self.profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


if __name__ == "__main__":
    main()
