"""RNN-T and TDT losses in plain PyTorch, vectorised over the batch and the label axis, for any device.

NeMo's fast transducer losses are Numba CUDA kernels (its TDT loss has no CPU version at all, and its pure-PyTorch
TDT reference loops over every lattice cell in Python). These compute the same negative log-likelihoods with one
loop over the frames: within a frame, the recursion along the labels,
``alpha[t, u] = logaddexp(A[t, u], alpha[t, u - 1] + e[t, u - 1])`` (``A``: arcs from earlier frames, ``e``: the
label emitted without advancing time), is solved in closed form with a cumulative log-sum-exp. Gradients come from
autograd. :func:`install_torch_loss` puts them into a NeMo model's ``RNNTLoss`` in place of NeMo's kernels; NeMo's
wrapper keeps doing the casting, trimming and reduction.

Shapes: ``acts`` ``[B, T, U + 1, V + 1 (+ D)]`` joint logits (blank at ``V``; for TDT the ``D`` duration logits
follow), ``labels`` ``[B, U]``, ``act_lens`` ``[B]``, ``label_lens`` ``[B]``; the result is ``[B]`` losses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

_NEG = -1e30  # log(0) that stays finite under subtraction, so gradients never meet inf - inf


def _label_scores(log_probs: torch.Tensor, labels: torch.Tensor, blank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Blank and next-label log-probabilities ``[B, T, U + 1]`` each (the label score is ``_NEG`` at ``u = U``)."""
    batch, frames, states, _ = log_probs.shape
    blank_scores = log_probs[..., blank]
    index = torch.cat([labels, labels.new_zeros(batch, 1)], dim=1).clamp_min(0)  # [B, U + 1]
    label_scores = log_probs.gather(3, index[:, None, :, None].expand(batch, frames, states, 1)).squeeze(3)
    last = torch.arange(states, device=labels.device) == states - 1
    return blank_scores, label_scores.masked_fill(last, _NEG)


def _delayed(x: torch.Tensor, frames: int) -> torch.Tensor:
    """``x`` ``[B, T, ...]`` moved ``frames`` later in time: ``y[:, t] = x[:, t - frames]``, log(0) before."""
    if frames == 0:
        return x
    pad = x.new_full((x.shape[0], min(frames, x.shape[1]), *x.shape[2:]), _NEG)
    return torch.cat([pad, x[:, : x.shape[1] - pad.shape[1]]], dim=1)


def _next_label(x: torch.Tensor) -> torch.Tensor:
    """``y[..., u] = x[..., u - 1]`` (log(0) at ``u = 0``): what leaving label state ``u - 1`` brings to ``u``."""
    return torch.cat([torch.full_like(x[..., :1], _NEG), x[..., :-1]], dim=-1)


def _previous_label(x: torch.Tensor) -> torch.Tensor:
    """``y[..., u] = x[..., u + 1]`` (log(0) at the last ``u``)."""
    return torch.cat([x[..., 1:], torch.full_like(x[..., :1], _NEG)], dim=-1)


def _prefix(scores: torch.Tensor) -> torch.Tensor:
    """``P[..., u] = scores[..., 0] + ... + scores[..., u - 1]`` (``P[..., 0] = 0``)."""
    return torch.cat([torch.zeros_like(scores[..., :1]), scores[..., :-1].cumsum(dim=-1)], dim=-1)


