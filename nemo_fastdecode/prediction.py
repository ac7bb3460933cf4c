"""NeMo's LSTM prediction network and the joint's prediction projection (and output layer) on Triton kernels.

With NeMo's modules the decoders call ``decoder.predict`` (embedding, cuDNN LSTM) and ``joint.project_prednet``,
NeMo's own calls. :class:`FastMathPredictor` (opt-in ``fast_math``) computes the same step with fewer and faster
kernels:

- the first layer's input GEMM and both its biases depend only on the label, so they are one lookup in a
  table ``embedding @ W_ih^T + b_ih + b_hh`` computed once in float64 (``[V + 1, 4H]``);
- each layer is one 3xTF32 tensor-core kernel with the LSTM cell in its epilogue
  (:func:`~nemo_fastdecode.kernels.lstm_step.lstm_cell_step`), the projection one more
  (:func:`~nemo_fastdecode.kernels.matmul.linear`);
- the joint's output layer (``[B, H] -> [B, V + 1 (+ durations)]``, evaluated every step) is the same 3xTF32
  linear kernel instead of cuBLAS's fp32 SIMT GEMM and its split-K reduction.

Results are near fp32 but not bit-identical (see :mod:`nemo_fastdecode.kernels.tf32x3`). Without a Triton
backend (CPU) it runs the kernels' torch references, which is how the CPU tests check the algebra.

:class:`ExactPredictor` is the exact label loop's form of the same step, in IEEE fp32: the label table, the
recurrent GEMMs of every layer on a parallel branch while the joint looks, and IEEE-fp32 products for the rest
(on CUDA the few-row kernel of :mod:`~nemo_fastdecode.kernels.few_row_gemm`, the joint's output layer included).
cuDNN's fp32 LSTM runs its two GEMMs per layer one after the other on the loop's critical path (four sequential
SIMT GEMMs for a two-layer network); here only a deeper layer's input GEMM and the projection
remain on it. Every product and sum is an fp32 operation as in cuDNN and cuBLAS, in another order, so scores agree
with NeMo's to float32 rounding, as NeMo's own decoders of other shapes do.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from nemo_fastdecode.kernels import few_row_gemm, lstm_step, matmul, triton_runs_on
from nemo_fastdecode.kernels.tf32x3 import split_k_counters


def decode_precision(
    encoder_output: torch.Tensor, *, fast_math: bool, like_nemo_graphs: bool, parameter_dtype: torch.dtype
) -> tuple[contextlib.AbstractContextManager, torch.Tensor]:
    """The precision a decode runs in: that of the NeMo decoder it replaces, in the caller's precision context.

    Returns ``(context to decode in, the encoder output to decode)``:

    - ``fast_math``: float32 whatever the caller's autocast (autocast off, the encoder output taken to float32).
    - ``like_nemo_graphs`` (the decode replaces one of NeMo's label-looping greedy or ``malsd_batch`` decoders with
      their CUDA graphs, their default on a GPU): those turn autocast off and decode in the dtype of the joint's
      parameters -- float32 under bf16 autocast with float32 weights, bf16 with bf16 weights -- and so does this
      decode, with the encoder output cast to ``parameter_dtype`` (where NeMo's projection raises on a mismatch,
      e.g. bf16 encoder outputs into a float32 joint, this decodes their float32 values).
    - otherwise (the CPU, graphs off, the frame loop): unchanged; the decode runs under the caller's autocast, as
      NeMo's eager loops do.
    """
    if fast_math:
        return torch.autocast(encoder_output.device.type, enabled=False), encoder_output.float()
    if like_nemo_graphs:
        return torch.autocast(encoder_output.device.type, enabled=False), encoder_output.to(parameter_dtype)
    return contextlib.nullcontext(), encoder_output


def is_default_joint(joint: torch.nn.Module) -> bool:
    """NeMo's default joint network: ReLU, (dropout), Linear, no adapters (a joint without ``joint_net`` is not)."""
    layers = list(getattr(joint, "joint_net", ()))
    return (
        len(layers) >= 2
        and isinstance(layers[0], torch.nn.ReLU)
        and isinstance(layers[-1], torch.nn.Linear)
        and all(isinstance(layer, torch.nn.Dropout) for layer in layers[1:-1])
        and not joint.is_adapter_available()
    )


