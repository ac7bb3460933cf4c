"""NeMo's decoding-computer contract over one of our greedy computers: what NeMo's streaming pipelines drive.

NeMo 3.0's ``BufferedRNNTPipeline`` (stateful mode) and ``CacheAwareRNNTPipeline`` read
``model.decoding.decoding.decoding_computer`` and use the interface of NeMo's label-looping computers
(``GreedyBatchedRNNTLabelLoopingComputer`` / ``GreedyBatchedTDTLabelLoopingComputer``):
``merge_to_batched_state(list[item | None])``, ``split_batched_state(state)``,
``__call__(x [B, T, D], out_len [B], prev_batched_state, multi_biasing_ids) -> (BatchedHyps, state)``,
``per_stream_biasing_enabled`` and ``biasing_multi_model``. :class:`NemoDecodingComputer` serves that interface
with :meth:`~nemo_fastdecode.greedy.base.GreedyComputerBase.decode_with_state`; its states are NeMo's
``BatchedLabelLoopingState`` / ``LabelLoopingStateItem`` (:class:`~nemo_fastdecode.greedy.state.BatchedGreedyState`),
so a stream may move between NeMo's computer and this one.
"""

from __future__ import annotations

import torch
from nemo.collections.asr.parts.submodules.transducer_decoding.batched_hyps import BatchedHyps
from nemo.collections.asr.parts.submodules.transducer_decoding.label_looping_base import (
    BatchedLabelLoopingState,
    LabelLoopingStateItem,
)

from nemo_fastdecode.graphs.owner import ComputerGraphsSwitch
from nemo_fastdecode.greedy.base import GreedyComputerBase
from nemo_fastdecode.greedy.hyps import EmittedTokens
from nemo_fastdecode.greedy.state import BatchedGreedyState
from nemo_fastdecode.transducer.modules import module_device, module_dtype

__all__ = ["NemoDecodingComputer", "batched_hyps_of"]


class NemoDecodingComputer(ComputerGraphsSwitch):
    """NeMo's label-looping computer interface (``decoding_computer``) backed by ``computer``.

    ``allow_cuda_graphs``: whether :meth:`maybe_enable_cuda_graphs` may turn the computer's CUDA graphs (back) on,
    as NeMo's computers keep it (``use_cuda_graph_decoder``).

    The computer's n-gram LM / boosting-tree fusion models (if any) are ``fusion_models`` / ``fusion_models_alpha``,
    their states part of the decoding state, as in NeMo's computers. With per-stream biasing (the computer's
    ``fusion.per_row``), ``biasing_multi_model`` is that ``GPUBiasingMultiModel`` (NeMo's pipelines add and remove
    the streams' trees there) and ``per_stream_biasing_enabled`` is True; else it is ``None`` and NeMo's pipelines
    skip their biasing steps. The returned hypotheses and state own their memory (NeMo's pipelines keep the split
    items and pass the state again for the right context); ``prev_batched_state`` is never written.
    """

    def __init__(self, computer: GreedyComputerBase, allow_cuda_graphs: bool = True):
        self.computer = computer
        self.allow_cuda_graphs = allow_cuda_graphs
        fusion = computer.fusion
        self.fusion_models: list = [] if fusion is None else list(fusion.models)
        self.fusion_models_alpha: list[float] = [] if fusion is None else list(fusion.alphas)
        self.biasing_multi_model = None if fusion is None else fusion.per_row

    def maybe_enable_cuda_graphs(self) -> bool:
        return self.allow_cuda_graphs and super().maybe_enable_cuda_graphs()

    @property
    def per_stream_biasing_enabled(self) -> bool:
        return self.biasing_multi_model is not None

    def has_fusion_models(self, with_multi_model: bool = True) -> bool:
        return bool(self.fusion_models) or (with_multi_model and self.per_stream_biasing_enabled)

    @property
    def max_symbols(self) -> int | None:
        return self.computer.max_symbols

    def _float_dtype(self) -> torch.dtype:
        return module_dtype(self.computer.joint)  # a joint may have no parameters (NeMo's test stand-ins)

    def _device(self) -> torch.device:
        return module_device(self.computer.joint)

    def _after_sos(self, batch_size: int, device: torch.device) -> BatchedGreedyState:
        return self.computer.initial_state(batch_size, device, self._float_dtype())

    # ----- state -------------------------------------------------------------------------------
    def merge_to_batched_state(self, state_items: list[LabelLoopingStateItem | None]) -> BatchedGreedyState:
        """One batched state of the items; a ``None`` item (a new stream) is the state after ``<SOS>``.

        Unlike NeMo's computer, the list is not modified and an all-``None`` list is allowed.
        """
        known = next((item for item in state_items if item is not None), None)
        device = known.predictor_output.device if known is not None else self._device()
        new_streams = any(item is None for item in state_items)
        start = self._after_sos(1, device).split()[0] if new_streams else None
        items = [start if item is None else item for item in state_items]
        return BatchedGreedyState.stack(items, self.computer.state_batch_dim)

    def split_batched_state(self, state: BatchedLabelLoopingState) -> list[LabelLoopingStateItem]:
        """One item per row of ``state`` (all its rows, as NeMo's computer does), each owning its memory."""
        return BatchedGreedyState.of(state, self.computer.state_batch_dim).split()

    def reset_state_by_mask(self, state: BatchedLabelLoopingState, mask: torch.Tensor) -> BatchedLabelLoopingState:
        """Rows in ``mask [B]`` start afresh (the state after ``<SOS>``), in place, as NeMo's computer does."""
        rows = BatchedGreedyState.of(state, self.computer.state_batch_dim)
        fresh = self._after_sos(rows.batch_size, rows.labels.device)
        for (target, dim), (value, _) in zip(rows._fields(), fresh._fields(), strict=True):
            if target is not None:
                where = mask.view([-1 if d == dim else 1 for d in range(target.dim())])
                torch.where(where, value.to(target.dtype), target, out=target)
        return state

    # ----- decoding ----------------------------------------------------------------------------
    def __call__(
        self,
        x: torch.Tensor,
        out_len: torch.Tensor,
        prev_batched_state: BatchedLabelLoopingState | None = None,
        multi_biasing_ids: torch.Tensor | None = None,
    ) -> tuple[BatchedHyps, BatchedGreedyState]:
        """Decode ``x [B, T, D]`` (``out_len [B]`` valid frames) continuing from ``prev_batched_state``.

        Returns NeMo's ``BatchedHyps`` of this chunk (timestamps from each stream's start) and the state to continue
        from; both have ``B`` rows. A previous state of more rows (NeMo's CUDA-graph computer pads its batch) gives
        its first ``B``. ``multi_biasing_ids [B]``: each row's tree in ``biasing_multi_model`` (-1: none; ``None``: no
        row has one); without per-stream biasing it may request none.
        """
        if not self.per_stream_biasing_enabled:
            if multi_biasing_ids is not None and bool((multi_biasing_ids >= 0).any()):
                raise ValueError(
                    f"multi_biasing_ids={multi_biasing_ids.tolist()} requests a biasing model, but per-stream biasing "
                    "is off: set decoding.greedy.enable_per_stream_biasing=true"
                )
            multi_biasing_ids = None
        batch_size = x.shape[0]
        if prev_batched_state is None:
            state = self._after_sos(batch_size, x.device)
        else:
            state = BatchedGreedyState.of(prev_batched_state, self.computer.state_batch_dim)
            if state.batch_size < batch_size:
                raise ValueError(f"prev_batched_state has {state.batch_size} rows for a batch of {batch_size}")
            state = state.narrow(batch_size)
        final, emitted = self.computer.decode_with_state(x, out_len, state, multi_biasing_ids)
        hyps = batched_hyps_of(emitted, self.computer.blank_index, x.dtype, state.decoded_lengths)
        return hyps, final.clone()  # `final` is a view of the computer's buffers, which its next call overwrites


