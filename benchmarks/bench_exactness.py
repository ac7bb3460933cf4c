"""Exactness tables with the speed beside them: ``fast_greedy`` / ``fast_beam`` against NeMo's ``greedy_batch`` /
``malsd_batch`` in their default configurations, through ``model.transcribe`` and NeMo's decoding API, in fp32 and
bf16 (issue 47).

Options: ``configs/bench_exactness.yaml`` (``fastdecode_lab.configs.ExactnessBenchmarkConfig``).

    python benchmarks/bench_exactness.py                                       # GPU: rnnt-0.6b, tdt-0.6b; 0.3, trained
    python benchmarks/bench_exactness.py models=[tdt-0.6b] calibrations=[trained] date=2026-11-29   # one set
    python benchmarks/bench_exactness.py models=[rnnt-0.6b] precisions=[fp32] paths=[decoding_api]  # a subset of rows
    python benchmarks/bench_exactness.py                                       # CPU: tiny-rnnt, tiny-tdt (a smoke test)

The JSON and Markdown are rewritten after every row, so that a run cut short keeps the rows it finished.
"""

from __future__ import annotations

import os
import sys
import time

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

import nemo_fastdecode  # noqa: F401  (registers the strategies)
from fastdecode_lab.benchmarks.exactness import ExactnessSet, benchmark_exactness, write_exactness_reports
from fastdecode_lab.configs import ExactnessBenchmarkConfig
from nemo_fastdecode.apps.environment import environment


@hydra.main(config_path="../configs", config_name="bench_exactness", version_base=None)
def main(cfg: DictConfig) -> None:
    started = time.perf_counter()
    schema = OmegaConf.structured(ExactnessBenchmarkConfig)
    cfg = ExactnessBenchmarkConfig(**OmegaConf.to_container(OmegaConf.merge(schema, cfg)))
    cuda = torch.cuda.is_available()
    models = cfg.models or (["rnnt-0.6b", "tdt-0.6b"] if cuda else ["tiny-rnnt", "tiny-tdt"])
    total_seconds = cfg.total_seconds or (1800.0 if cuda else 10.0)
    if not cuda:
        # tiny models are bound by per-op overhead: more threads on a small, busy CPU only spin (tests/conftest.py)
        torch.set_num_threads(1)
        print(
            f"No CUDA GPU: a CPU smoke test ({', '.join(models)}, {total_seconds:g} s, one thread); the timings mean "
            "nothing.",
            flush=True,
        )
    os.makedirs(cfg.out_dir, exist_ok=True)
    gpu = torch.cuda.get_device_name(0).split()[1] if cuda else "cpu"
    # runs of parts of the tables (a model, a calibration, some precisions) into one folder keep their own files
    parts = ["exactness", "-".join(models), cfg.subset_tag(), gpu, cfg.date or ""]
    stem = os.path.join(cfg.out_dir, "_".join(p for p in parts if p))
    command = ("python benchmarks/bench_exactness.py " + " ".join(sys.argv[1:])).strip()
    env, config = environment(), OmegaConf.to_container(OmegaConf.structured(cfg))
    files = (stem + ".json", stem + ".md")
    sets: list[ExactnessSet] = []

    def write(in_progress: ExactnessSet | None = None) -> str:
        """Both reports of the sets done (and of the one in progress); the Markdown."""
        return write_exactness_reports([*sets, *filter(None, [in_progress])], command, *files, env, config)

    for preset in models:
        for calibration in cfg.calibrations:
            options = cfg.run_options(repeats=3 if cuda else 1)
            # the reports are rewritten after every row: a run stopped at a time limit keeps what it finished
            sets.append(benchmark_exactness(preset, calibration, total_seconds, options, progress=write))
    print(write(), flush=True)
    print(f"Written {stem}.json and {stem}.md in {time.perf_counter() - started:.0f} s.", flush=True)


if __name__ == "__main__":
    main()
