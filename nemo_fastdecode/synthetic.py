"""Synthetic Parakeet-architecture NeMo models and synthetic audio, for tests, demos and benchmarks.

Every model built here has RANDOM, UNTRAINED weights: real NeMo modules (FastConformer encoder,
LSTM prediction network, RNN-T / TDT joint) at real sizes, initialised from a seed. The transcripts
they produce are meaningless; they exist so that decoding speed and exactness can be measured
without downloading a checkpoint. The audio is synthetic too (filtered noise with a syllable-rate
amplitude envelope), with utterance lengths drawn like LibriSpeech test-other.

Typical use::

    model = build_synthetic_model("tiny-tdt")
    durations = librispeech_like_durations(total_seconds=60)
    audios = synthetic_audio(durations)
    encoded, lengths = encode(model, audios, batch_size=8, device="cpu")
    calibrate_blank_bias(model, encoded, lengths, target_tokens_per_frame=0.3)

Vocabulary conventions (see :func:`transducer_spec`): ``V`` non-blank tokens, blank id ``V`` (the
last token logit), and for TDT ``len(durations)`` duration logits after the ``V + 1`` token logits.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import string
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel

__all__ = [
    "PRESETS",
    "TransducerSpec",
    "build_synthetic_model",
    "calibrate_blank_bias",
    "char_vocabulary",
    "encode",
    "librispeech_like_durations",
    "make_synthetic_config",
    "nemo_baseline_greedy",
    "synthetic_audio",
    "tokens_per_frame",
    "transducer_spec",
    "write_manifest",
    "write_wavs",
]

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


_TDT_DURATIONS = (0, 1, 2, 3, 4)
_TINY = {"n_layers": 2, "d_model": 64, "n_heads": 2, "subsampling_conv_channels": 64}
_TINY_DEC = {"pred_hidden": 64, "pred_rnn_layers": 1, "joint_hidden": 64, "char_vocab_size": 28, "bpe_vocab_size": 128}
_BIG = {"d_model": 1024, "n_heads": 8, "subsampling_conv_channels": 256}
_STREAMING_CONTEXTS = ((70, 13), (70, 6), (70, 1), (70, 0))
_BIG_DEC = {"pred_hidden": 640, "joint_hidden": 640, "char_vocab_size": 1024, "bpe_vocab_size": 1024}

_PRESETS: dict[str, _Preset] = {
    "tiny-rnnt": _Preset(**_TINY, **_TINY_DEC),
    "tiny-tdt": _Preset(**_TINY, **_TINY_DEC, durations=_TDT_DURATIONS),
    "tiny-hybrid": _Preset(**_TINY, **_TINY_DEC, hybrid=True),
    "rnnt-0.6b": _Preset(n_layers=24, **_BIG, **_BIG_DEC, pred_rnn_layers=1),
    "rnnt-1.1b": _Preset(n_layers=42, **_BIG, **_BIG_DEC, pred_rnn_layers=1),
    "tdt-0.6b": _Preset(n_layers=24, **_BIG, **_BIG_DEC, pred_rnn_layers=2, durations=_TDT_DURATIONS),
    # cache-aware streaming presets: 1 frame = 80 ms; [70, 1] = 5.6 s of left context, 160 ms chunks
    "tiny-streaming": _Preset(**_TINY, **_TINY_DEC, hybrid=True, att_context_size=((16, 3), (16, 1), (16, 0))),
    "hybrid-17x512-streaming": _Preset(
        n_layers=17,
        d_model=512,
        n_heads=8,
        subsampling_conv_channels=256,
        **_BIG_DEC,
        pred_rnn_layers=1,
        hybrid=True,
        att_context_size=_STREAMING_CONTEXTS,
    ),
    "rnnt-0.6b-streaming": _Preset(
        n_layers=24, **_BIG, **_BIG_DEC, pred_rnn_layers=1, att_context_size=_STREAMING_CONTEXTS
    ),
}
#: Names accepted by :func:`build_synthetic_model` and :func:`make_synthetic_config`.
PRESETS: tuple[str, ...] = tuple(_PRESETS)
_VOCABS = ("char", "bpe")


def _get_preset(preset: str) -> _Preset:
    if preset not in _PRESETS:
        raise ValueError(f"unknown synthetic model preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    return _PRESETS[preset]


def _check_vocab(vocab: str) -> None:
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
    p = _get_preset(preset)
    _check_vocab(vocab)
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
        "validation_ds": None,
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


def _train_bpe_tokenizer(out_dir: str, vocab_size: int, seed: int) -> None:
    """Train a sentencepiece BPE tokenizer of exactly ``vocab_size`` pieces on generated text.

    Writes ``tokenizer.model``, ``tokenizer.vocab`` and ``vocab.txt`` (NeMo's layout) into ``out_dir``.
    """
    import sentencepiece as spm

    rng = np.random.default_rng(seed)
    corpus = os.path.join(out_dir, "corpus.txt")
    with open(corpus, "w", encoding="utf8") as f:
        f.write("\n".join(_pseudo_words(rng, 4000 if vocab_size <= 256 else 20000)) + "\n")
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


@contextlib.contextmanager
def _eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """Put every submodule in eval mode, then restore each one's own training flag.

    Needed because NeMo's ``transcribe()`` leaves the encoder, decoder and joint in train mode
    (it unfreezes them with ``module.train()`` on exit), which would turn dropout on.
    """
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in flags:
            m.training = training


@contextlib.contextmanager
def _quiet_nemo() -> Iterator[None]:
    from nemo.utils import logging as nemo_logging

    with nemo_logging.temp_verbosity(nemo_logging.ERROR):
        yield


def build_synthetic_model(
    preset: str,
    *,
    vocab: str = "char",
    seed: int = 0,
    device: str | torch.device = "cpu",
    balance_joint: bool = True,
) -> ASRModel:
    """Build a NeMo transducer model of Parakeet architecture with RANDOM (synthetic, untrained) weights.

    The weights are drawn from NeMo's default initialisation under ``torch.manual_seed(seed)``
    (the global RNG state is left as it was), so the same preset and seed give the same model.
    Nothing is downloaded. Use :func:`calibrate_blank_bias` afterwards to make the greedy decoder
    emit a realistic number of tokens per frame.

    Presets (:data:`PRESETS`):
        ``tiny-rnnt``, ``tiny-tdt``, ``tiny-hybrid``: 2-layer FastConformer, d_model 64, 2 heads,
        1-layer LSTM prediction network of 64, joint 64; 28 characters (or a 128-piece BPE). Built
        in well under a second on a CPU. ``tiny-hybrid`` adds an auxiliary CTC head.
        ``rnnt-0.6b`` (24 layers), ``rnnt-1.1b`` (42 layers), ``tdt-0.6b`` (24 layers, 2-layer LSTM):
        d_model 1024, 8 heads, prediction network and joint 640, vocabulary 1024. These take
        seconds and gigabytes to build on a CPU.
        TDT presets use durations [0, 1, 2, 3, 4].
        Cache-aware streaming encoders (causal subsampling and convolutions, ``chunked_limited``
        attention, no feature normalisation; ``att_context_size`` lists the look-aheads, the first is
        the default): ``tiny-streaming`` (tiny hybrid, [[16, 3], [16, 1], [16, 0]]),
        ``hybrid-17x512-streaming`` (17 x 512, 8 heads, hybrid RNN-T/CTC) and ``rnnt-0.6b-streaming``
        (24 x 1024 RNN-T), both [[70, 13], [70, 6], [70, 1], [70, 0]].

    Args:
        preset: one of :data:`PRESETS`.
        vocab: ``"char"``: ``EncDecRNNTModel`` / ``EncDecHybridRNNTCTCModel`` with a ``labels`` list
            (for the 1024-token presets, 1024 distinct synthetic pieces, see :func:`char_vocabulary`).
            ``"bpe"``: ``EncDecRNNTBPEModel`` / ``EncDecHybridRNNTCTCBPEModel`` with a sentencepiece BPE
            tokenizer trained on generated text in a temporary directory that lives as long as the model.
        seed: seed for the random weights (and the BPE training text).
        device: where to put the model.
        balance_joint: rescale the joint's output layer and centre its biases (see below). Without
            it, a random joint picks the same token at almost every step, whatever the input.

    With ``balance_joint`` the joint is rescaled once, deterministically, and stays random: on the
    encoder frames of a few seconds of :func:`synthetic_audio` and on prediction-network states after
    random tokens, the spread of its encoder and prediction projections is equalised (a random
    encoder's frames, and a random LSTM's states, barely differ from each other), and its output
    layer is scaled and centred so that every token, the blank and every TDT duration has mean
    logit 0 and standard deviation about 2. The emitted tokens then depend on both the frame and the
    decoder state. Blank is left at parity with each token, so an uncalibrated model emits at almost
    every step: call :func:`calibrate_blank_bias` to set the emission rate.

    Limits of a random model, to keep in mind when reading benchmark numbers: only the overall rate
    is calibrated; RNN-T emissions come in bursts (some frames reach ``max_symbols``, some
    utterances emit little) rather than spread as in a trained model. In NeMo 3.0, the text (not the
    token ids) of a *char* TDT model drops the last ``len(durations)`` labels (``RNNTDecoding``
    filters ids below ``blank_id - num_extra_outputs``); BPE TDT models are not affected. NeMo's
    ``transcribe()`` leaves the encoder, decoder and joint in train mode (dropout on) when it
    returns: call ``model.eval()`` after it before running the modules yourself.

    Returns:
        The model, in ``eval()`` mode, with no datasets set up; decoding strategy ``greedy_batch``
        with NeMo's defaults (``max_symbols`` 10).

    Raises:
        ValueError: unknown preset or vocab (the message lists the valid ones).
    """
    p = _get_preset(preset)
    _check_vocab(vocab)
    from nemo.collections.asr import models as asr_models

    tmp: tempfile.TemporaryDirectory | None = None
    if vocab == "bpe":
        tmp = tempfile.TemporaryDirectory(prefix=f"synthetic_{preset}_bpe_")
        _train_bpe_tokenizer(tmp.name, p.bpe_vocab_size, seed)
        cls = asr_models.EncDecHybridRNNTCTCBPEModel if p.hybrid else asr_models.EncDecRNNTBPEModel
    else:
        cls = asr_models.EncDecHybridRNNTCTCModel if p.hybrid else asr_models.EncDecRNNTModel
    cfg = make_synthetic_config(preset, vocab=vocab, tokenizer_dir=tmp.name if tmp is not None else None)

    with torch.random.fork_rng(devices=[]), _quiet_nemo():
        torch.manual_seed(seed)
        model = cls(cfg=cfg)
    model.eval()
    if balance_joint:
        _balance_joint(model, seed)
    if tmp is not None:
        # keep the tokenizer files (registered artifacts, needed by save_to) as long as the model lives
        model._synthetic_tokenizer_tmpdir = tmp
    model = model.to(device)
    model.eval()
    return model


def _balance_joint(model: ASRModel, seed: int, logit_std: float = 2.0, states: int = 16) -> None:
    """Scale the joint's output weights and centre its biases on encoded synthetic audio (see build_synthetic_model)."""
    spec = transducer_spec(model)
    joint = model.joint
    out = joint.joint_net[-1]
    device = out.weight.device
    audio = synthetic_audio([4.0, 3.0, 2.0], seed=seed + 1)
    encoded, lengths = encode(model, audio, batch_size=len(audio), device=device)
    valid = torch.arange(encoded[0].shape[2], device=device)[None, :] < lengths[0][:, None]
    frames = encoded[0].transpose(1, 2)[valid].unsqueeze(0)  # [1, N, D]
    generator = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, spec.vocab_size, (states, 4), generator=generator).to(device)
    with torch.inference_mode(), _eval_mode(model):
        g, _ = model.decoder.predict(tokens, state=None, add_sos=True, batch_size=states)  # [S, 5, H]
        g = g[:, 1:].reshape(1, -1, g.shape[-1])  # states after 1-4 random tokens
        enc_part, pred_part = joint.enc(frames)[0], joint.pred(g)[0]  # [N, J], [S * 4, J]
    # The frames of a random encoder differ little from each other, and so do the states of a random
    # LSTM: scale the spread of each projection (about its mean) to the spread of the mean
    # activation over the joint's units, so that emissions depend on both the frame and the state.
    target = float((enc_part.mean(dim=0) + pred_part.mean(dim=0)).std())
    with torch.no_grad():
        for layer, part in ((joint.enc, enc_part), (joint.pred, pred_part)):
            mean = part.mean(dim=0)
            scale = target / max(float(part.std(dim=0).mean()), 1e-12)
            layer.weight *= scale
            layer.bias.copy_((1.0 - scale) * mean + scale * layer.bias)
    with torch.inference_mode(), _eval_mode(model):
        hidden = joint.joint_net[:-1](joint.enc(frames)[0][:, None] + joint.pred(g)[0][None, :])  # [N, S * 4, J]
        logits = hidden.reshape(-1, hidden.shape[-1]) @ out.weight.detach().T  # [N * S * 4, outputs], no bias
    # one scale per group of rows: tokens, blank, durations (TDT)
    groups = [slice(0, spec.blank_id), slice(spec.blank_id, spec.blank_id + 1)]
    if spec.is_tdt:
        groups.append(slice(spec.blank_id + 1, spec.num_outputs))
    with torch.no_grad():
        for rows in groups:
            part = logits[:, rows]
            scale = logit_std / float(part.std(dim=0).mean().clamp_min(1e-12))
            out.weight[rows] *= scale
            out.bias[rows] = -scale * part.mean(dim=0)


