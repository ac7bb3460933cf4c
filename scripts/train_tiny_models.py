"""Train small ASR models on synthesised speech: a FastConformer TDT and a cache-aware streaming FastConformer RNN-T.

eSpeak NG speaks a generated English corpus with many voices; a SentencePiece BPE tokenizer is trained on the
text; NeMo trains each model on Lightning, resumably, and exports it as ``.nemo``; the held-out test split (new
sentences, new voices) gives their WER. The logic lives in ``fastdecode_lab.tiny_models``; outputs in
``outputs/tiny_models/`` (``models/*.nemo``, ``models/*_eval.json``).

    python scripts/train_tiny_models.py                                   # all stages, both models
    python scripts/train_tiny_models.py stages=[data]                     # speech + manifests + tokenizer
    python scripts/train_tiny_models.py stages=[train,evaluate] models=[tdt]

    # a toy run on a CPU (a minute or two)
    python scripts/train_tiny_models.py output_dir=outputs/tiny_toy num_train=64 num_dev=8 num_test=8 \\
        max_steps=20 max_time=null batch_size=8 eval_streaming_utterances=4 \\
        'model_overrides={encoder: {n_layers: 1, d_model: 32, n_heads: 2}}'

    # a warm start from the shipped models; two trainings sharing one GPU
    python scripts/train_tiny_models.py stages=[train] models=[tdt] init_from=shipped gpu_memory_fraction=0.45
"""

import os

# Expandable segments: variable-length batches no longer fragment the caching allocator into ever more reserved
# memory. PyTorch reads this when CUDA initialises, so it is set before anything imports NeMo or touches CUDA.
if "PYTORCH_CUDA_ALLOC_CONF" not in os.environ and "PYTORCH_ALLOC_CONF" not in os.environ:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

from nemo.core.config import hydra_runner  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from fastdecode_lab.tiny_models.recipe import run  # noqa: E402


@hydra_runner(config_path="../configs", config_name="train_tiny_models")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
