"""Transcribe a manifest or folder on several GPUs / processes / machines (Lightning DDP or Ray Data), merged in input
order, with the throughput (audio seconds per second, per worker too).

Follows NeMo's ``examples/asr/transcribe_speech_parallel.py``; the logic lives in
``nemo_fastdecode.apps.parallel``. A rerun of the same command after a failure reuses the finished shards.

    python scripts/transcribe_parallel.py model=/path/parakeet.nemo dataset_manifest=big.jsonl accelerator=gpu devices=-1
    python scripts/transcribe_parallel.py dataset_manifest=test.jsonl accelerator=cpu devices=2   # two CPU processes
    python scripts/transcribe_parallel.py model=/path/parakeet.nemo dataset_manifest=big.jsonl backend=ray \\
        ray_address=auto   # one actor per GPU of a running Ray cluster
    python scripts/transcribe_parallel.py --help   # every option, its default and description

``model`` defaults to ``tiny-rnnt``, a synthetic preset with random weights (its transcripts are gibberish: it
checks the set-up); give a ``.nemo`` checkpoint, a pretrained name or the shipped ``trained-tdt`` for real text.
"""

from nemo.core.config import hydra_runner
from omegaconf import DictConfig

import fastdecode_lab.models  # noqa: F401  (the lab's synthetic presets as model names: model=tiny-rnnt)
from nemo_fastdecode.apps.confighelp import check_hydra_argv
from nemo_fastdecode.apps.configs import ParallelTranscribeConfig
from nemo_fastdecode.apps.parallel import transcribe_parallel
from nemo_fastdecode.apps.transcribe import resolve_config


@hydra_runner(config_path="../configs", config_name="transcribe_parallel")
def main(cfg: DictConfig) -> None:
    # checked as scripts/transcribe.py's options are; neither audio_dir nor dataset_manifest: read_inputs says so
    transcribe_parallel(resolve_config(cfg, ParallelTranscribeConfig))


if __name__ == "__main__":
    check_hydra_argv(ParallelTranscribeConfig, "scripts/transcribe_parallel.py")  # --help; misspelled keys named
    main()
