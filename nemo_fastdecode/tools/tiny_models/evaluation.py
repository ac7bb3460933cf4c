"""Held-out word error rates of a tiny model: offline (NeMo's ``transcribe``, greedy) and cache-aware streaming.

The ``test`` split holds sentences and voices that training never saw. Offline, every model decodes with its own
greedy decoding (the hybrid also with its CTC head). Streaming, the hybrid runs as NeMo's cache-aware streaming
script does (``CacheAwareStreamingAudioBuffer`` chunks, ``conformer_stream_step`` with the previous hypotheses), a
batch of streams at a time, at each of its look-aheads.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from nemo_fastdecode.tools.tiny_models.layout import RecipeLayout

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel


@dataclass(frozen=True)
class WerResult:
    """One evaluation: ``decoding`` (e.g. ``rnnt``, ``ctc``, ``streaming [70, 1]``), WER over ``utterances``
    (errors / reference words), wall time, and a few hypotheses next to their references."""

    decoding: str
    wer: float
    utterances: int
    seconds: float
    examples: list[dict[str, str]]


def read_manifest(path: str | os.PathLike) -> list[dict[str, Any]]:
    """A JSON-lines manifest's entries, ``audio_filepath`` made absolute (relative paths are relative to it)."""
    folder = Path(path).parent
    entries = []
    with open(path, encoding="utf8") as f:
        for line in f:
            if line.strip():
                entry = json.loads(line)
                entry["audio_filepath"] = str((folder / entry["audio_filepath"]).resolve())
                entries.append(entry)
    return entries


def _result(decoding: str, hypotheses: Sequence[str], references: Sequence[str], seconds: float) -> WerResult:
    from nemo.collections.asr.metrics.wer import word_error_rate

    examples = [{"ref": r, "hyp": h} for r, h in list(zip(references, hypotheses, strict=True))[:5]]
    wer = word_error_rate(hypotheses=list(hypotheses), references=list(references))
    return WerResult(decoding, round(float(wer), 5), len(references), round(seconds, 2), examples)


def offline_wer(
    model: ASRModel, entries: Sequence[dict[str, Any]], batch_size: int, decoder_type: str | None = None
) -> WerResult:
    """WER of NeMo's ``transcribe`` (the model's greedy decoding; ``decoder_type`` ``ctc`` / ``rnnt`` picks a
    hybrid's head, which is left as it was)."""
    from nemo_fastdecode.tools.transcribe_app import transcribe_files

    previous = getattr(model, "cur_decoder", None)
    if decoder_type is not None:
        model.change_decoding_strategy(decoder_type=decoder_type, verbose=False)
    start = time.perf_counter()
    try:
        hyps = transcribe_files(model, [e["audio_filepath"] for e in entries], batch_size=batch_size, progress=False)
    finally:
        if decoder_type is not None and previous is not None:
            model.change_decoding_strategy(decoder_type=previous, verbose=False)
    model.eval()  # NeMo's transcribe leaves the modules in train mode
    texts = [h.text if not isinstance(h, str) else h for h in hyps]
    return _result(decoder_type or "greedy", texts, [e["text"] for e in entries], time.perf_counter() - start)


def streaming_transcripts(model: ASRModel, audio_paths: Sequence[str], batch_size: int) -> list[str]:
    """Final transcripts of NeMo's cache-aware streaming of the files, ``batch_size`` streams at a time, at the
    encoder's current look-ahead."""
    from nemo.collections.asr.parts.utils.streaming_utils import CacheAwareStreamingAudioBuffer

    texts: list[str] = []
    for first in range(0, len(audio_paths), batch_size):
        buffer = CacheAwareStreamingAudioBuffer(model=model, online_normalization=False, pad_and_drop_preencoded=False)
        for path in audio_paths[first : first + batch_size]:
            buffer.append_audio_file(path, stream_id=-1)
        channel, time_cache, channel_len = model.encoder.get_initial_cache_state(batch_size=len(buffer.streams_length))
        hypotheses, predictions, transcribed = None, None, []
        with torch.inference_mode():
            for step, (chunk, chunk_len) in enumerate(buffer):
                predictions, transcribed, channel, time_cache, channel_len, hypotheses = model.conformer_stream_step(
                    processed_signal=chunk,
                    processed_signal_length=chunk_len,
                    cache_last_channel=channel,
                    cache_last_time=time_cache,
                    cache_last_channel_len=channel_len,
                    keep_all_outputs=buffer.is_buffer_empty(),
                    previous_hypotheses=hypotheses,
                    previous_pred_out=predictions,
                    drop_extra_pre_encoded=0 if step == 0 else model.encoder.streaming_cfg.drop_extra_pre_encoded,
                    return_transcription=True,
                )
        texts += [t.text if not isinstance(t, str) else t for t in transcribed]
    return texts


def streaming_wers(model: ASRModel, entries: Sequence[dict[str, Any]], batch_size: int) -> list[WerResult]:
    """:func:`streaming_transcripts` WER at each of the encoder's look-aheads (the default look-ahead is restored)."""
    contexts = [list(c) for c in model.encoder.att_context_size_all]
    default = list(model.encoder.att_context_size)
    paths = [e["audio_filepath"] for e in entries]
    results = []
    try:
        for context in contexts:
            model.encoder.set_default_att_context_size(context)
            start = time.perf_counter()
            texts = streaming_transcripts(model, paths, batch_size)
            results.append(
                _result(f"streaming {context}", texts, [e["text"] for e in entries], time.perf_counter() - start)
            )
    finally:
        model.encoder.set_default_att_context_size(default)
    return results


def evaluate(
    model_name: str,
    layout: RecipeLayout,
    *,
    batch_size: int = 64,
    streaming: bool = True,
    streaming_utterances: int | None = None,
    device: str | torch.device | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Evaluate ``models/{model_name}.nemo`` on the test split; writes and returns ``models/{model}_eval.json``."""
    from nemo_fastdecode.tools.tiny_models.training import restore

    path = layout.nemo(model_name)
    if not path.is_file():
        raise FileNotFoundError(f"no model {path}: train and export {model_name} first")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = restore(path, device)
    entries = read_manifest(layout.manifest("test"))
    results = [offline_wer(model, entries, batch_size)]
    if hasattr(model, "cur_decoder"):  # a hybrid: its CTC head too
        results.append(offline_wer(model, entries, batch_size, decoder_type="ctc"))
    if streaming and model.cfg.encoder.get("att_context_style") == "chunked_limited":
        results += streaming_wers(model, entries[:streaming_utterances], batch_size)
    report = {
        "model": str(path),
        "parameters": sum(p.numel() for p in model.parameters()),
        "size_bytes": path.stat().st_size,
        "test_utterances": len(entries),
        "test_seconds": round(sum(float(e["duration"]) for e in entries), 1),
        "results": [asdict(r) for r in results],
    }
    layout.evaluation(model_name).write_text(json.dumps(report, indent=2) + "\n")
    for r in results:
        log(f"{model_name}: {r.decoding:>22}  WER {100 * r.wer:6.2f}%  ({r.utterances} utterances, {r.seconds} s)")
    return report
