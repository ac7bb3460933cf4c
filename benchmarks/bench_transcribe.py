"""Benchmark ``model.transcribe`` end to end: NeMo as throughput leaderboards run it (files sorted longest-first,
batch 128 and its best batch, bf16) beside ``fast_greedy`` on the offline path, in fp32 and bf16, on two calibrations.

Options: ``configs/bench_transcribe.yaml`` (``fastdecode_lab.configs.TranscribeBenchmarkConfig``).

    python benchmarks/bench_transcribe.py                          # GPU: rnnt-0.6b and tdt-0.6b, 0.5 h of files
    python benchmarks/bench_transcribe.py models=[tdt-0.6b] calibrations=[0.3] precisions=[bf16_autocast]  # quick
    python benchmarks/bench_transcribe.py rows=[nemo_beam_sorted_best,fast_beam+offline]  # beam search, 4 beams
    python benchmarks/bench_transcribe.py                          # CPU: tiny-rnnt, 10 s (a smoke test)
"""

from __future__ import annotations

import os
import sys

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

import nemo_fastdecode  # noqa: F401  (registers the strategies)
from fastdecode_lab.benchmarks.transcribe import benchmark_transcribe, write_transcribe_reports
from fastdecode_lab.configs import TranscribeBenchmarkConfig


@hydra.main(config_path="../configs", config_name="bench_transcribe", version_base=None)
def main(cfg: DictConfig) -> None:
    schema = OmegaConf.structured(TranscribeBenchmarkConfig)
    cfg = TranscribeBenchmarkConfig(**OmegaConf.to_container(OmegaConf.merge(schema, cfg)))
    cuda = torch.cuda.is_available()
    models = cfg.models or (["rnnt-0.6b", "tdt-0.6b"] if cuda else ["tiny-rnnt"])
    total_seconds = cfg.total_seconds or (1800.0 if cuda else 10.0)
    if not cuda:
        print(f"No CUDA GPU: a CPU smoke test ({', '.join(models)}, {total_seconds:g} s); the timings mean nothing.")
    new_process = cuda if cfg.first_call_new_process is None else cfg.first_call_new_process
    reports = [
        benchmark_transcribe(
            preset,
            total_seconds,
            batch_size=cfg.batch_size,
            repeats=cfg.repeats,
            calibration=calibration,
            precisions=cfg.precisions,
            rows=cfg.rows,
            nemo_batch_sizes=cfg.nemo_batch_sizes,
            seed=cfg.seed,
            # one test set per model is enough for a first call (it is the code path's, not the emissions')
            first_call_new_process=new_process and calibration == cfg.calibrations[0],
            new_processes=cfg.new_processes,
        )
        for preset in models
        for calibration in cfg.calibrations
    ]
    os.makedirs(cfg.out_dir, exist_ok=True)
    gpu = torch.cuda.get_device_name(0).split()[1] if cuda else "cpu"
    # one file per set of models: runs of one model each into one folder keep their own results
    stem = os.path.join(cfg.out_dir, f"transcribe_{'-'.join(models)}_{gpu}" + (f"_{cfg.date}" if cfg.date else ""))
    command = "python benchmarks/bench_transcribe.py " + " ".join(sys.argv[1:])
    print(write_transcribe_reports(reports, command.strip(), stem + ".json", stem + ".md"))


if __name__ == "__main__":
    main()
