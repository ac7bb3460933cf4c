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

from decoder_sweep import Sweep, run_sweeps

import nemo_fastdecode  # noqa
from nemo_fastdecode.graphs import LoopPhases
from nemo_fastdecode.kernels import few_row_gemm

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


VARIANTS = [
    ("exact", set(), {}),
    ("triton_ieee", {"triton_ieee"}, {}),
    ("unroll2", {"unroll2"}, {}),
    ("unroll3", {"unroll3"}, {}),
    ("exact_again", set(), {}),
    ("fast_math", set(), {"fast_math": True}),
]


def sweep(s: Sweep, windows: tuple[int, ...]) -> None:
    variants = VARIANTS + [(f"W{w}", set(), {"lookahead_frames": w}) for w in windows]
    variants += [(f"unroll2_W{w}", {"unroll2"}, {"lookahead_frames": w}) for w in windows]
    for name, mode, options in variants:
        MODE.clear()
        MODE.update(mode)
        try:
            s.time(name, s.exact_label_loop(**options))
        except Exception as error:  # a failing variant is a result too
            print(json.dumps({"preset": s.preset, "calibration": s.calibration, "row": name, "error": repr(error)}))
    MODE.clear()


def main(out: str) -> None:
    LoopPhases.one_level = classmethod(one_level)
    few_row_gemm.available = available
    sets = [
        ("tdt-0.6b", 0.3, "nemo_label_loop+graphs", (1, 2, 4)),
        ("tdt-0.6b", "trained", "nemo_label_loop+graphs", (1, 2, 4)),
        ("rnnt-0.6b", 0.3, "nemo_frame_loop+graphs", (2, 4, 8)),
    ]
    run_sweeps(sets, sweep, out)


if __name__ == "__main__":
    main(sys.argv[1])