def batched_hyps_of(
    emitted: EmittedTokens, blank_index: int, float_dtype: torch.dtype, time_offsets: torch.Tensor | None = None
) -> BatchedHyps:
    """NeMo's ``BatchedHyps`` holding ``emitted`` (copied; no host synchronisation): tokens, frames, TDT durations,
    scores (as ``float_dtype``, like NeMo's label loop) and the last-label bookkeeping its ``merge_`` reads.

    ``time_offsets [B]``: frames decoded before this chunk, already in ``emitted.timestamps``; NeMo's label loop adds
    them to the timestamps only, its ``last_nb_timestamp`` stays within the chunk, and so does this one's.
    """
    batch_size, width = emitted.labels.shape
    hyps = BatchedHyps(
        batch_size=batch_size,
        init_length=max(width, 1),
        blank_id=blank_index,
        device=emitted.labels.device,
        float_dtype=float_dtype,
        with_durations=emitted.durations is not None,
    )
    hyps.current_lengths.copy_(emitted.lengths)
    hyps.transcript[:, :width].copy_(emitted.labels)
    hyps.timestamps[:, :width].copy_(emitted.timestamps)
    if emitted.durations is not None:
        hyps.token_durations[:, :width].copy_(emitted.durations)
    hyps.scores.copy_(emitted.scores)
    if width:
        no_label = emitted.lengths == 0
        last = (emitted.lengths - 1).clamp(min=0)[:, None]
        last_time = hyps.timestamps.gather(1, last)
        hyps.last_nb_labels.copy_(hyps.transcript.gather(1, last)[:, 0].masked_fill(no_label, -1))
        chunk_time = last_time[:, 0] if time_offsets is None else last_time[:, 0] - time_offsets
        hyps.last_nb_timestamp.copy_(chunk_time.masked_fill(no_label, -1))
        valid = torch.arange(width, device=hyps.transcript.device)[None, :] < emitted.lengths[:, None]
        torch.sum((hyps.timestamps[:, :width] == last_time) & valid, dim=1, out=hyps.last_nb_timestamp_lasts)
    return hyps
