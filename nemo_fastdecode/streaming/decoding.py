"""Per-slot greedy decoding state in batched tensors: streams continue chunk after chunk, no per-row Python.

Every slot's greedy state (the prediction network's state: an LSTM's ``h``/``c`` per layer or a stateless
network's last labels; its projected output, the last label, frames decoded so far, the TDT time jump) lives
in one :class:`~nemo_fastdecode.greedy.state.BatchedGreedyState` of ``S + 1`` rows (slot ``S`` is the dummy slot of a bucket's padding rows). A step gathers the stepping
slots' rows (``index_select``), runs the greedy computer's
:meth:`~nemo_fastdecode.greedy.base.GreedyComputerBase.decode_with_state` on the whole batch, scatters the final
state back (``index_copy_``) and appends the emitted tokens to per-slot token storage on the device. Python
work per step does not grow with the batch; NeMo ``Hypothesis`` objects and text are built only when asked
(:meth:`SlotDecoder.hypotheses`, :meth:`SlotDecoder.text`).

With CUDA graphs the batch sizes are the encoder's buckets and each bucket has its own greedy computer
(its own buffers and graph, captured once by :meth:`SlotDecoder.warm_up`), so a step of a few streams does
not run the decoder at the largest bucket. :meth:`SlotDecoder.capture_step` (the streaming transcriber's
default with graphs) also captures the gather, loading, scatter and token append around that graph, for a
bucket's static input tensors.

Phrase boosting (:meth:`SlotDecoder.set_boosting`): slots may have their own boosting tree
(:class:`~nemo_fastdecode.streaming.boosting.SlotBoosting`, NeMo's per-stream biasing). A step in which any slot has
one runs a second set of greedy computers that fuse NeMo's multi-model (every row against its own tree, rows without
one score 0 and decode as without fusion), each slot's tree state kept in ``boost_states [S + 1]``; steps of slots
without trees run the plain computers and graphs as before, at no extra cost.

N-gram LM fusion (``ngram_lm_model`` / ``ngram_lm_alpha``, NeMo's ``greedy.ngram_lm_model`` / ``ngram_lm_alpha``): one
model-wide NeMo ``NGramGPULanguageModel`` that every computer fuses, the plain ones (and their step graphs) and the
boosting ones alike (the LM first, then the multi-model, as NeMo orders them). Each slot's LM state is one more field of
the batched state (``state.fusion_states_list``, ``[S + 1]``): gathered and scattered with the prediction network's
state, set after ``<BOS>`` by :meth:`SlotDecoder.reset`, carried across chunks as NeMo's partial hypotheses carry it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis

from nemo_fastdecode.config import greedy_max_symbols
from nemo_fastdecode.graphs import TwoLevelLoop
from nemo_fastdecode.graphs.capture import capture_graph
from nemo_fastdecode.greedy.base import GreedyComputerBase
from nemo_fastdecode.greedy.frame_loop import FrameLoopGreedy
from nemo_fastdecode.greedy.hyps import EmittedTokens
from nemo_fastdecode.greedy.label_loop import LabelLoopGreedy
from nemo_fastdecode.greedy.state import BatchedGreedyState, LoopBuffers
from nemo_fastdecode.streaming.boosting import SlotBoosting
from nemo_fastdecode.streaming.token_logprobs import TokenLogprobs
from nemo_fastdecode.transducer.fusion import FusionModels

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel
    from nemo.collections.asr.parts.submodules.ngram_lm import NGramGPULanguageModel

    from nemo_fastdecode.streaming.events import BoostingOptions

__all__ = ["SlotDecoder", "check_ngram_lm", "ngram_lm_fusion"]

logger = logging.getLogger(__name__)

INITIAL_TOKEN_CAPACITY = 256  # tokens per slot before the storage grows (doubling)


class SlotDecoder:
    """Greedy transducer decoding for ``num_slots`` streams, state kept per slot in batched device tensors.

    Args:
        model: a NeMo transducer model (RNN-T, TDT or hybrid; its RNN-T head decodes).
        num_slots: ``S``, number of slots; row ``S`` of the storage is the dummy slot (:attr:`dummy_slot`).
        max_symbols: most labels per frame; default the model's ``decoding.greedy.max_symbols`` (or 10).
        loop_labels: label looping (default) or frame looping (RNN-T only).
        use_cuda_graphs: let the greedy computers use CUDA graphs on a GPU (then one computer per batch size).
        token_capacity: initial tokens per slot (grows as needed).
        fast_math: opt-in near-fp32 tensor-core prediction network and joint output
            (:mod:`nemo_fastdecode.prediction`); not bit-identical to NeMo.
        ngram_lm_model: an n-gram LM over the model's tokens to fuse into every stream's decoding (an ARPA file or
            NeMo's ``.nemo`` n-gram LM, loaded by NeMo's ``NGramGPULanguageModel.from_file``); label looping only.
        ngram_lm_alpha: the LM's weight (> 0 with a model; its log-probabilities times alpha join the logits).
    """

    def __init__(
        self,
        model: ASRModel,
        num_slots: int,
        *,
        max_symbols: int | None = None,
        loop_labels: bool = True,
        use_cuda_graphs: bool = True,
        token_capacity: int = INITIAL_TOKEN_CAPACITY,
        fast_math: bool = False,
        ngram_lm_model: str | Path | None = None,
        ngram_lm_alpha: float = 0.0,
    ):
        if ngram_lm_model is not None and not loop_labels:
            raise ValueError(
                f"ngram_lm_model={str(ngram_lm_model)!r} needs the label-looping decoder (loop_labels=True), as NeMo's; "
                "valid with loop_labels=False: ngram_lm_model=None"
            )
        decoding_cfg = model.cfg.get("decoding", {}) or {}
        greedy = decoding_cfg.get("greedy", {}) or {}
        if max_symbols is None:
            max_symbols = greedy_max_symbols(greedy, bounded=True)
        durations = decoding_cfg.get("durations", None) or None
        self.model, self.num_slots = model, num_slots
        parameter = next(model.decoder.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self._computer_args = {
            "decoder": model.decoder,
            "joint": model.joint,
            "blank_index": int(model.decoding.blank_id),
            "max_symbols": int(max_symbols),
            "durations": list(durations) if durations else None,
            "use_cuda_graphs": use_cuda_graphs,
            "fast_math": fast_math,
            # NeMo's own prediction-network modules, op for op: each stream's tokens are held to NeMo's decoding of
            # that stream alone, on networks whose labels may tie to float32 rounding (the exact predictor is the
            # offline decoders' default)
            "exact_predictor": False,
        }
        # the model-wide n-gram LM: every computer fuses it (NeMo's order: the LM, then the per-row multi-model)
        self.lm, self._lm_fusion = ngram_lm_fusion(model, ngram_lm_model, ngram_lm_alpha)
        self.lm_alpha = float(ngram_lm_alpha)
        self._computer_class = LabelLoopGreedy if loop_labels else FrameLoopGreedy
        # graphs are specialised to a batch size: one computer per bucket; eagerly one is enough
        self.per_batch_size = use_cuda_graphs and self.device.type == "cuda"
        self._computers: dict[int, GreedyComputerBase] = {}
        fresh = self._computer(1)
        rows = num_slots + 1
        with torch.inference_mode():
            self._fresh = fresh.initial_state(1, self.device, self.dtype)
            self.state = fresh.initial_state(rows, self.device, self.dtype)  # [S + 1] rows
            self.with_durations = fresh.is_tdt
            self.labels = torch.zeros([rows, token_capacity], dtype=torch.long, device=self.device)
            self.timestamps = torch.zeros_like(self.labels)
            self.durations = torch.zeros_like(self.labels) if self.with_durations else None
            self.counts = torch.zeros([rows], dtype=torch.long, device=self.device)
            self.scores = torch.zeros([rows], dtype=torch.float64, device=self.device)
            # row ids on the device: a slot's reset indexes a view of them (a tensor built from a host list would be
            # a synchronous copy, waiting for the GPU's queued work at every stream's open)
            self._row_ids = torch.arange(rows, device=self.device)
        # host upper bound of each slot's token count: the storage grows before it could overflow, and the
        # device counts are read only when the bound says it might (no host synchronisation per step)
        self._bound = np.zeros(rows, dtype=np.int64)
        self._decoded = np.zeros(rows, dtype=bool)
        self._arange: torch.Tensor | None = None
        # per batch size: the CUDA graphs around the greedy loop (capture_step), None where capturing failed
        self._step_graphs: dict[int, _StepGraphs | None] = {}
        # phrase boosting, set up by the first slot that asks for it: the slots' trees, their states, the computers
        # that fuse them (one per batch size, as the plain ones)
        self.boosting: SlotBoosting | None = None
        self.boost_states: torch.Tensor | None = None  # [S + 1] int64: each slot's state in its tree
        self._boosted_computers: dict[int, GreedyComputerBase] = {}
        # token log-probabilities, for the slots that ask (set up by the first): [S + 1, capacity] float32 beside
        # the labels, and the scorer that fills them after each step
        self.logprobs: torch.Tensor | None = None
        self._wants_logprobs = np.zeros(rows, dtype=bool)
        self._scorer: TokenLogprobs | None = None

    # ------------------------------------------------------------------------------------------
    @property
    def dummy_slot(self) -> int:
        return self.num_slots

    @property
    def token_capacity(self) -> int:
        return self.labels.shape[1]

    @property
    def max_symbols(self) -> int:
        """Most labels the decoder emits per encoder frame."""
        return int(self._computer_args["max_symbols"])

    @property
    def computers(self) -> dict[int, GreedyComputerBase]:
        """The greedy computers by batch size (one, under key 0, without CUDA graphs)."""
        return self._computers

    @property
    def captured_batch_sizes(self) -> list[int]:
        """The batch sizes whose step replays CUDA graphs around the greedy loop (:meth:`capture_step`)."""
        return sorted(size for size, graphs in self._step_graphs.items() if graphs is not None)

    def _computer(self, batch_size: int) -> GreedyComputerBase:
        key = batch_size if self.per_batch_size else 0
        computer = self._computers.get(key)
        if computer is None:
            computer = self._computers[key] = self._computer_class(**self._computer_args, fusion=self._lm_fusion)
        return computer

    @property
    def lm_states(self) -> torch.Tensor | None:
        """``[S + 1]`` int64: each slot's state in the n-gram LM (``None`` without one)."""
        return self.state.fusion_states_list[0] if self.lm is not None else None

    def reset(self, slots: int | Sequence[int], rows: torch.Tensor | None = None) -> None:
        """Start slots afresh (new streams): the state after ``<SOS>`` (the LM's after ``<BOS>``), no tokens, no
        boosting tree. ``rows``: the same slots as ``[N]`` int64 on the device, if the caller has them (else made
        here); one copy per state tensor, however many slots."""
        slots = [slots] if isinstance(slots, int) else list(slots)
        if rows is None:
            rows = self._row_ids[slots[0] : slots[0] + 1] if len(slots) == 1 else self._row_ids[slots]
        with torch.inference_mode():
            self.state.index_copy_(rows, self._fresh.expand(len(slots)))
            self.counts.index_fill_(0, rows, 0)
            self.scores.index_fill_(0, rows, 0)
        self._bound[slots] = 0
        self._decoded[slots] = False
        self._wants_logprobs[slots] = False
        for slot in slots:
            self.set_boosting(slot, None)

    def set_token_logprobs(self, slot: int, wanted: bool) -> None:
        """Whether the slot's tokens get their log-probabilities (:mod:`~nemo_fastdecode.streaming.token_logprobs`,
        read with :meth:`token_logprob_rows`); the first slot that asks sets the storage up."""
        if wanted and self.logprobs is None:
            args = self._computer_args
            self._scorer = TokenLogprobs(args["decoder"], args["joint"], args["blank_index"])
            with torch.inference_mode():
                self.logprobs = torch.zeros(self.labels.shape, dtype=torch.float32, device=self.device)
        self._wants_logprobs[slot] = wanted

    # ------------------------------------------------------------------------------------------
    def enable_boosting(self) -> None:
        """Set phrase boosting up now (else the first stream with phrases does): :meth:`warm_up` then also runs (and
        captures) the computers that fuse the slots' trees."""
        self._setup_boosting()

    def boosting_tree(self, options: BoostingOptions) -> None:
        """Build (or find) the boosting tree of ``options`` now: raises ``ValueError`` for phrases the model cannot
        boost, before any slot changes."""
        self._setup_boosting().tree(options)

    def set_boosting(self, slot: int, options: BoostingOptions | None) -> None:
        """The slot's boosting tree from now on (``None``: none); the slot's tree state starts after ``<BOS>``."""
        if options is None:
            if self.boosting is not None:
                self.boosting.detach(slot)
            return
        boosting = self._setup_boosting()
        boosting.attach(slot, options)
        with torch.inference_mode():
            self.boost_states[slot] = int(boosting.multi_model.get_init_states(1, bos=True)[0])

    def _setup_boosting(self) -> SlotBoosting:
        if self.boosting is None:
            if self._computer_class is not LabelLoopGreedy:
                raise ValueError("phrase boosting needs the label-looping decoder (loop_labels=True), as NeMo's")
            blank = int(self._computer_args["blank_index"])
            self.boosting = SlotBoosting(self.model, self.num_slots, blank, self.device, self._boosting_reallocated)
            with torch.inference_mode():
                self.boost_states = self.boosting.multi_model.get_init_states(self.num_slots + 1, bos=True).clone()
        return self.boosting

    def _boosting_reallocated(self) -> None:
        """The multi-model's storage moved: graphs captured on it would read freed memory."""
        for computer in self._boosted_computers.values():
            computer.reset_graphs()

    def _boosted_computer(self, batch_size: int) -> GreedyComputerBase:
        key = batch_size if self.per_batch_size else 0
        computer = self._boosted_computers.get(key)
        if computer is None:
            models, alphas = ([], []) if self.lm is None else ([self.lm], [self.lm_alpha])
            fusion = FusionModels(models, alphas, per_row=self.boosting.multi_model)
            computer = self._boosted_computers[key] = self._computer_class(**self._computer_args, fusion=fusion)
        return computer

    def _decode_boosted(self, encoded: torch.Tensor, lengths: torch.Tensor, slot_ids: torch.Tensor) -> EmittedTokens:
        """A step with boosting trees: every row fuses its slot's tree (rows without one: id -1, no change), after the
        n-gram LM if there is one."""
        computer = self._boosted_computer(encoded.shape[0])
        state = self.state.index_select(slot_ids)  # its fusion states: the LM's (if any)
        state.fusion_states_list = [*state.fusion_states_list, self.boost_states.index_select(0, slot_ids)]
        model_ids = self.boosting.model_ids.index_select(0, slot_ids)
        final, emitted = computer.decode_with_state(encoded.to(self.dtype), lengths, state, model_ids)
        *lm_states, tree_states = final.fusion_states_list
        self.boost_states.index_copy_(0, slot_ids, tree_states)
        self.state.index_copy_(slot_ids, dataclasses.replace(final, fusion_states_list=lm_states))
        return emitted

    # ------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def decode(
        self,
        slots: Sequence[int],
        encoded: torch.Tensor,
        lengths: torch.Tensor,
        slot_ids: torch.Tensor | None = None,
    ) -> None:
        """Continue the streams in ``slots`` with their new frames (state and tokens updated in place).

        Args:
            slots: the ``N`` distinct slots (host ints).
            encoded: ``[B, T, D]`` new encoder frames of each row (left-aligned), ``B >= N``; rows past ``N``
                are padding (length 0).
            lengths: ``[B]`` valid frames of each row.
            slot_ids: ``[B]`` int64 slots on the device: ``slots`` then the dummy slot (built if ``None``).
        """
        batch_size = encoded.shape[0]
        if slot_ids is None:
            padded = list(slots) + [self.dummy_slot] * (batch_size - len(slots))
            slot_ids = torch.tensor(padded, dtype=torch.long).to(self.device, non_blocking=True)
        host_slots = np.asarray(slots, dtype=np.int64)
        asking = np.flatnonzero(self._wants_logprobs[host_slots]) if self.logprobs is not None else ()
        before = self._before_step(host_slots[asking], asking, encoded) if len(asking) else None
        self._step(host_slots, encoded, lengths, slot_ids)
        if before is not None:
            self._score_step(*before)

    def _step(
        self, host_slots: np.ndarray, encoded: torch.Tensor, lengths: torch.Tensor, slot_ids: torch.Tensor
    ) -> None:
        """:meth:`decode`'s step: boosted, replayed from the step's graphs, or eager."""
        batch_size = encoded.shape[0]
        if self.boosting is not None and self.boosting.boosted(host_slots):
            emitted = self._decode_boosted(encoded, lengths, slot_ids)
            self._reserve(host_slots, emitted.labels.shape[1])
            self._append(slot_ids, emitted)
            self._decoded[host_slots] = True
            return
        computer = self._computer(batch_size)
        graphs = self._step_graphs.get(batch_size)
        reserved = False
        if graphs is not None and graphs.reads(encoded, lengths, slot_ids) and graphs.current(computer, self.labels):
            self._reserve(host_slots, graphs.width)  # may grow the token storage: the graphs then write stale memory
            reserved = True
            if graphs.current(computer, self.labels):
                graphs.replay()
                self._decoded[host_slots] = True
                return
        state = self.state.index_select(slot_ids)
        final, emitted = computer.decode_with_state(encoded.to(self.dtype), lengths, state)
        self.state.index_copy_(slot_ids, final)
        if not reserved:
            self._reserve(host_slots, emitted.labels.shape[1])
        self._append(slot_ids, emitted)
        self._decoded[host_slots] = True
        if graphs is not None and graphs.reads(encoded, lengths, slot_ids):
            # the same static inputs, but the storage grew or the computer re-allocated: capture again (a capture
            # records without running, so this step's work is not repeated)
            self._step_graphs[batch_size] = self._capture(computer, encoded, lengths, slot_ids, warmup=0)

    def _before_step(
        self, slots: np.ndarray, positions: np.ndarray, encoded: torch.Tensor
    ) -> tuple[torch.Tensor, BatchedGreedyState, torch.Tensor, torch.Tensor]:
        """What scoring the step's tokens of ``slots`` (rows ``positions`` of the batch) needs from before it: their
        rows, greedy states and token counts, and their encoder frames."""
        with torch.inference_mode():
            rows = torch.from_numpy(slots).to(self.device)
            chunk = encoded.index_select(0, torch.from_numpy(positions).to(self.device))
            return rows, self.state.index_select(rows), self.counts.index_select(0, rows), chunk

    def _score_step(
        self, rows: torch.Tensor, state: BatchedGreedyState, counts: torch.Tensor, encoded: torch.Tensor
    ) -> None:
        """Write the log-probabilities of the tokens the step appended to ``rows`` (one device read: their count)."""
        with torch.inference_mode():
            added = self.counts.index_select(0, rows) - counts
            width = int(added.max())
            if width == 0:
                return
            steps = torch.arange(width, device=self.device)
            valid = steps[None, :] < added[:, None]  # [N, K]
            columns = (counts[:, None] + steps[None, :]).clamp_(max=self.token_capacity - 1)
            labels = torch.where(valid, self.labels[rows[:, None], columns], 0)
            frames = torch.where(valid, self.timestamps[rows[:, None], columns] - state.decoded_lengths[:, None], 0)
            scores = self._scorer.score(state, encoded, labels, frames)
            targets = torch.where(valid, rows[:, None], self.dummy_slot)  # steps past a row's count: the dummy slot
            self.logprobs.index_put_((targets, columns), scores)

    def capture_step(self, encoded: torch.Tensor, lengths: torch.Tensor, slot_ids: torch.Tensor) -> bool:
        """Capture the step's work around the greedy loop for these static inputs (a batch-size bucket's outputs,
        every row the dummy slot): later :meth:`decode` calls with these very tensors replay two CUDA graphs
        (gather the state and load the loop; scatter the final state and append the tokens) around the loop's
        own graph, instead of about fifty small kernels launched from Python.

        Returns whether the graphs were captured (not on the CPU, without CUDA graphs, or with
        ``max_symbols=None``, whose loop may need to run again from the host; then :meth:`decode` stays eager).
        """
        batch_size = encoded.shape[0]
        computer = self._computer(batch_size)
        if not self.per_batch_size or computer.max_symbols is None:
            return False
        with torch.inference_mode():
            self.decode([], encoded, lengths, slot_ids)  # eager first: buffers, the loop's graph, lazy set-up
            graphs = self._capture(computer, encoded, lengths, slot_ids, warmup=1)
            self.reset(self.dummy_slot)
        self._step_graphs[batch_size] = graphs
        return graphs is not None

    def _capture(
        self, computer: GreedyComputerBase, encoded: torch.Tensor, lengths: torch.Tensor, slot_ids: torch.Tensor,
        warmup: int,
    ) -> _StepGraphs | None:  # fmt: skip
        """The two graphs around ``computer``'s loop for these inputs, or None (logged) if capturing fails."""
        batch_size = encoded.shape[0]
        try:
            load = functools.partial(self._load_step, computer, encoded, lengths, slot_ids)
            load_graph, (rows, buffers, loop) = capture_graph(load, self.device, warmup=warmup)
            width = buffers.hyps.labels.shape[1]
            self._ensure_arange(width)
            finish = functools.partial(self._finish_step, computer, buffers, batch_size, lengths, slot_ids, rows)
            finish_graph, _ = capture_graph(finish, self.device, warmup=warmup)
        except RuntimeError as error:  # e.g. a driver that cannot capture: the eager step stays correct
            logger.warning("nemo_fastdecode: streaming decoder step not captured at batch %d (%s)", batch_size, error)
            return None
        return _StepGraphs(load_graph, loop, finish_graph, width, (encoded, lengths, slot_ids), rows, buffers,
                           self._arange, self.labels.data_ptr())  # fmt: skip

    def _load_step(
        self, computer: GreedyComputerBase, encoded: torch.Tensor, lengths: torch.Tensor, slot_ids: torch.Tensor
    ) -> tuple[BatchedGreedyState, LoopBuffers, TwoLevelLoop]:
        """The captured work before the loop: gather the rows' states, load the loop (device work only)."""
        rows = self.state.index_select(slot_ids)
        buffers, loop = computer.load_with_state(encoded.to(self.dtype), lengths, rows)
        return rows, buffers, loop

    def _finish_step(
        self, computer: GreedyComputerBase, buffers: LoopBuffers, batch_size: int, lengths: torch.Tensor,
        slot_ids: torch.Tensor, rows: BatchedGreedyState,
    ) -> None:  # fmt: skip
        """The captured work after the loop: scatter the final states, append the tokens (device work only)."""
        final, emitted = computer.state_after(buffers, batch_size, lengths, rows)
        self.state.index_copy_(slot_ids, final)
        self._append(slot_ids, emitted)

    def _reserve(self, host_slots: np.ndarray, width: int) -> None:
        """Make room for ``width`` more tokens in each of ``host_slots`` (grows the storage if it could overflow)."""

        def needed() -> int:
            return width + (int(self._bound[host_slots].max()) if len(host_slots) else 0)

        if needed() > self.token_capacity:
            self._bound[:] = self.counts.cpu().numpy()  # the exact counts (one synchronisation, rarely)
            if needed() > self.token_capacity:
                self._grow(max(needed(), 2 * self.token_capacity))
        self._bound[host_slots] += width
        self._ensure_arange(width)

    def _ensure_arange(self, width: int) -> None:
        if self._arange is None or self._arange.shape[0] < width:
            self._arange = torch.arange(width, device=self.device)

    def _append(self, slot_ids: torch.Tensor, emitted: EmittedTokens) -> None:
        """Append each row's ``emitted.lengths`` tokens to its slot's storage (padding rows write nothing; room
        reserved by :meth:`_reserve`). Device work only."""
        width = emitted.labels.shape[1]  # most tokens a row can have emitted in this chunk
        columns = self.counts.index_select(0, slot_ids)[:, None] + self._arange[None, :width]  # [B, K]
        valid = self._arange[None, :width] < emitted.lengths[:, None]
        # same as: labels[slot, count:count + length] = emitted[:length] per row; the rest goes to the dummy slot
        rows = torch.where(valid, slot_ids[:, None], self.dummy_slot)
        columns = torch.where(valid, columns, 0)
        self.labels.index_put_((rows, columns), emitted.labels)
        self.timestamps.index_put_((rows, columns), emitted.timestamps)
        if self.durations is not None and emitted.durations is not None:
            self.durations.index_put_((rows, columns), emitted.durations)
        self.counts.index_add_(0, slot_ids, emitted.lengths)
        self.scores.index_add_(0, slot_ids, emitted.scores.to(self.scores.dtype))
        # a fill, not `counts[dummy] = 0`: that copies a host scalar, which a CUDA graph capture refuses
        self.counts.narrow(0, self.dummy_slot, 1).zero_()

    def _grow(self, capacity: int) -> None:
        def grown(t: torch.Tensor) -> torch.Tensor:
            out = t.new_zeros([t.shape[0], capacity])
            out[:, : t.shape[1]] = t
            return out

        self.labels, self.timestamps = grown(self.labels), grown(self.timestamps)
        if self.durations is not None:
            self.durations = grown(self.durations)
        if self.logprobs is not None:
            self.logprobs = grown(self.logprobs)

    # ------------------------------------------------------------------------------------------
    def warm_up(self, batch_sizes: Sequence[int], frames: int, dim: int) -> None:
        """Run (and, with CUDA graphs, capture) the decoder at every batch size now, on the dummy slot only.

        Every row is the dummy slot with ``frames`` frames of zeros (the longest chunk), so each computer sizes
        its buffers for the largest input it will see; the dummy slot is emptied afterwards. With phrase boosting
        set up (:meth:`enable_boosting`), the fused computers too.
        """
        sizes = sorted(set(batch_sizes)) if self.per_batch_size else [max(batch_sizes)]
        with torch.inference_mode():
            for size in sizes:
                encoded = torch.zeros([size, frames, dim], dtype=self.dtype, device=self.device)
                lengths = torch.full([size], frames, dtype=torch.long, device=self.device)
                slot_ids = torch.full([size], self.dummy_slot, dtype=torch.long, device=self.device)
                self.decode([], encoded, lengths, slot_ids)
                if self.boosting is not None:
                    self._decode_boosted(encoded, lengths, slot_ids)  # every row without a tree
        self.reset(self.dummy_slot)

    # ------------------------------------------------------------------------------------------
    def decoded(self, slot: int) -> bool:
        """Whether the slot has decoded any chunk since it was reset."""
        return bool(self._decoded[slot])

    def hypotheses(self, slots: Sequence[int], with_state: bool = True) -> list[Hypothesis | None]:
        """Each slot's hypothesis so far, built now (``None`` for a slot that has not stepped).

        ``y_sequence`` / ``timestamp`` (frames from the stream's start) / ``score`` as NeMo's streaming
        ``partial_hypotheses`` accumulate them; ``dec_state`` is NeMo's ``LabelLoopingStateItem`` that
        ``fast_greedy`` can continue from; ``length`` is the frames decoded so far. ``with_state=False``: tokens,
        timestamps and scores only (``dec_state`` ``None``, ``length`` 0), the cheaper build that events need.
        """
        stepped = [slot for slot in slots if self._decoded[slot]]
        built: dict[int, Hypothesis] = {}
        if stepped:
            with torch.inference_mode():
                rows = torch.tensor(stepped, dtype=torch.long, device=self.device)
                tokens = EmittedTokens(
                    labels=self.labels.index_select(0, rows),
                    timestamps=self.timestamps.index_select(0, rows),
                    durations=None if self.durations is None else self.durations.index_select(0, rows),
                    lengths=self.counts.index_select(0, rows),
                    scores=self.scores.index_select(0, rows),
                )
                hyps = tokens.to_hypotheses()
                if with_state:
                    state = self.state.index_select(rows)
                    lengths = state.decoded_lengths.cpu()
                    for i, (hyp, item) in enumerate(zip(hyps, state.split(), strict=True)):
                        hyp.dec_state, hyp.length = item, lengths[i]
                built = dict(zip(stepped, hyps, strict=True))
        return [built.get(slot) for slot in slots]

    def token_counts(self, slots: np.ndarray) -> np.ndarray:
        """``[N]`` int64: each slot's token count so far (one device read of every slot's, nothing uploaded)."""
        return self.counts.cpu().numpy()[np.asarray(slots, dtype=np.int64)]

    def token_rows(
        self, slots: np.ndarray, starts: np.ndarray, stops: np.ndarray, with_timestamps: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The slots' tokens ``starts[i] .. stops[i] - 1`` on the host, without building hypotheses (one device read
        of just those tokens: a long stream's earlier segments are not read again).

        Args:
            slots: ``[N]`` slots.
            starts, stops: ``[N]`` the first token and one past the last of each (``stops[i]`` at most the slot's
                token count, :meth:`token_counts`).
            with_timestamps: also read each token's encoder frame.

        Returns:
            ``[N, W]`` int64 labels, ``W = max(stops - starts)``: row ``i`` holds its tokens left-aligned (valid up to
            ``stops[i] - starts[i]``), and the same layout of timestamps (``None`` without ``with_timestamps``).
        """
        width = int((stops - starts).max()) if len(slots) else 0
        if width <= 0:
            empty = np.zeros((len(slots), 0), dtype=np.int64)
            return empty, (empty if with_timestamps else None)
        index = torch.from_numpy(np.stack([slots, starts]).astype(np.int64)).to(self.device)  # [2, N]
        with torch.inference_mode():
            # [N, W]: each row's window of columns (past its stop: stale tokens, ignored; clamped into the storage)
            columns = (index[1][:, None] + torch.arange(width, device=self.device)).clamp_(max=self.token_capacity - 1)
            rows = index[0][:, None].expand(-1, width)
            fields = [self.labels] + ([self.timestamps] if with_timestamps else [])
            block = torch.stack([field[rows, columns] for field in fields]).cpu().numpy()
        return block[0], (block[1] if with_timestamps else None)

    def token_logprob_rows(self, slots: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        """``[N, W]`` float32: the log-probabilities of the slots' tokens ``starts[i] .. stops[i] - 1``, left-aligned
        as :meth:`token_rows` gives the tokens (slots that asked: :meth:`set_token_logprobs`)."""
        width = int((stops - starts).max()) if len(slots) else 0
        if width <= 0 or self.logprobs is None:
            return np.zeros((len(slots), max(width, 0)), dtype=np.float32)
        with torch.inference_mode():
            rows = torch.from_numpy(np.asarray(slots, dtype=np.int64)).to(self.device)[:, None].expand(-1, width)
            first = torch.from_numpy(np.asarray(starts, dtype=np.int64)).to(self.device)[:, None]
            columns = (first + torch.arange(width, device=self.device)).clamp_(max=self.token_capacity - 1)
            return self.logprobs[rows, columns].cpu().numpy()

    def hypothesis(self, slot: int) -> Hypothesis | None:
        """The slot's hypothesis so far (``None`` before its first step)."""
        return self.hypotheses([slot])[0]

    def token_ids(self, slot: int) -> list[int]:
        """The slot's token ids so far."""
        count = int(self.counts[slot])
        return self.labels[slot, :count].tolist()

    def text(self, slot: int) -> str:
        """The slot's transcript so far (the model's tokenizer or labels)."""
        return self.model.decoding.decode_ids_to_str(self.token_ids(slot))


def check_ngram_lm(ngram_lm_model: str | Path | None, ngram_lm_alpha: float) -> None:
    """Raise ``ValueError`` naming the value for an n-gram LM setting the streaming decoder cannot run: a weight without
    a model, a model without a weight > 0, a file that does not exist."""
    if isinstance(ngram_lm_alpha, bool) or not isinstance(ngram_lm_alpha, numbers.Real):
        raise ValueError(f"ngram_lm_alpha must be a number, got {ngram_lm_alpha!r}")
    if ngram_lm_model is None:
        if ngram_lm_alpha != 0:
            raise ValueError(
                f"ngram_lm_alpha={ngram_lm_alpha!r} needs ngram_lm_model (an ARPA file or NeMo's .nemo n-gram LM); "
                "valid without a model: ngram_lm_alpha=0.0"
            )
        return
    if not (math.isfinite(ngram_lm_alpha) and ngram_lm_alpha > 0):
        raise ValueError(
            f"ngram_lm_alpha={ngram_lm_alpha!r} with ngram_lm_model={str(ngram_lm_model)!r}: valid weights are "
            "finite and > 0 (a weight of 0 fuses nothing: leave ngram_lm_model unset)"
        )
    if not Path(ngram_lm_model).is_file():
        raise ValueError(
            f"ngram_lm_model={str(ngram_lm_model)!r}: no such file (an ARPA file or NeMo's .nemo n-gram LM)"
        )


def ngram_lm_fusion(
    model: ASRModel, ngram_lm_model: str | Path | None, ngram_lm_alpha: float
) -> tuple[NGramGPULanguageModel | None, FusionModels | None]:
    """The streaming decoders' model-wide n-gram LM, checked (:func:`check_ngram_lm`) and loaded as NeMo's decoding
    loads ``greedy.ngram_lm_model`` (over the model's non-blank labels, on its decoder's device), and its fusion with
    ``ngram_lm_alpha``; ``(None, None)`` without a model."""
    check_ngram_lm(ngram_lm_model, ngram_lm_alpha)
    if ngram_lm_model is None:
        return None, None
    from nemo.collections.asr.parts.submodules.ngram_lm import NGramGPULanguageModel

    device = next(model.decoder.parameters()).device
    with torch.inference_mode(False):  # outside inference mode, as NeMo loads it (its tensors are not inference ones)
        lm = NGramGPULanguageModel.from_file(lm_path=ngram_lm_model, vocab_size=int(model.decoding.blank_id))
        lm = lm.to(device)
    return lm, FusionModels([lm], [float(ngram_lm_alpha)])


@dataclass
class _StepGraphs:
    """A bucket's decoder step as CUDA graphs: ``load`` (state gather, encoder projection, loop inputs), the greedy
    computer's ``loop`` (its own graph), ``finish`` (final state scattered, tokens appended).

    Valid while :meth:`decode` gets the same static input tensors and the memory they were captured on is
    still in use (the computer's loop buffers, the token storage, which grows by re-allocation).
    """

    load: torch.cuda.CUDAGraph
    loop: TwoLevelLoop
    finish: torch.cuda.CUDAGraph
    width: int  # tokens a row can emit per step (the loop's capacity)
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # encoded, lengths, slot_ids
    rows: BatchedGreedyState  # the gathered state (memory of the load graph, read by finish)
    buffers: LoopBuffers
    arange: torch.Tensor  # read by finish: held so that a longer one replacing it cannot free its memory
    labels_ptr: int

    def reads(self, encoded: torch.Tensor, lengths: torch.Tensor, slot_ids: torch.Tensor) -> bool:
        return all(a is b for a, b in zip(self.inputs, (encoded, lengths, slot_ids), strict=True))

    def current(self, computer: GreedyComputerBase, labels: torch.Tensor) -> bool:
        return computer.loop_buffers is self.buffers and labels.data_ptr() == self.labels_ptr

    def replay(self) -> None:
        self.load.replay()
        self.loop.run()
        self.finish.replay()
