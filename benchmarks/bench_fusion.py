"""Benchmark fast_greedy / fast_beam against NeMo's greedy_batch / malsd_batch with n-gram LM and boosting-tree fusion.

Options: ``configs/bench_fusion.yaml`` (``fastdecode_lab.benchmarks.fusion.FusionBenchmarkConfig``).

    python benchmarks/bench_fusion.py                            # GPU: rnnt-0.6b and tdt-0.6b, 1 hour, batch 32, beam 4
    python benchmarks/bench_fusion.py models=[tdt-0.6b] total_seconds=600 families=[beam]
    python benchmarks/bench_fusion.py                            # CPU: tiny models, a few seconds (a smoke test)
"""

from __future__ import annotations

import os
import sys

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

import nemo_fastdecode  # noqa: F401  (registers the strategies)
from fastdecode_lab.benchmarks.fusion import FusionBenchmarkConfig, benchmark_fusion, write_fusion_reports


@hydra.main(config_path="../configs", config_name="bench_fusion", version_base=None)
def main(cfg: DictConfig) -> None:
    schema = OmegaConf.structured(FusionBenchmarkConfig)
    cfg = FusionBenchmarkConfig(**OmegaConf.to_container(OmegaConf.merge(schema, cfg)))
    cuda = torch.cuda.is_available()
    models = cfg.models or (["rnnt-0.6b", "tdt-0.6b"] if cuda else ["tiny-rnnt", "tiny-tdt"])
    total_seconds = cfg.total_seconds or (3600.0 if cuda else 12.0)
    if not cuda:
        print(
            f"No CUDA GPU: a CPU smoke test ({', '.join(models)}, {total_seconds:g} s); the timings say nothing "
            "about GPU decoding."
        )
    torch.backends.cuda.matmul.allow_tf32 = False  # exactness is decided in fp32
    torch.backends.cudnn.allow_tf32 = False
    encoder_dtype = torch.bfloat16 if cuda else None
    reports = [benchmark_fusion(preset, total_seconds, cfg, encoder_dtype=encoder_dtype) for preset in models]
    os.makedirs(cfg.out_dir, exist_ok=True)
    command = "python " + " ".join(sys.argv)
    gpu = torch.cuda.get_device_name(0).replace(" ", "-") if cuda else "cpu"
    name = f"fusion_{'-'.join(models)}_{gpu}"
    stem = os.path.join(cfg.out_dir, f"{name}_{cfg.date}" if cfg.date else name)
    print(write_fusion_reports(reports, command, stem + ".json", stem + ".md"))


if __name__ == "__main__":
    main()