def _logsumexp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``torch.logsumexp`` for finite inputs (log(0) is ``_NEG`` here), without its infinity handling."""
    top = x.amax(dim=dim, keepdim=True)
    return (x - top).exp().sum(dim=dim).log() + top.squeeze(dim)


class _TransducerLattice(torch.autograd.Function):
    """Negative log-likelihood ``[B]`` of the transducer lattice and its exact gradient, by forward (alpha) and
    backward (beta) recursions over the frames, without an autograd graph of the recursions.

    States ``(t, u)``: frame ``t < act_len``, ``u`` labels emitted (``u <= label_len``). Arcs: blank ``k`` moves
    ``(t, u) -> (t + blank_durations[k], u)`` with score ``blank[b, t, u, k]``; label ``k`` moves
    ``(t, u) -> (t + label_durations[k], u + 1)`` with score ``label[b, t, u, k]``. Paths start at ``(0, 0)`` and
    end with a blank reaching ``(act_len, label_len)``. Arcs that stay in their frame (label duration 0) are summed
    along ``u`` in closed form: ``alpha[u] = logaddexp(A[u], alpha[u - 1] + e[u - 1])`` is
    ``alpha = P + logcumsumexp(A - P)`` with ``P`` the prefix sums of ``e``, and beta likewise from the end.
    The gradient of an arc's score is minus its posterior, ``exp(alpha + score + beta(next) - log Z)``.
    Each frame costs a fixed handful of tensor operations, whatever the number of durations.
    """

    @staticmethod
    def forward(ctx, blank, label, blank_durations, label_durations, act_lens, label_lens):
        batch, frames, states, _ = blank.shape
        device = blank.device
        longest = max(*blank_durations, *label_durations)
        lengths, last_u = act_lens.long().to(device), label_lens.long().to(device)
        never = torch.full((batch, states), _NEG, device=device)
        moving = [k for k, d in enumerate(label_durations) if d > 0]
        staying = [k for k, d in enumerate(label_durations) if d == 0]
        stay_prefix = _prefix(label[..., staying[0]]) if staying else None  # [B, T, S]
        moving_durations = [label_durations[k] for k in moving]

        # alpha: arrivals at frame t by every arc that moved there: [B, T, arcs, S], labels one state up
        arrivals = [_delayed(blank[..., k], d) for k, d in enumerate(blank_durations)]
        arrivals += [_next_label(_delayed(label[..., k], label_durations[k])) for k in moving]
        arrivals = torch.stack(arrivals, dim=2)
        start = never.clone()
        start[:, 0] = 0.0
        alphas = [never] * longest  # frames -longest .. -1
        raised = [never] * longest  # alpha one label state up (the source of label arcs)
        for t in range(frames):
            if t == 0:
                arriving = start
            else:
                sources = [alphas[longest + t - d] for d in blank_durations]
                sources += [raised[longest + t - d] for d in moving_durations]
                arriving = torch.stack(sources, dim=1) + arrivals[:, t]
                arriving = arriving[:, 0] if arriving.shape[1] == 1 else _logsumexp(arriving, dim=1)
            if stay_prefix is not None:
                arriving = stay_prefix[:, t] + torch.logcumsumexp(arriving - stay_prefix[:, t], dim=-1)
            alphas.append(arriving)
            if moving:
                raised.append(_next_label(arriving))
        alpha = torch.stack(alphas[longest:], dim=1)  # [B, T, S]

        # beta over frames 0 .. T - 1 + longest: at and after a path's end only its final state (act_len,
        # label_len) counts, for blanks; label arcs may not land there
        frame_ids = torch.arange(frames + longest, device=device)
        final = never.clone()
        final[torch.arange(batch, device=device), last_u] = 0.0
        after = (frame_ids[None, :] >= lengths[:, None])[..., None]  # [B, T + longest, 1]
        beta_end = torch.where((frame_ids[None, :] == lengths[:, None])[..., None], final[:, None], never[:, None])
        leaves = torch.stack([blank[..., k] for k in range(len(blank_durations))] + [label[..., k] for k in moving], 2)
        beta_at = [beta_end[:, t] for t in range(frames + longest)]
        lowered = [never] * (frames + longest)  # beta of label targets, one label state down
        for t in range(frames - 1, -1, -1):
            targets = [beta_at[t + d] for d in blank_durations] + [lowered[t + d] for d in moving_durations]
            leaving = torch.stack(targets, dim=1) + leaves[:, t]
            leaving = leaving[:, 0] if leaving.shape[1] == 1 else _logsumexp(leaving, dim=1)
            if stay_prefix is not None:
                reverse = torch.logcumsumexp((leaving + stay_prefix[:, t]).flip(-1), dim=-1)
                leaving = reverse.flip(-1) - stay_prefix[:, t]
            beta_at[t] = torch.where(after[:, t], beta_end[:, t], leaving)
            if moving:
                lowered[t] = torch.where(after[:, t], never, _previous_label(beta_at[t]))
        beta = torch.stack(beta_at, dim=1)  # [B, T + longest, S]
        log_z = beta[:, 0, 0]
        ctx.save_for_backward(blank, label, alpha, beta, log_z, after)
        ctx.durations = (blank_durations, label_durations)
        return -log_z

    @staticmethod
    def backward(ctx, grad_output):
        blank, label, alpha, beta, log_z, after = ctx.saved_tensors
        blank_durations, label_durations = ctx.durations
        frames = blank.shape[1]
        base = (alpha - log_z[:, None, None])[..., None]  # [B, T, S, 1]
        to_blank = torch.stack([beta[:, d : d + frames] for d in blank_durations], dim=-1)
        label_beta = torch.where(after, _NEG, beta)  # labels may not land at or after the end
        to_label = torch.stack([_previous_label(label_beta[:, d : d + frames]) for d in label_durations], dim=-1)
        scale = -grad_output.view(-1, 1, 1, 1)
        return scale * (base + blank + to_blank).exp(), scale * (base + label + to_label).exp(), None, None, None, None


def _lattice_loss(
    blank: torch.Tensor,
    label: torch.Tensor,
    blank_durations: Sequence[int],
    label_durations: Sequence[int],
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
) -> torch.Tensor:
    return _TransducerLattice.apply(blank, label, tuple(blank_durations), tuple(label_durations), act_lens, label_lens)


def rnnt_loss(
    acts: torch.Tensor, labels: torch.Tensor, act_lens: torch.Tensor, label_lens: torch.Tensor, blank: int
) -> torch.Tensor:
    """RNN-T negative log-likelihood per utterance ``[B]`` (NeMo's ``RNNTLossNumba``, without FastEmit)."""
    log_probs = torch.log_softmax(acts.float(), dim=-1)
    blank_scores, label_scores = _label_scores(log_probs, labels, blank)
    return _lattice_loss(blank_scores[..., None], label_scores[..., None], (1,), (0,), act_lens, label_lens)


def tdt_loss(
    acts: torch.Tensor,
    labels: torch.Tensor,
    act_lens: torch.Tensor,
    label_lens: torch.Tensor,
    blank: int,
    durations: Sequence[int],
    sigma: float = 0.0,
) -> torch.Tensor:
    """TDT negative log-likelihood per utterance ``[B]`` (NeMo's ``TDTLossNumba`` with ``omega=0``, no FastEmit).

    A token (or blank) at frame ``t`` with duration ``d`` moves to frame ``t + d``; blank needs ``d > 0``, and the
    path ends where a blank reaches ``act_len``. ``sigma``: logit under-normalisation (subtracted from the token
    log-probabilities).
    """
    durations = [int(d) for d in durations]
    if 0 not in durations or 1 not in durations or len(set(durations)) != len(durations):
        raise ValueError(f"TDT durations must be distinct and include 0 and 1, got {durations}")
    num_durations = len(durations)
    token_log_probs = torch.log_softmax(acts[..., :-num_durations].float(), dim=-1) - sigma
    duration_log_probs = torch.log_softmax(acts[..., -num_durations:].float(), dim=-1)  # [B, T, U + 1, D]
    blank_scores, label_scores = _label_scores(token_log_probs, labels, blank)
    moving = [n for n, d in enumerate(durations) if d > 0]
    blank_arcs = blank_scores[..., None] + duration_log_probs[..., moving]
    label_arcs = label_scores[..., None] + duration_log_probs
    return _lattice_loss(blank_arcs, label_arcs, [durations[n] for n in moving], durations, act_lens, label_lens)


class TorchTransducerLoss(torch.nn.Module):
    """NeMo's per-utterance loss interface (``acts, labels, act_lens, label_lens`` -> ``[B]``) over
    :func:`rnnt_loss` or :func:`tdt_loss`; ``reduction`` is there because NeMo's ``RNNTLoss`` sets it (it reduces
    the result itself)."""

    def __init__(self, blank: int, durations: Sequence[int] | None = None, sigma: float = 0.0):
        super().__init__()
        self.blank = blank
        self.durations = list(durations) if durations else None
        self.sigma = sigma
        self.reduction = None

    def forward(
        self, acts: torch.Tensor, labels: torch.Tensor, act_lens: torch.Tensor, label_lens: torch.Tensor
    ) -> torch.Tensor:
        if self.durations:
            return tdt_loss(acts, labels, act_lens, label_lens, self.blank, self.durations, self.sigma)
        return rnnt_loss(acts, labels, act_lens, label_lens, self.blank)


_KWARGS_SECTIONS = {"tdt": "tdt_kwargs", "default": "warprnnt_numba_kwargs", "warprnnt_numba": "warprnnt_numba_kwargs"}


def install_torch_loss(loss: torch.nn.Module, loss_config: Mapping[str, Any]) -> None:
    """Replace the kernel inside NeMo's ``RNNTLoss`` ``loss`` by :class:`TorchTransducerLoss`.

    ``loss_config``: the model's ``loss`` section: ``loss_name`` ``tdt`` (with ``tdt_kwargs``), ``default`` or
    ``warprnnt_numba`` (with ``warprnnt_numba_kwargs``). FastEmit, gradient clamping and TDT's ``omega`` are not
    implemented here: a ``ValueError`` names a setting that is not 0 (clamp: not > 0).
    """
    name = loss_config.get("loss_name", "default")
    if name not in _KWARGS_SECTIONS:
        raise ValueError(f"loss.loss_name={name!r} has no PyTorch version here; valid: {', '.join(_KWARGS_SECTIONS)}")
    kwargs = dict(loss_config.get(_KWARGS_SECTIONS[name]) or {})
    for key in ("fastemit_lambda", "omega"):
        if float(kwargs.get(key, 0.0)) != 0.0:
            raise ValueError(f"loss.{key}={kwargs[key]} is not supported by the PyTorch transducer loss; set it to 0")
    if float(kwargs.get("clamp", -1.0)) > 0:
        raise ValueError(f"loss.clamp={kwargs['clamp']} is not supported by the PyTorch transducer loss; set it to -1")
    durations = kwargs.get("durations") if name == "tdt" else None
    loss._loss = TorchTransducerLoss(loss._blank, durations=durations, sigma=float(kwargs.get("sigma", 0.0)))
    loss._force_float32 = True
