"""The exact label loop's prediction network, variant by variant, on the 0.6B sets (a one-off sweep, kept with its result).

python3 benchmarks/experiments/exact_predictor_variants.py out.json       # on a GPU, about 5 minutes

Rows: NeMo's fastest greedy decoder; the exact predictor (IEEE-fp32 Triton GEMMs); NeMo's modules; fast math; the
exact predictor with cuBLAS for some products (``cublas_proj``: the projection, ``cublas_l1``: a deeper layer's
input gates, ``cublas_all``: those and the recurrent gates; patched in below); look-ahead windows. Result:
``benchmarks/results/archive/experiment_exact-predictor-variants_H100_2026-11-28.txt``.
"""

import sys

import torch
from decoder_sweep import Sweep, run_sweeps

import nemo_fastdecode  # noqa
from nemo_fastdecode.prediction import ExactPredictor

CUBLAS: set[str] = set()  # the products the patched predictor runs on cuBLAS
original_advance = ExactPredictor.advance_in_place
original_gates = ExactPredictor.recurrent_gates


def advance(self, labels, mask, states, output, recurrent_gates, fused):
    if not CUBLAS & {"l1", "proj"}:
        return original_advance(self, labels, mask, states, output, recurrent_gates, fused)
    w = self._refreshed_weights()
    h, c = states
    cell = self._cell(fused)
    for layer in range(h.shape[0]):
        gates = recurrent_gates[layer]
        if layer == 0:
            row_bias, bias_index = w["table"], labels
        else:
            if "l1" in CUBLAS:
                gates.addmm_(h[layer - 1], w[f"weight_ih_{layer}"].T)
            else:
                self._linear(h[layer - 1], w[f"weight_ih_{layer}"], None, gates, fused, "main", residual=gates)
            row_bias, bias_index = w[f"bias_{layer}"], None
        cell(row_bias, bias_index, None, None, None, None, c[layer], h[layer], c[layer], recurrent_gates=gates,
             row_mask=mask)  # fmt: skip
    if "proj" in CUBLAS:
        torch.addmm(w["projection_bias"], h[-1], w["projection_weight"].T, out=output[:, 0])
    else:
        self._linear(h[-1], w["projection_weight"], w["projection_bias"], output[:, 0], fused, "main", mask)


def recurrent_gates(self, states, out, fused):
    if "rg" not in CUBLAS:
        return original_gates(self, states, out, fused)
    for layer in range(states[0].shape[0]):
        torch.mm(states[0][layer], self._weights[f"weight_hh_{layer}"].T, out=out[layer])
    return out


def sweep(s: Sweep, windows: tuple[int, ...]) -> None:
    variants = [
        ("exact_predictor", {}, set()),
        ("nemo_modules", {"exact_predictor": False}, set()),
        ("fast_math", {"fast_math": True}, set()),
        ("cublas_proj", {}, {"proj"}),
        ("cublas_l1", {}, {"l1"}),
        ("cublas_l1_proj", {}, {"l1", "proj"}),
        ("cublas_all", {}, {"l1", "proj", "rg"}),
    ]
    variants += [(f"exact_predictor_W{w}", {"lookahead_frames": w}, set()) for w in windows]
    variants += [(f"cublas_proj_W{w}", {"lookahead_frames": w}, {"proj"}) for w in windows]
    for name, options, on_cublas in variants:
        CUBLAS.clear()
        CUBLAS.update(on_cublas)
        s.time(name, s.exact_label_loop(**options))
    CUBLAS.clear()


def main(out: str) -> None:
    ExactPredictor.advance_in_place = advance
    ExactPredictor.recurrent_gates = recurrent_gates
    sets = [
        ("tdt-0.6b", 0.3, "nemo_label_loop+graphs", (1, 2, 4, 8)),
        ("tdt-0.6b", "trained", "nemo_label_loop+graphs", (1, 2, 4, 8)),
        ("rnnt-0.6b", 0.3, "nemo_frame_loop+graphs", (4, 8, 16)),
    ]
    run_sweeps(sets, sweep, out)


if __name__ == "__main__":
    main(sys.argv[1])
