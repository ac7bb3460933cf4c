"""Synthetic Parakeet-architecture NeMo models: built with random weights, calibrated, run through the encoder.

Every model built here has RANDOM, UNTRAINED weights: real NeMo modules (FastConformer encoder, LSTM
prediction network, RNN-T / TDT joint) at real sizes, initialised from a seed. Their transcripts are
meaningless; they exist so that decoding speed and exactness can be measured without downloading a
checkpoint. :func:`calibrate_blank_bias` sets how often the greedy decoder emits a token.

Vocabulary conventions (see :func:`transducer_spec`): ``V`` non-blank tokens, blank id ``V`` (the
last token logit), and for TDT ``len(durations)`` duration logits after the ``V + 1`` token logits.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fastdecode_lab.synthetic.audio import synthetic_audio
from fastdecode_lab.synthetic.presets import check_vocab, get_preset, make_synthetic_config, train_bpe_tokenizer
from nemo_fastdecode.apps.comparison import encode
from nemo_fastdecode.config import greedy_max_symbols
from nemo_fastdecode.nemo.context import eval_mode, quiet_nemo

if TYPE_CHECKING:
    from nemo.collections.asr.models import ASRModel


def build_synthetic_model(
    preset: str,
    *,
    vocab: str = "char",
    seed: int = 0,
    device: str | torch.device = "cpu",
    balance_joint: bool = True,
    residual_scale: float | None = None,
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
        the default): ``tiny-streaming`` (tiny hybrid, [[16, 3], [16, 1], [16, 0]]), ``tiny-rnnt-streaming``
        (the same, pure RNN-T), ``tiny-tdt-streaming`` (the same, TDT), ``hybrid-17x512-streaming`` (17 x 512, 8 heads, hybrid RNN-T/CTC) and
        ``rnnt-0.6b-streaming`` (24 x 1024 RNN-T), both [[70, 13], [70, 6], [70, 1], [70, 0]].

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
        residual_scale: scale each encoder layer's residual branches (both feed-forward modules', the attention's
            and the convolution module's output projections) by this, before the joint is balanced; ``None``: the
            preset's (0.1 for the benchmark-size cache-aware presets, else 1). A deep random encoder's frames
            otherwise converge to nearly one vector once its left context fills, so a cache-aware model would emit
            only at a stream's start.

    With ``balance_joint`` the joint is rescaled once, deterministically, and stays random: on the
    encoder frames of a few seconds of :func:`synthetic_audio` and on prediction-network states after
    random tokens, the spread of its encoder and prediction projections is equalised (a random
    encoder's frames, and a random LSTM's states, barely differ from each other), and its output
    layer is scaled and centred so that every token, the blank and every TDT duration has mean
    logit 0 and standard deviation about 2. The emitted tokens then depend on both the frame and the
    decoder state. Blank is left at parity with each token, so an uncalibrated model emits at almost
    every step: call :func:`calibrate_blank_bias` to set the emission rate.

    Limits of a random model, to keep in mind when reading benchmark numbers: :func:`calibrate_blank_bias`
    sets only the overall rate, and a random joint's blank margin depends mostly on the frame, so RNN-T
    emissions come in bursts (6-7 tokens per emitting frame on ``rnnt-0.6b``, many frames reach
    ``max_symbols``; TDT about 1.5) separated by long blank runs, where a trained model emits mostly one token
    per emitting frame. Decoder speed depends on that pattern, not only on the rate.
    :func:`~fastdecode_lab.synthetic.calibrate_trained_like` (the benchmarks' ``trained`` calibration)
    reshapes the joint so that the rate *and* the burst length match a trained model's
    (:mod:`fastdecode_lab.emissions`); the blank runs then come close but are not calibrated, and the
    tokens themselves stay meaningless. In NeMo 3.0, the text (not the
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
    p = get_preset(preset)
    check_vocab(vocab)
    from nemo.collections.asr import models as asr_models

    tmp: tempfile.TemporaryDirectory | None = None
    if vocab == "bpe":
        tmp = tempfile.TemporaryDirectory(prefix=f"synthetic_{preset}_bpe_")
        train_bpe_tokenizer(tmp.name, p.bpe_vocab_size, seed)
        cls = asr_models.EncDecHybridRNNTCTCBPEModel if p.hybrid else asr_models.EncDecRNNTBPEModel
    else:
        cls = asr_models.EncDecHybridRNNTCTCModel if p.hybrid else asr_models.EncDecRNNTModel
    cfg = make_synthetic_config(preset, vocab=vocab, tokenizer_dir=tmp.name if tmp is not None else None)

    with torch.random.fork_rng(devices=[]), quiet_nemo():
        torch.manual_seed(seed)
        model = cls(cfg=cfg)
    model.eval()
    scale = p.residual_scale if residual_scale is None else residual_scale
    if scale != 1.0:
        _scale_residual_branches(model, scale)
    if balance_joint:
        _balance_joint(model, seed)
    if tmp is not None:
        # keep the tokenizer files (registered artifacts, needed by save_to) as long as the model lives
        model._synthetic_tokenizer_tmpdir = tmp
    model = model.to(device)
    model.eval()
    return model


def _scale_residual_branches(model: ASRModel, scale: float) -> None:
    """Multiply the output projections of every encoder layer's residual branches by ``scale`` (weights, biases)."""
    with torch.no_grad():
        for layer in model.encoder.layers:
            for branch in (
                layer.feed_forward1.linear2,
                layer.feed_forward2.linear2,
                layer.self_attn.linear_out,
                layer.conv.pointwise_conv2,
            ):
                branch.weight.mul_(scale)
                if branch.bias is not None:
                    branch.bias.mul_(scale)


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
    with torch.inference_mode(), eval_mode(model):
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
    with torch.inference_mode(), eval_mode(model):
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
    max_symbols = greedy_max_symbols(decoding_cfg.get("greedy", None))
    return TransducerSpec(
        vocab_size=vocab_size,
        blank_id=int(model.decoding.blank_id),
        durations=durations,
        num_outputs=int(joint.num_classes_with_blank),
        max_symbols=max_symbols,
    )


