"""Each simulated stream's phrases to boost: which streams have them, and random phrases of the model's vocabulary."""

from __future__ import annotations

import random
from typing import Any

from nemo_fastdecode.streaming.events import BoostingOptions

MAX_PHRASE_TOKENS = 3


def boosted_streams(num_streams: int, share: float) -> list[bool]:
    """Whether each stream opens with phrases: ``round(share * num_streams)`` of them, spread evenly (stream ``i``
    where ``floor((i + 1) * share)`` steps up), so that the first streams hold boosted and plain ones alike."""
    return [int((i + 1) * share + 1e-9) > int(i * share + 1e-9) for i in range(num_streams)]


def random_text_phrases(tokenizer: Any, count: int, rng: random.Random) -> tuple[str, ...]:
    """``count`` distinct phrases, each the text of 1 to 3 random tokens of ``tokenizer`` (``<unk>``, id 0, left out),
    kept where the text has tokens of its own (the tokenizer may split it differently: the tree holds its split)."""
    vocab = int(tokenizer.vocab_size)
    phrases: dict[str, None] = {}
    while len(phrases) < count:
        ids = [rng.randrange(1, vocab) for _ in range(rng.randint(1, MAX_PHRASE_TOKENS))]
        text = tokenizer.ids_to_text(ids).strip()
        if text and tokenizer.text_to_ids(text):
            phrases[text] = None
    return tuple(phrases)


def stream_boosting(
    model: Any, num_streams: int, share: float, weight: float, phrases: int, seed: int = 0
) -> list[BoostingOptions | None]:
    """Each stream's :class:`BoostingOptions` (``None``: no boosting): ``phrases`` random phrases at ``weight`` for the
    share ``share`` of the streams (:func:`boosted_streams`); stream ``i``'s phrases depend on ``seed`` and ``i`` only.

    Raises:
        ValueError: ``share > 0`` and the model has no tokenizer (phrases are text).
    """
    if share <= 0:
        return [None] * num_streams
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError(
            f"boosting_streams_share={share} needs a model with a tokenizer (phrases are text); "
            f"{type(model).__name__} has none: use a BPE model (a synthetic preset with vocab=bpe)"
        )
    return [
        BoostingOptions(phrases=random_text_phrases(tokenizer, phrases, random.Random(f"{seed}/{i}")), weight=weight)
        if boosted
        else None
        for i, boosted in enumerate(boosted_streams(num_streams, share))
    ]
