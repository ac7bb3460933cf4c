"""What a push may carry, checked before anything is queued: raw audio of the stream's sample format (int16, float32,
G.711 mu-law or A-law bytes), whole samples.

:class:`PcmInput` keeps, per slot, the stream's sample format, the whole samples pushed so far and the first bytes of
a sample split between pushes (put together with the rest at the next push). Its checks raise
:class:`~nemo_fastdecode.streaming.events.StreamError` naming the stream and the problem; nothing changes then.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from nemo_fastdecode.streaming.events import StreamError
from nemo_fastdecode.streaming.frontend import SampleFormat

__all__ = ["PcmInput"]


class PcmInput:
    """Per-slot PCM bookkeeping of the pushes: sample format, whole samples pushed, a split sample's first bytes.

    Attributes:
        carry: per slot, the first bytes of a sample whose other bytes are to come.
        samples: ``[S]`` int64, whole samples pushed (at the stream's own rate).
        format: per slot, the stream's :class:`SampleFormat`.
        itemsize: ``[S]`` int64, bytes per sample.
    """

    def __init__(self, num_slots: int):
        self.carry: list[bytes] = [b""] * num_slots
        self.samples = np.zeros(num_slots, dtype=np.int64)
        self.format = [SampleFormat.INT16] * num_slots
        self.itemsize = np.full(num_slots, SampleFormat.INT16.itemsize, dtype=np.int64)

    def open(self, slot: int, sample_format: str | SampleFormat) -> None:
        self.samples[slot] = 0
        self.carry[slot] = b""
        self.format[slot] = SampleFormat.parse(sample_format)
        self.itemsize[slot] = self.format[slot].itemsize

    def whole_samples(self, stream_id: int, slot: int, pcm: Any) -> bytes | memoryview:
        """The push's whole samples (with a split sample's bytes waiting before them), not copied, once every check
        passed; then counted, and the bytes of a sample it leaves split kept (a copy) for the next push."""
        data = self._as_bytes(stream_id, slot, pcm)
        itemsize, carry = self.format[slot].itemsize, self.carry[slot]
        total = len(carry) + len(data)
        whole = total - total % itemsize
        if carry and whole:
            samples = carry + data[: whole - len(carry)]
        else:
            samples = data if whole == len(data) else memoryview(data)[:whole]
        if whole and self.format[slot] is SampleFormat.FLOAT32:
            self._check_finite(stream_id, slot, samples)
        # every check passed
        self.carry[slot] = carry + data if not whole else bytes(data[len(data) - (total - whole) :])  # kept: a copy
        self.samples[slot] += whole // itemsize
        return samples

    def batchable(self, slots: np.ndarray) -> np.ndarray:
        """``[N]`` bool: open int16 or G.711 streams (slots >= 0) without a split sample waiting, whose pushes of
        whole samples may go in together (float32 pushes go alone: their samples are checked for NaN first)."""
        simple = slots >= 0
        simple[simple] = self.itemsize[slots[simple]] <= 2
        for i in np.flatnonzero(simple).tolist():
            if self.carry[slots[i]]:
                simple[i] = False
        return simple

    def drop_split_sample(self, slot: int, stream_id: int) -> None:
        """A stream that ends with part of a sample: the bytes are dropped, with a warning."""
        if self.carry[slot]:
            warnings.warn(
                f"stream {stream_id} ends with {len(self.carry[slot])} byte(s) of an incomplete "
                f"{self.format[slot].value} sample; dropped",
                stacklevel=4,
            )
            self.carry[slot] = b""

    def _as_bytes(self, stream_id: int, slot: int, pcm: Any) -> bytes | memoryview:
        """The push's raw bytes, not copied (``bytes``, or an unsigned-byte view of a 1-D array of the stream's dtype,
        a ``bytearray`` or a ``memoryview``): the engine copies them into its inbox before ``push`` returns."""
        if type(pcm) is bytes:
            return pcm
        sample_format = self.format[slot].value
        if isinstance(pcm, np.ndarray):
            if pcm.ndim != 1:
                channels = f"{pcm.shape[1]} channels" if pcm.ndim == 2 else f"{pcm.ndim} dimensions"
                raise StreamError(
                    stream_id,
                    f"stream {stream_id}: audio must be mono, a 1-D array; got shape {pcm.shape} ({channels})",
                )
            expected = self.format[slot].dtype
            if pcm.dtype != expected:
                raise StreamError(
                    stream_id,
                    f"stream {stream_id}: an array of dtype {pcm.dtype} was pushed to a {sample_format} stream; "
                    f"valid: {expected} (or open the stream with StreamOptions(sample_format=...))",
                )
            if self.carry[slot]:  # an array's first sample would start inside the waiting one
                raise StreamError(
                    stream_id,
                    f"stream {stream_id}: {len(self.carry[slot])} byte(s) of a split sample wait for the rest; push "
                    "those bytes before pushing an array",
                )
            return memoryview(np.ascontiguousarray(pcm)).cast("B")
        if isinstance(pcm, (bytearray, memoryview)):
            view = memoryview(pcm)
            if not view.c_contiguous:
                raise StreamError(stream_id, f"stream {stream_id}: audio bytes must be contiguous")
            return view.cast("B")
        raise StreamError(
            stream_id,
            f"stream {stream_id}: audio must be bytes or a 1-D numpy array, got {type(pcm).__name__}",
        )

    def _check_finite(self, stream_id: int, slot: int, samples: bytes | memoryview) -> None:
        """Refuse NaN and infinite float32 samples, naming the first (its index counts from the stream's start)."""
        values = np.frombuffer(samples, dtype="<f4")
        if np.isfinite(values).all():
            return
        index = int(np.flatnonzero(~np.isfinite(values))[0])
        raise StreamError(
            stream_id,
            f"stream {stream_id}: non-finite sample {values[index]} at sample {self.samples[slot] + index}; "
            "audio must be finite",
        )
