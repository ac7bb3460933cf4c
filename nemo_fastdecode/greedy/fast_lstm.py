"""Opt-in prediction-network step: per layer one cuBLAS GEMM and one Triton cell kernel, instead of cuDNN.

cuDNN runs a one-step LSTM at batch 32 as two ``sgemm_largek`` GEMMs of about 22 us each on an H200
(plus bias, scale and memset kernels): the largest single cost of a frame-loop step. Here each layer is
``gates = [x | h] @ [W_ih | W_hh]^T + (b_ih + b_hh)`` (one GEMM over the concatenated input) and
:func:`~nemo_fastdecode.greedy.steps.lstm_cell_masked`, which also applies the row mask in place.
The sums run in a different order than cuDNN's, so hidden states differ by float32 rounding and a
near-tie in the joint can resolve differently: opt-in (``fast_lstm=True``), agreement reported by the
benchmark.
"""

from __future__ import annotations

import torch

from nemo_fastdecode.greedy import steps


def fast_lstm_unsupported_reason(decoder: torch.nn.Module) -> str | None:
    """Why ``decoder``'s prediction network cannot take the fast step; ``None`` when it can."""
    prediction = getattr(decoder, "prediction", None)
    rnn = prediction["dec_rnn"] if isinstance(prediction, torch.nn.ModuleDict) and "dec_rnn" in prediction else None
    lstm = getattr(rnn, "lstm", None)
    if not isinstance(lstm, torch.nn.LSTM):
        return f"the prediction network is {type(rnn).__name__}, not NeMo's LSTMDropout around torch.nn.LSTM"
    if lstm.proj_size or lstm.bidirectional or not lstm.bias or lstm.batch_first:
        return "the LSTM has a projection, two directions, no bias or batch_first=True"
    if decoder.is_adapter_available():
        return "the prediction network has adapters"
    return None


class FastLSTMStep:
    """One step of NeMo's LSTM prediction network for a fixed batch; the state advances only where masked.

    Args:
        decoder: NeMo ``RNNTDecoder`` (checked with :func:`fast_lstm_unsupported_reason`).
        batch_size: rows of the pre-allocated buffers.
    """

    def __init__(self, decoder: torch.nn.Module, batch_size: int):
        reason = fast_lstm_unsupported_reason(decoder)
        if reason:
            raise ValueError(f"fast_lstm=True is not possible: {reason}")
        self.embed = decoder.prediction["embed"]
        self.lstm: torch.nn.LSTM = decoder.prediction["dec_rnn"].lstm
        weight = self.lstm.weight_ih_l0
        hidden, layers = self.lstm.hidden_size, self.lstm.num_layers
        sizes = [self.lstm.input_size] + [hidden] * (layers - 1)
        self.weights = [torch.empty([4 * hidden, n + hidden], dtype=weight.dtype, device=weight.device) for n in sizes]
        self.biases = [torch.empty([4 * hidden], dtype=weight.dtype, device=weight.device) for _ in sizes]
        self.inputs = [torch.zeros([batch_size, n + hidden], dtype=weight.dtype, device=weight.device) for n in sizes]
        self.gates = torch.zeros([batch_size, 4 * hidden], dtype=weight.dtype, device=weight.device)
        self.outputs = torch.zeros([layers, batch_size, hidden], dtype=weight.dtype, device=weight.device)
        self.refresh_weights()

    def refresh_weights(self) -> None:
        """Copy the LSTM's current weights into the concatenated ones (in place: captured graphs keep them)."""
        with torch.no_grad():
            for layer, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
                w_ih, w_hh = getattr(self.lstm, f"weight_ih_l{layer}"), getattr(self.lstm, f"weight_hh_l{layer}")
                weight[:, : w_ih.shape[1]].copy_(w_ih)
                weight[:, w_ih.shape[1] :].copy_(w_hh)
                torch.add(getattr(self.lstm, f"bias_ih_l{layer}"), getattr(self.lstm, f"bias_hh_l{layer}"), out=bias)

    def __call__(
        self, labels: torch.Tensor, mask: torch.Tensor, states: list[torch.Tensor], fused: bool
    ) -> torch.Tensor:
        """Advance ``states`` (``(h, c)``, each ``[L, B, H]``, in place) by ``labels [B]`` where ``mask [B]``.

        Returns the last layer's new hidden state ``[B, H]`` for every row (NeMo's prediction output).
        """
        x = self.embed(labels)  # the blank (padding) label embeds as zeros, as in NeMo's predict
        h, c = states
        for layer, (weight, bias, inputs) in enumerate(zip(self.weights, self.biases, self.inputs, strict=True)):
            size = weight.shape[1] - h.shape[2]
            inputs[:, :size].copy_(x)
            inputs[:, size:].copy_(h[layer])
            torch.addmm(bias, inputs, weight.T, out=self.gates)
            x = steps.lstm_cell_masked(self.gates, mask, h[layer], c[layer], self.outputs[layer], fused)
        return x