def joint_normalises(joint: torch.nn.Module, device: torch.device) -> bool:
    """Whether the joint log-softmaxes its logits on ``device`` (NeMo's ``log_softmax=None``: on the CPU only)."""
    log_softmax = joint.log_softmax
    return bool(log_softmax) or (log_softmax is None and device.type != "cuda")


def normalise_joint_logits(joint: torch.nn.Module, logits: torch.Tensor) -> torch.Tensor:
    """The joint's output normalisation, as ``RNNTJoint.joint_after_projection`` applies it after its last layer."""
    if joint_normalises(joint, logits.device):
        if joint.temperature != 1.0:
            logits = logits / joint.temperature
        logits = logits.log_softmax(dim=-1)
    return logits


def fast_math_unsupported_reason(decoder: torch.nn.Module, joint: torch.nn.Module) -> str | None:
    """Why :class:`FastMathPredictor` cannot replace this prediction network (``None``: it can)."""
    modules = getattr(decoder, "prediction", None)
    if not (isinstance(modules, torch.nn.ModuleDict) and "dec_rnn" in modules):
        # e.g. StatelessTransducerDecoder: its state is the last labels, there is no recurrent step to replace
        return f"fast_math needs NeMo's plain LSTM prediction network (RNNTDecoder), got {type(decoder).__name__}"
    rnn = modules["dec_rnn"]
    lstm = getattr(rnn, "lstm", None)
    if not isinstance(lstm, torch.nn.LSTM):
        return f"fast_math needs NeMo's plain LSTM prediction network (LSTMDropout), got {type(rnn).__name__}"
    if lstm.proj_size or not lstm.bias or lstm.batch_first or lstm.bidirectional:
        return "fast_math needs an LSTM without projection, with biases, unidirectional, time-major"
    if decoder.is_adapter_available():
        return "fast_math does not cover prediction-network adapters"
    if not isinstance(getattr(joint, "pred", None), torch.nn.Linear):
        return f"fast_math needs the joint's prediction projection to be a Linear, got {type(joint.pred).__name__}"
    if not is_default_joint(joint):
        layers = ", ".join(type(layer).__name__ for layer in joint.joint_net)
        return f"fast_math needs NeMo's default joint (ReLU, Dropout, Linear; no adapters), got {layers}"
    return None


