"""Graph execution modes and the one place that chooses between them."""

from __future__ import annotations

import enum
import logging

import torch

from nemo_fastdecode.graphs.cuda_api import while_nodes_unavailable_reason

logger = logging.getLogger("nemo_fastdecode")


class GraphMode(str, enum.Enum):
    """How a decoding loop runs.

    FULL_GRAPH: one CUDA graph, loops are conditional WHILE nodes (the GPU never waits for the CPU).
    NO_WHILE_GRAPH: each loop phase is a CUDA graph; the host reads the loop flags between replays.
    EAGER: plain PyTorch (CPU, or graphs switched off).
    """

    FULL_GRAPH = "full_graph"
    NO_WHILE_GRAPH = "no_while_graph"
    EAGER = "eager"

    @classmethod
    def parse(cls, value: str | GraphMode | None) -> GraphMode | None:
        """``None``/"auto" mean choose automatically; anything else must name a mode."""
        if value is None or isinstance(value, GraphMode):
            return value
        if value == "auto":
            return None
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(["auto"] + [m.value for m in cls])
            raise ValueError(f"Unknown graph mode {value!r}; valid modes: {valid}") from None


_logged_choices: set[tuple] = set()


def choose_graph_mode(device: torch.device, use_cuda_graphs: bool, forced: GraphMode | None) -> GraphMode:
    """Pick the fastest mode that works on ``device``; logs the choice and the reason once per situation."""
    if forced is not None:
        mode, reason = forced, "forced"
        if forced is not GraphMode.EAGER and device.type != "cuda":
            raise ValueError(f"graph mode {forced.value!r} needs a CUDA device, got {device}")
    elif device.type != "cuda":
        mode, reason = GraphMode.EAGER, f"device is {device.type}"
    elif not use_cuda_graphs:
        mode, reason = GraphMode.EAGER, "use_cuda_graph_decoder=False"
    else:
        unavailable = while_nodes_unavailable_reason(device)
        mode = GraphMode.NO_WHILE_GRAPH if unavailable else GraphMode.FULL_GRAPH
        reason = unavailable or "conditional WHILE nodes available"
    key = (mode, reason, device.type)
    if key not in _logged_choices:
        _logged_choices.add(key)
        logger.info("nemo_fastdecode: decoding with graph mode %s (%s)", mode.value, reason)
    return mode
