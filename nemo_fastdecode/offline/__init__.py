"""The offline path: ``model.transcribe`` on length-sorted, budgeted batches with audio read ahead."""

from nemo_fastdecode.offline.batching import plan_batches
from nemo_fastdecode.offline.fast_path import (
    FastTranscribeOptions,
    disable_fast_transcribe,
    enable_fast_transcribe,
    fast_transcribe,
)

__all__ = [
    "FastTranscribeOptions",
    "disable_fast_transcribe",
    "enable_fast_transcribe",
    "fast_transcribe",
    "plan_batches",
]
