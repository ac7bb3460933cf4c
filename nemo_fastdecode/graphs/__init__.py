"""CUDA graph helpers: mode choice, conditional WHILE nodes, and the two-level loop runner."""

from nemo_fastdecode.graphs.modes import GraphMode, choose_graph_mode
from nemo_fastdecode.graphs.two_level_loop import LoopPhases, TwoLevelLoop

__all__ = ["GraphMode", "LoopPhases", "TwoLevelLoop", "choose_graph_mode"]
