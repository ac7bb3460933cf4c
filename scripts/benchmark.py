"""Benchmark fast_greedy against NeMo's greedy strategies on the same encoder outputs (needs a GPU).

python scripts/benchmark.py                                   # rnnt-0.6b and tdt-0.6b, 1 hour, batch 32
python scripts/benchmark.py models=[tdt-0.6b] total_seconds=600 out_dir=/tmp/bench
"""

from __future__ import annotations

import os
import sys

import hydra
import torch
from omegaconf import DictConfig

import nemo_fastdecode  # noqa: F401  (registers the strategies)
from nemo_fastdecode.benchmark import benchmark_model, write_reports


@hydra.main(config_path="../configs", config_name="benchmark", version_base=None)
def main(cfg: DictConfig) -> None:
    if not torch.cuda.is_available():
        print("benchmark.py needs a CUDA GPU (the comparison is about GPU decoding); nothing to do here.")
        return
    torch.backends.cuda.matmul.allow_tf32 = False  # exactness is decided in fp32
    torch.backends.cudnn.allow_tf32 = False
    reports = [
        benchmark_model(
            preset,
            total_seconds=cfg.total_seconds,
            batch_size=cfg.batch_size,
            repeats=cfg.repeats,
            max_symbols=cfg.max_symbols,
            strategies=list(cfg.strategies) if cfg.strategies else None,
            seed=cfg.seed,
            profile_busy=cfg.profile_busy,
            experimental=cfg.experimental,
        )
        for preset in cfg.models
    ]
    os.makedirs(cfg.out_dir, exist_ok=True)
    command = "python " + " ".join(sys.argv)
    gpu = torch.cuda.get_device_name(0).replace(" ", "-")
    stem = os.path.join(cfg.out_dir, f"greedy_{gpu}_{cfg.date}" if cfg.date else f"greedy_{gpu}")
    print(write_reports(reports, command, stem + ".json", stem + ".md"))


if __name__ == "__main__":
    main()
