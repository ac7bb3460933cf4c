"""Exact greedy decoding: frame looping and label looping (RNN-T, TDT), eager or as CUDA graphs."""

from nemo_fastdecode.greedy.frame_loop import FrameLoopGreedy
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer
from nemo_fastdecode.greedy.label_loop import LabelLoopGreedy

__all__ = ["FastGreedyBatchedInfer", "FrameLoopGreedy", "LabelLoopGreedy"]
