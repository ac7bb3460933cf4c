"""What the decoder sweeps in this folder share: a 0.6B synthetic set with NeMo's fastest decoder as the reference row,
the exact label loop built per variant, best-of-3 timing after a warm-up pass, and one JSON line per row.

Imported by ``exact_predictor_variants.py`` and ``label_loop_schedule_variants.py`` (run from this folder's scripts;
it is not part of the library).
"""

import json
from collections.abc import Callable, Iterable
from typing import Any

import torch

from fastdecode_lab import synthetic
from fastdecode_lab.benchmarks.decoder import decoder_factories, prepare_synthetic_set
from nemo_fastdecode.apps.comparison import agreement, decode_all
from nemo_fastdecode.apps.timing import best_time
from nemo_fastdecode.greedy.infer import FastGreedyBatchedInfer

MAX_SYMBOLS = 10


def best(decoder: Any, batches: list, repeats: int = 3) -> tuple[float, list]:
    """Best seconds of ``repeats`` passes after one warm-up pass (capture and lazy set-up), and the hypotheses."""
    decode_all(decoder, batches)
    return best_time(decoder, batches, repeats)


class Sweep:
    """One test set (an hour of a 0.6B preset at ``calibration``) with NeMo's ``nemo_name`` decoder timed as the first
    row; every row goes to ``results`` and is printed as a JSON line."""

    def __init__(self, preset: str, calibration: float | str, nemo_name: str, results: list[dict]) -> None:
        self.preset, self.calibration, self.results = preset, calibration, results
        self.model, _, self.batches, _, _ = prepare_synthetic_set(
            preset, 3600, 32, MAX_SYMBOLS, calibration=calibration
        )
        self.spec = synthetic.transducer_spec(self.model)
        self.nemo_seconds, self.reference = best(decoder_factories(self.model, MAX_SYMBOLS)[nemo_name](), self.batches)
        self.row(nemo_name, self.nemo_seconds, self.reference)

    def exact_label_loop(self, **options: Any) -> FastGreedyBatchedInfer:
        """Our greedy decoder, full graph, with ``options`` (``lookahead_frames``, ``fast_math``, ...)."""
        return FastGreedyBatchedInfer(self.model.decoder, self.model.joint, self.spec.blank_id,
                                      max_symbols_per_step=MAX_SYMBOLS, durations=self.spec.durations,
                                      graph_mode="full_graph", **options)  # fmt: skip

    def time(self, name: str, decoder: Any) -> None:
        """Time ``decoder`` on the set and record it as row ``name``."""
        self.row(name, *best(decoder, self.batches))

    def row(self, name: str, seconds: float, hyps: list) -> None:
        same, worst = agreement(self.reference, hyps)
        result = {"preset": self.preset, "calibration": self.calibration, "row": name, "s": round(seconds, 4),
                  "x_nemo": round(seconds / self.nemo_seconds, 3), "tokens": sum(len(h.y_sequence) for h in hyps),
                  "identical": same, "max_score_diff": worst}  # fmt: skip
        self.results.append(result)
        print(json.dumps(result), flush=True)


def run_sweeps(
    sets: Iterable[tuple[str, float | str, str, tuple[int, ...]]],
    sweep: Callable[[Sweep, tuple[int, ...]], None],
    out: str,
) -> None:
    """``sweep(Sweep(preset, calibration, nemo_name, results), windows)`` for each set, IEEE fp32 (no TF32 in NeMo's
    rows); the rows so far are written to ``out`` after each set."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    results: list[dict] = []
    for preset, calibration, nemo_name, windows in sets:
        sweep(Sweep(preset, calibration, nemo_name, results), windows)
        torch.cuda.empty_cache()
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
