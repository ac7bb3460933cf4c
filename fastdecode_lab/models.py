"""The synthetic presets as a model family of the apps' loader: ``load_model("tiny-rnnt")`` builds one with random
weights and calibrates its blank bias (importing this module registers the family)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from fastdecode_lab import synthetic
from nemo_fastdecode.apps.comparison import encode
from nemo_fastdecode.apps.models import DEMO_DURATIONS, ModelFamily, register_model_family

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

__all__ = ["SYNTHETIC_MODELS", "TARGET_TOKENS_PER_FRAME", "build_synthetic", "demo_audio", "synthetic_banner"]

#: Tokens per encoder frame that synthetic models are calibrated to (trained Parakeet models: about 0.3).
TARGET_TOKENS_PER_FRAME = 0.3


def demo_audio(seed: int = 0, durations: Sequence[float] = DEMO_DURATIONS) -> list[np.ndarray]:
    """Speech-like synthetic audio (16 kHz) of ``durations`` seconds: what a synthetic model's demo transcribes."""
    return synthetic.synthetic_audio(durations, seed=seed)


def build_synthetic(name: str, device: torch.device, seed: int = 0, vocab: str = "char") -> ASRModel:
    """A synthetic preset with random weights (:func:`~fastdecode_lab.synthetic.build_synthetic_model`), its blank
    bias calibrated on its own encoder outputs of :func:`demo_audio` so that greedy decoding emits about
    :data:`TARGET_TOKENS_PER_FRAME`; the benchmark-size cache-aware presets instead emit like a trained model, its
    rate and bursts, throughout a stream (:func:`~fastdecode_lab.synthetic.calibrate_trained_like`)."""
    model = synthetic.build_synthetic_model(name, seed=seed, device=device, vocab=vocab)
    audio = demo_audio(seed)
    encoded, lengths = encode(model, audio, batch_size=len(audio), device=device)
    if synthetic.get_preset(name).trained_like:  # tokens spread over a stream, mostly one per emitting frame
        calibration = synthetic.calibrate_trained_like(model, encoded, lengths, seed=seed)
        model._fastdecode_tokens_per_frame = calibration.achieved.tokens_per_frame
    else:
        model._fastdecode_tokens_per_frame = synthetic.calibrate_blank_bias(
            model, encoded, lengths, TARGET_TOKENS_PER_FRAME, iterations=6, tolerance=0.03
        )
    return model


def synthetic_banner(name: str, model: ASRModel | None = None) -> str:
    """The warning printed whenever a synthetic (random-weight) model transcribes."""
    tokens_per_frame = getattr(model, "_fastdecode_tokens_per_frame", None)
    lines = [
        f"SYNTHETIC MODEL {name!r}: RANDOM, UNTRAINED WEIGHTS -- the transcripts are gibberish.",
        "Real NeMo architecture: decoding speed and exactness are meaningful, the text is not.",
    ]
    if tokens_per_frame is not None:
        lines.append(f"Blank bias calibrated to emit {tokens_per_frame:.2f} tokens/frame (trained models: ~0.3).")
    lines.append("For real transcripts pass a checkpoint: model=/path/to/model.nemo")
    rule = "=" * max(len(line) for line in lines)
    return "\n".join([rule, *lines, rule])


#: The synthetic presets (:data:`fastdecode_lab.synthetic.PRESETS`) as a family of :func:`load_model`'s names.
SYNTHETIC_MODELS = ModelFamily(
    description="synthetic preset (random weights)",
    names=tuple(synthetic.PRESETS),
    build=build_synthetic,
    demo_audio=lambda durations, seed: demo_audio(seed, durations),
    banner=synthetic_banner,
)
register_model_family(SYNTHETIC_MODELS)
