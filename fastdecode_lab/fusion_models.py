"""Synthetic fusion models for tests and benchmarks: a random ARPA n-gram LM and a boosting tree of random phrases.

Both are NeMo's own models, built the way NeMo builds them: the LM is an ARPA file over token ids (NeMo's encoding,
``chr(id + DEFAULT_TOKEN_OFFSET)``) loaded by ``NGramGPULanguageModel.from_file``; the boosting tree comes from
``GPUBoostingTreeModel.from_config`` with a list of key phrases, tokenised by :class:`TokenIdTokenizer` (a phrase is
its token ids written as numbers, so no trained tokenizer is needed).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from nemo.collections.asr.parts.context_biasing import BoostingTreeModelConfig, GPUBoostingTreeModel
from nemo.collections.asr.parts.submodules.ngram_lm import DEFAULT_TOKEN_OFFSET, NGramGPULanguageModel

BOS, EOS, UNK = "<s>", "</s>", "<unk>"


def write_arpa(
    path: str | Path, vocab_size: int, order: int = 3, shares: Sequence[float] = (0.4, 0.3), seed: int = 0
) -> list[int]:
    """Write a random ARPA n-gram LM over the token ids ``0 .. vocab_size - 1``.

    Each n-gram of order ``k >= 2`` extends an existing ``(k - 1)``-gram (its context) by a token that already
    follows the context's suffix (so every n-gram's suffix and prefix are n-grams too, as ARPA requires), kept with
    probability ``shares[k - 2]``. Log-probabilities are uniform in ``[-2.5, -0.2]``, back-off weights in
    ``[-1, 0]`` (on the n-grams that are contexts of longer ones).

    Args:
        path: the ``.arpa`` file to write.
        vocab_size: V, the number of non-blank tokens.
        order: the LM's order (>= 2).
        shares: per order 2 .. ``order``, the probability of keeping each candidate continuation
            (about ``V * shares[0]`` bigrams per context).
        seed: the random generator's seed (the same arguments give the same file).

    Returns:
        The number of n-grams of each order, unigrams first.

    Raises:
        ValueError: ``order`` below 2, or not one share per order from 2 to ``order``.
    """
    if order < 2 or len(shares) != order - 1:
        raise ValueError(f"order must be >= 2 with one share per order 2..order; got order={order}, shares={shares}")
    rng = random.Random(seed)
    words = [chr(i + DEFAULT_TOKEN_OFFSET) for i in range(vocab_size)]
    levels: list[list[tuple[str, ...]]] = [[(UNK,), (BOS,), (EOS,), *((w,) for w in words)]]
    # children[k][context] = the tokens that follow the (k + 1)-gram context among the (k + 2)-grams
    children: list[dict[tuple[str, ...], list[str]]] = []
    bigram_contexts = [(BOS,), *((w,) for w in words)]
    for k, share in enumerate(shares):
        level: list[tuple[str, ...]] = []
        follows: dict[tuple[str, ...], list[str]] = {}
        contexts = bigram_contexts if k == 0 else [g for g in levels[k] if g[-1] != EOS]
        for context in contexts:
            candidates = [*words, EOS] if k == 0 else children[k - 1].get(context[1:], [])
            kept = [w for w in candidates if rng.random() < share]
            if kept:
                follows[context] = kept
                level.extend((*context, w) for w in kept)
        children.append(follows)
        levels.append(level)

    def line(ngram: tuple[str, ...], order_index: int) -> str:
        weight = "-99" if ngram == (BOS,) else f"{-rng.uniform(0.2, 2.5):.4f}"
        is_context = order_index < len(children) and ngram in children[order_index]
        has_backoff = is_context or (order_index == 0 and ngram != (EOS,))
        backoff = f"\t{-rng.uniform(0.0, 1.0):.4f}" if has_backoff else ""
        return f"{weight}\t{' '.join(ngram)}{backoff}"

    lines = ["\\data\\", *(f"ngram {k + 1}={len(level)}" for k, level in enumerate(levels)), ""]
    for k, level in enumerate(levels):
        lines += [f"\\{k + 1}-grams:", *(line(g, k) for g in level), ""]
    lines += ["\\end\\", ""]
    Path(path).write_text("\n".join(lines), encoding="utf-8")
    return [len(level) for level in levels]


def ngram_lm(path: str | Path, vocab_size: int) -> NGramGPULanguageModel:
    """NeMo's GPU n-gram LM from an ARPA file over token ids (as NeMo's decoding loads ``ngram_lm_model``)."""
    return NGramGPULanguageModel.from_file(lm_path=path, vocab_size=vocab_size)


class TokenIdTokenizer:
    """A tokenizer whose text is token ids written as numbers (``"3 17 5"`` -> ``[3, 17, 5]``), for NeMo's
    boosting-tree builder on models without a trained tokenizer."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def text_to_ids(self, text: str) -> list[int]:
        ids = [int(t) for t in text.split()]
        if any(not 0 <= i < self.vocab_size for i in ids):
            raise ValueError(f"phrase {text!r} holds token ids outside 0..{self.vocab_size - 1}")
        return ids


def random_phrases(
    vocab_size: int, count: int = 100, min_tokens: int = 2, max_tokens: int = 5, seed: int = 0
) -> list[str]:
    """``count`` distinct random phrases of ``min_tokens`` to ``max_tokens`` token ids (:class:`TokenIdTokenizer`)."""
    rng = random.Random(seed)
    phrases: dict[str, None] = {}
    while len(phrases) < count:
        length = rng.randint(min_tokens, max_tokens)
        phrases[" ".join(str(rng.randrange(vocab_size)) for _ in range(length))] = None
    return list(phrases)


def boosting_tree(phrases: Sequence[str], vocab_size: int, **options) -> GPUBoostingTreeModel:
    """NeMo's boosting tree of key phrases of token ids, built by NeMo from its ``boosting_tree`` config.

    Args:
        phrases: key phrases, token ids separated by spaces (e.g. from :func:`random_phrases`).
        vocab_size: V, the number of non-blank tokens.
        options: other ``BoostingTreeModelConfig`` fields (``context_score``, ``depth_scaling``, ...).
    """
    cfg = BoostingTreeModelConfig(key_phrases_list=list(phrases), **options)
    return GPUBoostingTreeModel.from_config(cfg, tokenizer=TokenIdTokenizer(vocab_size))
