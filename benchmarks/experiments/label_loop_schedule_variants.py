"""The exact label loop's schedule, variant by variant, on the 0.6B sets (a one-off sweep, kept with its result).

python3 benchmarks/experiments/label_loop_schedule_variants.py out.json       # on a GPU, a few minutes

Rows (the exact predictor, full graph; variants patched in below):

- ``exact``: the decoder as it is (its products on the few-row CUDA kernel, :mod:`nemo_fastdecode.kernels.few_row_gemm`);
- ``triton_ieee``: the few-row kernel switched off (Triton's IEEE GEMMs for the predictor, NeMo's Linear for the joint);
- ``unroll2`` / ``unroll3``: two / three iterations per WHILE body (one condition evaluation per body; an iteration
  after the last row finished changes nothing): what the conditional node's relaunch costs;
- ``W<n>``: look-ahead windows of n frames;
- fast math, for reference.
"""

import json
import sys

import torch

import nemo_fastdecode  # noqa
from nemo_fastdecode.graphs import LoopPhases
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer
from nemo_fastdecode.kernels import few_row_gemm
from nemo_fastdecode.tools import synthetic
from nemo_fastdecode.tools.comparison import agreement, decode_all
from nemo_fastdecode.tools.decoder_benchmark import decoder_factories, prepare_synthetic_set
from nemo_fastdecode.tools.timing import best_time

MODE: set[str] = set()
original_one_level = LoopPhases.one_level.__func__
original_available = few_row_gemm.available


def one_level(cls, before_loop, body, flag):
    copies = 3 if "unroll3" in MODE else 2 if "unroll2" in MODE else 1

    def unrolled():
        for _ in range(copies):
            body()

    return original_one_level(cls, before_loop, unrolled, flag)


def available(device):
    return "triton_ieee" not in MODE and original_available(device)


def best(decoder, batches, repeats=3):
    decode_all(decoder, batches)  # warm-up: capture and lazy set-up
    return best_time(decoder, batches, repeats)


VARIANTS = [
    ("exact", set(), {}),
    ("triton_ieee", {"triton_ieee"}, {}),
    ("unroll2", {"unroll2"}, {}),
    ("unroll3", {"unroll3"}, {}),
    ("exact_again", set(), {}),
    ("fast_math", set(), {"fast_math": True}),
]


def sweep(preset, calibration, nemo_name, windows, results):
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
    variants = VARIANTS + [(f"W{w}", set(), {"lookahead_frames": w}) for w in windows]
    variants += [(f"unroll2_W{w}", {"unroll2"}, {"lookahead_frames": w}) for w in windows]
    for name, mode, options in variants:
        MODE.clear()
        MODE.update(mode)
        try:
            decoder = FastGreedyBatchedInfer(model.decoder, model.joint, spec.blank_id, max_symbols_per_step=10,
                                             durations=spec.durations, graph_mode="full_graph", **options)  # fmt: skip
            row(name, *best(decoder, batches))
        except Exception as error:  # a failing variant is a result too
            print(json.dumps({"preset": preset, "calibration": calibration, "row": name, "error": repr(error)}))
    MODE.clear()


def main(out: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    LoopPhases.one_level = classmethod(one_level)
    few_row_gemm.available = available
    results: list[dict] = []
    for preset, calibration, nemo_name, windows in [
        ("tdt-0.6b", 0.3, "nemo_label_loop+graphs", (1, 2, 4)),
        ("tdt-0.6b", "trained", "nemo_label_loop+graphs", (1, 2, 4)),
        ("rnnt-0.6b", 0.3, "nemo_frame_loop+graphs", (2, 4, 8)),
    ]:
        sweep(preset, calibration, nemo_name, windows, results)
        torch.cuda.empty_cache()
        with open(out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
