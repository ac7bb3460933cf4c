"""Per-slot beam search (NeMo's ``malsd_batch``) for streams that continue chunk after chunk.

Every slot's beams between chunks (NeMo's ``BatchedBeamState``: per beam the prediction network's state and output,
scores, transcript hashes, last labels, ...) live in batched device tensors of ``S + 1`` rows (``K`` beams per row); a
step gathers the stepping slots' rows, runs :meth:`~nemo_fastdecode.beam.malsd.MALSDBeamComputer.search_chunk` on
the whole batch (one call for the streams' first chunks, one for the others) and scatters the state back.

Each beam's transcript so far is kept flat on the device (``[S + 1, K, capacity]`` labels, timestamps, TDT durations):
after a chunk, beam ``k``'s transcript is that of the beam it descends from at the chunk's start (the root NeMo's
``BatchedBeamHyps.flatten_`` returns) followed by its non-blank labels of the chunk, for every stepping slot at once.
That is what NeMo's ``merge_(..., is_chunk_continuation=True, boundary_prev_ptr=roots)`` of the chunks' prefix trees
followed by ``to_hyps_list(score_norm)`` reads back; the best beam is the first of NeMo's sort of the normalised
scores. Host work per step does not grow with the number of streams.

With an n-gram LM (``ngram_lm_model`` / ``ngram_lm_alpha``) the search fuses it as NeMo's ``malsd_batch`` does
(``beam.ngram_lm_model``; ``late`` pruning, ``lm_weighted_full`` blank scoring, NeMo's defaults there): every beam's LM
state is kept with the rest of its slot's state (``[(S + 1) * K]``) and continued by the slot's next chunk; a stream's
first chunk starts every beam after ``<BOS>``.

Per-stream phrase boosting (:meth:`SlotBeamDecoder.set_boosting`): a slot may have its own boosting tree in NeMo's
``GPUBiasingMultiModel`` (:class:`~nemo_fastdecode.streaming.boosting.SlotBoosting`, as greedy decoding has it). The
slots with a tree are searched by a second computer that fuses the multi-model after the LM (NeMo's order), every
beam of a slot fusing the slot's tree with its weight; each beam's tree state is kept with the slot's beams
(``[(S + 1) * K]``), follows the beam as its LM state does and starts after ``<BOS>`` when the stream opens or its
boosting changes. A stream with phrases ``P`` and weight ``w`` decodes as NeMo's ``malsd_batch`` fusing
``[LM (if any), GPUBoostingTreeModel of P]`` with weights ``[ngram_lm_alpha, w]`` (so blank's scaling sums the LM's
weight and ``w``); slots without a tree step on the plain computer, exactly as without boosting.

The same interface as :class:`~nemo_fastdecode.streaming.decoding.SlotDecoder` where the transcriber and the engine
use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from nemo.collections.asr.parts.submodules.transducer_decoding.label_looping_base import BatchedBeamState
from nemo.collections.asr.parts.utils.batched_beam_decoding_utils import BatchedBeamHyps
from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis

from nemo_fastdecode.beam.malsd import MALSDBeamComputer
from nemo_fastdecode.config import DEFAULT_MAX_SYMBOLS
from nemo_fastdecode.streaming.boosting import SlotBoosting
from nemo_fastdecode.streaming.decoding import ngram_lm_fusion
from nemo_fastdecode.transducer.fusion import FusionModels

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

    from nemo_fastdecode.streaming.events import BoostingOptions

__all__ = ["SlotBeamDecoder"]

INITIAL_TOKEN_CAPACITY = 64  # labels per beam before the transcript storage grows (doubling)

# BatchedBeamState fields stored per row ([B, K] or [B]) and per flattened beam ([B * K, ...])
_PER_ROW = ("labels", "decoded_lengths", "time_jumps", "scores", "transcript_hash", "current_lengths_nb",
            "last_timestamp_lasts")  # fmt: skip


class SlotBeamDecoder:
    """Modified-ALSD beam search for ``num_slots`` streams, each slot's beams kept between its chunks.

    Args:
        model: a NeMo transducer model (RNN-T, TDT or hybrid; its RNN-T head decodes).
        num_slots: ``S``, number of slots; row ``S`` is the dummy slot (:attr:`dummy_slot`).
        beam_size: beams per stream (NeMo's ``beam.beam_size``), ``1..min(16, V)``.
        max_symbols: most labels per frame and hypothesis (NeMo's ``beam.max_symbols``); default 10, what NeMo's
            ``malsd_batch`` uses when it is unset and CUDA graphs are allowed.
        score_norm: pick the best beam by score / (tokens + 1) (NeMo's ``beam.score_norm``).
        use_cuda_graphs: let the search use CUDA graphs on a GPU.
        ngram_lm_model: an n-gram LM over the model's tokens fused into every stream's beams (an ARPA file or NeMo's
            ``.nemo`` n-gram LM; NeMo's ``beam.ngram_lm_model``); ``None``: none.
        ngram_lm_alpha: the LM's weight, > 0 with a model (NeMo's ``beam.ngram_lm_alpha``).
    """

    def __init__(
        self,
        model: ASRModel,
        num_slots: int,
        *,
        beam_size: int = 4,
        max_symbols: int | None = None,
        score_norm: bool = True,
        use_cuda_graphs: bool = True,
        ngram_lm_model: str | Path | None = None,
        ngram_lm_alpha: float = 0.0,
    ):
        self.lm, fusion = ngram_lm_fusion(model, ngram_lm_model, ngram_lm_alpha)
        self.lm_alpha = float(ngram_lm_alpha)
        decoding_cfg = model.cfg.get("decoding", {}) or {}
        durations = decoding_cfg.get("durations", None) or None
        self.model, self.num_slots, self.score_norm = model, num_slots, score_norm
        parameter = next(model.decoder.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self._computer_args = dict(
            decoder=model.decoder,
            joint=model.joint,
            blank_index=int(model.decoding.blank_id),
            beam_size=beam_size,
            max_symbols=DEFAULT_MAX_SYMBOLS if max_symbols is None else int(max_symbols),
            durations=list(durations) if durations else None,
            use_cuda_graphs=use_cuda_graphs,
        )
        self.computer = MALSDBeamComputer(**self._computer_args, fusion=fusion)
        self.beam_size = beam_size
        rows = num_slots + 1
        self._state: BatchedBeamState | None = None  # [S + 1] rows, allocated by the first chunk
        # every beam's LM state, [(S + 1) * K]; a slot's first chunk does not read it (<BOS>)
        self._fusion_states: list[torch.Tensor] | None = None
        # phrase boosting, set up by the first slot that asks for it: the slots' trees, every beam's state in its slot's
        # tree ([(S + 1) * K]), the computer that fuses them
        self.boosting: SlotBoosting | None = None
        self.tree_states: torch.Tensor | None = None
        self._boosted_computer: MALSDBeamComputer | None = None
        # every beam's transcript so far: non-blank labels, their timestamps (frames from the stream's start) and TDT
        # durations [S + 1, K, capacity + 1] (the last column takes the writes of blank steps), counts [S + 1, K]
        self._tdt = self.computer.is_tdt
        self._labels: torch.Tensor | None = None
        self._times: torch.Tensor | None = None
        self._durations: torch.Tensor | None = None
        self._counts = torch.zeros([rows, beam_size], dtype=torch.long, device=self.device)
        self._best_beam = torch.zeros([rows], dtype=torch.long, device=self.device)
        self._capacity = 0
        self._best: list[Hypothesis | None] = [None] * rows  # cache of the best beam, dropped by a step
        self._reported: list[tuple[int, ...] | None] = [None] * rows  # best tokens at the last changed() call
        self._decoded = np.zeros(rows, dtype=bool)

    # ------------------------------------------------------------------------------------------
    @property
    def dummy_slot(self) -> int:
        return self.num_slots

    @property
    def max_symbols(self) -> int | None:
        """Most labels per frame and hypothesis."""
        return self.computer.max_symbols

    @property
    def captured_batch_sizes(self) -> list[int]:
        """No step is captured around the search (its own loop uses CUDA graphs)."""
        return []

    def reset(self, slots: int | Sequence[int], rows: torch.Tensor | None = None) -> None:
        """Start slots afresh (new streams): their next chunk begins from the empty hypotheses after ``<SOS>`` (the
        LM's after ``<BOS>``), no boosting tree. ``rows``: unused (the beams live on the host between chunks)."""
        for slot in [slots] if isinstance(slots, int) else slots:
            self._best[slot] = self._reported[slot] = None
            self._decoded[slot] = False
            self.set_boosting(slot, None)

    # ------------------------------------------------------------------------------------------
    def enable_boosting(self) -> None:
        """Set phrase boosting up now (else the first stream with phrases does): :meth:`warm_up` then also runs the
        computer that fuses the slots' trees."""
        self._setup_boosting()

    def boosting_tree(self, options: BoostingOptions) -> None:
        """Build (or find) the boosting tree of ``options`` now: raises ``ValueError`` for phrases the model cannot
        boost, before any slot changes."""
        self._setup_boosting().tree(options)

    def set_boosting(self, slot: int, options: BoostingOptions | None) -> None:
        """The slot's boosting tree from now on (``None``: none); every beam's tree state starts after ``<BOS>``."""
        if options is None:
            if self.boosting is not None:
                self.boosting.detach(slot)
            return
        boosting = self._setup_boosting()
        boosting.attach(slot, options)
        with torch.inference_mode():
            bos = int(boosting.multi_model.get_init_states(1, bos=True)[0])
            self.tree_states.narrow(0, slot * self.beam_size, self.beam_size).fill_(bos)

    def _setup_boosting(self) -> SlotBoosting:
        if self.boosting is None:
            blank = int(self._computer_args["blank_index"])
            self.boosting = SlotBoosting(self.model, self.num_slots, blank, self.device, self._boosting_reallocated)
            with torch.inference_mode():
                beams = (self.num_slots + 1) * self.beam_size
                self.tree_states = self.boosting.multi_model.get_init_states(beams, bos=True).clone()
            models, alphas = ([], []) if self.lm is None else ([self.lm], [self.lm_alpha])
            fusion = FusionModels(models, alphas, per_row=self.boosting.multi_model)
            self._boosted_computer = MALSDBeamComputer(**self._computer_args, fusion=fusion)
        return self.boosting

    def _boosting_reallocated(self) -> None:
        """The multi-model's storage moved: graphs captured on it would read freed memory."""
        if self._boosted_computer is not None:
            self._boosted_computer.reset_graphs()

    # ------------------------------------------------------------------------------------------
    def decode(
        self,
        slots: Sequence[int],
        encoded: torch.Tensor,
        lengths: torch.Tensor,
        slot_ids: torch.Tensor | None = None,
    ) -> None:
        """Continue the beams of the streams in ``slots`` with their new frames.

        Args:
            slots: the ``N`` distinct slots (host ints).
            encoded: ``[B, T, D]`` new encoder frames of each row (left-aligned), ``B >= N``; rows past ``N`` are
                padding.
            lengths: ``[B]`` valid frames of each row.
            slot_ids: unused (the greedy decoder's padded slot ids); rows are taken from ``slots``.
        """
        host_lengths = lengths[: len(slots)].cpu().numpy()
        # a chunk without frames changes nothing (NeMo's computer is not called for it)
        stepping = [i for i, length in enumerate(host_lengths.tolist()) if length > 0]
        boosted = np.zeros(len(slots), dtype=bool)
        if self.boosting is not None and stepping:
            boosted[stepping] = self.boosting.has_tree(np.asarray([slots[i] for i in stepping], dtype=np.int64))
        # one search per kind (decided before any runs): first chunks or continued beams, with a tree or without
        groups = [
            ([i for i in stepping if self._decoded[slots[i]] != first and boosted[i] == tree], first, tree)
            for first in (True, False)
            for tree in (False, True)
        ]
        for rows, first, tree in groups:
            if rows:
                self._search([slots[i] for i in rows], encoded, lengths, rows, first, tree)

    def _search(
        self,
        slots: list[int],
        encoded: torch.Tensor,
        lengths: torch.Tensor,
        rows: list[int],
        first: bool,
        boosted: bool = False,
    ) -> None:
        """One search of the ``slots`` (rows ``rows`` of ``encoded``): their first chunks, or continuing their beams;
        ``boosted``: every slot has a boosting tree (the computer fusing them), else none has."""
        index = torch.tensor(rows, dtype=torch.long, device=encoded.device)
        x = encoded.index_select(0, index).to(self.dtype)
        x_lengths = lengths.index_select(0, index)
        x = x[:, : int(x_lengths.max())]
        slot_index = torch.tensor(slots, dtype=torch.long, device=self.device)
        previous = None if first else self._gather(slot_index, boosted)
        if boosted:
            ids, weights = (t.index_select(0, slot_index) for t in (self.boosting.model_ids, self.boosting.weights))
            hyps, state = self._boosted_computer.search_chunk(x, x_lengths, previous, ids, weights)
        else:
            hyps, state = self.computer.search_chunk(x, x_lengths, previous)
        self._scatter(slot_index, state, boosted)
        self._append(slot_index, hyps, first)
        # NeMo's flatten_sort_: beams sorted by score / (non-blank labels + 1), descending; the first is the best
        normalized = state.scores / (state.current_lengths_nb.to(state.scores.dtype) + 1)
        _, order = torch.sort(normalized, dim=-1, descending=True)
        self._best_beam.index_copy_(0, slot_index, order[:, 0])
        for slot in slots:
            self._best[slot] = None
        self._decoded[np.asarray(slots)] = True

    def _append(self, slots: torch.Tensor, hyps: BatchedBeamHyps, first: bool) -> None:
        """Each beam's transcript: its root's (the beam it descends from at the chunk's start; none for a first chunk)
        followed by its non-blank labels of the chunk (``hyps``, ``[N, K, W]`` prefix trees of this chunk)."""
        roots = hyps.flatten_()  # [N, K]; every beam's labels of the chunk now in its own row
        width = hyps._max_length
        labels = hyps.transcript_wb[..., :width]
        valid = (labels >= 0) & (labels != hyps.blank_index)
        # labels each beam's root held (none before a first chunk)
        before = torch.zeros_like(roots) if first else torch.gather(self._counts.index_select(0, slots), 1, roots)
        counts = before + valid.sum(-1)
        self._reserve(int(counts.max()))
        columns = torch.where(valid, before[..., None] + valid.cumsum(-1) - 1, self._capacity)  # spare column
        sources = [(self._labels, labels), (self._times, hyps.timestamps[..., :width])]
        if self._durations is not None:
            sources.append((self._durations, hyps.token_durations[..., :width]))
        for store, chunk in sources:
            if first:
                out = torch.zeros([len(roots), self.beam_size, store.shape[-1]], dtype=store.dtype, device=store.device)
            else:
                rows = store.index_select(0, slots)
                out = torch.gather(rows, 1, roots[..., None].expand(-1, -1, store.shape[-1]))
            out.scatter_(2, columns, chunk.to(store.dtype))
            store.index_copy_(0, slots, out)
        self._counts.index_copy_(0, slots, counts)

    def _reserve(self, needed: int) -> None:
        """Room for ``needed`` labels per beam (the storage doubles when it is short)."""
        if needed <= self._capacity:
            return
        capacity = max(needed, 2 * self._capacity, INITIAL_TOKEN_CAPACITY)
        rows, k = self.num_slots + 1, self.beam_size

        def grown(old: torch.Tensor | None) -> torch.Tensor:
            new = torch.zeros([rows, k, capacity + 1], dtype=torch.long, device=self.device)
            if old is not None:
                new[..., : self._capacity].copy_(old[..., : self._capacity])
            return new

        self._labels, self._times = grown(self._labels), grown(self._times)
        if self._tdt:
            self._durations = grown(self._durations)
        self._capacity = capacity

    def _gather(self, slots: torch.Tensor, boosted: bool = False) -> BatchedBeamState:
        """The slots' saved states as one ``BatchedBeamState`` (rows in the order of ``slots``); its fusion states: the
        LM's (if any), then with ``boosted`` the trees'."""
        s, k = self._state, self.beam_size
        beams = (slots[:, None] * k + torch.arange(k, device=slots.device)).view(-1)
        dim = self.computer.state_batch_dim
        fields = {name: _select(getattr(s, name), slots) for name in _PER_ROW}
        fusion = [t.index_select(0, beams) for t in self._fusion_states or []]
        if boosted:
            fusion.append(self.tree_states.index_select(0, beams))
        return BatchedBeamState(
            predictor_states=tuple(t.index_select(dim, beams) for t in s.predictor_states),
            predictor_outputs=s.predictor_outputs.index_select(0, beams),
            fusion_states_list=fusion or None,
            transcript_prefix_hash=None,
            **fields,
        )

    def _scatter(self, slots: torch.Tensor, state: BatchedBeamState, boosted: bool = False) -> None:
        """Save the slots' states after a chunk (the storage is allocated from the first one's shapes); ``boosted``:
        the last fusion states are the slots' trees'."""
        if self._state is None:
            self._state = _allocate(state, self.num_slots + 1, self.computer.state_batch_dim)
            if self.lm is not None:
                beams = (self.num_slots + 1) * self.beam_size
                self._fusion_states = [state.fusion_states_list[0].new_zeros([beams])]
        s, k, dim = self._state, self.beam_size, self.computer.state_batch_dim
        beams = (slots[:, None] * k + torch.arange(k, device=slots.device)).view(-1)
        for stored, new in zip(s.predictor_states, state.predictor_states, strict=True):
            stored.index_copy_(dim, beams, new)
        s.predictor_outputs.index_copy_(0, beams, state.predictor_outputs)
        fusion = list(state.fusion_states_list or [])
        if boosted:
            self.tree_states.index_copy_(0, beams, fusion.pop().reshape(-1))
        if self._fusion_states is not None:
            for stored, new in zip(self._fusion_states, fusion, strict=True):
                stored.index_copy_(0, beams, new.reshape(-1))
        for name in _PER_ROW:
            stored = getattr(s, name)
            if stored is not None:
                stored.index_copy_(0, slots, getattr(state, name).to(stored.dtype))

    # ------------------------------------------------------------------------------------------
    def warm_up(self, batch_sizes: Sequence[int], frames: int, dim: int) -> None:
        """Run the search once at the largest batch size with ``frames`` frames of zeros (its buffers and CUDA graphs
        are sized for the largest input; smaller batches reuse them); the dummy slot is emptied afterwards. With phrase
        boosting set up (:meth:`enable_boosting`), the computer fusing the trees too (rows without a tree)."""
        size = max(batch_sizes)
        with torch.inference_mode():
            encoded = torch.zeros([size, frames, dim], dtype=self.dtype, device=self.device)
            lengths = torch.full([size], frames, dtype=torch.long, device=self.device)
            self.computer.search_chunk(encoded, lengths, None)
            if self._boosted_computer is not None:
                ids = torch.full([size], -1, dtype=torch.long, device=self.device)
                weights = torch.zeros([size], dtype=torch.float64, device=self.device)
                self._boosted_computer.search_chunk(encoded, lengths, None, ids, weights)
        self.reset(self.dummy_slot)

    def capture_step(self, encoded: torch.Tensor, lengths: torch.Tensor, slot_ids: torch.Tensor) -> bool:
        """Nothing is captured around the search: returns ``False``."""
        return False

    # ------------------------------------------------------------------------------------------
    def decoded(self, slot: int) -> bool:
        """Whether the slot has decoded any frame since it was reset."""
        return bool(self._decoded[slot])

    def hypotheses(self, slots: Sequence[int], with_state: bool = True) -> list[Hypothesis | None]:
        """Each slot's best beam so far (``None`` for a slot that has not decoded a frame), as NeMo's
        ``to_hyps_list(score_norm)`` of the joined chunks gives it: tokens, timestamps (frames from the stream's start;
        TDT: the start frames and ``token_duration``), score; ``dec_state`` is ``None``, ``length`` the frames decoded.
        Built for all asked slots in one read back; ``with_state`` is accepted for the greedy decoder's interface."""
        todo = [slot for slot in dict.fromkeys(slots) if self._decoded[slot] and self._best[slot] is None]
        if todo:
            with torch.inference_mode():
                rows = torch.tensor(todo, dtype=torch.long, device=self.device)
                best = self._best_beam.index_select(0, rows)[:, None]
                stores = [self._labels, self._times] + ([self._durations] if self._durations is not None else [])
                picked = [
                    s.index_select(0, rows)[torch.arange(len(todo), device=self.device), best[:, 0]] for s in stores
                ]
                counts = torch.gather(self._counts.index_select(0, rows), 1, best)[:, 0]
                scores = torch.gather(self._state.scores.index_select(0, rows), 1, best)[:, 0]
                frames = self._state.decoded_lengths.index_select(0, rows)
                host = [t.cpu().numpy() for t in (*picked, counts, frames)]
                host_scores = scores.tolist()
            labels, times, *rest = host[: len(stores)]
            durations = rest[0] if rest else None
            counts, frames = host[len(stores) :]
            for i, slot in enumerate(todo):
                n = int(counts[i])
                hyp = Hypothesis(score=host_scores[i], y_sequence=labels[i, :n].copy(), timestamp=times[i, :n].copy())
                if durations is not None:  # NeMo's timestamps of TDT tokens: where they start
                    hyp.token_duration = durations[i, :n].copy()
                    hyp.timestamp = hyp.timestamp - hyp.token_duration
                hyp.length = int(frames[i])
                self._best[slot] = hyp
        return [self._best[slot] if self._decoded[slot] else None for slot in slots]

    def hypothesis(self, slot: int) -> Hypothesis | None:
        """The slot's best beam so far (``None`` before its first frame)."""
        return self.hypotheses([slot])[0]

    def token_ids(self, slot: int) -> list[int]:
        """The best beam's token ids so far."""
        hyp = self.hypothesis(slot)
        return [] if hyp is None else [int(t) for t in hyp.y_sequence]

    def text(self, slot: int) -> str:
        """The best beam's transcript so far."""
        return self.model.decoding.decode_ids_to_str(self.token_ids(slot))

    def changed(self, slots: np.ndarray) -> np.ndarray:
        """``[N]`` bool: each slot's best beam differs from the one at the previous call (partial events: a beam search
        may also replace tokens, so a change, not a growth, calls for one)."""
        out = np.zeros(len(slots), dtype=bool)
        for i, slot in enumerate(slots.tolist()):
            tokens = tuple(self.token_ids(slot))
            out[i] = tokens != (self._reported[slot] or ())
            self._reported[slot] = tokens
        return out


def _select(t: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    return None if t is None else t.index_select(0, rows)


def _allocate(state: BatchedBeamState, rows: int, state_batch_dim: int) -> BatchedBeamState:
    """Zeroed storage of ``rows`` rows shaped as ``state``'s (a chunk's state, ``B`` rows of ``K`` beams)."""
    beams = rows * state.scores.shape[1]

    def grown(t: torch.Tensor | None, size: int, dim: int = 0) -> torch.Tensor | None:
        if t is None:
            return None
        shape = list(t.shape)
        shape[dim] = size
        return t.new_zeros(shape)

    return BatchedBeamState(
        predictor_states=tuple(grown(t, beams, state_batch_dim) for t in state.predictor_states),
        predictor_outputs=grown(state.predictor_outputs, beams),
        fusion_states_list=None,
        transcript_prefix_hash=None,
        **{name: grown(getattr(state, name), rows) for name in _PER_ROW},
    )
