"""Load the model an app runs on by name (a shipped trained model, a ``.nemo`` checkpoint, a pretrained name, or a
name from a registered family such as the lab's synthetic presets) and set its decoding."""

from __future__ import annotations

import copy
import importlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from nemo_fastdecode.apps.trained_models import TRAINED_MODELS, is_trained, trained_model_path

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel


@dataclass(frozen=True)
class ModelFamily:
    """Models known by name beside the shipped ones, built rather than loaded (the lab's synthetic presets are one:
    ``import fastdecode_lab.models`` registers them).

    Attributes:
        description: what the family is, for error messages (``"synthetic preset (random weights)"``).
        names: the names it answers to.
        build: ``(name, device, seed, vocab) -> model`` in eval mode on ``device``.
        demo_audio: ``(durations, seed) -> 16 kHz float arrays``: the audio an app uses when none is given (a model
            of the family has no example utterances of its own).
        banner: ``(name, model) -> text`` printed whenever the model transcribes (e.g. "random weights").
    """

    description: str
    names: tuple[str, ...]
    build: Callable[[str, torch.device, int, str], ASRModel]
    demo_audio: Callable[[Sequence[float], int], list[np.ndarray]]
    banner: Callable[[str, ASRModel], str]


_FAMILIES: list[ModelFamily] = []


def register_model_family(family: ModelFamily) -> None:
    """Make ``family``'s names loadable by :func:`load_model` (idempotent per description)."""
    _FAMILIES[:] = [f for f in _FAMILIES if f.description != family.description] + [family]


def family_modules() -> list[str]:
    """The modules whose import registered the current families: what a worker process imports
    (:func:`import_model_families`) to know the same names."""
    return sorted({f.build.__module__ for f in _FAMILIES})


def import_model_families(modules: Sequence[str]) -> None:
    """Import each of ``modules`` (from :func:`family_modules` of another process), registering its families."""
    for module in modules:
        importlib.import_module(module)


def model_family(name: str) -> ModelFamily | None:
    """The registered family that answers to ``name``, if any."""
    return next((f for f in _FAMILIES if name in f.names), None)


#: Durations (seconds) of the demo utterances made for a model of a registered family (no example utterances).
DEMO_DURATIONS: tuple[float, ...] = (5.8, 4.4, 3.1, 2.0)


def inference_device(cuda: int | None = None) -> torch.device:
    """NeMo's convention: ``None`` -> GPU 0 if available else CPU; ``< 0`` -> CPU; ``k`` -> GPU ``k``."""
    if cuda is None:
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if cuda < 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"cuda={cuda} asks for a GPU but CUDA is not available; use cuda=-1 (or null) for the CPU")
    if cuda >= torch.cuda.device_count():
        raise ValueError(f"cuda={cuda} but only {torch.cuda.device_count()} GPU(s) are visible")
    return torch.device(f"cuda:{cuda}")


def load_model(name: str, *, device: str | torch.device = "cpu", seed: int = 0, vocab: str = "char") -> ASRModel:
    """Load a NeMo transducer model by name.

    Args:
        name: a shipped trained model (``trained-tdt``, ``trained-streaming``;
            :mod:`~nemo_fastdecode.apps.trained_models`), a path ending in ``.nemo`` (``ASRModel.restore_from``), a
            name of a registered :class:`ModelFamily` (the lab's synthetic presets once ``fastdecode_lab.models`` is
            imported), or a pretrained model name (``ASRModel.from_pretrained``, which needs network access).
        device: where to put the model.
        seed: weights of a built model (a registered family; ignored otherwise).
        vocab: a built model's vocabulary, ``"char"`` or ``"bpe"``; ignored otherwise.

    Returns:
        The model in ``eval()`` mode on ``device``.

    Raises:
        FileNotFoundError: a ``.nemo`` path (or a shipped model's file) that does not exist.
        RuntimeError: a pretrained name that could not be loaded (e.g. offline).
        ValueError: the model is not a transducer (RNN-T / TDT / hybrid RNN-T) model.
    """
    from nemo.collections.asr.models import ASRModel

    from nemo_fastdecode.nemo.one_line_logs import one_line_nemo_messages

    one_line_nemo_messages()  # NeMo's restore and decoding set-up lines: one line each, once
    device = torch.device(device)
    family = model_family(name)
    if family is not None:
        model = family.build(name, device, seed, vocab)
    elif is_trained(name) or name.endswith(".nemo"):
        path = str(trained_model_path(name)) if is_trained(name) else name
        if not os.path.isfile(path):
            raise FileNotFoundError(f"model checkpoint {name!r} does not exist")
        model = ASRModel.restore_from(path, map_location=device)
    else:
        if os.path.exists(name):
            raise ValueError(f"model={name!r} is a path but not a .nemo checkpoint; pass a file ending in .nemo")
        try:
            model = ASRModel.from_pretrained(name, map_location=device)
        except Exception as error:
            raise RuntimeError(
                f"could not load pretrained model {name!r} with ASRModel.from_pretrained ({type(error).__name__}: "
                f"{error}). Without network access use a local checkpoint (model=/path/to/model.nemo), a shipped "
                f"trained model ({', '.join(TRAINED_MODELS)}){_family_names()}"
            ) from error
    _check_transducer(model, name)
    model.eval()
    return model.to(device)


def _check_transducer(model: ASRModel, name: str) -> None:
    from nemo.collections.asr.models import EncDecRNNTModel

    if not isinstance(model, EncDecRNNTModel):
        raise ValueError(
            f"model {name!r} is a {type(model).__name__}, not a transducer (RNN-T / TDT / hybrid RNN-T-CTC) model; "
            "fast_greedy decodes transducer models only"
        )


def is_hybrid(model: ASRModel) -> bool:
    from nemo.collections.asr.models import EncDecHybridRNNTCTCModel

    return isinstance(model, EncDecHybridRNNTCTCModel)


def _family_names() -> str:
    return "".join(f", or a {f.description}: {', '.join(f.names)}" for f in _FAMILIES)


def model_banner(name: str, model: ASRModel) -> str | None:
    """The banner a model of a registered family prints whenever it transcribes (``None`` for other models)."""
    family = model_family(name)
    return family.banner(name, model) if family is not None else None


def apply_decoding(model: ASRModel, decoding: DictConfig | dict[str, Any], verbose: bool = False) -> None:
    """Apply a decoding section: ``model.change_decoding_strategy`` (the RNN-T head of a hybrid model).

    ``decoding`` is merged over the model's current ``cfg.decoding`` first, as NeMo users do by hand
    (``cfg = model.cfg.decoding; cfg.strategy = ...``), so that what belongs to the model is kept:
    ``model_type: tdt`` and ``durations`` of a TDT model, timestamp settings, the ``beam`` section.
    NeMo then fills in its ``RNNTDecodingConfig`` defaults; an unknown strategy raises and lists the
    valid ones.
    """
    current = model.cfg.get("decoding") or {}
    if isinstance(current, DictConfig):  # plain (untyped) nodes: NeMo and the registry edit the config
        current = OmegaConf.to_container(current, resolve=True)
    if isinstance(decoding, DictConfig):
        decoding = OmegaConf.to_container(decoding, resolve=True)
    merged = OmegaConf.merge(OmegaConf.create(current), OmegaConf.create(copy.deepcopy(decoding)))
    kwargs = {"decoder_type": "rnnt"} if is_hybrid(model) else {}
    model.change_decoding_strategy(merged, verbose=verbose, **kwargs)


def model_device(model: ASRModel) -> torch.device:
    return next(model.parameters()).device
