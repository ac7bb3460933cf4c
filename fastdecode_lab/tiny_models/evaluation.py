"""Held-out word error rates of a tiny model, NeMo's decoding and ours side by side: greedy, beam, streaming.

The ``test`` split holds sentences and voices that training never saw. Every row decodes the same utterances:

* offline, through NeMo's ``transcribe``: NeMo's ``greedy_batch`` (the frame and label loops for RNN-T, the label
  loop for TDT) and our ``fast_greedy``; NeMo's batched beam search ``malsd_batch`` (for a TDT model NeMo's TDT
  variant) and our ``fast_beam`` with the same beam settings; a hybrid's CTC head too. The rows are those of
  :func:`~nemo_fastdecode.apps.transcribe.comparison_configs`, NeMo's without CUDA graphs.
* streaming (a cache-aware encoder), at each look-ahead: NeMo's cache-aware streaming of each file alone over the
  preprocessor's features of the whole file (:func:`~nemo_fastdecode.apps.streaming_reference.reference_transcript`,
  the reference of every streaming test), our :class:`~nemo_fastdecode.streaming.StreamingEngine` on the files'
  int16 samples, and NeMo's streaming script's loop (``CacheAwareStreamingAudioBuffer.append_audio_file`` chunks,
  ``conformer_stream_step`` with the previous hypotheses, a batch of streams at a time). The script's buffer also
  holds the preprocessor's masked frame past each file's feature length (``append_processed_signal`` takes the
  padded size as the length), one zero frame more at the end than the reference, which can change the last tokens.

* sessions: consecutive test utterances joined by pauses into one recording each, as a live session holds them,
  decoded offline with the model's own decoding and, for a cache-aware model, streamed by NeMo and by our engine
  at each look-ahead (:func:`session_wers`). A model that only ever heard single utterances starting at once can
  lose the first words after each pause.

Each of our rows names its NeMo reference row and counts the utterances whose token ids differ from it (0 in fp32);
so does the streaming script's row.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fastdecode_lab.tiny_models.layout import RecipeLayout
from nemo_fastdecode.apps.comparison import as_int_list
from nemo_fastdecode.apps.manifests import read_manifest

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel


@dataclass(frozen=True)
class WerResult:
    """One evaluation row.

    Attributes:
        decoding: e.g. ``greedy_batch (label loop)``, ``fast_beam (beam 4)``, ``ctc``, ``StreamingEngine [70, 1]``.
        wer: NeMo's word error rate over ``utterances`` (errors / reference words).
        utterances: test utterances decoded.
        seconds: wall time of the row (encoder included).
        tokens: tokens emitted over all utterances (``None`` for CTC, whose hypotheses carry frame scores).
        reference: the row whose token ids this one is compared with (``None``: a reference row, or CTC).
        differing: utterances whose token ids differ from ``reference``'s (``None`` without a reference).
        examples: the first few hypotheses next to their references.
    """

    decoding: str
    wer: float
    utterances: int
    seconds: float
    tokens: int | None
    reference: str | None
    differing: int | None
    examples: list[dict[str, str]]


@dataclass(frozen=True)
class Decoded:
    """One row's transcripts (``text`` and token ids per utterance; ``None`` for CTC) and wall time."""

    name: str
    texts: list[str]
    token_ids: list[list[int]] | None
    seconds: float


def differing_utterances(reference: Sequence[Sequence[int]], token_ids: Sequence[Sequence[int]]) -> int:
    """How many utterances' token ids differ between two rows (in the same utterance order)."""
    return sum(list(a) != list(b) for a, b in zip(reference, token_ids, strict=True))


def wer_result(
    decoded: Decoded, references: Sequence[str], reference: Decoded | None = None, examples: int = 5
) -> WerResult:
    """The row of ``decoded`` against the reference texts (and, if given, the token ids of a ``reference`` row)."""
    from nemo.collections.asr.metrics.wer import word_error_rate

    wer = word_error_rate(hypotheses=list(decoded.texts), references=list(references))
    return WerResult(
        decoding=decoded.name,
        wer=round(float(wer), 5),
        utterances=len(references),
        seconds=round(decoded.seconds, 2),
        tokens=None if decoded.token_ids is None else sum(len(ids) for ids in decoded.token_ids),
        reference=None if reference is None else reference.name,
        differing=None if reference is None else differing_utterances(reference.token_ids, decoded.token_ids),
        examples=[{"ref": r, "hyp": h} for r, h in list(zip(references, decoded.texts, strict=True))[:examples]],
    )


