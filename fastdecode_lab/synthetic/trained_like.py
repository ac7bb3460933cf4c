"""The ``trained`` calibration: make a random-weight synthetic model emit tokens in a trained model's pattern.

:func:`~fastdecode_lab.synthetic.calibrate_blank_bias` sets only how many tokens a random model emits. Its
emissions come in bursts: a random joint's blank margin depends mostly on the frame, so a frame that emits one token
keeps emitting after the prediction network's state changes (often up to ``max_symbols``). A trained model emits
mostly one token per emitting frame: the token it has just emitted is what the frame said, so the next step at that
frame is blank.

:func:`install_consumption_gate` gives the joint that behaviour, with six of its hidden units (deterministically,
from a seed; weights only, so NeMo's decoders and ours see the same model):

* a *frame sign* ``z(f)``: a fixed projection of the encoder frame, standardised over the calibration frames, along
  the direction in which consecutive frames differ most (so that its sign changes often), saturated as
  ``clip(k z, -1, 1)`` (``k`` = :data:`SHARPNESS`) so that frames near ``z = 0`` are gated too;
* a *token sign* ``s(y) = +-1`` for each token (half of the tokens each, at random), which the prediction network is
  made to show: the last unit of each LSTM layer becomes a register that holds the last token's sign (its gates ignore
  the recurrent state; the first layer reads the sign from one embedding dimension; ``0`` before the first token).
  Two joint units add ``boost * s(y) * clip(k z, -1, 1)`` to every token's logit: the frame prefers the tokens of its
  sign;
* four units read the register and add ``gate * clip(s(last) * k z, 0, 1)`` to the blank logit: ``gate`` once the
  last token's sign agrees with the frame's, nothing while they differ. Once a token has "consumed" the frame's sign,
  blank wins until the sign changes.

The units work in the ReLU's piecewise-linear range (``relu(x) - relu(x - 1)`` clips ``x`` to ``[0, 1]``).
:func:`calibrate_trained_like` keeps the gate strong, so that a frame's burst ends at its first token of the frame's
sign, and bisects the preference (``boost``) so that the tokens per emitting frame match the target,
with the blank bias re-calibrated to the target tokens per frame at every step (and, for TDT, the duration biases
to the target's duration shares: a random TDT model's durations otherwise bound its rate). The blank runs follow
from these (reported, not calibrated).

The register reads the last token's sign exactly at any size (a linear probe of a random 1024-token LSTM's state
read it for only about 80% of the states, too few for the gate to work at Parakeet sizes). The trained targets come
from the shipped small-vocabulary models, whose tokens per frame (about 0.47) are higher than a 1024-token Parakeet's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fastdecode_lab.emissions import EmissionStats, emission_stats, trained_emission_stats
from fastdecode_lab.synthetic.model import (
    _as_batches,
    calibrate_blank_bias,
    nemo_calibration_greedy,
    transducer_spec,
)

#: the joint hidden units the gate takes over, counted from the last
GATE_UNITS = 6
#: ``k``: the frame sign's slope before it saturates at +-1 (``clip(k z, -1, 1)``)
SHARPNESS = 16.0


@dataclass(frozen=True)
class TrainedLikeCalibration:
    """What :func:`calibrate_trained_like` reached.

    Attributes:
        boost: the frame's preference for tokens of its sign that was kept.
        target: the trained statistics aimed at.
        achieved: NeMo's baseline greedy decoder's statistics on the calibration batches.
    """

    boost: float
    target: EmissionStats
    achieved: EmissionStats


def _frame_sign_direction(frames: list[torch.Tensor]) -> tuple[torch.Tensor, float, float]:
    """Direction ``w`` [D] maximising var(w . (f_t - f_t-1)) / var(w . f), its projections' mean and std."""
    diffs = torch.cat([f[1:] - f[:-1] for f in frames if f.shape[0] > 1])  # [N, D]
    stacked = torch.cat(frames)  # [M, D]
    cov = torch.cov(stacked.T.double())
    # shrunk towards its mean variance: a stable direction also where there are few frames for many dimensions
    cov = 0.9 * cov + 0.1 * cov.diagonal().mean() * torch.eye(cov.shape[0], dtype=torch.float64, device=cov.device)
    cov_diff = torch.cov(diffs.T.double())
    # generalised eigenproblem cov_diff w = l cov w, through the Cholesky factor of cov
    chol = torch.linalg.cholesky(cov)
    inv = torch.linalg.inv(chol)
    _, vectors = torch.linalg.eigh(inv @ cov_diff @ inv.T)
    w = (inv.T @ vectors[:, -1]).float()
    proj = stacked @ w
    return w, float(proj.mean()), float(proj.std().clamp_min(1e-12))