@dataclass(frozen=True)
class TransducerSpec:
    """Output layout of a transducer model's joint network.

    Attributes:
        vocab_size: V, the number of non-blank tokens.
        blank_id: index of blank among the token logits; always V for the models built here.
        durations: TDT durations (the logits after the ``V + 1`` token logits), or ``None`` for RNN-T.
        num_outputs: size of the joint's last dimension, ``V + 1 + len(durations or [])``.
        max_symbols: the model's greedy ``max_symbols`` per frame (``None`` if unset).
    """

    vocab_size: int
    blank_id: int
    durations: list[int] | None
    num_outputs: int
    max_symbols: int | None

    @property
    def is_tdt(self) -> bool:
        """True for a TDT model (it has duration outputs)."""
        return bool(self.durations)


def transducer_spec(model: ASRModel) -> TransducerSpec:
    """Read V, the blank id, the TDT durations and ``max_symbols`` from a NeMo transducer model."""
    joint = model.joint
    vocab_size = int(joint.num_classes_with_blank) - 1 - int(joint.num_extra_outputs)
    decoding_cfg = model.cfg.decoding
    durations = decoding_cfg.get("durations", None)
    durations = [int(d) for d in durations] if durations else None
    greedy = decoding_cfg.get("greedy", None) or {}
    max_symbols = greedy.get("max_symbols", None) or greedy.get("max_symbols_per_step", None)
    return TransducerSpec(
        vocab_size=vocab_size,
        blank_id=int(model.decoding.blank_id),
        durations=durations,
        num_outputs=int(joint.num_classes_with_blank),
        max_symbols=int(max_symbols) if max_symbols is not None else None,
    )


