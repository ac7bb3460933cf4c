"""Load the model a tool runs on (a shipped trained model, a synthetic preset, a ``.nemo`` checkpoint or a pretrained
name) and set its decoding."""

from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from nemo_fastdecode.tools import synthetic
from nemo_fastdecode.tools.trained_models import TRAINED_MODELS, is_trained, trained_model_path

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel


#: Durations (seconds) of the embedded demo's synthetic utterances.
DEMO_DURATIONS: tuple[float, ...] = (5.8, 4.4, 3.1, 2.0)


#: Tokens per encoder frame that synthetic models are calibrated to (trained Parakeet models: about 0.3).
TARGET_TOKENS_PER_FRAME = 0.3


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


def is_synthetic(name: str) -> bool:
    """True for a synthetic preset name (:data:`nemo_fastdecode.tools.synthetic.PRESETS`)."""
    return name in synthetic.PRESETS


def demo_audio(seed: int = 0) -> list[np.ndarray]:
    """The embedded demo's utterances: :data:`DEMO_DURATIONS` of speech-like synthetic audio (16 kHz)."""
    return synthetic.synthetic_audio(DEMO_DURATIONS, seed=seed)


def load_model(name: str, *, device: str | torch.device = "cpu", seed: int = 0, vocab: str = "char") -> ASRModel:
    """Load a NeMo transducer model by name.

    Args:
        name: a shipped trained model (``trained-tdt``, ``trained-streaming``;
            :mod:`~nemo_fastdecode.tools.trained_models`), a synthetic preset (``tiny-rnnt``, ...; built with random weights by
            :func:`~nemo_fastdecode.tools.synthetic.build_synthetic_model`, then its blank bias is calibrated
            on its own encoder outputs of :func:`demo_audio` so that greedy decoding emits about 0.3
            tokens per frame; the benchmark-size cache-aware presets instead emit like a trained model, its rate and
            bursts, throughout a stream: :func:`~nemo_fastdecode.tools.synthetic.calibrate_trained_like`), a path
            ending in ``.nemo`` (``ASRModel.restore_from``), or a pretrained
            model name (``ASRModel.from_pretrained``, which needs network access).
        device: where to put the model.
        seed: weights of a synthetic model (ignored otherwise).
        vocab: a synthetic model's vocabulary, ``"char"`` or ``"bpe"`` (a sentencepiece tokenizer, as NeMo's streaming
            pipelines need); ignored otherwise.

    Returns:
        The model in ``eval()`` mode on ``device``.

    Raises:
        FileNotFoundError: a ``.nemo`` path (or a shipped model's file) that does not exist.
        RuntimeError: a pretrained name that could not be loaded (e.g. offline).
        ValueError: the model is not a transducer (RNN-T / TDT / hybrid RNN-T) model.
    """
    from nemo.collections.asr.models import ASRModel

    device = torch.device(device)
    if is_synthetic(name):
        model = synthetic.build_synthetic_model(name, seed=seed, device=device, vocab=vocab)
        audio = demo_audio(seed)
        encoded, lengths = synthetic.encode(model, audio, batch_size=len(audio), device=device)
        if synthetic.get_preset(name).trained_like:  # tokens spread over a stream, mostly one per emitting frame
            calibration = synthetic.calibrate_trained_like(model, encoded, lengths, seed=seed)
            model._fastdecode_tokens_per_frame = calibration.achieved.tokens_per_frame
        else:
            model._fastdecode_tokens_per_frame = synthetic.calibrate_blank_bias(
                model, encoded, lengths, TARGET_TOKENS_PER_FRAME, iterations=6, tolerance=0.03
            )
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
                f"trained model ({', '.join(TRAINED_MODELS)}) or a synthetic preset (random weights): "
                f"{', '.join(synthetic.PRESETS)}"
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


def synthetic_banner(name: str, tokens_per_frame: float | None = None) -> str:
    """The warning printed whenever a synthetic (random-weight) model transcribes."""
    lines = [
        f"SYNTHETIC MODEL {name!r}: RANDOM, UNTRAINED WEIGHTS -- the transcripts are gibberish.",
        "Real NeMo architecture: decoding speed and exactness are meaningful, the text is not.",
    ]
    if tokens_per_frame is not None:
        lines.append(f"Blank bias calibrated to emit {tokens_per_frame:.2f} tokens/frame (trained models: ~0.3).")
    lines.append("For real transcripts pass a checkpoint: model=/path/to/model.nemo")
    rule = "=" * max(len(line) for line in lines)
    return "\n".join([rule, *lines, rule])


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