# ---- offline ---------------------------------------------------------------------------------------------------
def transcribed(model: ASRModel, name: str, paths: Sequence[str], batch_size: int, ctc: bool = False) -> Decoded:
    """NeMo's ``transcribe`` of the files with the model's current decoding (``ctc``: a hybrid's CTC head, whose
    token ids are not kept)."""
    from nemo_fastdecode.apps.transcribe import transcribe_files

    start = time.perf_counter()
    hyps = transcribe_files(model, paths, batch_size=batch_size, progress=False)
    model.eval()  # NeMo's transcribe leaves the modules in train mode
    texts = [h if isinstance(h, str) else h.text for h in hyps]
    ids = None if ctc else [[] if isinstance(h, str) else as_int_list(h.y_sequence) for h in hyps]
    return Decoded(name, texts, ids, time.perf_counter() - start)


def offline_rows(
    model: ASRModel, entries: Sequence[dict[str, Any]], batch_size: int, beam_size: int | None = 4
) -> list[WerResult]:
    """NeMo's greedy rows and ours, then (``beam_size`` not ``None``) NeMo's ``malsd_batch`` and our ``fast_beam``
    with ``beam_size`` beams, then a hybrid's CTC head; the model's decoding is restored afterwards."""
    from nemo_fastdecode.apps.models import apply_decoding, is_hybrid
    from nemo_fastdecode.apps.transcribe import comparison_configs
    from nemo_fastdecode.nemo.context import quiet_nemo

    paths = [e["audio_filepath"] for e in entries]
    references = [e["text"] for e in entries]
    groups = [comparison_configs(model, {"strategy": "fast_greedy"})]
    if beam_size is not None:
        beam = comparison_configs(model, {"strategy": "fast_beam", "beam": {"beam_size": beam_size}})
        groups.append([(f"{name} (beam {beam_size})", config) for name, config in beam])
    original = copy.deepcopy(model.cfg.decoding)
    results = []
    try:
        for group in groups:
            reference = None
            for name, config in group:
                with quiet_nemo():
                    apply_decoding(model, config)
                decoded = transcribed(model, name, paths, batch_size)
                results.append(wer_result(decoded, references, reference))
                reference = reference or decoded
    finally:
        with quiet_nemo():  # the saved section itself, not merged over the last row's
            model.change_decoding_strategy(
                original, verbose=False, **({"decoder_type": "rnnt"} if is_hybrid(model) else {})
            )
    if is_hybrid(model):
        results.append(wer_result(ctc_decoded(model, paths, batch_size), references))
    return results


def ctc_decoded(model: ASRModel, paths: Sequence[str], batch_size: int) -> Decoded:
    """A hybrid model's CTC head through NeMo's ``transcribe`` (the transducer head is selected again afterwards)."""
    model.change_decoding_strategy(decoder_type="ctc", verbose=False)
    try:
        return transcribed(model, "ctc", paths, batch_size, ctc=True)
    finally:
        model.change_decoding_strategy(decoder_type="rnnt", verbose=False)


def split_wers(
    model: ASRModel, manifests: dict[str, str | os.PathLike], batch_size: int, limit: int | None = None
) -> dict[str, dict[str, Any]]:
    """Each manifest's WER with the model's own decoding (NeMo's ``transcribe``): split name -> :class:`WerResult`
    fields, the manifest and ``by_voice`` (voice -> WER, where the entries name several voices: a held-out engine's
    voices may share recordings with a trained engine's, so each is reported apart); ``limit``: its first this many
    utterances."""
    from nemo.collections.asr.metrics.wer import word_error_rate

    results = {}
    for split, manifest in manifests.items():
        entries = read_manifest(manifest)[:limit]
        decoded = transcribed(model, split, [e["audio_filepath"] for e in entries], batch_size)
        references = [e["text"] for e in entries]
        results[split] = {"manifest": str(manifest), **asdict(wer_result(decoded, references))}
        voices: dict[str, list[int]] = {}
        for i, entry in enumerate(entries):
            voices.setdefault(str(entry.get("voice", "")), []).append(i)
        if len(voices) > 1:
            results[split]["by_voice"] = {
                voice: round(float(word_error_rate([decoded.texts[i] for i in rows], [references[i] for i in rows])), 5)
                for voice, rows in sorted(voices.items())
            }
    return results


