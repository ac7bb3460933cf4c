"""The exact label loop's schedule, variant by variant, on the 0.6B sets (a one-off sweep, kept with its result).

python3 benchmarks/experiments/label_loop_schedule_variants.py out.json       # on a GPU, a few minutes

Rows (all patched in below, on the exact predictor, full graph):

- ``exact``: the decoder as it is;
- ``serial``: the recurrent gates on the main stream (no parallel branch): what the branch is worth;
- ``unroll2`` / ``unroll3``: two / three iterations per WHILE body (one condition evaluation per body; an iteration
  after the last row finished changes nothing): what the conditional node's relaunch costs;
- ``split``: layer 1's recurrent gates on a second parallel branch, joined just before layer 1's input product, so
  they overlap the look, the emission and layer 0's cell instead of queueing after layer 0's on one branch;
- ``ieee_joint``: the look's joint output layer as the exact predictor's IEEE-fp32 split-K GEMM instead of NeMo's
  Linear (cuBLAS: memset, scale, split-K GEMM and epilogue kernels);
- combinations.
"""

import json
import sys
import time

import torch

import nemo_fastdecode  # noqa
from nemo_fastdecode.graphs import LoopPhases
from nemo_fastdecode.greedy.base import GreedyComputerBase
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer
from nemo_fastdecode.kernels.tf32x3 import split_k_counters
from nemo_fastdecode.prediction import ExactPredictor, normalise_joint_logits
from nemo_fastdecode.tools import synthetic
from nemo_fastdecode.tools.comparison import agreement, decode_all
from nemo_fastdecode.tools.decoder_benchmark import decoder_factories, prepare_synthetic_set

MODE: set[str] = set()
original_advance = ExactPredictor.advance_in_place
original_gates = ExactPredictor.recurrent_gates
original_joint_output = GreedyComputerBase._joint_output
original_extra_buffers = None
original_one_level = LoopPhases.one_level.__func__
SECOND_BRANCH: dict[torch.device, torch.cuda.Stream] = {}
JOINT_TILING = {"block_m": 64, "block_n": 32, "block_k": 32, "num_warps": 2, "split_k": 4, "num_stages": 3}


def one_level(cls, before_loop, body, flag):
    copies = 3 if "unroll3" in MODE else 2 if "unroll2" in MODE else 1

    def unrolled():
        for _ in range(copies):
            body()

    return original_one_level(cls, before_loop, unrolled, flag)


def recurrent_gates(self, states, out, fused):
    if "split" not in MODE or not out.is_cuda:
        return original_gates(self, states, out, fused)
    w, h = self._weights, states[0]
    if "recurrent2" not in self._counters:
        self._counters["recurrent2"] = split_k_counters(out.device)
    second = SECOND_BRANCH.setdefault(out.device, torch.cuda.Stream(out.device))
    second.wait_stream(torch.cuda.current_stream(out.device))
    self._linear(h[0], w["weight_hh_0"], w["no_gate_bias"], out[0], fused, "recurrent")
    with torch.cuda.stream(second):
        for layer in range(1, h.shape[0]):
            self._linear(h[layer], w[f"weight_hh_{layer}"], w["no_gate_bias"], out[layer], fused, "recurrent2")
    return out


def advance(self, labels, mask, states, output, recurrent_gates, fused):
    if "split" not in MODE or not output.is_cuda:
        return original_advance(self, labels, mask, states, output, recurrent_gates, fused)
    w = self._refreshed_weights()
    h, c = states
    cell = self._cell(fused)
    for layer in range(h.shape[0]):
        gates = recurrent_gates[layer]
        if layer == 0:
            row_bias, bias_index = w["table"], labels
        else:
            if layer == 1:  # the second branch's gates
                torch.cuda.current_stream(output.device).wait_stream(SECOND_BRANCH[output.device])
            self._linear(h[layer - 1], w[f"weight_ih_{layer}"], None, gates, fused, "main", residual=gates)
            row_bias, bias_index = w[f"bias_{layer}"], None
        cell(row_bias, bias_index, None, None, None, None, c[layer], h[layer], c[layer], recurrent_gates=gates,
             row_mask=mask)  # fmt: skip
    self._linear(h[-1], w["projection_weight"], w["projection_bias"], output[:, 0], fused, "main", mask)


