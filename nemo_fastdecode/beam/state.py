"""Every tensor the beam search loop touches, allocated once per (batch, length) size; the state a search
continues from and hands on between chunks of a stream (NeMo's ``BatchedBeamState``) goes in and out of them here."""

from __future__ import annotations

import torch
from nemo.collections.asr.parts.submodules.transducer_decoding.label_looping_base import BatchedBeamState

from nemo_fastdecode.beam.hyps import NON_EXISTENT_LABEL_VALUE, BeamHypsBuffer
from nemo_fastdecode.graphs.owner import CapturedBuffers
from nemo_fastdecode.transducer.fusion import FusionBuffers, FusionModels


class BeamLoopBuffers(CapturedBuffers):
    """Pre-allocated state of the batched beam search for ``batch_size`` rows x ``beam_size`` beams.

    A CUDA graph is specialised to these addresses and shapes: inputs are copied in, the loop updates
    everything in place, and rows beyond the real batch have length 0 (never active). Beams are
    flattened row-major where the networks see them: row ``b``, beam ``k`` is entry ``b * K + k``.
    """

    def __init__(
        self,
        batch_size: int,
        beam_size: int,
        max_time: int,
        hidden: int,
        capacity: int,
        blank_index: int,
        device: torch.device,
        float_dtype: torch.dtype,
        tdt: bool,
    ):
        self.batch_size, self.beam_size, self.max_time = batch_size, beam_size, max_time
        self.device, self.float_dtype = device, float_dtype
        beams = [batch_size, beam_size]
        # inputs
        self.encoder_projected = torch.zeros([batch_size, max_time, hidden], dtype=float_dtype, device=device)
        self.encoder_lengths = torch.zeros([batch_size], dtype=torch.long, device=device)
        # the row of every flattened beam (constant)
        self.beam_rows = torch.arange(batch_size, device=device).repeat_interleave(beam_size)
        # per-beam time: the frame each hypothesis is at, and the last frame of its row
        self.time_indices = torch.zeros(beams, dtype=torch.long, device=device)
        self.safe_time_indices = torch.zeros(beams, dtype=torch.long, device=device)
        self.last_frame = torch.zeros(beams, dtype=torch.long, device=device)
        self.active = torch.zeros(beams, dtype=torch.bool, device=device)
        self.flag = torch.zeros([], dtype=torch.bool, device=device)  # any beam active and room left
        # prediction network: working state, the parents' state gathered per step, the state after <SOS>, and the
        # state the next search begins from (after <SOS>, or a previous chunk's)
        self.decoder_state: list[torch.Tensor] = []
        self.parent_decoder_state: list[torch.Tensor] = []
        self.sos_decoder_state: list[torch.Tensor] = []
        self.start_decoder_state: list[torch.Tensor] = []
        self.decoder_output = torch.zeros([batch_size * beam_size, 1, hidden], dtype=float_dtype, device=device)
        self.parent_decoder_output = torch.zeros_like(self.decoder_output)
        self.sos_decoder_output = torch.zeros_like(self.decoder_output)
        self.start_decoder_output = torch.zeros_like(self.decoder_output)
        self.hyps = BeamHypsBuffer(batch_size, beam_size, capacity, blank_index, device, float_dtype, tdt)
        self.starts_empty = True  # host flag: the start is the empty hypotheses after <SOS>
        # n-gram LM / boosting-tree states, one per beam (None: no fusion)
        self.fusion: FusionBuffers | None = None

    def start_empty(self) -> None:
        """The next search begins afresh: empty hypotheses, the prediction network after ``<SOS>``."""
        if self.starts_empty:
            return
        self.hyps.start_empty_()
        for start, sos in zip(self.start_decoder_state, self.sos_decoder_state, strict=True):
            start.copy_(sos)
        self.start_decoder_output.copy_(self.sos_decoder_output)
        self.starts_empty = True

    def start_from(
        self, state: BatchedBeamState, batch_size: int, state_batch_dim: int, tdt: bool, fuses: bool = False
    ) -> None:
        """The next search continues the first ``batch_size`` rows of a previous chunk's ``state`` (NeMo's
        ``BatchedBeamState``, ``[B', K]`` per beam with ``B' >= batch_size``); padding rows begin afresh.

        As NeMo's computers seed a chunk: the beams' scores, transcript hashes and lengths, labels at the
        current frame, last labels (``state.labels``, blank where a beam has none), the prediction network's
        state and projected output per beam, and (TDT) the frames each beam jumped past the previous chunk's end.
        """
        check_continuable(state, batch_size, self.beam_size, fuses)
        if batch_size < self.batch_size:
            self.start_empty()  # padding rows
        rows = slice(0, batch_size)
        beams = batch_size * self.beam_size
        zeros = torch.zeros([batch_size, self.beam_size], dtype=torch.long, device=self.device)
        per_beam = {
            "scores": state.scores[rows],
            "lengths": state.current_lengths_nb[rows],
            "last_label": state.labels[rows],
            "hashes": state.transcript_hash[rows],
            "labels_at_time": state.last_timestamp_lasts[rows],
            # RNN-T: every chunk begins at its first frame (NeMo's RNN-T search reads no time_jumps)
            "next_time": state.time_jumps[rows] if tdt and state.time_jumps is not None else zeros,
        }
        self.hyps.start_from_(batch_size, **per_beam)
        for start, previous in zip(self.start_decoder_state, state.predictor_states, strict=True):
            start.narrow(state_batch_dim, 0, beams).copy_(previous.narrow(state_batch_dim, 0, beams))
        hidden = self.start_decoder_output.shape[-1]
        self.start_decoder_output[:beams].copy_(state.predictor_outputs.reshape(-1, 1, hidden)[:beams])
        self.starts_empty = False

    def start_fusion_from(self, models: FusionModels, state: BatchedBeamState | None, batch_size: int) -> None:
        """Every beam's fusion states begin after ``<BOS>``, or, for the first ``batch_size`` rows, where ``state``
        (a previous chunk's, ``[B' * K]`` per model) left them; a state without fusion states begins after ``<BOS>``,
        as NeMo's computers begin it."""
        models.reset_initial_states(self.fusion)
        if state is None or not state.fusion_states_list:
            return
        if len(state.fusion_states_list) != len(models):
            raise ValueError(
                f"prev_batched_state carries {len(state.fusion_states_list)} fusion model states; this search fuses "
                f"{len(models)} models"
            )
        beams = batch_size * self.beam_size
        for initial, saved in zip(self.fusion.initial_states, state.fusion_states_list, strict=True):
            initial[:beams].copy_(saved.reshape(-1)[:beams])

    def state_after(
        self,
        batch_size: int,
        encoder_lengths: torch.Tensor,
        previous: BatchedBeamState | None,
        state_batch_dim: int,
        sos: int,
    ) -> BatchedBeamState:
        """The state to continue the first ``batch_size`` rows from after a search of ``encoder_lengths [B]`` frames
        (copies), as NeMo's computers make it: per beam the prediction network's state and projected output, the
        last label (``sos``, i.e. blank, where a beam has none, else the previous chunk's), the scores, transcript
        hashes and lengths, labels at the current frame and (TDT) the frames jumped past this chunk's end; per row
        the frames decoded so far."""
        hyps, beams, rows = self.hyps, batch_size * self.beam_size, slice(0, batch_size)
        last_labels = torch.where(hyps.last_label[rows] != NON_EXISTENT_LABEL_VALUE, hyps.last_label[rows], sos)
        if previous is not None:
            last_labels = torch.where(last_labels == sos, previous.labels[rows], last_labels)
        lengths = encoder_lengths.to(self.device)
        time_jumps = None
        if hyps.tdt:
            time_jumps = torch.clamp(self.time_indices[rows] - lengths[:, None], min=0)
        return BatchedBeamState(
            predictor_states=tuple(s.narrow(state_batch_dim, 0, beams).clone() for s in self.decoder_state),
            predictor_outputs=self.decoder_output[:beams].clone(),
            labels=last_labels,
            decoded_lengths=lengths.clone() if previous is None else lengths + previous.decoded_lengths[rows],
            fusion_states_list=None if self.fusion is None else [s[:beams].clone() for s in self.fusion.states],
            time_jumps=time_jumps,
            scores=hyps.scores[rows].clone(),
            transcript_hash=hyps.hashes[rows].clone(),
            current_lengths_nb=hyps.lengths[rows].clone(),
            last_timestamp_lasts=hyps.labels_at_time[rows].clone(),
            transcript_prefix_hash=None,
        )


def check_continuable(state: BatchedBeamState, batch_size: int, beam_size: int, fuses: bool = False) -> None:
    """Raise a ValueError naming what keeps a search of ``batch_size`` rows x ``beam_size`` beams from continuing
    ``state`` (a beam search's state: per-beam scores ``[B', K]``, ``B' >= batch_size``; fusion states only where
    the search ``fuses``)."""
    if not isinstance(state, BatchedBeamState) or state.scores is None:
        raise ValueError(
            f"prev_batched_state must be the BatchedBeamState a beam search returned (with per-beam scores), got "
            f"{type(state).__name__}"
        )
    if state.fusion_states_list and not fuses:
        raise ValueError(
            "prev_batched_state carries n-gram LM / boosting-tree fusion states, and this search fuses no models; "
            "continue it with the same ngram_lm_model / boosting_tree"
        )
    rows, beams = state.scores.shape
    if beams != beam_size or rows < batch_size:
        raise ValueError(
            f"prev_batched_state holds {rows} rows x {beams} beams; this search needs at least {batch_size} rows x "
            f"{beam_size} beams (beam_size={beam_size})"
        )
