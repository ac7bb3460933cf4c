"""Transcribe a manifest or folder on several GPUs / processes / machines (Lightning DDP), merged in input order.

Follows NeMo's ``examples/asr/transcribe_speech_parallel.py``; the logic lives in
``nemo_fastdecode.tools.parallel``. A rerun of the same command after a failure reuses the finished shards.

    python scripts/transcribe_parallel.py model=/path/parakeet.nemo dataset_manifest=big.jsonl accelerator=gpu devices=-1
    python scripts/transcribe_parallel.py dataset_manifest=test.jsonl accelerator=cpu devices=2   # two CPU processes
"""

from nemo.core.config import hydra_runner
from omegaconf import DictConfig, OmegaConf

from nemo_fastdecode.tools.configs import ParallelTranscribeConfig
from nemo_fastdecode.tools.parallel.lightning_run import transcribe_parallel


@hydra_runner(config_path="../configs", config_name="transcribe_parallel")
def main(cfg: DictConfig) -> None:
    schema = OmegaConf.structured(ParallelTranscribeConfig)
    OmegaConf.set_struct(schema.decoding, False)
    cfg = OmegaConf.merge(schema, cfg)
    if (cfg.audio_dir is None) == (cfg.dataset_manifest is None):
        raise SystemExit("give exactly one of audio_dir and dataset_manifest")
    transcribe_parallel(cfg)


if __name__ == "__main__":
    main()
