"""Synthetic Parakeet-architecture NeMo models and synthetic audio, for tests, demos and benchmarks.

* :mod:`.presets` -- the architectures at real sizes and their NeMo configs (``make_synthetic_config``).
* :mod:`.model` -- models with random weights (``build_synthetic_model``), the blank-bias calibration that sets
  how often they emit, the encoder run (``encode``) and NeMo's baseline greedy decoder.
* :mod:`.trained_like` -- the ``trained`` calibration (``calibrate_trained_like``): a trained model's rate and
  burst length (tokens per emitting frame), through a blank gate in the joint.
* :mod:`.audio` -- speech-like synthetic audio with LibriSpeech test-other-like durations, voiced utterances that a
  VAD takes for speech, WAV and manifest writers (a whole synthetic data set: ``write_synthetic_dataset``).

Typical use::

    model = build_synthetic_model("tiny-tdt")
    durations = librispeech_like_durations(total_seconds=60)
    audios = synthetic_audio(durations)
    encoded, lengths = encode(model, audios, batch_size=8, device="cpu")
    calibrate_blank_bias(model, encoded, lengths, target_tokens_per_frame=0.3)
"""

from fastdecode_lab.synthetic.audio import (
    librispeech_like_durations,
    synthetic_audio,
    synthetic_voiced_audio,
    write_manifest,
    write_synthetic_dataset,
)
from fastdecode_lab.synthetic.model import (
    TransducerSpec,
    build_synthetic_model,
    calibrate_blank_bias,
    nemo_baseline_greedy,
    nemo_calibration_greedy,
    tokens_per_frame,
    transducer_spec,
)
from fastdecode_lab.synthetic.presets import (
    PRESETS,
    SAMPLE_RATE,
    char_vocabulary,
    get_preset,
    make_synthetic_config,
)
from fastdecode_lab.synthetic.trained_like import (
    TRAINED_CALIBRATION,
    TrainedLikeCalibration,
    apply_calibration,
    calibrate_trained_like,
    check_calibration,
)
from nemo_fastdecode.apps.comparison import encode
from nemo_fastdecode.apps.manifests import write_wavs

__all__ = [
    "PRESETS",
    "get_preset",
    "SAMPLE_RATE",
    "TRAINED_CALIBRATION",
    "TrainedLikeCalibration",
    "TransducerSpec",
    "apply_calibration",
    "build_synthetic_model",
    "calibrate_blank_bias",
    "calibrate_trained_like",
    "char_vocabulary",
    "check_calibration",
    "encode",
    "librispeech_like_durations",
    "make_synthetic_config",
    "nemo_baseline_greedy",
    "nemo_calibration_greedy",
    "synthetic_audio",
    "synthetic_voiced_audio",
    "tokens_per_frame",
    "transducer_spec",
    "write_manifest",
    "write_synthetic_dataset",
    "write_wavs",
]
