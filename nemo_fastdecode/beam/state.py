"""Every tensor the beam search loop touches, allocated once per (batch, length) size."""

from __future__ import annotations

import torch

from nemo_fastdecode.beam.hyps import BeamHypsBuffer
from nemo_fastdecode.graphs.owner import CapturedBuffers


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
        # prediction network: working state, the parents' state gathered per step, and the state after <SOS>
        self.decoder_state: list[torch.Tensor] = []
        self.parent_decoder_state: list[torch.Tensor] = []
        self.sos_decoder_state: list[torch.Tensor] = []
        self.decoder_output = torch.zeros([batch_size * beam_size, 1, hidden], dtype=float_dtype, device=device)
        self.parent_decoder_output = torch.zeros_like(self.decoder_output)
        self.sos_decoder_output = torch.zeros_like(self.decoder_output)
        self.hyps = BeamHypsBuffer(batch_size, beam_size, capacity, blank_index, device, float_dtype, tdt)