def nemo_baseline_greedy(
    model: ASRModel, *, loop_labels: bool = False, max_symbols: int | None = None
) -> torch.nn.Module:
    """NeMo's own batched greedy decoder for ``model``, configured as the exactness baseline.

    RNN-T: ``GreedyBatchedRNNTInfer`` with ``loop_labels`` (default ``False``, the frame-looping
    algorithm); TDT: ``GreedyBatchedTDTInfer`` (label looping, NeMo's only batched TDT algorithm).
    CUDA graphs are off. Call it as ``decoder(encoder_output=enc [B, D, T], encoded_lengths=len [B])``;
    it returns a 1-tuple holding a list of ``Hypothesis`` whose ``y_sequence`` holds the emitted
    token ids (no blanks). It shares (does not copy) the model's decoder and joint.
    """
    from nemo.collections.asr.parts.submodules import rnnt_greedy_decoding as greedy

    spec = transducer_spec(model)
    if max_symbols is None:
        max_symbols = spec.max_symbols if spec.max_symbols is not None else 10
    common = {
        "decoder_model": model.decoder,
        "joint_model": model.joint,
        "blank_index": spec.blank_id,
        "max_symbols_per_step": max_symbols,
        "use_cuda_graph_decoder": False,
    }
    if spec.is_tdt:
        return greedy.GreedyBatchedTDTInfer(durations=spec.durations, **common)
    return greedy.GreedyBatchedRNNTInfer(loop_labels=loop_labels, **common)


