"""Where the wall time of one streaming step goes (GPU): host packing, the encoder graph, the decoder.

python scripts/streaming_step_breakdown.py                       # 17 x 512 hybrid, tf32x3 encoder, 256 of 1024
python scripts/streaming_step_breakdown.py encoder_matmul=fp32   # any scripts/streaming.py override

Builds the model and 256 streams as ``scripts/streaming.py --config-name streaming_hybrid_17x512`` does, steps
their first chunk, then times (median of 20, synchronised) the whole ``StreamingTranscriber.step`` and its parts:
checking and packing the chunks on the host, the encoder bucket's copies + graph replay, the graph replay alone,
and the decoder. The profile (``scripts/profile_streaming.py``) sums kernel times; the difference from the replay
time here is the graph's idle time between kernels.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir

from nemo_fastdecode.streaming import simulation
from nemo_fastdecode.streaming.transcriber import StreamingTranscriber

STREAMS, SLOTS, REPEATS = 256, 1024, 20
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def median_ms(fn, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return 1e3 * float(np.median(times))


def main(argv: list[str]) -> None:
    overrides = ["max_stream_seconds=4", "encoder_matmul=tf32x3", *argv]
    with initialize_config_dir(str(CONFIGS), version_base=None):
        cfg = simulation.resolve_config(compose("streaming_hybrid_17x512", overrides=overrides))
    setup = simulation._setup(cfg, print)
    plans = simulation._plans(cfg, setup, STREAMS)
    streamer = StreamingTranscriber(
        setup.model, SLOTS, dtype=setup.dtype, use_cuda_graphs=True, encoder_matmul=cfg.encoder_matmul,
        capture_decoder_step=cfg.capture_decoder_step,
    )  # fmt: skip
    streamer.warm_up()
    slots = [streamer.open() for _ in plans]
    streamer.step(slots, [plan.chunks[0] for plan in plans])
    chunks = [plan.chunks[1] for plan in plans]

    def pack_on_host():
        streamer._batch_chunks(streamer._check_step_slots(slots), chunks)

    features, lengths = streamer._batch_chunks(slots, chunks)
    ids = torch.tensor(slots, dtype=torch.long)
    bucket = streamer.runner.prepare(streamer.runner.bucket(STREAMS))
    with torch.inference_mode():
        padded_ids, encoded, encoded_lengths = streamer.runner.run_padded(ids, features, lengths)
        rows = {
            "full step": lambda: streamer.step(slots, chunks),
            "host: check + pack chunks": pack_on_host,
            "encoder: copies + graph replay": lambda: streamer.runner.run_padded(ids, features, lengths),
            "encoder: graph replay only": bucket.graph.replay,
            "decoder": lambda: streamer.decoder.decode(slots, encoded, encoded_lengths, padded_ids),
        }
        print(
            f"{STREAMS} streams stepping together, encoder_matmul={cfg.encoder_matmul}, "
            f"capture_decoder_step={cfg.capture_decoder_step}, median of {REPEATS}:"
        )
        for name, fn in rows.items():
            print(f"  {name:34s} {median_ms(fn):8.3f} ms", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
