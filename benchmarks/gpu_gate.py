"""The GPU gate: run ``pytest -m gpu tests`` on a CUDA host and write its summary for ``benchmarks/results/latest``.

CI has no GPU, so this is what keeps the GPU paths honest: whoever changes code that runs on a GPU runs it at their
final commit and commits the summary it writes (``gpu-tests.md``: commit, GPU, driver, library versions, passed /
failed / skipped / xfailed counts and the id of every failure).

    python benchmarks/gpu_gate.py --commit $(git rev-parse --short HEAD) --out benchmarks/results/latest
    python benchmarks/gpu_gate.py --commit abc1234 --out $OUT -- tests/test_greedy_gpu.py   # a subset (said so)

Exit status: pytest's (0 when every GPU test passed or is an expected failure).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class GateSummary:
    """The outcome of one ``pytest -m gpu`` run, read from its JUnit XML."""

    passed: int = 0
    failed: list[str] = field(default_factory=list)  # test ids (errors included)
    skipped: int = 0
    xfailed: list[str] = field(default_factory=list)
    seconds: float = 0.0


def read_junit(path: Path) -> GateSummary:
    """Counts and ids from pytest's ``--junitxml`` file (an xfail is a skip whose message starts with xfail)."""
    summary = GateSummary()
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            summary.passed += 1
        elif outcome.tag in ("failure", "error"):
            summary.failed.append(test_id)
        elif (outcome.get("type") or "").endswith("xfail") or (outcome.get("message") or "").startswith("xfail"):
            summary.xfailed.append(test_id)
        else:
            summary.skipped += 1
    return summary


def read_verbose_log(path: Path) -> GateSummary:
    """Counts and ids from ``pytest -v`` lines (``<id> PASSED``, ``FAILED``, ``SKIPPED``, ``XFAIL``, ``ERROR``)."""
    summary = GateSummary()
    for line in path.read_text(errors="replace").splitlines():
        test_id, _, rest = line.partition(" ")
        outcome = rest.split(" ", 1)[0]
        if "::" not in test_id:
            continue
        if outcome == "PASSED":
            summary.passed += 1
        elif outcome in ("FAILED", "ERROR"):
            summary.failed.append(test_id)
        elif outcome == "SKIPPED":
            summary.skipped += 1
        elif outcome == "XFAIL":
            summary.xfailed.append(test_id)
    return summary


def environment() -> dict[str, str]:
    """GPU, driver and library versions of this host."""
    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("triton", "nemo"):
        try:
            versions[name] = __import__(name).__version__
        except Exception as error:  # reported, not fatal: the gate still runs
            versions[name] = f"not importable ({type(error).__name__})"
    versions["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    try:
        versions["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        versions["driver"] = "unknown"
    return versions


def write_summary(path: Path, summary: GateSummary, commit: str, command: str, env: dict[str, str]) -> None:
    lines = [
        "# GPU gate: `pytest -m gpu tests`",
        "",
        f"- commit: `{commit}`",
        f"- date: {datetime.date.today().isoformat()}",
        f"- GPU: {env['gpu']}, driver {env['driver']}",
        f"- torch {env['torch']}, Triton {env['triton']}, NeMo {env['nemo']}, Python {env['python']}",
        f"- command: `{command}`",
        f"- wall time: {summary.seconds:.0f} s",
        "",
        "| passed | failed | skipped | xfailed |",
        "|---|---|---|---|",
        f"| {summary.passed} | {len(summary.failed)} | {summary.skipped} | {len(summary.xfailed)} |",
        "",
    ]
    if summary.failed:
        lines += ["## Failures", "", *(f"- `{test_id}`" for test_id in summary.failed), ""]
    if summary.xfailed:
        lines += ["## Expected failures (each marked xfail with its reason)", ""]
        lines += [f"- `{test_id}`" for test_id in summary.xfailed] + [""]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", required=True, help="the commit the tests run at (the host may have no .git)")
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu-tests.md and the pytest log")
    parser.add_argument("paths", nargs="*", default=["tests"], help="test paths (default: tests)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    junit = args.out / "gpu-tests.xml"
    # -v: every test's id and outcome in the log, also where the process dies before pytest's summary
    pytest_args = ["-m", "gpu", *args.paths, "-v", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    command = "python -m pytest " + " ".join(a for a in pytest_args if not a.startswith("--junitxml"))
    started = time.perf_counter()
    with open(args.out / "gpu-tests.log", "w") as log:
        status = subprocess.run([sys.executable, "-m", "pytest", *pytest_args], stdout=log, stderr=subprocess.STDOUT)
    if junit.exists():
        summary = read_junit(junit)
    else:  # the process died (an abort) before writing its report: what the verbose log shows, and the death
        summary = read_verbose_log(args.out / "gpu-tests.log")
        summary.failed.append(f"pytest exited with status {status.returncode} before its report (see gpu-tests.log)")
    summary.seconds = time.perf_counter() - started
    write_summary(args.out / "gpu-tests.md", summary, args.commit, command, environment())
    print((args.out / "gpu-tests.md").read_text())
    return status.returncode


if __name__ == "__main__":
    sys.exit(main())