def nemo_baseline_greedy(
    model: ASRModel,
    *,
    loop_labels: bool = False,
    max_symbols: int | None = None,
    include_duration: bool = False,
    cuda_graphs: bool = False,
) -> torch.nn.Module:
    """NeMo's own batched greedy decoder for ``model``, configured as the exactness baseline.

    RNN-T: ``GreedyBatchedRNNTInfer`` with ``loop_labels`` (default ``False``, the frame-looping
    algorithm); TDT: ``GreedyBatchedTDTInfer`` (label looping, NeMo's only batched TDT algorithm).
    CUDA graphs are off (``cuda_graphs``: NeMo's label-looping graphs, on a GPU). Call it as
    ``decoder(encoder_output=enc [B, D, T], encoded_lengths=len [B])``; it returns a 1-tuple holding a list of
    ``Hypothesis`` whose ``y_sequence`` holds the emitted token ids (no blanks), and for TDT with
    ``include_duration`` whose ``token_duration`` holds each token's duration. It shares (does not copy) the
    model's decoder and joint.
    """
    from nemo.collections.asr.parts.submodules import rnnt_greedy_decoding as greedy

    spec = transducer_spec(model)
    if max_symbols is None:
        max_symbols = greedy_max_symbols(model.cfg.decoding.get("greedy", None), bounded=True)
    common = {
        "decoder_model": model.decoder,
        "joint_model": model.joint,
        "blank_index": spec.blank_id,
        "max_symbols_per_step": max_symbols,
        "use_cuda_graph_decoder": cuda_graphs,
    }
    if spec.is_tdt:
        return greedy.GreedyBatchedTDTInfer(durations=spec.durations, include_duration=include_duration, **common)
    return greedy.GreedyBatchedRNNTInfer(loop_labels=loop_labels, **common)


def nemo_calibration_greedy(
    model: ASRModel, *, max_symbols: int | None = None, include_duration: bool = False
) -> torch.nn.Module:
    """NeMo's fastest batched greedy decoder for ``model``, the one the calibrations decode with: label looping with
    CUDA graphs where they run (a GPU; elsewhere the same label loop without them). NeMo's label loop returns its frame
    loop's hypotheses (the benchmarks check it on every set), so a calibration reaches the rates it would with the
    baseline, in a fraction of the time on a GPU (a trained-like calibration decodes its batches dozens of times)."""
    return nemo_baseline_greedy(
        model, loop_labels=True, max_symbols=max_symbols, include_duration=include_duration, cuda_graphs=True
    )


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
    :func:`nemo_calibration_greedy` (NeMo's label loop with CUDA graphs: the baseline's hypotheses) at
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

    Only the rate is calibrated: on a random model the tokens come in bursts at few frames (see
    :func:`build_synthetic_model`); :func:`~fastdecode_lab.synthetic.calibrate_trained_like` matches
    the burst length as well.
    """
    if target_tokens_per_frame <= 0:
        raise ValueError(f"target_tokens_per_frame must be > 0, got {target_tokens_per_frame}")
    batches = _as_batches(encoder_output, encoded_lengths)
    spec = transducer_spec(model)
    decoder = nemo_calibration_greedy(model, max_symbols=max_symbols)
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
    with torch.inference_mode(), eval_mode(model):
        for enc, lens in batches:
            batch = enc.shape[0]
            tokens = torch.randint(0, spec.vocab_size, (batch, num_states - 1), generator=generator).to(enc.device)
            g, _ = model.decoder.predict(tokens, state=None, add_sos=True, batch_size=batch)  # [B, U, H]
            logits = model.joint.joint(enc.transpose(1, 2), g)[..., : spec.blank_id + 1].float()  # [B, T, U, V+1]
            margin = logits[..., spec.blank_id] - logits[..., : spec.blank_id].amax(dim=-1)  # [B, T, U]
            valid = torch.arange(enc.shape[2], device=enc.device)[None, :] < lens[:, None]
            out.append(margin[valid].reshape(-1).cpu())
    return torch.cat(out)
