"""benchmarks/engine_cycle_breakdown.py on the CPU: every part of a poll is timed, and the finishing cycle ends every
stream (a diagnostic the streaming benchmarks' notes point to; it must keep running as the engine changes)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "engine_cycle_breakdown.py"
PARTS = [
    "inbox.take",
    "front.append_staged",
    "front.features",
    "queue.write",
    "queue.read",
    "step",
    "grew (device read)",
    "events",
    "rest",
]


@pytest.mark.parametrize("host_only", [False, True])
def test_breakdown_times_every_part_and_finishes_every_stream(host_only):
    # the device work at 24 kHz input (the front end resamples), the host's share at the model's rate
    rate = 16000 if host_only else 24000
    command = [sys.executable, str(SCRIPT), "--streams", "4", "--repeats", "2", "--input-rate", str(rate)]
    done = subprocess.run(command + (["--host-only"] if host_only else []), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    header = re.search(
        rf"== 4 streams at {rate} Hz on the cpu.*poll ([0-9.]+) ms.*?(\d+) partial events per cycle", done.stdout
    )
    assert header is not None, done.stdout
    assert float(header.group(1)) > 0
    for part in PARTS:
        assert re.search(rf"^\s+{re.escape(part)}\s+-?[0-9.]+ ms$", done.stdout, re.MULTILINE), part
    assert "finishing every stream" in done.stdout and "4 final events" in done.stdout
