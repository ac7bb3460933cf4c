"""Exact batched beam search (NeMo's modified ALSD, RNN-T and TDT) on the fused beam-step kernel."""

from nemo_fastdecode.beam.infer import FastBeamBatchedInfer
from nemo_fastdecode.beam.malsd import MALSDBeamComputer

__all__ = ["FastBeamBatchedInfer", "MALSDBeamComputer"]
