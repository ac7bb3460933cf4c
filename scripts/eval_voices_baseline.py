"""WER of the shipped trained models on other synthesisers' voices: the baseline of issue 52.

Synthesises a few dozen test sentences (held out of training) per evaluation split of
:mod:`fastdecode_lab.tiny_models.voices` (Festival's training and held-out voices, Flite, the held-out engine) and
eSpeak NG's held-out voices as the models were trained, then decodes them with each shipped model's own greedy
decoding (NeMo's ``transcribe``, CPU) and prints / writes the WER per split.

    python scripts/eval_voices_baseline.py                              # 24 utterances per split
    python scripts/eval_voices_baseline.py --num-test 48 --synthesisers-dir outputs/synthesisers
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from fastdecode_lab.tiny_models import corpus, speech, voices
from fastdecode_lab.tiny_models.evaluation import split_wers
from fastdecode_lab.tiny_models.layout import RecipeLayout
from fastdecode_lab.tiny_models.training import restore
from nemo_fastdecode.apps.trained_models import TRAINED_MODELS, trained_model_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", default="outputs/voices_baseline")
    parser.add_argument("--num-test", type=int, default=24, help="utterances per split")
    parser.add_argument("--synthesisers-dir", default=None, help="scripts/pack_synthesisers.sh's folder")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))

    layout = RecipeLayout.at(args.output_dir)
    config = replace(voices.VoicesConfig(), num_train=0, num_test=args.num_test, synthesisers_dir=args.synthesisers_dir)
    # the recipe's own held-out sentences (seed 0, the default sizes): never heard in training
    splits = corpus.make_splits(48000, 500, 1000, seed=0)
    plan = voices.plan_splits(config, splits.train, splits.test[: args.num_test], layout.root)
    plan = {name: requests for name, requests in plan.items() if name.startswith("test_")}
    manifests = voices.synthesize_splits(plan, config, layout.manifest, workers=args.workers)
    espeak = speech.draw_requests(splits.test[: args.num_test], "test", layout.root, seed=0)
    speech.write_manifest(espeak, speech.synthesize(espeak, workers=args.workers), layout.manifest("test"))
    manifests = {"test (espeak, held-out voices)": layout.manifest("test"), **manifests}

    report = {}
    for name in TRAINED_MODELS:
        model = restore(trained_model_path(name), "cpu")
        report[name] = split_wers(model, manifests, args.batch_size)
        for split, row in report[name].items():
            print(f"{name:>18}  {split:>32}  WER {100 * row['wer']:6.2f}%  ({row['utterances']} utterances)")
    out = Path(args.output_dir) / "baseline_wer.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
