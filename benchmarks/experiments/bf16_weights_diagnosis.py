"""Which step fails when a model's weights are bf16 (``model.to(torch.bfloat16)``): NeMo's ``transcribe`` with its
default decoding, our decoder's warm-up, and ours end to end; prints each traceback.

python benchmarks/experiments/bf16_weights_diagnosis.py [preset]
"""

from __future__ import annotations

import logging
import sys
import traceback

import torch

import nemo_fastdecode  # noqa: F401  (registers the strategies)
from fastdecode_lab import synthetic
from nemo_fastdecode.apps.models import apply_decoding


def main(preset: str) -> None:
    model = synthetic.build_synthetic_model(preset, device="cuda").eval()
    audio = list(synthetic.synthetic_audio([1.5, 2.0, 3.0, 7.0], seed=0))
    model.to(torch.bfloat16)
    for strategy, extra in (("greedy_batch", {}), ("fast_greedy", {}), ("fast_greedy", {"offline_batching": True})):
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append
        logging.getLogger("nemo_fastdecode").addHandler(handler)
        try:
            apply_decoding(model, {"strategy": strategy, "greedy": extra})
            model.to(torch.bfloat16)
            with torch.inference_mode():
                hyps = model.transcribe(audio, batch_size=2, return_hypotheses=True, verbose=False)
            print(strategy, extra, "ok", [h.y_sequence.tolist()[:6] for h in hyps])
        except Exception:  # noqa: BLE001 -- a diagnosis: print and go on
            print(strategy, extra, "FAILED")
            traceback.print_exc()
        finally:
            logging.getLogger("nemo_fastdecode").removeHandler(handler)
        for r in records:
            if "warm-up" in r.getMessage():
                print("  log:", r.getMessage())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tiny-tdt")
