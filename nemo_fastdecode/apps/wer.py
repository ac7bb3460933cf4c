"""Word error rate of transcripts against reference texts (NeMo's ``word_error_rate``), and the demos' report of it.

A *record* is a dict with the transcript in ``pred_text`` and, where the input has one, the reference in ``text``
(the keys of NeMo's manifests); records without a reference, or without a transcript, are left out of the WER.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["file_label", "report_wer", "scored_records", "word_error_rate_of"]


def scored_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records that have both a reference ``text`` and a ``pred_text``, in order."""
    return [r for r in records if isinstance(r.get("text"), str) and r.get("pred_text") is not None]


def word_error_rate_of(records: Sequence[dict[str, Any]]) -> float | None:
    """NeMo's corpus WER over :func:`scored_records` (``None`` when no record has both)."""
    from nemo.collections.asr.metrics.wer import word_error_rate

    scored = scored_records(records)
    if not scored:
        return None
    return float(word_error_rate(hypotheses=[r["pred_text"] for r in scored], references=[r["text"] for r in scored]))


def file_label(record: dict[str, Any]) -> str:
    """A record's audio file name (``audio_filepath``)."""
    return Path(record["audio_filepath"]).name


def report_wer(
    records: Sequence[dict[str, Any]],
    log: Callable[[str], None],
    show: int,
    label: Callable[[dict[str, Any]], str] = file_label,
) -> float | None:
    """Print the reference and hypothesis of the first ``show`` scored records (each headed by ``label(record)``),
    and NeMo's WER over all of them; returns the WER (``None`` when no record has both)."""
    scored = scored_records(records)
    if not scored:
        return None
    for record in scored[:show]:
        log(f"{label(record)}\n  reference:  {record['text']}\n  hypothesis: {record['pred_text']}")
    if len(scored) > show:
        log(f"... and {len(scored) - show} more")
    wer = word_error_rate_of(scored)
    log(f"WER {100 * wer:.2f}% over {len(scored)} utterance(s) with a reference text")
    return wer