# ---- streaming -------------------------------------------------------------------------------------------------
def nemo_streaming_script(
    model: ASRModel, audio_paths: Sequence[str], batch_size: int, name: str = "NeMo streaming script"
) -> Decoded:
    """NeMo's cache-aware streaming of the files as NeMo's streaming script runs it, ``batch_size`` streams at a
    time, at the encoder's current look-ahead; the final transcripts."""
    from nemo.collections.asr.parts.utils.streaming_utils import CacheAwareStreamingAudioBuffer

    start = time.perf_counter()
    texts: list[str] = []
    ids: list[list[int]] = []
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
        texts += [t.text for t in transcribed]
        ids += [as_int_list(t.y_sequence) for t in transcribed]
    return Decoded(name, texts, ids, time.perf_counter() - start)


def nemo_streaming_alone(
    model: ASRModel, pcm: Sequence[np.ndarray], att_context_size: Sequence[int], name: str = "NeMo streaming"
) -> Decoded:
    """NeMo's cache-aware streaming of each int16 PCM ``[T]`` alone over its whole-file features
    (:func:`~nemo_fastdecode.apps.streaming_reference.reference_transcript`); sets the look-ahead on the model."""
    from nemo_fastdecode.apps.streaming_reference import reference_transcript

    start = time.perf_counter()
    refs = [reference_transcript(model, samples, list(att_context_size)) for samples in pcm]
    return Decoded(name, [r.text for r in refs], [r.token_ids for r in refs], time.perf_counter() - start)


def read_pcm16(paths: Sequence[str]) -> list[np.ndarray]:
    """Each file's samples as int16 ``[T]`` (16-bit mono WAV files, as the recipe writes them)."""
    import soundfile as sf

    pcm = []
    for path in paths:
        samples, _ = sf.read(path, dtype="int16", always_2d=True)
        if samples.shape[1] != 1:
            raise ValueError(f"{path} has {samples.shape[1]} channels; the streaming evaluation takes mono files")
        pcm.append(samples[:, 0])
    return pcm


def engine_decoded(
    model: ASRModel,
    pcm: Sequence[np.ndarray],
    att_context_size: Sequence[int],
    num_slots: int,
    name: str = "StreamingEngine",
) -> Decoded:
    """Our :class:`~nemo_fastdecode.streaming.StreamingEngine` (fp32) over int16 PCM ``[T]`` per stream: up to
    ``num_slots`` streams at once, each pushed whole and finished, a new one opened as soon as a slot is free; the
    final transcripts, in the input order."""
    from nemo_fastdecode.streaming import StreamingEngine

    start = time.perf_counter()
    engine = StreamingEngine(model, num_slots=max(1, min(num_slots, len(pcm))), att_context_size=att_context_size)
    waiting = deque(range(len(pcm)))
    index: dict[int, int] = {}  # engine stream id -> input index
    texts: list[str] = [""] * len(pcm)
    ids: list[list[int]] = [[] for _ in pcm]
    while waiting or index:
        while waiting and len(index) < engine.num_slots:
            stream = engine.open()
            index[stream] = waiting.popleft()
            engine.push(stream, pcm[index[stream]])
            engine.finish(stream)
        for event in engine.poll():
            if event.is_last:
                i = index.pop(event.stream_id)
                texts[i], ids[i] = event.text, list(event.token_ids)
    return Decoded(name, texts, ids, time.perf_counter() - start)


def streaming_rows(
    model: ASRModel,
    entries: Sequence[dict[str, Any]],
    batch_size: int,
    contexts: Sequence[Sequence[int]] | None = None,
) -> list[WerResult]:
    """At each of the encoder's look-aheads: NeMo's cache-aware streaming of each file alone
    (:func:`nemo_streaming_alone`), then our engine (:func:`engine_decoded`, ``batch_size`` slots) and NeMo's
    streaming script (:func:`nemo_streaming_script`, ``batch_size`` streams per batch) against it. ``contexts``: the
    look-aheads (``None``: all of the encoder's); the default look-ahead is restored."""
    contexts = [list(c) for c in (model.encoder.att_context_size_all if contexts is None else contexts)]
    default = list(model.encoder.att_context_size)
    paths = [e["audio_filepath"] for e in entries]
    references = [e["text"] for e in entries]
    pcm = read_pcm16(paths)
    results = []
    try:
        for context in contexts:
            nemo = nemo_streaming_alone(model, pcm, context, name=f"NeMo streaming {context}")
            ours = engine_decoded(model, pcm, context, batch_size, name=f"StreamingEngine {context}")
            model.encoder.set_default_att_context_size(context)
            script = nemo_streaming_script(model, paths, batch_size, name=f"NeMo streaming script {context}")
            results += [wer_result(d, references, None if d is nemo else nemo) for d in (nemo, ours, script)]
    finally:
        model.encoder.set_default_att_context_size(default)
    return results