def _as_batches(
    encoder_output: torch.Tensor | Sequence[torch.Tensor], encoded_lengths: torch.Tensor | Sequence[torch.Tensor]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if isinstance(encoder_output, torch.Tensor):
        if not isinstance(encoded_lengths, torch.Tensor):
            raise TypeError("encoder_output is a tensor, so encoded_lengths must be a tensor too")
        batches = [(encoder_output, encoded_lengths)]
    else:
        if isinstance(encoded_lengths, torch.Tensor) or len(encoder_output) != len(encoded_lengths):
            raise ValueError("encoder_output and encoded_lengths must be lists of the same number of batches")
        batches = list(zip(encoder_output, encoded_lengths, strict=True))
    for enc, lens in batches:
        if enc.dim() != 3 or lens.dim() != 1 or enc.shape[0] != lens.shape[0]:
            raise ValueError(
                f"expected encoder_output [B, D, T] and encoded_lengths [B], got {tuple(enc.shape)} and {tuple(lens.shape)}"
            )
    return batches


def tokens_per_frame(
    decoder: torch.nn.Module,
    encoder_output: torch.Tensor | Sequence[torch.Tensor],
    encoded_lengths: torch.Tensor | Sequence[torch.Tensor],
) -> tuple[float, int, int]:
    """Run a NeMo greedy ``decoder`` (e.g. :func:`nemo_baseline_greedy`) and count its output.

    Args:
        decoder: a NeMo greedy infer module called as ``decoder(encoder_output=..., encoded_lengths=...)``.
        encoder_output: one ``[B, D, T]`` tensor, or a list of them (one per batch).
        encoded_lengths: the matching ``[B]`` length tensor(s).

    Returns:
        ``(tokens / frames, tokens, frames)``, where frames is the sum of ``encoded_lengths``.
    """
    tokens = frames = 0
    with torch.inference_mode():
        for enc, lens in _as_batches(encoder_output, encoded_lengths):
            hyps = decoder(encoder_output=enc, encoded_lengths=lens)[0]
            tokens += sum(len(h.y_sequence) for h in hyps)
            frames += int(lens.sum())
    return (tokens / frames if frames else 0.0), tokens, frames


def calibrate_blank_bias(
    model: ASRModel,
    encoder_output: torch.Tensor | Sequence[torch.Tensor],
    encoded_lengths: torch.Tensor | Sequence[torch.Tensor],
    target_tokens_per_frame: float = 0.3,
    *,
    iterations: int = 12,
    tolerance: float = 0.01,
    max_symbols: int | None = None,
) -> float:
    """Set the blank logit's bias so that NeMo's greedy decoder emits about ``target`` tokens per frame.

    A model with random (synthetic) weights emits either nothing or a token at almost every step;
    trained Parakeet models emit about 0.3 tokens per encoder frame. This shifts the bias of the
    joint's final linear layer at the blank index (V, the last token logit; for TDT the duration
    logits follow it and are left alone) and bisects on it, decoding ``encoder_output`` with
    :func:`nemo_baseline_greedy` (``greedy_batch``, frame looping for RNN-T, no CUDA graphs) at
    every step. The model is modified in place and the bias giving the closest rate is kept.

    Args:
        model: a transducer model, e.g. from :func:`build_synthetic_model`.
        encoder_output: one ``[B, D, T]`` tensor or a list of them (as returned by :func:`encode`),
            on the model's device; random tensors work too.
        encoded_lengths: the matching ``[B]`` length tensor(s).
        target_tokens_per_frame: the rate to reach (tokens / sum of ``encoded_lengths``).
        iterations: the most decoding passes spent on bisection (the bracket search adds a few).
        tolerance: stop once the rate is within this of the target.
        max_symbols: ``max_symbols`` per frame for the decoder; the model's setting by default.

    Returns:
        The tokens per frame achieved with the bias that was kept. For TDT models the reachable
        rate is bounded by the random duration predictions; the closest achievable rate is returned.
    """
    if target_tokens_per_frame <= 0:
        raise ValueError(f"target_tokens_per_frame must be > 0, got {target_tokens_per_frame}")
    batches = _as_batches(encoder_output, encoded_lengths)
    spec = transducer_spec(model)
    decoder = nemo_baseline_greedy(model, max_symbols=max_symbols)
    bias = model.joint.joint_net[-1].bias
    encs = [b[0] for b in batches]
    lens = [b[1] for b in batches]
    target = target_tokens_per_frame

    # Initial guess without decoding: over all frames and a few prediction-network states, the
    # margin of the blank logit over the best token logit. A token is emitted where the margin is
    # negative; at an emission probability p per step a frame emits p / (1 - p) tokens on average.
    margins = _blank_margins(model, spec, batches)
    p_emit = min(target / (1.0 + target), 0.999)
    current = float(bias.detach()[spec.blank_id])
    guess = current - float(torch.quantile(margins, p_emit))
    step = max(0.25 * float(margins.std()), 1e-3)

    tried: dict[float, float] = {}

    def evaluate(value: float) -> float:
        if value not in tried:
            with torch.no_grad():
                bias[spec.blank_id] = value
            tried[value] = tokens_per_frame(decoder, encs, lens)[0]
        return tried[value]

    def best() -> tuple[float, float]:
        value = min(tried, key=lambda v: abs(tried[v] - target))
        return value, tried[value]

    # The rate falls as the blank bias rises: bracket the target from the guess outwards, then bisect.
    lo = hi = guess
    if evaluate(guess) > target:
        while evaluate(hi) > target and len(tried) < 12:
            lo, hi, step = hi, hi + step, 2 * step
    else:
        while evaluate(lo) < target and len(tried) < 12:
            hi, lo, step = lo, lo - step, 2 * step
    for _ in range(iterations):
        if abs(best()[1] - target) <= tolerance or lo == hi:
            break
        mid = 0.5 * (lo + hi)
        if evaluate(mid) > target:
            lo = mid
        else:
            hi = mid
    value, rate = best()
    with torch.no_grad():
        bias[spec.blank_id] = value
    return rate


def _blank_margins(
    model: ASRModel, spec: TransducerSpec, batches: list[tuple[torch.Tensor, torch.Tensor]], num_states: int = 4
) -> torch.Tensor:
    """Blank logit minus the best non-blank logit, over valid frames and a few prediction-network states."""
    generator = torch.Generator().manual_seed(0)
    out = []
    with torch.inference_mode(), _eval_mode(model):
        for enc, lens in batches:
            batch = enc.shape[0]
            tokens = torch.randint(0, spec.vocab_size, (batch, num_states - 1), generator=generator).to(enc.device)
            g, _ = model.decoder.predict(tokens, state=None, add_sos=True, batch_size=batch)  # [B, U, H]
            logits = model.joint.joint(enc.transpose(1, 2), g)[..., : spec.blank_id + 1].float()  # [B, T, U, V+1]
            margin = logits[..., spec.blank_id] - logits[..., : spec.blank_id].amax(dim=-1)  # [B, T, U]
            valid = torch.arange(enc.shape[2], device=enc.device)[None, :] < lens[:, None]
            out.append(margin[valid].reshape(-1).cpu())
    return torch.cat(out)


def _clipped_lognormal_mean(mu: float, sigma: float, a: float, b: float) -> float:
    """E[clip(X, a, b)] for X ~ LogNormal(mu, sigma)."""

    def cdf(z: float) -> float:
        return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))

    la, lb = math.log(a), math.log(b)
    inside = math.exp(mu + 0.5 * sigma**2) * (cdf((lb - mu - sigma**2) / sigma) - cdf((la - mu - sigma**2) / sigma))
    return a * cdf((la - mu) / sigma) + b * (1.0 - cdf((lb - mu) / sigma)) + inside