class FastMathPredictor:
    """One prediction-network step for a batch of labels, in the layout of NeMo's ``(h, c)`` states.

    Args:
        decoder: NeMo ``RNNTDecoder`` with an LSTM prediction network (:func:`fast_math_unsupported_reason`).
        joint: NeMo ``RNNTJoint``; its ``pred`` Linear projects the LSTM output.
    """

    #: the products' precision (:data:`~nemo_fastdecode.kernels.tf32x3.PRECISIONS`)
    precision = "tf32x3"

    def __init__(self, decoder: torch.nn.Module, joint: torch.nn.Module):
        reason = fast_math_unsupported_reason(decoder, joint)
        if reason is not None:
            raise ValueError(reason)
        self.embedding = decoder.prediction["embed"]
        self.lstm: torch.nn.LSTM = decoder.prediction["dec_rnn"].lstm
        self.projection: torch.nn.Linear = joint.pred
        self.joint_output_layer: torch.nn.Linear = joint.joint_net[-1]
        self._weights: dict[str, torch.Tensor] = {}
        self._source_versions: tuple | None = None
        # split-K tile counters, one set per stream that may run a kernel concurrently with the other
        self._counters: dict[str, torch.Tensor] = {}

    def _parameters(self) -> list[torch.Tensor]:
        return [
            self.embedding.weight,
            *self.lstm.parameters(),
            *self.projection.parameters(),
            *self.joint_output_layer.parameters(),
        ]

    @torch.no_grad()
    def refresh(self) -> bool:
        """(Re)build the label table and fp32 weight copies when the model's parameters changed or moved.

        Call before a decode, outside graph capture. Returns ``True`` when the copies were reallocated (shape or
        device changed): graphs captured before read stale memory and must be re-captured. Same-shape updates
        are written in place.
        """
        versions = tuple((p.data_ptr(), p.device, p._version) for p in self._parameters())
        if versions == self._source_versions:
            return False
        lstm = self.lstm
        weights = {
            # layer 0: the input GEMM and both biases per label, rounded once from float64
            "table": (
                self.embedding.weight.double() @ lstm.weight_ih_l0.double().T
                + lstm.bias_ih_l0.double()
                + lstm.bias_hh_l0.double()
            ).float(),
            "projection_weight": self.projection.weight.detach().float(),
            "projection_bias": _bias_of(self.projection),
            "joint_weight": self.joint_output_layer.weight.detach().float(),
            "joint_bias": _bias_of(self.joint_output_layer),
            "no_gate_bias": torch.zeros(4 * lstm.hidden_size, device=lstm.weight_hh_l0.device),
        }
        for layer in range(lstm.num_layers):
            weights[f"weight_hh_{layer}"] = getattr(lstm, f"weight_hh_l{layer}").detach().float()
            if layer > 0:
                weights[f"weight_ih_{layer}"] = getattr(lstm, f"weight_ih_l{layer}").detach().float()
                bias = getattr(lstm, f"bias_ih_l{layer}").double() + getattr(lstm, f"bias_hh_l{layer}").double()
                weights[f"bias_{layer}"] = bias.float()
        same_layout = self._weights.keys() == weights.keys() and all(
            self._weights[k].shape == w.shape and self._weights[k].device == w.device for k, w in weights.items()
        )
        if same_layout:
            for key, value in weights.items():
                self._weights[key].copy_(value)
        else:
            self._weights = {key: value.contiguous() for key, value in weights.items()}
            device = self._weights["table"].device
            self._counters = {stream: split_k_counters(device) for stream in ("main", "recurrent")}
        self._source_versions = versions
        return not same_layout

    def check_dtype(self, dtype: torch.dtype) -> None:
        """Fast math decodes in float32 (:func:`fast_math_precision` sees to it): a clear error for anything else."""
        if dtype != torch.float32:
            raise ValueError(f"fast_math decodes in float32, got {dtype}; decode in float32 or set fast_math=false")

    def prepare(self, dtype: torch.dtype) -> bool:
        """Before a decode in ``dtype``: check it (:meth:`check_dtype`) and :meth:`refresh` the weight copies.

        Returns ``True`` when the copies were reallocated: the caller's captured graphs must be re-captured.
        """
        self.check_dtype(dtype)
        return self.refresh()

    def step(
        self,
        labels: torch.Tensor,
        states: list[torch.Tensor],
        fused: bool,
        recurrent_gates: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The prediction network advanced by ``labels``: ``(projected output [B, 1, H_joint], [h, c])``.

        Shapes: labels ``[B]`` int64; states ``[h, c]`` each ``[L, B, H]`` float32 (not modified);
        ``recurrent_gates [L, B, 4H]``: :meth:`recurrent_gates` of these states, computed beforehand (``None``:
        computed here, inside the cell kernels). ``fused``: the Triton kernels (CUDA, or the interpreter);
        otherwise their torch references.
        """
        w = self._refreshed_weights()
        h, c = states
        self.check_dtype(h.dtype)
        h_new, c_new = torch.empty_like(h), torch.empty_like(c)
        cell = self._cell(fused)
        for layer in range(h.shape[0]):
            row_bias, bias_index, x, weight_x = self._layer_input(layer, labels, h_new)
            if recurrent_gates is None:
                cell(row_bias, bias_index, x, weight_x, h[layer], w[f"weight_hh_{layer}"], c[layer], h_new[layer],
                     c_new[layer])  # fmt: skip
            else:
                cell(row_bias, bias_index, x, weight_x, None, None, c[layer], h_new[layer], c_new[layer],
                     recurrent_gates=recurrent_gates[layer])  # fmt: skip
        last = h_new[-1]
        output = torch.empty([last.shape[0], w["projection_weight"].shape[0]], device=last.device)
        self._linear(last, w["projection_weight"], w["projection_bias"], output, fused, "main")
        return output.unsqueeze(1), [h_new, c_new]

    def advance_in_place(
        self,
        labels: torch.Tensor,
        mask: torch.Tensor,
        states: list[torch.Tensor],
        output: torch.Tensor,
        recurrent_gates: torch.Tensor,
        fused: bool,
    ) -> None:
        """Where ``mask[b]``, advance row b's state and projected output by ``labels[b]``, in place; other rows keep
        theirs. The same values as :meth:`step` followed by a masked copy, without the copy.

        Shapes: labels / mask ``[B]``; states ``[h, c]`` each ``[L, B, H]``; output ``[B, 1, H_joint]``;
        ``recurrent_gates [L, B, 4H]`` (:meth:`recurrent_gates` of these states; needed: with it the kernels read no
        ``h`` that they overwrite).
        """
        w = self._refreshed_weights()
        h, c = states
        self.check_dtype(h.dtype)
        for layer in range(h.shape[0]):
            # the layer below was updated in place: its rows in the mask hold their new values
            gates = recurrent_gates[layer]
            row_bias, bias_index, x, weight_x = self._in_place_layer_input(layer, labels, h, gates, fused)
            self._cell(fused)(row_bias, bias_index, x, weight_x, None, None, c[layer], h[layer], c[layer],
                              recurrent_gates=gates, row_mask=mask)  # fmt: skip
        self._linear(h[-1], w["projection_weight"], w["projection_bias"], output[:, 0], fused, "main", mask)

    def _in_place_layer_input(
        self, layer: int, labels: torch.Tensor, h: torch.Tensor, gates: torch.Tensor, fused: bool
    ) -> tuple:
        """:meth:`_layer_input` of :meth:`advance_in_place`'s cell step, whose recurrent part is ``gates [B, 4H]``:
        a deeper layer's input product runs inside the cell kernel."""
        return self._layer_input(layer, labels, h)

    def _cell(self, fused: bool):
        """The LSTM cell step: the Triton kernel in this precision, or its torch reference."""
        if not fused:
            return lstm_step.lstm_cell_step_reference
        return functools.partial(lstm_step.lstm_cell_step, precision=self.precision)

    def _refreshed_weights(self) -> dict[str, torch.Tensor]:
        if not self._weights:
            raise RuntimeError("FastMathPredictor.refresh() must run before a step")
        return self._weights

    def _layer_input(self, layer: int, labels: torch.Tensor, new_h: torch.Tensor) -> tuple:
        """``(row_bias, bias_index, x, weight_x)`` of a cell step: layer 0 adds its precomputed input gates picked
        by label; a later layer the layer below's new hidden state ``new_h[layer - 1]`` times ``W_ih``."""
        w = self._weights
        if layer == 0:
            return w["table"], labels, None, None
        return w[f"bias_{layer}"], None, new_h[layer - 1], w[f"weight_ih_{layer}"]

    def recurrent_gates(self, states: list[torch.Tensor], out: torch.Tensor, fused: bool) -> torch.Tensor:
        """``out[l] = h[l] @ W_hh_l^T`` for every layer: the part of the next step's gates that needs no label.

        Shapes: states ``[h, c]`` each ``[L, B, H]``; out ``[L, B, 4H]`` float32. It depends only on the state
        before the step, so a decoder can start it early, on a parallel stream (split-K counters of their own),
        and pass it to :meth:`step`.
        """
        w = self._weights
        h = states[0]
        self.check_dtype(h.dtype)
        for layer in range(h.shape[0]):
            self._linear(h[layer], w[f"weight_hh_{layer}"], w["no_gate_bias"], out[layer], fused, "recurrent")
        return out

    def _linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor,
        fused: bool,
        stream: str,
        row_mask: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
    ) -> None:
        """``out = x @ weight^T + bias (+ residual)`` (rows of ``row_mask`` only), on the split-K counters of
        ``stream``."""
        if not fused:
            matmul.linear_reference(x, weight, bias, out=out, row_mask=row_mask, residual=residual)
            return
        options = self._tiling(x.shape[0], weight.shape[0])
        matmul.linear(x, weight, bias, self.precision, out=out, row_mask=row_mask, counters=self._counters[stream],
                      residual=residual, **options)  # fmt: skip

    def _tiling(self, rows: int, n_out: int) -> dict:
        """:func:`matmul.linear` tiling of a per-step product of ``rows`` rows and ``n_out`` outputs."""
        return matmul.decoder_tiling(rows, split_k=True)

    def joint_output(self, hidden: torch.Tensor, tile_rows: int | None = None) -> torch.Tensor:
        """The joint's last Linear on its hidden activations: ``[B, H_joint] -> [B, V + 1 (+ durations)]`` (fp32).

        The 3xTF32 kernel where Triton runs (CUDA, or the interpreter), else the torch reference. ``tile_rows``:
        tile the kernel as for a batch of that many rows (each row then comes out bit for bit as in that batch;
        the greedy look-ahead relies on it); ``None``: as for ``B``.
        """
        weight, bias = self._weights["joint_weight"], self._weights["joint_bias"]
        out = torch.empty([hidden.shape[0], weight.shape[0]], device=hidden.device)
        if not triton_runs_on(hidden.device):
            return matmul.linear_reference(hidden, weight, bias, out=out)
        return matmul.linear(hidden, weight, bias, out=out, **matmul.decoder_tiling(tile_rows or hidden.shape[0]))

    @property
    def joint_output_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The joint's last Linear as fp32 ``(weight [N, H_joint], bias [N])``."""
        return self._weights["joint_weight"], self._weights["joint_bias"]

    def joint_logits_from_hidden(self, joint: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """The joint's output layer and normalisation on its hidden activations ``[N, H_joint]``."""
        return normalise_joint_logits(joint, self.joint_output(hidden))


class ExactPredictor(FastMathPredictor):
    """The exact label loop's prediction-network step: :class:`FastMathPredictor`'s structure in IEEE fp32.

    - layer 0's input gates and both its biases: a row of the label table (float64, rounded once);
    - every layer's recurrent gates ``h @ W_hh^T``: :meth:`recurrent_gates`, which the label loop runs on a parallel
      branch while the joint looks (they need no label);
    - a deeper layer's input gates and the joint's prediction projection: IEEE-fp32 GEMMs, the only products left
      between one look and the next;
    - the LSTM cell: :func:`~nemo_fastdecode.kernels.lstm_step.lstm_cell_step` on the summed gates (no product);
    - the joint's output layer (:meth:`joint_output`): an IEEE-fp32 GEMM as well.

    On CUDA every product is :func:`~nemo_fastdecode.kernels.few_row_gemm.linear` (CUDA C, on transposed weight
    copies kept here); elsewhere, and beyond its row limit, :func:`~nemo_fastdecode.kernels.matmul.linear` in IEEE
    precision (Triton, the CPU tests through its interpreter) and NeMo's Linear for the joint. Float32 decodes only:
    under autocast the decoders run NeMo's modules in the caller's precision, as NeMo's decoders do.
    """

    precision = "ieee"
    #: the weights whose products run on the few-row kernel (transposed copies, CUDA only)
    _FEW_ROW_WEIGHTS = ("projection_weight", "joint_weight", "weight_hh_", "weight_ih_")

    def __init__(self, decoder: torch.nn.Module, joint: torch.nn.Module):
        super().__init__(decoder, joint)
        # data_ptr of a weight copy in ``_weights`` -> its few_row_gemm.transposed_weight
        self._transposed: dict[int, torch.Tensor] = {}

    def check_dtype(self, dtype: torch.dtype) -> None:
        if dtype != torch.float32:
            raise ValueError(
                f"the exact predictor decodes in float32, got {dtype} (other precisions run NeMo's modules)"
            )

    @torch.no_grad()
    def refresh(self) -> bool:
        """:meth:`FastMathPredictor.refresh`, and on CUDA the few-row kernel's transposed weight copies (written in
        place when only values changed) and its compilation, both outside any graph capture."""
        before = self._source_versions
        reallocated = super().refresh()
        if self._source_versions == before and not reallocated:
            return False
        device = self._weights["table"].device
        if not few_row_gemm.available(device):
            self._transposed = {}
            return reallocated
        few_row_gemm.prepare(device)
        keys = [key for key in self._weights if key.startswith(self._FEW_ROW_WEIGHTS)]
        previous = {} if reallocated else self._transposed
        transposed = {}
        for key in keys:
            weight = self._weights[key]
            copy = few_row_gemm.transposed_weight(weight)
            if weight.data_ptr() in previous:
                copy = previous[weight.data_ptr()].copy_(copy)
            transposed[weight.data_ptr()] = copy
        self._transposed = transposed
        return reallocated

    def _in_place_layer_input(
        self, layer: int, labels: torch.Tensor, h: torch.Tensor, gates: torch.Tensor, fused: bool
    ) -> tuple:
        """A deeper layer's input gates added to its recurrent ``gates`` by a GEMM before its cell (the cell kernel's
        own product would run on too few programs for the CUDA cores); layer 0 as in fast math."""
        if layer == 0:
            return self._layer_input(layer, labels, h)
        self._linear(h[layer - 1], self._weights[f"weight_ih_{layer}"], None, gates, fused, "main", residual=gates)
        return self._weights[f"bias_{layer}"], None, None, None

    def _linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor,
        fused: bool,
        stream: str,
        row_mask: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
    ) -> None:
        """:meth:`FastMathPredictor._linear` in IEEE fp32: the few-row kernel where it runs, else Triton's."""
        if not (fused and self._few_row_linear(x, weight, bias, out, residual, row_mask)):
            super()._linear(x, weight, bias, out, fused, stream, row_mask, residual)

    def _few_row_linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor,
        residual: torch.Tensor | None = None,
        row_mask: torch.Tensor | None = None,
    ) -> bool:
        """``out = x @ weight^T + bias (+ residual)`` on the few-row kernel, if it takes these operands (a transposed
        copy of ``weight`` is kept, on CUDA); returns whether it ran."""
        weight_t = self._transposed.get(weight.data_ptr())
        if weight_t is None or few_row_gemm.unsupported_reason(x, weight_t, out) is not None:
            return False
        few_row_gemm.linear(x, weight_t, bias, out, residual=residual, row_mask=row_mask)
        return True

    def _tiling(self, rows: int, n_out: int) -> dict:
        """Triton's IEEE tilings (where the few-row kernel does not run), the best of sweeps at H = 640
        (``benchmarks/results/archive/kernel_decoder-gemm-precisions_H100_2026-11-28.md``)."""
        wide = n_out >= 2048
        if rows <= 32:
            tiling = {"block_m": 32, "block_n": 64 if wide else 32, "block_k": 32 if wide else 64,
                      "num_warps": 2 if wide else 4, "split_k": 8}  # fmt: skip
        else:
            tiling = {"block_m": 64 if wide else 32, "block_n": 64, "block_k": 32, "num_warps": 2,
                      "split_k": 4 if wide else 8}  # fmt: skip
        return {**tiling, "num_stages": 3}

    def joint_output(self, hidden: torch.Tensor, tile_rows: int | None = None) -> torch.Tensor:
        """The joint's last Linear on its hidden activations in IEEE fp32: ``[N, H_joint] -> [N, V + 1 (+ durations)]``.

        The few-row kernel on CUDA (each output an fp32 sum in an order that does not depend on the row count up to
        64 rows, so a look-ahead window's rows come out as the single-frame look's); elsewhere NeMo's Linear on the
        same weights. ``tile_rows`` is fast math's and ignored here.
        """
        weight, bias = self.joint_output_weights
        out = torch.empty([hidden.shape[0], weight.shape[0]], device=hidden.device)
        if self._few_row_linear(hidden, weight, bias, out):
            return out
        return torch.nn.functional.linear(hidden, weight, bias)


def _bias_of(layer: torch.nn.Linear) -> torch.Tensor:
    if layer.bias is not None:
        return layer.bias.detach().float()
    return torch.zeros(layer.out_features, device=layer.weight.device)
