"""Which inputs of the stream-audio benchmark end with other tokens than NeMo's streaming of the file alone, and why.

python benchmarks/experiments/stream_exactness_check.py [stream_audio_bench overrides, e.g. num_files=32]

Loads the model and inputs as ``benchmarks/stream_audio_bench.py --config-name stream_audio_bench_hybrid_17x512`` does,
streams every input through one fp32 ``StreamingEngine`` (all at once, whole files pushed, then finished), and
compares each final with NeMo's cache-aware streaming of the file alone (``tools/streaming_reference``). For each
input that differs it prints where the tokens part, runs the engine again with the pointwise convolutions as NeMo's
Conv1d modules (not GEMMs) and NeMo's subsampling module (not :class:`CausalSubsampling`), then the encoder and decoder on NeMo's own
features of the file (split into NeMo's chunks), and how far the engine's front-end features are from those.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir

from fastdecode_lab.benchmarks.stream_audio.app import _inputs, _load, resolve_config
from nemo_fastdecode.apps.streaming_reference import reference_transcript
from nemo_fastdecode.streaming import StreamingEngine, StreamingTranscriber
from nemo_fastdecode.streaming.encoder import StreamingEncoderStep, _Normalized
from nemo_fastdecode.streaming.geometry import split_features
from nemo_fastdecode.streaming.transcriber import set_att_context_size

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
LINEAR = StreamingEncoderStep._linear


def conv1d_linear(self, module, x, *args, residual=None, keep_stats=False, **kwargs):
    """The pointwise convolutions as NeMo's Conv1d modules over ``[B, C, T]`` (cuDNN), the rest unchanged."""
    if not isinstance(module, torch.nn.Conv1d):
        return LINEAR(self, module, x, *args, residual=residual, keep_stats=keep_stats, **kwargs)
    x = x.compute() if isinstance(x, _Normalized) else x
    y = module(x.transpose(1, 2)).transpose(1, 2)
    y = y if residual is None else residual + y
    return (y, None) if keep_stats else y


def finals(model, pcm: list[np.ndarray], att: list[int], nemo_subsampling: bool) -> list[list[int]]:
    engine = StreamingEngine(model, len(pcm), att_context_size=att)
    if nemo_subsampling:
        engine.transcriber.encoder_step.subsampling = None
    ids = [engine.open() for _ in pcm]
    for stream_id, audio in zip(ids, pcm, strict=True):
        engine.push(stream_id, audio)
        engine.finish(stream_id)
    tokens: dict[int, list[int]] = {}
    while engine.open_streams:
        for event in engine.poll():
            if event.is_last:
                tokens[event.stream_id] = list(event.token_ids)
    return [tokens[i] for i in ids]


def main(argv: list[str]) -> None:
    with initialize_config_dir(str(CONFIGS), version_base=None):
        cfg = resolve_config(compose("stream_audio_bench_hybrid_17x512", overrides=argv))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, _ = _load(cfg, device, Path("/tmp/stream_exactness_check"), print)
    set_att_context_size(model.encoder, list(cfg.att_context_size))
    _, audios = _inputs(cfg, int(model.cfg.sample_rate))
    pcm = [np.round(a * 32768).astype(np.int16) for a in audios]
    reference = [reference_transcript(model, p).token_ids for p in pcm]
    print(f"{len(pcm)} inputs, {sum(map(len, reference))} reference tokens")
    variants = {"as built": (False, False), "Conv1d and NeMo subsampling": (True, True)}
    for name, (conv1d, nemo_subsampling) in variants.items():
        StreamingEncoderStep._linear = conv1d_linear if conv1d else LINEAR
        ours = finals(model, pcm, list(cfg.att_context_size), nemo_subsampling)
        differ = [i for i, (a, b) in enumerate(zip(ours, reference, strict=True)) if a != b]
        print(f"{name}: {len(pcm) - len(differ)}/{len(pcm)} equal NeMo alone")
        for i in differ:
            a, b = ours[i], reference[i]
            at = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            print(
                f"   input {i}: {len(a)} vs {len(b)} tokens, first difference at token {at}: {a[at : at + 3]} vs {b[at : at + 3]}"
            )
    StreamingEncoderStep._linear = LINEAR
    for i in differ:
        on_nemo_features(model, pcm[i], list(cfg.att_context_size), reference[i], f"input {i}")


def on_nemo_features(model, pcm: np.ndarray, att: list[int], reference: list[int], name: str) -> None:
    """The transcriber on NeMo's preprocessor features of the whole file, and the front end's distance from them."""
    device = next(model.parameters()).device
    signal = torch.from_numpy(pcm.astype(np.float32) / 32768)[None].to(device)
    with torch.inference_mode():
        feats, length = model.preprocessor(input_signal=signal, length=torch.tensor([signal.shape[1]], device=device))
    feats = feats[0, :, : int(length)]
    streamer = StreamingTranscriber(model, 1, att_context_size=att)
    slot = streamer.open()
    for chunk in split_features(feats, streamer.geometry):
        streamer.step([slot], [chunk])
    tokens = [int(t) for t in streamer.flush(slot).hypothesis.y_sequence]
    print(f"{name}, transcriber on NeMo's features: {'equal to' if tokens == reference else 'differs from'} NeMo alone")
    engine = StreamingEngine(model, 1, att_context_size=att)
    front = engine.front
    front.open(0)
    pieces, step = [], 8000  # half a second per call: within what the front end holds between two calls
    for start in range(0, len(pcm) + step, step):
        front.append({0: pcm[start : start + step].tobytes()})
        out = front.features(flush=[0] if start >= len(pcm) else ())
        if len(out.slots):
            pieces.append(out.features[:, int(out.offsets[0]) : int(out.offsets[0]) + int(out.counts[0])])
    ours = torch.cat(pieces, dim=1)
    frames = min(ours.shape[1], feats.shape[1])
    gap = (ours[:, :frames] - feats[:, :frames]).abs()
    print(f"{name}, front end vs NeMo's features: {frames} frames, max |difference| {gap.max().item():.3g}")


if __name__ == "__main__":
    main(sys.argv[1:])
