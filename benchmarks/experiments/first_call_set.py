"""The first-call experiments' test set: the transcribe benchmark's synthetic model and files, from the command line.

``add_set_arguments(parser)`` adds ``--model``, ``--calibration``, ``--seconds`` and ``--batch-size``;
``synthetic_set(args, bf16)`` makes the :class:`~fastdecode_lab.benchmarks.transcribe.SyntheticSet` they name.
"""

from __future__ import annotations

import argparse

from fastdecode_lab.benchmarks.transcribe import SyntheticSet
from fastdecode_lab.synthetic import check_calibration


def add_set_arguments(parser: argparse.ArgumentParser, model: str) -> None:
    parser.add_argument("--model", default=model, help="a synthetic preset (rnnt-0.6b, tdt-0.6b, tiny-rnnt)")
    parser.add_argument("--calibration", default="trained", help="tokens per frame (a number) or 'trained'")
    parser.add_argument("--seconds", type=float, default=1800.0, help="total audio")
    parser.add_argument("--batch-size", type=int, default=32)


def synthetic_set(args: argparse.Namespace, bf16: bool) -> SyntheticSet:
    """The benchmark's set (``max_symbols`` 10, seed 0) for the parsed ``args``."""
    return SyntheticSet(args.model, args.seconds, args.batch_size, check_calibration(args.calibration), bf16, 10, 0)
