"""EXPERIMENT (eighth session): scripts/benchmark.py with lstm_step.CELL_SPLIT_K set, for A/B runs in separate
processes. python benchmarks/experiments/benchmark_cell_split.py SPLIT [benchmark overrides...]"""

import runpy
import sys

import nemo_fastdecode.kernels.lstm_step as lstm_step

lstm_step.CELL_SPLIT_K = int(sys.argv[1])
sys.argv = ["scripts/benchmark.py", *sys.argv[2:]]
runpy.run_path("scripts/benchmark.py", run_name="__main__")