def librispeech_like_durations(
    total_seconds: float = 3600.0,
    seed: int = 0,
    mean: float = 6.3,
    min_s: float = 1.3,
    max_s: float = 35.0,
    sigma: float = 0.75,
) -> list[float]:
    """Synthetic utterance durations shaped like LibriSpeech test-other, longest first.

    Draws from a log-normal distribution (log-std ``sigma``) whose location is solved so that the
    mean after clipping to ``[min_s, max_s]`` equals ``mean``, until the durations add up to
    ``total_seconds``; the last one is shortened to land on the total (or dropped if that would
    make it shorter than ``min_s``), so the sum is within ``min_s`` of ``total_seconds``. Values are
    rounded to 1/100 s.

    Returns:
        Durations in seconds, sorted longest first.
    """
    if not 0 < min_s <= mean <= max_s:
        raise ValueError(f"need 0 < min_s <= mean <= max_s, got min_s={min_s}, mean={mean}, max_s={max_s}")
    if total_seconds <= 0:
        raise ValueError(f"total_seconds must be > 0, got {total_seconds}")
    lo, hi = math.log(min_s) - 5 * sigma, math.log(max_s) + 5 * sigma
    for _ in range(100):
        mu = 0.5 * (lo + hi)
        if _clipped_lognormal_mean(mu, sigma, min_s, max_s) < mean:
            lo = mu
        else:
            hi = mu
    rng = np.random.default_rng(seed)
    durations: list[float] = []
    total = 0.0
    while total < total_seconds:
        d = round(float(np.clip(rng.lognormal(mu, sigma), min_s, max_s)), 2)
        if total + d > total_seconds:
            d = round(total_seconds - total, 2)
            if d < min_s:
                break
        durations.append(d)
        total += d
    if not durations:  # total_seconds < min_s
        durations.append(round(min_s, 2))
    return sorted(durations, reverse=True)


