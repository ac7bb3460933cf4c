"""Where the streaming audio front end's time goes: ``append`` and ``features`` with N streams each pushing one chunk
period of int16 bytes (as a socket gives them), timed between synchronisations, then torch.profiler over a few cycles.
``append`` packs the pushes into the front end's own inbox first (the engine's pushes are packed as they arrive).

python benchmarks/experiments/frontend_profile.py --model hybrid-17x512-streaming --streams 1 1024
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

import fastdecode_lab.models  # noqa: F401  (synthetic presets as model names)
from nemo_fastdecode.apps.models import load_model
from nemo_fastdecode.streaming.frontend import AudioFrontEnd


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-streaming")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--push-seconds", type=float, default=0.16)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rows", type=int, default=25)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = load_model(args.model, device=device, vocab="bpe")
    rng = np.random.default_rng(0)
    for n in args.streams:
        front = AudioFrontEnd(model.preprocessor, n, device, max_push_seconds=2 * args.push_seconds)
        for slot in range(n):
            front.open(slot)
        samples = round(args.push_seconds * front.settings.sample_rate)
        pushes = {s: (rng.standard_normal(samples) * 3000).astype(np.int16).tobytes() for s in range(n)}
        for _ in range(3):
            front.append(pushes)
            front.features()
        spent = {"append": [], "features": []}
        for _ in range(args.repeats):
            for name, call in (("append", lambda: front.append(pushes)), ("features", front.features)):
                _sync(device)
                started = time.perf_counter()
                call()
                _sync(device)
                spent[name].append(time.perf_counter() - started)
        medians = ", ".join(f"{k} {1e3 * float(np.median(v)):.3f} ms" for k, v in spent.items())
        print(f"== {n} streams, {samples} samples each per call: {medians} (median of {args.repeats})")
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(5):
                front.append(pushes)
                front.features()
            _sync(device)
        print("-- 5 cycles of append + features, operators by host time")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
