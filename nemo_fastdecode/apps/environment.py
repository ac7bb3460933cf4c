"""The environment a measurement ran in: device, GPU, driver, library versions and the commit.

Every benchmark and simulation report carries this record, so that a table can be traced to what produced it.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path
from typing import Any

import torch


def environment(device: torch.device | str | None = None) -> dict[str, Any]:
    """Device, GPU name and driver, torch / CUDA / Triton / NeMo / Python versions, and the git commit.

    Args:
        device: the device measured on; ``None``: GPU 0 if there is one, else the CPU.

    Returns:
        A JSON-serialisable dict; fields that cannot be read here (no GPU, not a git checkout) are ``None``.
    """
    device = torch.device(device or ("cuda:0" if torch.cuda.is_available() else "cpu"))
    env: dict[str, Any] = {
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "driver": _driver_version() if device.type == "cuda" else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
        "nemo": _version("nemo"),
        "python": platform.python_version(),
        "commit": _commit(),
    }
    if device.type == "cpu":
        env["cpu_threads"] = torch.get_num_threads()
    return env


def report_header(title: str, command: str, env: dict[str, Any]) -> list[str]:
    """The first lines of a benchmark's Markdown report: its title, the exact command and the environment."""
    return [
        f"# {title}",
        "",
        f"Command: `{command}`",
        "",
        f"Environment: GPU {env['gpu']}, driver {env['driver']}, torch {env['torch']}, CUDA {env['cuda']}, "
        f"Triton {env['triton']}, NeMo {env['nemo']}, Python {env['python']}, commit {env['commit']}.",
        "",
    ]


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def _commit() -> str | None:
    """The checkout's commit (with ``-dirty`` when it has uncommitted changes), or ``None`` outside git."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}-dirty" if dirty else commit
