"""Streaming audio in, partial transcripts out: our StreamingEngine against NeMo 3.0's CacheAwareRNNTPipeline.

The same audio through both, at each stream count: chunk latency on a real-time clock, cycle and step times with all
streams together, real-time capacity, transcripts against NeMo's streaming of each file alone. The logic lives in
``fastdecode_lab.benchmarks.stream_audio``; results in ``outputs/stream_audio_bench/``.

    # smoke run on a CPU: tiny synthetic model, 2 and 4 streams, a few seconds
    python benchmarks/stream_audio_bench.py

    # on a GPU: the 17 x 512 hybrid and the 0.6B RNN-T at [70, 1] (160 ms), 64 ... 5,000 streams
    python benchmarks/stream_audio_bench.py --config-name stream_audio_bench_hybrid_17x512 tag=h200_2026-11-24
    python benchmarks/stream_audio_bench.py --config-name stream_audio_bench_rnnt_0.6b tag=h200_2026-11-24

    # your model and audio
    python benchmarks/stream_audio_bench.py model=/path/model.nemo dataset_manifest=test.json stream_counts=[64,256]
"""

import shlex
import sys

from nemo.core.config import hydra_runner
from omegaconf import DictConfig

from fastdecode_lab.benchmarks.stream_audio import run

COMMAND = " ".join(shlex.quote(arg) for arg in ["python", *sys.argv])  # before Hydra reads the arguments


@hydra_runner(config_path="../configs", config_name="stream_audio_bench")
def main(cfg: DictConfig) -> None:
    run(cfg, command=COMMAND)


if __name__ == "__main__":
    main()
