"""Context managers around NeMo calls: every submodule in eval mode, NeMo's logging quiet."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """Put every submodule in eval mode, then restore each one's own training flag.

    Needed because NeMo's ``transcribe()`` leaves the encoder, decoder and joint in train mode
    (it unfreezes them with ``module.train()`` on exit), which would turn dropout on.
    """
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in flags:
            m.training = training


@contextlib.contextmanager
def quiet_nemo() -> Iterator[None]:
    from nemo.utils import logging as nemo_logging

    with nemo_logging.temp_verbosity(nemo_logging.ERROR):
        yield
