"""Host cost of one push applied by the server's engine thread: N open streams, network batches of N pushes of one
PCM16 piece each, applied as while a cycle steps (``EngineLoop._push_to_open_streams``), device work stubbed out.

python benchmarks/experiments/serve_push_cost.py --streams 1000 --bytes 2560
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import engine_cycle_breakdown as breakdown  # noqa: E402  (its stub of the device work)

import fastdecode_lab.models  # noqa: F401  (synthetic presets as model names)
from nemo_fastdecode.apps.models import load_model  # noqa: E402
from nemo_fastdecode.serve.engine_loop import EngineLoop, Push, PushBatch  # noqa: E402
from nemo_fastdecode.serve.metrics import ServerMetrics  # noqa: E402
from nemo_fastdecode.streaming import StreamingEngine, StreamOptions  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--bytes", type=int, default=2560, help="bytes per push (80 ms of 16 kHz PCM16: 2,560)")
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_model("tiny-streaming", device=torch.device("cpu"), vocab="bpe")
    engine = StreamingEngine(model, args.streams, att_context_size=[16, 1], use_cuda_graphs=False)
    breakdown.stub_device_work(engine, int(model.decoding.blank_id))
    loop = EngineLoop(engine, lambda deliveries: None, ServerMetrics())
    options, pcm, n = StreamOptions(), bytes(args.bytes), args.streams
    loop._apply(PushBatch.of([Push((c, 0), pcm, time.monotonic(), options) for c in range(n)]))  # opens the streams
    batches = [
        PushBatch.of([Push((c, 0), pcm, time.monotonic(), options) for c in range(n)]) for _ in range(args.batches)
    ]
    everything, unlimited = np.arange(n), np.full(n, 10**9)
    spent = 0.0
    for batch in batches:
        started = time.perf_counter()
        assert not loop._push_to_open_streams(batch)
        spent += time.perf_counter() - started
        engine.inbox.take(everything, unlimited)  # as a cycle would: the inbox does not grow
    print(f"{n} streams, {args.bytes}-byte pushes: {spent / (args.batches * n) * 1e6:.2f} us per push applied")


if __name__ == "__main__":
    main()