# ---- sessions --------------------------------------------------------------------------------------------------
def joined_sessions(
    pcm: Sequence[np.ndarray], texts: Sequence[str], per_session: int, pause_seconds: float, sample_rate: int = 16000
) -> tuple[list[np.ndarray], list[str]]:
    """Each run of ``per_session`` consecutive int16 PCM ``[T]`` utterances as one recording (``pause_seconds`` of
    silence after each utterance, the last included) and its reference (their texts joined); a shorter last run
    is dropped."""
    if per_session < 1 or pause_seconds < 0:
        raise ValueError(f"per_session must be >= 1 and pause_seconds >= 0, got {per_session} and {pause_seconds}")
    pause = np.zeros(round(pause_seconds * sample_rate), dtype=np.int16)
    audio, references = [], []
    for first in range(0, len(pcm) - per_session + 1, per_session):
        run = range(first, first + per_session)
        audio.append(np.concatenate([part for i in run for part in (np.asarray(pcm[i], dtype=np.int16), pause)]))
        references.append(" ".join(texts[i] for i in run))
    return audio, references


def session_wers(
    model: ASRModel,
    entries: Sequence[dict[str, Any]],
    per_session: int,
    pause_seconds: float,
    batch_size: int,
    streaming: bool = True,
) -> dict[str, Any]:
    """The WERs of :func:`joined_sessions` of ``entries``: offline with the model's own decoding (NeMo's
    ``transcribe`` of the recordings written as WAV files), and, for a cache-aware model with ``streaming``, NeMo's
    cache-aware streaming of each recording alone and our engine against it at each look-ahead."""
    import tempfile

    import soundfile as sf

    pcm = read_pcm16([e["audio_filepath"] for e in entries])
    audio, references = joined_sessions(pcm, [e["text"] for e in entries], per_session, pause_seconds)
    if not audio:
        raise ValueError(f"{len(entries)} utterances make no session of {per_session}")
    with tempfile.TemporaryDirectory() as folder:
        paths = [os.path.join(folder, f"session_{i:03d}.wav") for i in range(len(audio))]
        for path, samples in zip(paths, audio, strict=True):
            sf.write(path, samples, 16000, subtype="PCM_16")
        rows = [wer_result(transcribed(model, "offline", paths, batch_size), references)]
    if streaming and model.cfg.encoder.get("att_context_style") == "chunked_limited":
        default = list(model.encoder.att_context_size)
        try:
            for context in [list(c) for c in model.encoder.att_context_size_all]:
                nemo = nemo_streaming_alone(model, audio, context, name=f"NeMo streaming {context}")
                ours = engine_decoded(model, audio, context, batch_size, name=f"StreamingEngine {context}")
                rows += [wer_result(nemo, references), wer_result(ours, references, nemo)]
        finally:
            model.encoder.set_default_att_context_size(default)
    return {
        "utterances_per_session": per_session,
        "pause_seconds": pause_seconds,
        "sessions": len(audio),
        "seconds": round(sum(a.size for a in audio) / 16000, 1),
        "rows": [asdict(r) for r in rows],
    }


