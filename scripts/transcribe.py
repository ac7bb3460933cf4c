"""Transcribe audio with a NeMo transducer model and ``decoding.strategy: fast_greedy``.

Follows NeMo's ``examples/asr/transcribe_speech.py``; the logic lives in ``nemo_fastdecode.apps.transcribe``.

    # embedded demo: the shipped trained model (trained-tdt) on the shipped example utterances: each reference,
    # hypothesis and the WER, then the fast_greedy vs greedy_batch table
    python scripts/transcribe.py

    # a real checkpoint on a folder of .wav/.flac, or on a JSON-lines manifest
    python scripts/transcribe.py model=/path/to/parakeet.nemo audio_dir=/data/wavs batch_size=16
    python scripts/transcribe.py model=/path/to/parakeet.nemo dataset_manifest=test.jsonl \\
        output_filename=out.jsonl timestamps=true bf16=true cuda=0 compare_strategies=true

    # decoding options (configs/decoding/fast_greedy.yaml), or NeMo's own strategy
    python scripts/transcribe.py decoding.greedy.loop_labels=false decoding.greedy.graph_mode=eager
    python scripts/transcribe.py decoding.strategy=greedy_batch

    # a synthetic preset (random weights) on synthetic audio
    python scripts/transcribe.py model=tiny-rnnt

    python scripts/transcribe.py --help   # every option, its default and description
"""

import sys

from nemo.core.config import hydra_runner
from omegaconf import DictConfig

import fastdecode_lab.models  # noqa: F401  (the lab's synthetic presets as model names: model=tiny-rnnt)
from nemo_fastdecode.apps.confighelp import check_hydra_argv
from nemo_fastdecode.apps.configs import TranscribeConfig
from nemo_fastdecode.apps.transcribe import run


@hydra_runner(config_path="../configs", config_name="transcribe")
def main(cfg: DictConfig) -> None:
    if run(cfg).failed:  # every readable file was transcribed; the others are listed above and in the manifest
        sys.exit(1)


if __name__ == "__main__":
    check_hydra_argv(TranscribeConfig, "scripts/transcribe.py")  # --help from the config; misspelled keys named
    main()
