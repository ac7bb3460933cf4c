"""SentencePiece BPE tokenizers in the layout NeMo's ``tokenizer: {dir, type: bpe}`` section reads."""

from __future__ import annotations

import os
from collections.abc import Iterable


def write_bpe_tokenizer(sentences: Iterable[str], out_dir: str | os.PathLike, vocab_size: int) -> None:
    """Train a sentencepiece BPE tokenizer of exactly ``vocab_size`` pieces on ``sentences``.

    Writes ``tokenizer.model``, ``tokenizer.vocab`` and ``vocab.txt`` (NeMo's layout, as NeMo's
    ``process_asr_text_tokenizer.py`` writes them) and the training text ``corpus.txt`` into ``out_dir``.
    Every character of the text is covered (``character_coverage=1.0``); id 0 is ``<unk>``, no BOS/EOS.
    """
    import sentencepiece as spm

    os.makedirs(out_dir, exist_ok=True)
    corpus = os.path.join(out_dir, "corpus.txt")
    with open(corpus, "w", encoding="utf8") as f:
        f.writelines(sentence + "\n" for sentence in sentences)
    spm.SentencePieceTrainer.train(
        input=corpus,
        model_prefix=os.path.join(out_dir, "tokenizer"),
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=1.0,
        bos_id=-1,
        eos_id=-1,
        unk_id=0,
        remove_extra_whitespaces=False,
        num_threads=1,
        minloglevel=2,
    )
    tokens = []
    with open(os.path.join(out_dir, "tokenizer.vocab"), encoding="utf8") as f:
        for line in f:
            piece = line.split("\t")[0]
            if piece == "<unk>":
                continue
            token = piece[1:] if piece.startswith("▁") else f"##{piece}"
            tokens.append(token if token else piece[0])
    with open(os.path.join(out_dir, "vocab.txt"), "w", encoding="utf8") as f:
        f.write("".join(t + "\n" for t in tokens))
