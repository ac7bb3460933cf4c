"""Patch: NeMo's RNN-T (and hybrid) ``transcribe`` takes our offline path when the decoding asks for it.

``EncDecRNNTModel.transcribe`` and ``EncDecHybridRNNTCTCModel.transcribe`` are wrapped by
:func:`install_offline_transcribe`: when the model's decoding is ours with ``offline_batching: true`` in its
``greedy`` or ``beam`` section (:func:`wants_offline_batching`), the call goes to
:func:`nemo_fastdecode.offline.fast_path.transcribe_call` (batches by length, the fused encoder with ``fast_encoder:
true``, NeMo's method as fallback for what it does not handle); every other call, and every other
model, goes to NeMo's method untouched. Idempotent: the wrappers are marked; NeMo's methods are their ``__wrapped__``.
"""

from __future__ import annotations

import functools

from nemo_fastdecode.nemo.patches import is_ours, mark

__all__ = ["install_offline_transcribe", "offline_transcribe_targets", "wants_offline_batching"]


def _classes() -> tuple[type, ...]:
    from nemo.collections.asr.models import EncDecHybridRNNTCTCModel, EncDecRNNTModel

    return EncDecRNNTModel, EncDecHybridRNNTCTCModel


def _decoding_flag(model, name: str) -> bool:
    """A flag of our decoding strategy (``fast_greedy``'s or ``fast_beam``'s section) on the decoding the model's
    ``transcribe`` uses (a hybrid model's RNN-T head only when it is the current decoder); ``False`` elsewhere."""
    if getattr(model, "cur_decoder", "rnnt") != "rnnt":
        return False
    return bool(getattr(getattr(getattr(model, "decoding", None), "decoding", None), name, False))


def wants_offline_batching(model) -> bool:
    """``offline_batching: true`` in the ``greedy`` / ``beam`` section of the decoding ``transcribe`` uses."""
    return _decoding_flag(model, "offline_batching")


def install_offline_transcribe() -> None:
    """Wrap both classes' own ``transcribe`` (idempotent)."""
    from nemo_fastdecode.offline.fast_path import FastTranscribeOptions, transcribe_call

    for cls in _classes():
        nemo_transcribe = cls.__dict__.get("transcribe")
        if nemo_transcribe is None or is_ours(nemo_transcribe):
            continue

        def transcribe(self, audio, *args, _nemo_transcribe=nemo_transcribe, **kwargs):
            bound = functools.partial(_nemo_transcribe, self)
            if args or not wants_offline_batching(self):
                return bound(audio, *args, **kwargs)
            options = FastTranscribeOptions(fast_encoder=_decoding_flag(self, "fast_encoder"))
            return transcribe_call(self, audio, kwargs, bound, options)

        functools.update_wrapper(transcribe, nemo_transcribe)
        cls.transcribe = mark(transcribe, nemo_transcribe)


def offline_transcribe_targets() -> dict[str, object]:
    return {f"{cls.__name__}.transcribe": cls.__dict__.get("transcribe") for cls in _classes()}
