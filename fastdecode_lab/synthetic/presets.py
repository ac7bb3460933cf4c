"""Synthetic Parakeet-architecture presets: their NeMo model configs, vocabularies and BPE tokenizers.

A preset names an architecture at a real size (FastConformer encoder, LSTM prediction network, RNN-T / TDT
joint, optionally a cache-aware streaming encoder or an auxiliary CTC head); :func:`make_synthetic_config`
writes its NeMo ``model:`` config. Nothing is trained here except, for ``vocab="bpe"``, a sentencepiece
tokenizer on generated pseudo-English text.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from fastdecode_lab.bpe_tokenizer import write_bpe_tokenizer

SAMPLE_RATE = 16000


_CHAR_LABELS: tuple[str, ...] = (" ", *string.ascii_lowercase, "'")


@dataclass(frozen=True)
class _Preset:
    n_layers: int
    d_model: int
    n_heads: int
    subsampling_conv_channels: int
    pred_hidden: int
    pred_rnn_layers: int
    joint_hidden: int
    char_vocab_size: int  # size of the synthetic "char" vocabulary (28 = real characters)
    bpe_vocab_size: int  # size of the sentencepiece BPE vocabulary for vocab="bpe"
    durations: tuple[int, ...] | None = None  # TDT durations; None for RNN-T
    hybrid: bool = False  # EncDecHybridRNNTCTC(BPE)Model with an auxiliary CTC head
    # cache-aware streaming encoder (NeMo's fastconformer *_streaming.yaml): its att_context_size list
    # (first = default look-ahead), chunked_limited attention, causal convolutions and subsampling
    att_context_size: tuple[tuple[int, int], ...] | None = None
    # the encoder layers' residual branches scaled by this at build (see build_synthetic_model); and whether tools
    # calibrate the model to emit like a trained one (rate and bursts) rather than to a rate alone
    residual_scale: float = 1.0
    trained_like: bool = False


#: Residual-branch scale of the benchmark-size cache-aware presets: a deep random encoder's frames converge to
#: nearly one vector once a second of left context fills (adjacent frames' cosine 0.99), so it would emit only at a
#: stream's start; at 0.1 they stay apart (about 0.9) and a trained-like calibration spreads tokens over the stream.
STREAMING_RESIDUAL_SCALE = 0.1


_TDT_DURATIONS = (0, 1, 2, 3, 4)


_TINY = {"n_layers": 2, "d_model": 64, "n_heads": 2, "subsampling_conv_channels": 64}


_TINY_DEC = {"pred_hidden": 64, "pred_rnn_layers": 1, "joint_hidden": 64, "char_vocab_size": 28, "bpe_vocab_size": 128}


_BIG = {"d_model": 1024, "n_heads": 8, "subsampling_conv_channels": 256}


_STREAMING_CONTEXTS = ((70, 13), (70, 6), (70, 1), (70, 0))


_TINY_STREAMING_CONTEXTS = ((16, 3), (16, 1), (16, 0))


_BIG_DEC = {"pred_hidden": 640, "joint_hidden": 640, "char_vocab_size": 1024, "bpe_vocab_size": 1024}


_PRESETS: dict[str, _Preset] = {
    "tiny-rnnt": _Preset(**_TINY, **_TINY_DEC),
    "tiny-tdt": _Preset(**_TINY, **_TINY_DEC, durations=_TDT_DURATIONS),
    "tiny-hybrid": _Preset(**_TINY, **_TINY_DEC, hybrid=True),
    "rnnt-0.6b": _Preset(n_layers=24, **_BIG, **_BIG_DEC, pred_rnn_layers=1),
    "rnnt-1.1b": _Preset(n_layers=42, **_BIG, **_BIG_DEC, pred_rnn_layers=1),
    "tdt-0.6b": _Preset(n_layers=24, **_BIG, **_BIG_DEC, pred_rnn_layers=2, durations=_TDT_DURATIONS),
    # cache-aware streaming presets: 1 frame = 80 ms; [70, 1] = 5.6 s of left context, 160 ms chunks
    "tiny-streaming": _Preset(**_TINY, **_TINY_DEC, hybrid=True, att_context_size=_TINY_STREAMING_CONTEXTS),
    "tiny-rnnt-streaming": _Preset(**_TINY, **_TINY_DEC, att_context_size=_TINY_STREAMING_CONTEXTS),
    "tiny-tdt-streaming": _Preset(
        **_TINY, **_TINY_DEC, durations=_TDT_DURATIONS, att_context_size=_TINY_STREAMING_CONTEXTS
    ),
    "hybrid-17x512-streaming": _Preset(
        n_layers=17,
        d_model=512,
        n_heads=8,
        subsampling_conv_channels=256,
        **_BIG_DEC,
        pred_rnn_layers=1,
        hybrid=True,
        att_context_size=_STREAMING_CONTEXTS,
        residual_scale=STREAMING_RESIDUAL_SCALE,
        trained_like=True,
    ),
    "rnnt-0.6b-streaming": _Preset(
        n_layers=24,
        **_BIG,
        **_BIG_DEC,
        pred_rnn_layers=1,
        att_context_size=_STREAMING_CONTEXTS,
        residual_scale=STREAMING_RESIDUAL_SCALE,
        trained_like=True,
    ),
}


#: Names accepted by :func:`build_synthetic_model` and :func:`make_synthetic_config`.
PRESETS: tuple[str, ...] = tuple(_PRESETS)


_VOCABS = ("char", "bpe")


def get_preset(preset: str) -> _Preset:
    if preset not in _PRESETS:
        raise ValueError(f"unknown synthetic model preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    return _PRESETS[preset]


def check_vocab(vocab: str) -> None:
    if vocab not in _VOCABS:
        raise ValueError(f"unknown vocab {vocab!r}; valid values: {', '.join(_VOCABS)}")


def char_vocabulary(size: int = 28) -> list[str]:
    """Return ``size`` distinct label strings for a char-style (``labels``) NeMo model.

    The first 28 are the real character set (space, a-z, apostrophe); larger vocabularies add
    deterministic multi-character pieces (" a".." z", letter pairs, then letter triples), which
    stand in for a BPE vocabulary of the same size without training a tokenizer. Decoding to text
    simply concatenates the pieces.
    """
    if size < 1:
        raise ValueError(f"vocabulary size must be >= 1, got {size}")
    letters = string.ascii_lowercase
    common = "etaoinshrdlucmfwypvbgkjqxz"

    def pieces() -> Iterator[str]:
        yield from _CHAR_LABELS
        yield from (" " + c for c in letters)
        yield from ("".join(p) for p in itertools.product(letters, repeat=2))
        yield from ("".join(p) for p in itertools.product(common, repeat=3))

    labels = list(itertools.islice(pieces(), size))
    if len(labels) < size:
        raise ValueError(f"vocabulary size {size} is larger than the {len(labels)} synthetic pieces available")
    return labels


def make_synthetic_config(preset: str, *, vocab: str = "char", tokenizer_dir: str | None = None) -> DictConfig:
    """Return the NeMo model config (``model:`` section) of a synthetic Parakeet-architecture preset.

    Nothing is built or trained. The config describes a FastConformer encoder (8x ``dw_striding``
    subsampling, conv kernel 9, ``rel_pos`` attention), an LSTM prediction network and an RNN-T /
    TDT joint, an 80-feature 16 kHz mel preprocessor without dither, no SpecAugment, and no
    datasets. Weights of the model built from it are random (see :func:`build_synthetic_model`).

    Sizes are readable from the config: ``encoder.n_layers``, ``encoder.d_model``,
    ``model_defaults.pred_hidden``, ``decoder.prednet.pred_rnn_layers``, ``model_defaults.joint_hidden``,
    ``decoder.vocab_size`` (V, without blank), ``model_defaults.tdt_durations`` (TDT presets only).

    Args:
        preset: one of :data:`PRESETS`.
        vocab: ``"char"`` (``labels`` list, for ``EncDecRNNTModel`` / ``EncDecHybridRNNTCTCModel``) or
            ``"bpe"`` (``tokenizer`` section, for the BPE model classes).
        tokenizer_dir: for ``vocab="bpe"``, the directory holding ``tokenizer.model``; left as
            ``None`` here, :func:`build_synthetic_model` trains one and fills it in.

    Raises:
        ValueError: unknown preset or vocab (the message lists the valid ones).
    """
    p = get_preset(preset)
    check_vocab(vocab)
    vocab_size = p.char_vocab_size if vocab == "char" else p.bpe_vocab_size
    is_tdt = p.durations is not None
    durations = list(p.durations) if is_tdt else []
    features = 80

    model_defaults: dict[str, Any] = {
        "enc_hidden": p.d_model,
        "pred_hidden": p.pred_hidden,
        "joint_hidden": p.joint_hidden,
    }
    if is_tdt:
        model_defaults["tdt_durations"] = durations
        model_defaults["num_tdt_durations"] = len(durations)

    cfg: dict[str, Any] = {
        "sample_rate": SAMPLE_RATE,
        "compute_eval_loss": False,
        "log_prediction": False,
        "rnnt_reduction": "mean_volume",
        "skip_nan_grad": False,
        "model_defaults": model_defaults,
        "train_ds": None,
        # no data, but the keys NeMo's transcribe() reads from it (the BPE models read validation_ds)
        "validation_ds": {
            "manifest_filepath": None,
            "sample_rate": SAMPLE_RATE,
            "batch_size": 1,
            "shuffle": False,
            "use_start_end_token": False,
        },
        "test_ds": None,
        "preprocessor": {
            "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
            "sample_rate": SAMPLE_RATE,
            "normalize": "per_feature",
            "window_size": 0.025,
            "window_stride": 0.01,
            "window": "hann",
            "features": features,
            "n_fft": 512,
            "log": True,
            "frame_splicing": 1,
            "dither": 0.0,
            "pad_to": 0,
            "pad_value": 0.0,
        },
        "spec_augment": None,
        "encoder": {
            "_target_": "nemo.collections.asr.modules.ConformerEncoder",
            "feat_in": features,
            "feat_out": -1,
            "n_layers": p.n_layers,
            "d_model": p.d_model,
            "subsampling": "dw_striding",
            "subsampling_factor": 8,
            "subsampling_conv_channels": p.subsampling_conv_channels,
            "causal_downsampling": False,
            "ff_expansion_factor": 4,
            "self_attention_model": "rel_pos",
            "n_heads": p.n_heads,
            "att_context_size": [-1, -1],
            "att_context_style": "regular",
            "xscaling": True,
            "untie_biases": True,
            "pos_emb_max_len": 5000,
            "conv_kernel_size": 9,
            "conv_norm_type": "batch_norm",
            "conv_context_size": None,
            "dropout": 0.1,
            "dropout_pre_encoder": 0.1,
            "dropout_emb": 0.0,
            "dropout_att": 0.1,
            "stochastic_depth_drop_prob": 0.0,
            # NeMo's default all-reduces each batch's length across ranks whenever a process group exists (for
            # training). A synthetic model's build runs its encoder on the CPU before it moves to its device, which
            # an NCCL group cannot all-reduce, and every rank of a parallel job encodes its own audio: no sync
            "sync_max_audio_length": False,
        },
        "decoder": {
            "_target_": "nemo.collections.asr.modules.RNNTDecoder",
            "normalization_mode": None,
            "random_state_sampling": False,
            "blank_as_pad": True,
            "vocab_size": vocab_size,
            "prednet": {
                "pred_hidden": p.pred_hidden,
                "pred_rnn_layers": p.pred_rnn_layers,
                "t_max": None,
                "dropout": 0.2,
            },
        },
        "joint": {
            "_target_": "nemo.collections.asr.modules.RNNTJoint",
            "log_softmax": None,
            "preserve_memory": False,
            "fuse_loss_wer": False,
            "fused_batch_size": None,
            "num_classes": vocab_size,
            "num_extra_outputs": len(durations),
            "jointnet": {
                "encoder_hidden": p.d_model,
                "pred_hidden": p.pred_hidden,
                "joint_hidden": p.joint_hidden,
                "activation": "relu",
                "dropout": 0.2,
            },
        },
        "decoding": {
            "strategy": "greedy_batch",
            "model_type": "tdt" if is_tdt else "rnnt",
            "durations": durations,
            "greedy": {"max_symbols": 10},
            "beam": {"beam_size": 2, "return_best_hypothesis": False, "score_norm": True},
        },
        "loss": (
            {
                "loss_name": "tdt",
                "tdt_kwargs": {
                    "fastemit_lambda": 0.0,
                    "clamp": -1.0,
                    "durations": durations,
                    "sigma": 0.02,
                    "omega": 0.1,
                },
            }
            if is_tdt
            else {"loss_name": "default", "warprnnt_numba_kwargs": {"fastemit_lambda": 0.0, "clamp": -1.0}}
        ),
    }
    if p.att_context_size is not None:
        # NeMo's cache-aware streaming configs (fastconformer_hybrid_transducer_ctc_bpe_streaming.yaml)
        cfg["preprocessor"]["normalize"] = "NA"  # per-utterance normalisation would look ahead
        cfg["encoder"].update(
            causal_downsampling=True,
            att_context_size=[list(c) for c in p.att_context_size],
            att_context_style="chunked_limited",
            conv_context_size="causal",
            conv_norm_type="layer_norm",
        )
    if vocab == "char":
        labels = char_vocabulary(vocab_size)
        cfg["labels"] = labels
        cfg["joint"]["vocabulary"] = labels
    else:
        cfg["tokenizer"] = {"dir": tokenizer_dir, "type": "bpe"}
    if p.hybrid:
        cfg["aux_ctc"] = {
            "ctc_loss_weight": 0.3,
            "use_cer": False,
            "ctc_reduction": "mean_batch",
            "decoder": {
                "_target_": "nemo.collections.asr.modules.ConvASRDecoder",
                "feat_in": None,
                "num_classes": -1,
                "vocabulary": cfg.get("labels", []),
            },
            "decoding": {"strategy": "greedy"},
        }
    return OmegaConf.create(cfg)


def _pseudo_words(rng: np.random.Generator, n_sentences: int) -> list[str]:
    """Generated lower-case pseudo-English sentences (consonant-vowel syllables) for tokenizer training."""
    onsets = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "qu", "r", "s", "t", "v", "w", "x"]
    onsets += ["y", "z", "th", "sh", "ch", "st", "br", "tr", "pl", "gr"]
    vowels = ["a", "e", "i", "o", "u", "ee", "ou", "ai", "y"]
    codas = ["", "", "", "n", "r", "s", "t", "ng", "ck", "ll", "'s"]
    sentences = []
    for _ in range(n_sentences):
        words = []
        for _ in range(int(rng.integers(3, 15))):
            n_syl = int(rng.integers(1, 4))
            words.append(
                "".join(
                    onsets[rng.integers(len(onsets))]
                    + vowels[rng.integers(len(vowels))]
                    + codas[rng.integers(len(codas))]
                    for _ in range(n_syl)
                )
            )
        sentences.append(" ".join(words))
    return sentences


def train_bpe_tokenizer(out_dir: str, vocab_size: int, seed: int) -> None:
    """Train a sentencepiece BPE tokenizer of exactly ``vocab_size`` pieces on generated pseudo-English text.

    Writes ``tokenizer.model``, ``tokenizer.vocab`` and ``vocab.txt`` (NeMo's layout) into ``out_dir``.
    """
    rng = np.random.default_rng(seed)
    write_bpe_tokenizer(_pseudo_words(rng, 4000 if vocab_size <= 256 else 20000), out_dir, vocab_size)
