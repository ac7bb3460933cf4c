"""Where the tiny-model recipe keeps its files, under one output folder.

::

    {root}/corpus/{train,dev,test}.txt          the sentences of each split
    {root}/wavs/{split}/NNN/*.wav               16 kHz speech (the file name carries a hash of its request)
    {root}/manifests/{split}.jsonl              NeMo manifests (paths relative to the manifest); besides train, dev
                                                and test, voices.py's train_{engine} and test_* splits
    {root}/tokenizer/                           SentencePiece BPE (tokenizer.model, vocab.txt)
    {root}/{model}/model_config.yaml            the NeMo model config the model was trained with
    {root}/{model}/checkpoints/last.ckpt        the training state, resumed by the next train stage
    {root}/{model}/logs/version_N/metrics.csv   Lightning's CSV log of each training run
    {root}/{model}/TRAINED                      the step and limits at which training reached its end
    {root}/models/{model}.nemo                  the exported model
    {root}/models/{model}_eval.json             its held-out evaluation
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: the models the recipe trains
MODELS: tuple[str, ...] = ("tdt", "streaming_hybrid")

#: corpus splits, in order
SPLITS: tuple[str, ...] = ("train", "dev", "test")


def check_model(model: str) -> str:
    """``model`` if it is one of :data:`MODELS`; a ``ValueError`` naming the valid ones otherwise."""
    if model not in MODELS:
        raise ValueError(f"unknown tiny model {model!r}; valid models: {', '.join(MODELS)}")
    return model


@dataclass(frozen=True)
class RecipeLayout:
    """The file layout of one recipe output folder (see the module docstring)."""

    root: Path

    @classmethod
    def at(cls, root: str | os.PathLike) -> RecipeLayout:
        return cls(Path(root).absolute())

    def corpus(self, split: str) -> Path:
        return self.root / "corpus" / f"{split}.txt"

    def manifest(self, split: str) -> Path:
        return self.root / "manifests" / f"{split}.jsonl"

    @property
    def tokenizer_dir(self) -> Path:
        return self.root / "tokenizer"

    def model_dir(self, model: str) -> Path:
        return self.root / check_model(model)

    def model_config(self, model: str) -> Path:
        return self.model_dir(model) / "model_config.yaml"

    def checkpoint_dir(self, model: str) -> Path:
        return self.model_dir(model) / "checkpoints"

    def last_checkpoint(self, model: str) -> Path:
        return self.checkpoint_dir(model) / "last.ckpt"

    def trained_marker(self, model: str) -> Path:
        return self.model_dir(model) / "TRAINED"

    def nemo(self, model: str) -> Path:
        return self.root / "models" / f"{check_model(model)}.nemo"

    def evaluation(self, model: str) -> Path:
        return self.root / "models" / f"{check_model(model)}_eval.json"
