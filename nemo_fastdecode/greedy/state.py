"""Decoding state: pre-allocated loop buffers, and the state carried between chunks (streaming)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from nemo.collections.asr.parts.submodules.transducer_decoding.label_looping_base import (
    BatchedLabelLoopingState,
    LabelLoopingStateItem,
)

from nemo_fastdecode.graphs.owner import CapturedBuffers
from nemo_fastdecode.greedy.hyps import BatchedHypsBuffer

if TYPE_CHECKING:
    from nemo_fastdecode.greedy.records import StepRecords
    from nemo_fastdecode.kernels.window_look import WindowLookBuffers
    from nemo_fastdecode.prediction import FastMathPredictor
    from nemo_fastdecode.transducer.fusion import FusionBuffers


@dataclass
class BatchedGreedyState(BatchedLabelLoopingState):
    """NeMo's ``BatchedLabelLoopingState`` with what batched streaming needs: ``B`` rows (streams or slots) of the
    state between chunks, one tensor per field, gathered and scattered by rows without host synchronisation.

    Fields (NeMo's): ``predictor_states`` the prediction network's state in the decoder's own layout (LSTM
    ``[h, c]`` each ``[L, B, H]``; stateless ``[labels [B, C - 1]]``), ``predictor_outputs [B, 1, H]`` (already
    projected by the joint), ``labels [B]`` (last emitted label, blank if none), ``decoded_lengths [B]`` (encoder
    frames decoded so far: the next chunk's timestamp offset), ``time_jumps [B]`` (TDT: frames jumped past the
    chunk's end; ``None`` for RNN-T), ``fusion_states_list`` one ``[B]`` state per fusion model (n-gram LM, boosting
    tree; empty without fusion). ``state_batch_dim`` is
    the batch dimension of the ``predictor_states`` tensors
    (:func:`~nemo_fastdecode.transducer.modules.predictor_state_batch_dim`).

    A fresh row (nothing decoded yet) holds the prediction network's state after ``<SOS>`` (blank), label
    blank, decoded length 0 and time jump 0 (:meth:`GreedyComputerBase.initial_state`), so continuing from
    it is the same as starting afresh.
    """

    state_batch_dim: int = 1

    @property
    def batch_size(self) -> int:
        return self.labels.shape[0]

    @classmethod
    def of(cls, state: BatchedLabelLoopingState, state_batch_dim: int) -> BatchedGreedyState:
        """NeMo's batched state as this class, sharing its tensors (NeMo's own label loop made it, for example)."""
        if isinstance(state, cls):
            return state
        return cls(
            predictor_states=list(state.predictor_states),
            predictor_outputs=state.predictor_outputs,
            labels=state.labels,
            decoded_lengths=state.decoded_lengths,
            time_jumps=state.time_jumps,
            fusion_states_list=list(state.fusion_states_list),
            state_batch_dim=state_batch_dim,
        )

    def split(self) -> list[LabelLoopingStateItem]:
        """One NeMo ``LabelLoopingStateItem`` per row, owning its memory (the fields may be views of buffers that
        the next decode reuses); NeMo's item layout: ``predictor_state`` a tuple of the state tensors without their
        batch dimension (LSTM ``(h [L, H], c [L, H])``, stateless ``(labels [C - 1],)``), ``predictor_output
        [1, H]``, 0-d ``label`` / ``decoded_length`` / ``time_jump``.

        Each field is copied once for the whole batch and the items are views of the copies (``unbind``: one call
        per field, not one per row): per-row work here had cost more host time than the copies.
        """
        states = [s.clone().unbind(self.state_batch_dim) for s in self.predictor_states]
        outputs = self.predictor_outputs.clone().unbind(0)
        labels, lengths = self.labels.clone().unbind(0), self.decoded_lengths.clone().unbind(0)
        jumps = self.time_jumps.clone().unbind(0) if self.time_jumps is not None else [None] * len(labels)
        fusion = [s.clone().unbind(0) for s in self.fusion_states_list]
        return [
            LabelLoopingStateItem(
                predictor_state=tuple(s[i] for s in states),
                predictor_output=outputs[i],
                label=labels[i],
                decoded_length=lengths[i],
                time_jump=jumps[i],
                fusion_state_list=[s[i] for s in fusion],
            )
            for i in range(len(labels))
        ]

    @classmethod
    def stack(cls, items: Sequence[LabelLoopingStateItem], state_batch_dim: int = 1) -> BatchedGreedyState:
        """The items (at least one, NeMo's or ours) as one batch; a missing TDT ``time_jump`` counts as 0."""
        num_fusion = {len(item.fusion_state_list) for item in items}
        if len(num_fusion) != 1:
            raise ValueError(
                f"the decoding states carry different numbers of fusion model states: {sorted(num_fusion)}"
            )
        jumps = [item.time_jump for item in items]
        parts = zip(*(item.predictor_state for item in items), strict=True)
        return cls(
            predictor_states=[torch.stack(rows, state_batch_dim) for rows in parts],
            predictor_outputs=torch.stack([item.predictor_output for item in items]),
            labels=torch.stack([item.label for item in items]),
            decoded_lengths=torch.stack([item.decoded_length for item in items]),
            time_jumps=None
            if all(j is None for j in jumps)
            else torch.stack([torch.zeros_like(items[0].label) if j is None else j for j in jumps]),
            fusion_states_list=[
                torch.stack(rows) for rows in zip(*(item.fusion_state_list for item in items), strict=True)
            ],
            state_batch_dim=state_batch_dim,
        )

    def _fields(self) -> list[tuple[torch.Tensor | None, int]]:
        """Every tensor with its batch dimension."""
        fields = [(s, self.state_batch_dim) for s in self.predictor_states]
        fields += [(self.predictor_outputs, 0), (self.labels, 0), (self.decoded_lengths, 0), (self.time_jumps, 0)]
        return fields + [(s, 0) for s in self.fusion_states_list]

    def _with_fields(self, tensors: list[torch.Tensor | None]) -> BatchedGreedyState:
        num_states = len(self.predictor_states)
        states, (outputs, labels, lengths, jumps) = tensors[:num_states], tensors[num_states : num_states + 4]
        return BatchedGreedyState(
            predictor_states=states,
            predictor_outputs=outputs,
            labels=labels,
            decoded_lengths=lengths,
            time_jumps=jumps,
            fusion_states_list=list(tensors[num_states + 4 :]),
            state_batch_dim=self.state_batch_dim,
        )

    def index_select(self, rows: torch.Tensor) -> BatchedGreedyState:
        """Rows ``rows`` (``[N]`` int64, repeats allowed) as a new batch of ``N`` (a gather, no host sync)."""
        return self._with_fields([None if t is None else t.index_select(dim, rows) for t, dim in self._fields()])

    def narrow(self, batch_size: int) -> BatchedGreedyState:
        """The first ``batch_size`` rows (views)."""
        return self._with_fields([None if t is None else t.narrow(dim, 0, batch_size) for t, dim in self._fields()])

    def expand(self, batch_size: int) -> BatchedGreedyState:
        """A batch of one row repeated ``batch_size`` times (views, no copy)."""

        def repeated(t: torch.Tensor, dim: int) -> torch.Tensor:
            shape = list(t.shape)
            shape[dim] = batch_size
            return t.expand(shape)

        return self._with_fields([None if t is None else repeated(t, dim) for t, dim in self._fields()])

    def clone(self) -> BatchedGreedyState:
        """A copy that owns its memory."""
        return self._with_fields([None if t is None else t.clone() for t, _ in self._fields()])

    def index_copy_(self, rows: torch.Tensor, source: BatchedGreedyState) -> None:
        """Same as ``self[rows] = source`` for every field (``rows [N]``, ``source`` of ``N`` rows; in place).

        With repeated ``rows`` one of the repeated source rows lands (padding rows of a bucket all write the
        dummy slot). A ``time_jumps`` of ``None`` on either side is skipped (RNN-T).
        """
        for (target, dim), (value, _) in zip(self._fields(), source._fields(), strict=True):
            if target is not None and value is not None:
                target.index_copy_(dim, rows, value.to(target.dtype))


class LoopBuffers(CapturedBuffers):
    """Every tensor the decoding loops touch, allocated once for ``batch_size x max_time``.

    A CUDA graph is specialised to these addresses and shapes: inputs are copied in, the loops
    update everything in place, and rows beyond the real batch have length 0 (never active).
    """

    def __init__(
        self,
        batch_size: int,
        max_time: int,
        hidden: int,
        capacity: int,
        device: torch.device,
        float_dtype: torch.dtype,
        score_dtype: torch.dtype,
    ):
        self.batch_size, self.max_time, self.device, self.float_dtype = batch_size, max_time, device, float_dtype

        def longs(fill: int = 0) -> torch.Tensor:
            return torch.full([batch_size], fill, dtype=torch.long, device=device)

        def flags() -> torch.Tensor:
            return torch.zeros([batch_size], dtype=torch.bool, device=device)

        # inputs
        self.encoder_projected = torch.zeros([batch_size, max_time, hidden], dtype=float_dtype, device=device)
        self.encoder_lengths = longs()
        self.initial_time = longs()  # TDT continuation starts past the chunk boundary
        self.batch_indices = torch.arange(batch_size, device=device)
        # per-row loop state
        self.time_indices, self.safe_time_indices, self.label_time = longs(), longs(), longs()
        self.last_frame = longs()
        self.active, self.active_before, self.advance, self.blank, self.found = (flags() for _ in range(5))
        self.labels = longs()
        self.scores = torch.zeros([batch_size], dtype=float_dtype, device=device)
        self.durations = longs()  # TDT: duration emitted with the current label
        # frame loop: the current frame and how many labels were emitted at it (same for all rows)
        self.frame = torch.zeros([], dtype=torch.long, device=device)
        self.max_length = torch.zeros([], dtype=torch.long, device=device)
        self.symbols_at_frame = torch.zeros([], dtype=torch.long, device=device)
        self.frame_indices = self.frame.expand(batch_size)  # the frame as every row's time index (a view)
        self.joint_hidden = torch.zeros([batch_size, hidden], dtype=float_dtype, device=device)  # fused joint
        # loop flags (0-d, read by WHILE nodes or by the host)
        self.outer_flag = torch.zeros([], dtype=torch.bool, device=device)
        self.inner_flag = torch.zeros([], dtype=torch.bool, device=device)
        # prediction network state: working copy, and the value each row starts from
        self.predictor_states: list[torch.Tensor] = []
        self.predictor_output = torch.zeros([batch_size, 1, hidden], dtype=float_dtype, device=device)
        self.initial_predictor_states: list[torch.Tensor] = []
        self.initial_predictor_output = torch.zeros_like(self.predictor_output)
        # the state after <SOS> (blank), where every fresh row starts
        self.sos_predictor_states: list[torch.Tensor] = []
        self.sos_predictor_output = torch.zeros_like(self.predictor_output)
        self.hyps = BatchedHypsBuffer(batch_size, capacity, device, score_dtype)
        self.steps: StepRecords | None = None  # every look at the joint, when alignments or confidence are kept
        # each row's best token of the current look (written by kernels.best_token)
        self.token_scores = torch.zeros([batch_size], dtype=torch.float32, device=device)
        self.token_labels = longs()
        # the prediction network's step on Triton kernels (fast math or the exact predictor; None: NeMo's modules)
        self.predictor: FastMathPredictor | None = None
        # label loop with a predictor only (allocated by LabelLoopGreedy, else None):
        # the LSTM's recurrent gates computed ahead on a side stream while the joint runs
        self.recurrent_gates: torch.Tensor | None = None  # [L, B, 4 * H]
        self.side_stream: torch.cuda.Stream | None = None
        # n-gram LM / boosting tree fusion (allocated with the buffers when the computer fuses, else None)
        self.fusion: FusionBuffers | None = None
        # looks at each row's next `window` frames per joint call (window > 1)
        self.window_hidden: torch.Tensor | None = None  # [B * window, H], the joint's hidden layer per frame
        self.window_look: WindowLookBuffers | None = None  # one-kernel look (joint without log-softmax)
        self.window_scores: torch.Tensor | None = None  # [B * window], best token score per frame (log-softmax joint)
        self.window_labels: torch.Tensor | None = None  # [B * window], its label
