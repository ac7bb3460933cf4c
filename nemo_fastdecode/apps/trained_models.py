"""The small trained models shipped in the package, and the example utterances their demos transcribe.

* ``trained-tdt``: an offline FastConformer TDT (label-looping greedy by default);
* ``trained-streaming``: a cache-aware FastConformer hybrid RNN-T/CTC with look-aheads
  ``[[70, 13], [70, 6], [70, 1], [70, 0]]``.

Both were trained by ``scripts/train_tiny_models.py`` (stage ``ship`` copies them here) on English speech that
eSpeak NG synthesised from a generated corpus: about 1.7M parameters and 7 MiB each. They transcribe clear
synthesised English well (held-out WER in ``nemo_fastdecode/assets/README.md``) and real recordings poorly; for
those, pass a NeMo checkpoint. The example utterances are the first sentences of the recipe's held-out test
split, spoken by voices the models never heard in training.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: the package's asset folder: the shipped ``.nemo`` files, their evaluations and the example utterances
ASSETS_DIR = Path(__file__).resolve().parents[1] / "assets"

#: shipped model name -> the recipe's model name (``configs/tiny_models/<name>.yaml``)
TRAINED_MODELS: dict[str, str] = {"trained-tdt": "tdt", "trained-streaming": "streaming_hybrid"}

#: the example utterances' folder and manifest (``audio_filepath`` relative to it, ``duration``, ``text``)
EXAMPLES_DIR = ASSETS_DIR / "examples"
EXAMPLES_MANIFEST = EXAMPLES_DIR / "manifest.jsonl"


def is_trained(name: str) -> bool:
    """True for the name of a shipped trained model (:data:`TRAINED_MODELS`)."""
    return name in TRAINED_MODELS


def shipped_name(recipe_model: str) -> str:
    """The shipped name of a recipe model (``tdt`` -> ``trained-tdt``)."""
    for name, model in TRAINED_MODELS.items():
        if model == recipe_model:
            return name
    raise ValueError(f"unknown tiny model {recipe_model!r}; valid models: {', '.join(TRAINED_MODELS.values())}")


def trained_model_path(name: str, assets_dir: Path = ASSETS_DIR) -> Path:
    """The ``.nemo`` file of a shipped model.

    Raises:
        ValueError: ``name`` is not one of :data:`TRAINED_MODELS`.
        FileNotFoundError: the file is missing (a source tree without the package's assets).
    """
    if name not in TRAINED_MODELS:
        raise ValueError(f"unknown trained model {name!r}; valid names: {', '.join(TRAINED_MODELS)}")
    path = assets_dir / f"{name}.nemo"
    if not path.is_file():
        raise FileNotFoundError(
            f"the trained model {name!r} is missing: {path} does not exist. Reinstall the package, or train it "
            f"with `python scripts/train_tiny_models.py` (its `ship` stage copies it there)"
        )
    return path


def example_entries(manifest: Path = EXAMPLES_MANIFEST) -> list[dict[str, Any]]:
    """The example utterances' manifest entries, ``audio_filepath`` made absolute; in the manifest's order."""
    if not manifest.is_file():
        raise FileNotFoundError(f"the example utterances are missing: {manifest} does not exist")
    entries = []
    with open(manifest, encoding="utf8") as f:
        for line in f:
            if line.strip():
                entry = json.loads(line)
                entry["audio_filepath"] = str((manifest.parent / entry["audio_filepath"]).resolve())
                entries.append(entry)
    return entries