def _valid_frames(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """Each utterance's valid encoder frames, ``[T_i, D]``, in fp32."""
    out = []
    for enc, lens in batches:
        for row in range(enc.shape[0]):
            out.append(enc[row, :, : int(lens[row])].T.float())
    return [f for f in out if f.shape[0] > 0]


def _install_sign_register(model, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Give every token a sign ``s(y) = +-1`` and make the prediction network's output show the last token's sign.

    The last hidden unit of every LSTM layer becomes a register: its gates ignore the recurrent state (input and
    output gates open, forget gate shut), so its cell holds ``tanh`` of what the layer reads now: in the first layer
    the last embedding dimension, set to ``+-scale`` by the token's sign, in later layers the register below. The
    output's register unit is then ``+-0.76`` after a token and ``0`` at the start (the blank/padding embedding is
    zero). Returns the signs ``[V]`` (half of the tokens each, random from ``seed``) and a linear probe ``[H + 1]``
    (weights, bias) reading the sign (+-1, 0 before the first token) from the decoder output.

    Raises:
        ValueError: the prediction network is not NeMo's embedding + LSTM.
    """
    spec = transducer_spec(model)
    prediction = getattr(model.decoder, "prediction", None)
    embed = prediction["embed"] if prediction is not None and "embed" in prediction else None
    lstm = getattr(prediction["dec_rnn"], "lstm", None) if prediction is not None and "dec_rnn" in prediction else None
    if not isinstance(embed, torch.nn.Embedding) or not isinstance(lstm, torch.nn.LSTM) or lstm.proj_size:
        raise ValueError("the consumption gate needs NeMo's embedding + LSTM prediction network (no projection)")
    device = embed.weight.device
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(spec.vocab_size, generator=generator)
    signs = torch.ones(spec.vocab_size)
    signs[order[: spec.vocab_size // 2]] = -1.0
    signs = signs.to(device)
    hidden = lstm.hidden_size
    unit = hidden - 1
    saturate, cell_in = 10.0, 3.0  # gate pre-activations; tanh(3) = 0.995
    register_out = float(torch.tanh(torch.tanh(torch.tensor(cell_in))))  # h = o * tanh(c), o ~= 1, c ~= tanh(3)
    with torch.no_grad():
        # the spread of the other dimensions (not the register's: installing again gives the same weights)
        scale = float(embed.weight[: spec.vocab_size, :-1].std())
        embed.weight[: spec.vocab_size, -1] = signs * scale
        if embed.padding_idx is not None:
            embed.weight[embed.padding_idx] = 0.0
        for layer in range(lstm.num_layers):
            w_ih, w_hh = getattr(lstm, f"weight_ih_l{layer}"), getattr(lstm, f"weight_hh_l{layer}")
            b_ih, b_hh = getattr(lstm, f"bias_ih_l{layer}"), getattr(lstm, f"bias_hh_l{layer}")
            rows = [gate * hidden + unit for gate in range(4)]  # PyTorch's gate order: input, forget, cell, output
            w_ih[rows] = 0.0
            w_hh[rows] = 0.0
            b_hh[rows] = 0.0
            b_ih[rows] = torch.tensor([saturate, -saturate, 0.0, saturate], dtype=b_ih.dtype, device=device)
            if layer == 0:
                w_ih[2 * hidden + unit, -1] = cell_in / scale
            else:
                w_ih[2 * hidden + unit, unit] = cell_in / register_out
    probe = torch.zeros(hidden + 1, device=device)
    probe[unit] = 1.0 / register_out
    return signs, probe


def install_consumption_gate(
    model,
    encoder_output: torch.Tensor | Sequence[torch.Tensor],
    encoded_lengths: torch.Tensor | Sequence[torch.Tensor],
    gate: float = 64.0,
    boost: float = 1.0,
    seed: int = 0,
) -> None:
    """Take over the last :data:`GATE_UNITS` hidden units of the joint for the frame's preference and the blank gate,
    and the last unit of every prediction-network layer (and the last embedding dimension) for the token-sign register
    (see the module docstring).

    Args:
        model: a synthetic transducer model (:func:`~fastdecode_lab.synthetic.build_synthetic_model`) whose
            joint activation is ReLU; modified in place (call it again to change ``gate`` or ``boost``: it overwrites
            the same units).
        encoder_output: ``[B, D, T]`` tensor(s) the frame sign is standardised on.
        encoded_lengths: the matching ``[B]`` length tensor(s).
        gate: added to the blank logit once the last token's sign agrees with the frame's
            (``gate * clip(s(last) k z, 0, 1)``); strong enough by default to end any burst there.
        boost: added to a token's logit per unit of ``s(token) * clip(k z(frame), -1, 1)``.
        seed: the tokens' random signs.

    Raises:
        ValueError: the joint's activation is not ReLU, it has too few hidden units, or the prediction network is not
            NeMo's embedding + LSTM.
    """
    joint = model.joint
    act = joint.joint_net[0]
    if not isinstance(act, torch.nn.ReLU):
        raise ValueError(f"the consumption gate needs a ReLU joint activation, got {type(act).__name__}")
    enc_layer, pred_layer, out = joint.enc, joint.pred, joint.joint_net[-1]
    hidden = enc_layer.weight.shape[0]
    if hidden < 4 * GATE_UNITS:
        raise ValueError(f"the joint has {hidden} hidden units; the gate needs at least {4 * GATE_UNITS}")
    spec = transducer_spec(model)
    device = out.weight.device
    batches = _as_batches(encoder_output, encoded_lengths)
    w, mean, std = _frame_sign_direction(_valid_frames(batches))
    signs, probe = _install_sign_register(model, seed)  # s(last) = probe[:-1] . g + probe[-1]
    kz_weight, kz_bias = (SHARPNESS * w / std).to(device), -SHARPNESS * mean / std
    reach = 4.0 * SHARPNESS  # shuts the gate of the other sign (and before the first token) for |z| < 4
    units = list(range(hidden - GATE_UNITS, hidden))
    with torch.no_grad():
        for unit in units:
            out.weight[:, unit] = 0.0
        # the frame's preference: tokens get boost * s(y) * clip(k z, -1, 1) = boost * s(y) * (relu(k z + 1) -
        # relu(k z - 1) - 1), the constant in the token biases
        for unit, shift, sign in ((units[0], 1.0, 1.0), (units[1], -1.0, -1.0)):
            enc_layer.weight[unit] = kz_weight
            enc_layer.bias[unit] = kz_bias + shift
            pred_layer.weight[unit] = 0.0
            pred_layer.bias[unit] = 0.0
            out.weight[: spec.vocab_size, unit] = sign * boost * signs
        # the token biases before the first gate, so that installing it again (another preference) starts from them
        if not hasattr(model, "_token_bias_without_gate"):
            model._token_bias_without_gate = out.bias[: spec.vocab_size].clone()
        out.bias[: spec.vocab_size] = model._token_bias_without_gate - boost * signs
        # the gate: blank gets gate * clip(s(last) * k z, 0, 1), one pair of units per sign of the last token:
        # relu(side * k z + reach * (side * s - 1)) - relu(... - 1) is clip(k z * side, 0, 1) where s = side, else 0
        for side, (upper, lower) in ((1.0, units[2:4]), (-1.0, units[4:6])):
            for unit, shift, weight in ((upper, 0.0, gate), (lower, -1.0, -gate)):
                enc_layer.weight[unit] = side * kz_weight
                enc_layer.bias[unit] = side * kz_bias + shift - reach
                pred_layer.weight[unit] = side * reach * probe[:-1]
                pred_layer.bias[unit] = side * reach * probe[-1]
                out.weight[spec.blank_id, unit] = weight


def _stats(model, batches: list[tuple[torch.Tensor, torch.Tensor]], max_symbols: int | None) -> EmissionStats:
    """NeMo's greedy decoder's emission statistics on ``batches`` (with token durations for TDT)."""
    decoder = nemo_calibration_greedy(model, max_symbols=max_symbols, include_duration=True)
    hyps, lengths = [], []
    with torch.inference_mode():
        for enc, lens in batches:
            hyps += decoder(encoder_output=enc, encoded_lengths=lens)[0]
            lengths += [int(n) for n in lens]
    return emission_stats(hyps, lengths)


def _duration_shares(histogram: dict[str, int] | None, durations: list[int]) -> torch.Tensor:
    counts = torch.tensor([float((histogram or {}).get(str(d), 0)) for d in durations], dtype=torch.float64)
    return counts / counts.sum().clamp_min(1.0)


def match_durations(
    model,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    target: dict[str, int],
    rounds: int = 4,
    max_symbols: int | None = None,
) -> EmissionStats:
    """TDT: shift the duration logits' biases so that emitted tokens' durations follow ``target``'s shares.

    Each round decodes ``batches`` with NeMo's greedy decoder (the baseline's hypotheses) and adds
    ``log(target share / achieved share)`` (clipped to +-3) to each duration's bias. Returns the statistics of the
    last decoding.
    """
    spec = transducer_spec(model)
    bias = model.joint.joint_net[-1].bias
    want = _duration_shares(target, spec.durations)
    stats = _stats(model, batches, max_symbols)
    for _ in range(rounds):
        got = _duration_shares(stats.duration_histogram, spec.durations)
        step = torch.log((want + 1e-3) / (got + 1e-3)).clamp(-3.0, 3.0)
        with torch.no_grad():
            bias[spec.blank_id + 1 :] += step.to(bias.dtype).to(bias.device)
        stats = _stats(model, batches, max_symbols)
    return stats


def calibrate_trained_like(
    model,
    encoder_output: torch.Tensor | Sequence[torch.Tensor],
    encoded_lengths: torch.Tensor | Sequence[torch.Tensor],
    target: EmissionStats | None = None,
    *,
    iterations: int = 4,
    tolerance: float = 0.05,
    max_symbols: int | None = None,
    seed: int = 0,
) -> TrainedLikeCalibration:
    """Make NeMo's greedy decoder emit like a trained model: its tokens per frame and per emitting frame.

    Installs :func:`install_consumption_gate` with a gate that ends every frame's burst at its first token of the
    frame's sign, and bisects the frame's preference for such tokens (``boost``, on a log scale, 1/64 to 16): the
    bursts are then geometric, as a trained model's are, their mean 2 at no preference and 1 at a strong one. The
    bisection stops when NeMo's greedy decoder (:func:`~fastdecode_lab.synthetic.nemo_calibration_greedy`,
    the baseline's hypotheses) emits ``target.tokens_per_emitting_frame`` tokens per emitting frame on
    ``encoder_output``; at every step the blank bias is re-calibrated to ``target.tokens_per_frame``
    (:func:`~fastdecode_lab.synthetic.calibrate_blank_bias`) and, for TDT, the duration biases to the
    target's duration shares (:func:`match_durations`; a random TDT model's durations otherwise bound its rate).
    The preference whose statistics are closest (relative errors of both rates, summed) is kept; the model is
    modified in place.

    Args:
        model: a synthetic transducer model (ReLU joint), e.g. from
            :func:`~fastdecode_lab.synthetic.build_synthetic_model`.
        encoder_output: one ``[B, D, T]`` tensor or a list of them, on the model's device.
        encoded_lengths: the matching ``[B]`` length tensor(s).
        target: the statistics to reach; ``None``: the shipped trained model's
            (:func:`~fastdecode_lab.emissions.trained_emission_stats`) of the model's kind (RNN-T or TDT).
        iterations: bisection steps on the preference after its two ends.
        tolerance: stop once the summed relative error of both rates is within this.
        max_symbols: ``max_symbols`` per frame for the decoder; the model's setting by default.
        seed: the tokens' random signs in the gate.

    Returns:
        The preference kept, the target and the statistics achieved.
    """
    spec = transducer_spec(model)
    if target is None:
        target = trained_emission_stats("tdt" if spec.is_tdt else "rnnt")
    if target.tokens_per_frame <= 0 or target.tokens_per_emitting_frame < 1:
        raise ValueError(
            f"target needs tokens_per_frame > 0 and tokens_per_emitting_frame >= 1, got "
            f"{target.tokens_per_frame} and {target.tokens_per_emitting_frame}"
        )
    batches = _as_batches(encoder_output, encoded_lengths)
    encs, lens = [b[0] for b in batches], [b[1] for b in batches]
    bias = model.joint.joint_net[-1].bias
    initial = bias.detach().clone()
    tried: dict[float, tuple[float, torch.Tensor, EmissionStats]] = {}  # boost -> (error, output biases, stats)

    def calibrate_rate() -> None:
        calibrate_blank_bias(
            model, encs, lens, target.tokens_per_frame, iterations=10, tolerance=0.01 * target.tokens_per_frame,
            max_symbols=max_symbols,
        )  # fmt: skip

    def evaluate(boost: float) -> float:
        with torch.no_grad():
            bias.copy_(initial)
        install_consumption_gate(model, encs, lens, boost=boost, seed=seed)
        calibrate_rate()
        if spec.is_tdt and target.duration_histogram:
            match_durations(model, batches, target.duration_histogram, max_symbols=max_symbols)
            calibrate_rate()
        stats = _stats(model, batches, max_symbols)
        rate = abs(stats.tokens_per_frame / target.tokens_per_frame - 1)
        burst = stats.tokens_per_emitting_frame / target.tokens_per_emitting_frame - 1
        tried[boost] = (rate + abs(burst), bias.detach().clone(), stats)
        return burst

    # bursts shorten as the preference strengthens: bisect log2(boost) between a weak and a strong one
    lo, hi = -6.0, 4.0
    if evaluate(2**lo) > 0 > evaluate(2**hi):
        for _ in range(iterations):
            if min(v[0] for v in tried.values()) <= tolerance:
                break
            mid = 0.5 * (lo + hi)
            if evaluate(2**mid) > 0:
                lo = mid
            else:
                hi = mid
    boost = min(tried, key=lambda b: tried[b][0])
    _, biases, stats = tried[boost]
    install_consumption_gate(model, encs, lens, boost=boost, seed=seed)
    with torch.no_grad():
        bias.copy_(biases)
    return TrainedLikeCalibration(boost=boost, target=target, achieved=stats)


#: the benchmarks' ``calibrations`` entry that stands for the trained models' emission pattern
TRAINED_CALIBRATION = "trained"


def check_calibration(value: float | int | str) -> float | str:
    """A benchmark calibration: a target tokens per frame (a number > 0: the blank bias alone) or ``"trained"``.

    Raises:
        ValueError: anything else (the message names the valid choices).
    """
    if isinstance(value, str) and value.strip().lower() == TRAINED_CALIBRATION:
        return TRAINED_CALIBRATION
    try:
        rate = float(value)
    except (TypeError, ValueError):
        rate = 0.0
    if isinstance(value, bool) or not rate > 0:
        raise ValueError(
            f"calibration {value!r} is not valid; use a target tokens per frame > 0 (e.g. 0.3) or "
            f"{TRAINED_CALIBRATION!r} (the trained models' rate and burst length)"
        )
    return rate


def apply_calibration(
    model,
    encoder_output: torch.Tensor | Sequence[torch.Tensor],
    encoded_lengths: torch.Tensor | Sequence[torch.Tensor],
    calibration: float | str,
    *,
    max_symbols: int | None = None,
    seed: int = 0,
) -> float:
    """Calibrate a synthetic model for a benchmark: :func:`calibrate_blank_bias` to a number (tokens per frame), or
    :func:`calibrate_trained_like` for ``"trained"``. Returns the tokens per frame reached on ``encoder_output``."""
    calibration = check_calibration(calibration)
    if calibration == TRAINED_CALIBRATION:
        result = calibrate_trained_like(model, encoder_output, encoded_lengths, max_symbols=max_symbols, seed=seed)
        return result.achieved.tokens_per_frame
    return calibrate_blank_bias(model, encoder_output, encoded_lengths, calibration, max_symbols=max_symbols)