def synthetic_audio(durations: Sequence[float], sample_rate: int = SAMPLE_RATE, seed: int = 0) -> list[np.ndarray]:
    """Speech-like synthetic signals (not speech): one float32 array per duration.

    Each is white noise shaped by a spectral tilt and three random "formant" resonances, modulated
    by a 3-6 Hz syllable-rate envelope and gated into words separated by short pauses. Utterance
    ``i`` depends only on ``(seed, i, durations[i])``. Samples lie on the int16 grid (``k / 32768``,
    peak 0.5), so writing them as 16-bit PCM with :func:`write_wavs` and reading back is lossless.
    """
    out = []
    for i, duration in enumerate(durations):
        n = max(1, round(float(duration) * sample_rate))
        rng = np.random.default_rng([seed, i])
        spec = np.fft.rfft(rng.standard_normal(n))
        freqs = np.fft.rfftfreq(n, 1.0 / sample_rate)
        shape = 1.0 / (1.0 + freqs / 500.0)  # spectral tilt
        for centre, width in zip(
            rng.uniform([300, 900, 2200], [900, 2200, 3500]), rng.uniform(80, 250, 3), strict=True
        ):
            shape += 3.0 / (1.0 + ((freqs - centre) / width) ** 2)
        shape[freqs < 60] = 0.0
        x = np.fft.irfft(spec * shape, n)
        t = np.arange(n) / sample_rate
        envelope = (0.5 * (1.0 - np.cos(2 * np.pi * rng.uniform(3.0, 6.0) * t + rng.uniform(0, 2 * np.pi)))) ** 2
        # words: ~0.2-0.8 s on, ~0.05-0.3 s off, with 10 ms ramps
        gate = np.zeros(n)
        pos = int(rng.uniform(0.0, 0.2) * sample_rate)
        while pos < n:
            length = int(rng.uniform(0.2, 0.8) * sample_rate)
            gate[pos : pos + length] = 1.0
            pos += length + int(rng.uniform(0.05, 0.3) * sample_rate)
        ramp = max(1, sample_rate // 100)
        gate = np.convolve(gate, np.ones(ramp) / ramp, mode="same")
        x = x * envelope * gate + 1e-3 * rng.standard_normal(n)
        peak = float(np.abs(x).max())
        x = x * (0.5 / peak) if peak > 0 else x
        out.append((np.round(x * 32768.0) / 32768.0).astype(np.float32))
    return out


def write_wavs(
    audios: Sequence[np.ndarray], out_dir: str | os.PathLike, sample_rate: int = SAMPLE_RATE, prefix: str = "utt"
) -> list[Path]:
    """Write mono float arrays in [-1, 1) as 16-bit PCM WAV files ``{prefix}_{i:05d}.wav``; return their paths."""
    import soundfile as sf

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, audio in enumerate(audios):
        path = out / f"{prefix}_{i:05d}.wav"
        sf.write(str(path), np.asarray(audio, dtype=np.float32), sample_rate, subtype="PCM_16")
        paths.append(path)
    return paths


def write_manifest(
    audio_paths: Sequence[str | os.PathLike],
    durations: Sequence[float],
    manifest_path: str | os.PathLike,
    texts: Sequence[str] | None = None,
) -> Path:
    """Write a NeMo JSON-lines manifest (``audio_filepath``, ``duration``, ``text``; text "" by default)."""
    if len(audio_paths) != len(durations) or (texts is not None and len(texts) != len(audio_paths)):
        raise ValueError(
            f"audio_paths ({len(audio_paths)}), durations ({len(durations)}) and texts "
            f"({'None' if texts is None else len(texts)}) must have the same length"
        )
    path = Path(manifest_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf8") as f:
        for i, (audio, duration) in enumerate(zip(audio_paths, durations, strict=True)):
            entry = {
                "audio_filepath": str(Path(audio).resolve()),
                "duration": float(duration),
                "text": texts[i] if texts is not None else "",
            }
            f.write(json.dumps(entry) + "\n")
    return path


def encode(
    model: ASRModel,
    audios: Sequence[np.ndarray | torch.Tensor],
    batch_size: int,
    device: str | torch.device,
    dtype: torch.dtype | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Run the model's preprocessor and encoder once, batch by batch, in the given order.

    Args:
        model: a NeMo ASR model, already on ``device``. It runs in eval mode (dropout off) whatever
            its modules' training flags, which are restored afterwards.
        audios: mono 16 kHz signals (float in [-1, 1]); batches are taken in this order, so sort
            them (e.g. longest first) beforehand to limit padding.
        batch_size: utterances per batch.
        device: the model's device; audio is moved there.
        dtype: ``None`` runs in fp32; ``torch.bfloat16`` / ``torch.float16`` run the encoder under
            autocast (the outputs then come back in whatever dtype autocast produced).

    Returns:
        ``(encoded, lengths)``: per batch, the encoder output ``[B, D, T]`` and its lengths ``[B]``
        (int64), on ``device``. Feed them to a transducer decoder, e.g.
        ``model.decoding.rnnt_decoder_predictions_tensor(encoder_output=encoded[i], encoded_lengths=lengths[i])``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if dtype not in (None, torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype must be None, torch.float32, torch.bfloat16 or torch.float16, got {dtype}")
    device = torch.device(device)
    model_device = next(model.parameters()).device
    if model_device.type != device.type or (device.index is not None and model_device != device):
        raise ValueError(f"model is on {model_device} but device={device}; move it with model.to({str(device)!r})")
    encoded: list[torch.Tensor] = []
    lengths: list[torch.Tensor] = []
    use_autocast = dtype in (torch.bfloat16, torch.float16)
    with torch.inference_mode(), _eval_mode(model):
        for start in range(0, len(audios), batch_size):
            chunk = [torch.as_tensor(a, dtype=torch.float32).reshape(-1) for a in audios[start : start + batch_size]]
            lens = torch.tensor([c.numel() for c in chunk], dtype=torch.int64)
            signal = torch.zeros(len(chunk), int(lens.max()), dtype=torch.float32)
            for row, c in enumerate(chunk):
                signal[row, : c.numel()] = c
            signal, lens = signal.to(device), lens.to(device)
            autocast = (
                torch.autocast(device_type=device.type, dtype=dtype) if use_autocast else contextlib.nullcontext()
            )
            with autocast:
                feats, feat_lens = model.preprocessor(input_signal=signal, length=lens)
                enc, enc_lens = model.encoder(audio_signal=feats, length=feat_lens)
            encoded.append(enc)
            lengths.append(enc_lens.to(torch.int64))
    return encoded, lengths
