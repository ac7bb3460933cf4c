"""Benchmark fast_greedy / fast_beam against NeMo's strategies on the same encoder outputs (on a GPU).

Options: ``configs/benchmark.yaml`` (``fastdecode_lab.configs.BenchmarkConfig``).

    python benchmarks/benchmark.py                               # GPU: rnnt-0.6b and tdt-0.6b, 1 hour, batch 32
    python benchmarks/benchmark.py models=[tdt-0.6b] total_seconds=600 out_dir=/tmp/bench
    python benchmarks/benchmark.py calibrations=[trained]        # synthetic models that emit like the trained ones
    python benchmarks/benchmark.py 'strategies=["nemo_malsd_batch+graphs","fast_beam[full_graph]"]' beam_size=4
    python benchmarks/benchmark.py                               # CPU: tiny models, eager rows (a smoke test)
"""

from __future__ import annotations

import os
import sys

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

import nemo_fastdecode  # noqa: F401  (registers the strategies)
from fastdecode_lab.benchmarks.decoder import BEAM_STRATEGIES, benchmark_model, write_reports
from fastdecode_lab.configs import BenchmarkConfig


@hydra.main(config_path="../configs", config_name="benchmark", version_base=None)
def main(cfg: DictConfig) -> None:
    cfg = BenchmarkConfig(**OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(BenchmarkConfig), cfg)))
    cuda = torch.cuda.is_available()
    models = cfg.models or (["rnnt-0.6b", "tdt-0.6b"] if cuda else ["tiny-rnnt", "tiny-tdt"])
    total_seconds = cfg.total_seconds or (3600.0 if cuda else 20.0)
    if not cuda:
        print(
            f"No CUDA GPU: a CPU smoke test ({', '.join(models)}, {total_seconds:g} s); the timings say nothing "
            "about GPU decoding, and rows that need CUDA are skipped."
        )
    torch.backends.cuda.matmul.allow_tf32 = False  # exactness is decided in fp32
    torch.backends.cudnn.allow_tf32 = False
    reports = [
        benchmark_model(
            preset,
            total_seconds=total_seconds,
            batch_size=cfg.batch_size,
            repeats=cfg.repeats,
            baseline_repeats=cfg.baseline_repeats,
            max_symbols=cfg.max_symbols,
            strategies=list(cfg.strategies) if cfg.strategies else None,
            seed=cfg.seed,
            profile_busy=cfg.profile_busy,
            experimental=cfg.experimental,
            beam_size=cfg.beam_size,
            encoder_dtype=torch.bfloat16 if cuda else None,
            calibration=calibration,
        )
        for preset in models
        for calibration in cfg.calibrations
    ]
    os.makedirs(cfg.out_dir, exist_ok=True)
    command = "python " + " ".join(sys.argv)
    gpu = torch.cuda.get_device_name(0).replace(" ", "-") if cuda else "cpu"
    kind = "beam" if any(name in BEAM_STRATEGIES for name in cfg.strategies or ()) else "greedy"
    stem = os.path.join(cfg.out_dir, f"{kind}_{gpu}_{cfg.date}" if cfg.date else f"{kind}_{gpu}")
    print(write_reports(reports, command, stem + ".json", stem + ".md"))


if __name__ == "__main__":
    main()
