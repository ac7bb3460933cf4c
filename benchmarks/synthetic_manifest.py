"""Write speech-like synthetic WAV files and their manifest: inputs for throughput runs without downloads.

Options: ``configs/synthetic_manifest.yaml`` (``fastdecode_lab.configs.SyntheticManifestConfig``).

    python benchmarks/synthetic_manifest.py total_seconds=3600 output_dir=/tmp/synthetic_1h   # writes .../manifest.jsonl
    python scripts/transcribe_parallel.py model=rnnt-0.6b dataset_manifest=/tmp/synthetic_1h/manifest.jsonl ...
"""

from nemo.core.config import hydra_runner
from omegaconf import DictConfig, OmegaConf

from fastdecode_lab.configs import SyntheticManifestConfig
from fastdecode_lab.synthetic import write_synthetic_dataset


@hydra_runner(config_path="../configs", config_name="synthetic_manifest")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SyntheticManifestConfig), cfg))
    manifest = write_synthetic_dataset(cfg.output_dir, cfg.total_seconds, seed=cfg.seed)
    with open(manifest, encoding="utf-8") as f:
        count = sum(1 for line in f if line.strip())
    print(f"Wrote {count} synthetic utterance(s), about {cfg.total_seconds:g} s of audio: {manifest}")


if __name__ == "__main__":
    main()
