"""Cache-aware streaming of many concurrent streams, ours against NeMo's path, on a simulated real-time clock.

Follows NeMo's ``examples/asr/asr_cache_aware_streaming/speech_to_text_cache_aware_streaming_infer.py``;
the logic lives in ``fastdecode_lab.streaming_sim``.

    # the shipped trained model on the example utterances: each stream's reference, final transcript and the WER;
    # quick on a CPU
    python scripts/streaming.py
    python scripts/streaming.py --help   # every option, its default and description

    # every input of a manifest, one stream each (num_streams=N: N streams, stream i playing input i mod inputs)
    python scripts/streaming.py dataset_manifest=test.jsonl

    # a synthetic (random-weight) preset on synthetic audio
    python scripts/streaming.py model=tiny-streaming

    # a real cache-aware checkpoint on a folder of audio, 64 streams at 160 ms chunks
    python scripts/streaming.py model=/path/to/model.nemo audio_dir=/data/wavs num_streams=64 att_context_size=[70,1]

    # the benchmark presets (FastConformer 17 x 512 hybrid; 0.6B RNN-T), results in benchmarks/results/
    python scripts/streaming.py --config-name streaming_hybrid_17x512 tag=h200_2026-11-23
    python scripts/streaming.py --config-name streaming_rnnt_0.6b tag=h200_2026-11-23

    # latency vs concurrent streams (64/256/512/1024, both paths, 8 s streams): table, JSON and plot
    python scripts/streaming.py --config-name streaming_sweep_17x512 tag=h200_2026-11-23
    python scripts/streaming.py num_streams_sweep=[2,4,8] max_stream_seconds=2   # tiny, on a CPU

    # beam search: no NeMo path is timed; NeMo's beam search of the first 8 streams alone checks our tokens
    python scripts/streaming.py --config-name streaming_hybrid_17x512 decoding=beam beam_size=4
    python scripts/streaming.py decoding=beam ngram_lm_model=lm.arpa ngram_lm_alpha=0.5   # + an n-gram LM
    # half the streams boost 10 random phrases of their own (text: vocab=bpe gives a synthetic preset a tokenizer)
    python scripts/streaming.py model=tiny-streaming vocab=bpe decoding=beam boosting_streams_share=0.5
    python scripts/streaming.py model=tiny-streaming vocab=bpe boosting_streams_share=0.5 compare_nemo=false  # greedy
"""

from nemo.core.config import hydra_runner
from omegaconf import DictConfig

import fastdecode_lab.models  # noqa: F401  (the lab's synthetic presets as model names: model=tiny-rnnt)
from fastdecode_lab.configs import StreamingConfig
from fastdecode_lab.streaming_sim import run
from nemo_fastdecode.apps.confighelp import check_hydra_argv


@hydra_runner(config_path="../configs/streaming", config_name="streaming")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    check_hydra_argv(StreamingConfig, "scripts/streaming.py", open_sections=())  # --help; misspelled keys named
    main()