def joint_output(self, hidden, tile_rows=None):
    if "ieee_joint" not in MODE or self.exact_predictor is None or not hidden.is_cuda:
        return original_joint_output(self, hidden, tile_rows)
    p = self.exact_predictor
    weight, bias = p._weights["joint_weight"], p._weights["joint_bias"]
    out = torch.empty([hidden.shape[0], weight.shape[0]], device=hidden.device)
    from nemo_fastdecode.kernels import matmul

    matmul.linear(hidden, weight, bias, "ieee", out=out, counters=p._counters["main"], **JOINT_TILING)
    return normalise_joint_logits(self.joint, out)


def serial_extra_buffers(self, b):
    original_extra_buffers(self, b)
    if "serial" in MODE:
        b.side_stream = None


def best(decoder, batches, repeats=3):
    hyps = decode_all(decoder, batches)
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        hyps = decode_all(decoder, batches)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times), hyps


VARIANTS = [
    ("exact", set()),
    ("serial", {"serial"}),
    ("unroll2", {"unroll2"}),
    ("unroll3", {"unroll3"}),
    ("split", {"split"}),
    ("ieee_joint", {"ieee_joint"}),
    ("split+ieee_joint", {"split", "ieee_joint"}),
    ("unroll2+split", {"unroll2", "split"}),
    ("unroll2+split+ieee_joint", {"unroll2", "split", "ieee_joint"}),
    ("exact_again", set()),
]


def sweep(preset, calibration, nemo_name, results):
    model, _, batches, _, _ = prepare_synthetic_set(preset, 3600, 32, 10, calibration=calibration)
    spec = synthetic.transducer_spec(model)
    t_nemo, reference = best(decoder_factories(model, 10)[nemo_name](), batches)

    def row(name, seconds, hyps):
        same, worst = agreement(reference, hyps)
        result = {"preset": preset, "calibration": calibration, "row": name, "s": round(seconds, 4),
                  "x_nemo": round(seconds / t_nemo, 3), "tokens": sum(len(h.y_sequence) for h in hyps),
                  "identical": same, "max_score_diff": worst}  # fmt: skip
        results.append(result)
        print(json.dumps(result), flush=True)

    row(nemo_name, t_nemo, reference)
    variants = VARIANTS + [("fast_math", {"fast_math"})]
    for name, mode in variants:
        MODE.clear()
        MODE.update(mode)
        options = {"fast_math": True} if "fast_math" in mode else {}
        try:
            decoder = FastGreedyBatchedInfer(model.decoder, model.joint, spec.blank_id, max_symbols_per_step=10,
                                             durations=spec.durations, graph_mode="full_graph", **options)  # fmt: skip
            row(name, *best(decoder, batches))
        except Exception as error:  # a failing variant is a result too
            print(json.dumps({"preset": preset, "calibration": calibration, "row": name, "error": repr(error)}))
    MODE.clear()


def main(out: str) -> None:
    global original_extra_buffers
    from nemo_fastdecode.greedy.label_loop import LabelLoopGreedy

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    original_extra_buffers = LabelLoopGreedy._extra_buffers
    LabelLoopGreedy._extra_buffers = serial_extra_buffers
    LoopPhases.one_level = classmethod(one_level)
    ExactPredictor.advance_in_place = advance
    ExactPredictor.recurrent_gates = recurrent_gates
    GreedyComputerBase._joint_output = joint_output
    results: list[dict] = []
    for preset, calibration, nemo_name in [
        ("tdt-0.6b", 0.3, "nemo_label_loop+graphs"),
        ("tdt-0.6b", "trained", "nemo_label_loop+graphs"),
        ("rnnt-0.6b", 0.3, "nemo_frame_loop+graphs"),
    ]:
        sweep(preset, calibration, nemo_name, results)
        torch.cuda.empty_cache()
        with open(out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
