"""NeMo's batched beam-search computer contract over our beam search: chunk-by-chunk decoding of streams.

NeMo 3.0's ``malsd_batch`` decodes streams chunk by chunk only through its computer,
``model.decoding.decoding.decoding_computer`` (``ModifiedALSDBatchedRNNTComputer`` /
``ModifiedALSDBatchedTDTComputer``): ``__call__(x [B, T, D], out_len [B], prev_batched_state) ->
(BatchedBeamHyps, BatchedBeamState)``; its ``forward`` refuses ``partial_hypotheses``. The caller joins the chunks'
hypotheses with NeMo's ``BatchedBeamHyps.flatten_`` and ``merge_(..., is_chunk_continuation=True,
boundary_prev_ptr=...)``. :class:`NemoBeamComputer` serves that interface with
:meth:`~nemo_fastdecode.beam.malsd.MALSDBeamComputer.search_chunk`; its states are NeMo's ``BatchedBeamState``,
so a stream may move between NeMo's computer and this one.
"""

from __future__ import annotations

import torch
from nemo.collections.asr.parts.submodules.transducer_decoding.label_looping_base import BatchedBeamState
from nemo.collections.asr.parts.utils.batched_beam_decoding_utils import BatchedBeamHyps

from nemo_fastdecode.beam.malsd import MALSDBeamComputer
from nemo_fastdecode.graphs.owner import ComputerGraphsSwitch

__all__ = ["NemoBeamComputer"]


class NemoBeamComputer(ComputerGraphsSwitch):
    """NeMo's modified-ALSD computer interface (``decoding_computer``) backed by ``computer``.

    ``allow_cuda_graphs``: whether :meth:`maybe_enable_cuda_graphs` may turn the computer's CUDA graphs (back) on,
    as NeMo's computers keep it (``allow_cuda_graphs``). ``fusion_models`` / ``fusion_models_alpha``: the computer's
    n-gram LMs / boosting trees and weights (``None`` without fusion), as NeMo's computer exposes them. Graph modes are chosen with ``beam.graph_mode``
    (``computer.force_mode``), not with NeMo's ``force_cuda_graphs_mode``.
    """

    def __init__(self, computer: MALSDBeamComputer, allow_cuda_graphs: bool = True):
        self.computer = computer
        self.allow_cuda_graphs = allow_cuda_graphs

    def maybe_enable_cuda_graphs(self) -> bool:
        return self.allow_cuda_graphs and super().maybe_enable_cuda_graphs()

    def reset_cuda_graphs_state(self) -> None:
        """Drop the captured graphs and their buffers (the next call captures again), as NeMo's method does."""
        self.computer.reset_graphs()

    @property
    def fusion_models(self) -> list | None:
        return None if self.computer.fusion is None else self.computer.fusion.models.models

    @property
    def fusion_models_alpha(self) -> list[float] | None:
        return None if self.computer.fusion is None else self.computer.fusion.models.alphas

    @property
    def beam_size(self) -> int:
        return self.computer.beam_size

    @property
    def max_symbols(self) -> int | None:
        return self.computer.max_symbols

    def __call__(
        self, x: torch.Tensor, out_len: torch.Tensor, prev_batched_state: BatchedBeamState | None = None
    ) -> tuple[BatchedBeamHyps, BatchedBeamState]:
        """Decode ``x [B, T, D]`` (``out_len [B]`` valid frames, 0 allowed) continuing from ``prev_batched_state``.

        Returns this chunk's ``BatchedBeamHyps`` (timestamps from each stream's start, cumulative scores) and the
        state to continue from, both of ``B`` rows, as NeMo's computer does; a previous state of more rows (NeMo's
        CUDA-graph computer pads its batch) gives its first ``B``. ``prev_batched_state`` is never written.
        """
        if x.dim() != 3 or not x.is_floating_point():
            raise ValueError(f"x must be a float tensor [B, T, D], got {x.dtype} of shape {tuple(x.shape)}")
        batch_size, max_time, _ = x.shape
        if batch_size == 0:
            raise ValueError("x holds no stream (B=0); NeMo's computer needs B >= 1 as well")
        if out_len.shape != (batch_size,) or out_len.is_floating_point() or out_len.is_complex():
            raise ValueError(f"out_len must be an integer tensor [B]=[{batch_size}], got shape {tuple(out_len.shape)}")
        if not bool(((out_len >= 0) & (out_len <= max_time)).all()):
            raise ValueError(f"out_len must be in [0, T={max_time}], got {out_len.tolist()}")
        return self.computer.search_chunk(x, out_len, prev_batched_state)