# ---- the recipe's stage ----------------------------------------------------------------------------------------
def format_table(model_name: str, results: Sequence[dict[str, Any]]) -> str:
    """A Markdown table of one model's result rows (:class:`WerResult` as dicts)."""
    lines = [
        f"### {model_name}",
        "",
        "| decoding | utterances | WER | tokens | compared with | utterances with other token ids | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        compared = r["reference"] or "-"
        differing = "-" if r["differing"] is None else str(r["differing"])
        lines.append(
            f"| {r['decoding']} | {r['utterances']} | {100 * r['wer']:.2f}% | {r['tokens'] or '-'} | {compared} | "
            f"{differing} | {r['seconds']} |"
        )
    return "\n".join(lines)


def evaluate(
    model_name: str,
    layout: RecipeLayout,
    *,
    batch_size: int = 64,
    beam_size: int | None = 4,
    streaming: bool = True,
    streaming_utterances: int | None = None,
    extra_splits: Sequence[str] = (),
    sessions: int = 0,
    session_utterances: int = 6,
    session_pause_seconds: float = 1.2,
    device: str | torch.device | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Evaluate ``models/{model_name}.nemo`` on the test split (see the module docstring); writes and returns
    ``models/{model}_eval.json``.

    Args:
        model_name: a recipe model (``tdt``, ``streaming_hybrid``).
        layout: the recipe's output folder.
        batch_size: utterances per offline batch; streams per NeMo streaming batch and engine slots.
        beam_size: beams of the beam rows; ``None``: no beam rows.
        streaming: a cache-aware model also gets the streaming rows.
        streaming_utterances: the first this many test utterances for the streaming rows; ``None``: all.
        extra_splits: more evaluation splits (:func:`~fastdecode_lab.tiny_models.voices.evaluation_splits`: other
            synthesisers, held-out voices, the held-out engine), each decoded with the model's own decoding
            (:func:`split_wers`); their WERs go to the report's ``splits`` beside ``test`` (the greedy row's).
        sessions: how many sessions of ``session_utterances`` consecutive test utterances, each followed by
            ``session_pause_seconds`` of silence, :func:`session_wers` decodes (the report's ``sessions``); 0: none.
        device: where the model runs; ``None``: GPU 0 if there is one, else the CPU.
        log: where each row and the table go.
    """
    from fastdecode_lab.tiny_models.training import restore
    from nemo_fastdecode.apps.environment import environment

    path = layout.nemo(model_name)
    if not path.is_file():
        raise FileNotFoundError(f"no model {path}: train and export {model_name} first")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = restore(path, device)
    entries = read_manifest(layout.manifest("test"))
    results = offline_rows(model, entries, batch_size, beam_size)
    if streaming and model.cfg.encoder.get("att_context_style") == "chunked_limited":
        results += streaming_rows(model, entries[:streaming_utterances], batch_size)
    report = {
        "model": str(path),
        "parameters": sum(p.numel() for p in model.parameters()),
        "size_bytes": path.stat().st_size,
        "test_utterances": len(entries),
        "test_seconds": round(sum(float(e["duration"]) for e in entries), 1),
        "environment": environment(device),
        "results": [asdict(r) for r in results],
        "splits": {
            "test": {"manifest": str(layout.manifest("test")), **asdict(results[0])},
            **split_wers(model, {split: layout.manifest(split) for split in extra_splits}, batch_size),
        },
    }
    if sessions:
        report["sessions"] = session_wers(
            model,
            entries[: sessions * session_utterances],
            session_utterances,
            session_pause_seconds,
            batch_size,
            streaming=streaming,
        )
    layout.evaluation(model_name).write_text(json.dumps(report, indent=2) + "\n")
    for r in results:
        differing = "" if r.differing is None else f", {r.differing} differ from {r.reference}"
        log(
            f"{model_name}: {r.decoding:>28}  WER {100 * r.wer:6.2f}%  ({r.utterances} utterances, {r.seconds} s"
            f"{differing})"
        )
    log(format_table(model_name, report["results"]))
    for split, row in report["splits"].items():
        by_voice = ", ".join(f"{voice} {100 * wer:.2f}%" for voice, wer in row.get("by_voice", {}).items())
        log(
            f"{model_name}: {split:>28}  WER {100 * row['wer']:6.2f}%  ({row['utterances']} utterances)"
            + (f"; by voice: {by_voice}" if by_voice else "")
        )
    if sessions:
        joined = report["sessions"]
        for r in joined["rows"]:
            differing = "" if r["differing"] is None else f", {r['differing']} differ from {r['reference']}"
            log(
                f"{model_name}: sessions of {joined['utterances_per_session']} with {joined['pause_seconds']} s "
                f"pauses, {r['decoding']:>26}  WER {100 * r['wer']:6.2f}%  ({r['utterances']} sessions{differing})"
            )
    return report
