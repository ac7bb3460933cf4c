"""The log-probability of each token a greedy stream emits, for the streams that ask (``StreamOptions(token_logprobs=
True)``): the model's ``log_softmax`` of the joint's output at the token's frame and prediction-network output.

The greedy loop picks each token as the argmax of the joint's output and keeps no log-probability (NeMo's greedy
``score`` sums the chosen logits, unnormalised on a GPU). After a chunk is decoded, :class:`TokenLogprobs` scores the
chunk's tokens of the asking streams again, teacher-forced: from each stream's prediction-network state before the
chunk, token ``i`` was chosen on the network's output after the tokens before it, at its frame, so running the network
over the chunk's tokens gives every token's joint input. ``log_softmax`` over the tokens and blank (TDT: over the token
part, as NeMo normalises it apart from the durations) at the token's label is its log-probability.

It is the model's own probability of the token: fusion (an n-gram LM, boosting) is left out. It is NeMo's modules'
arithmetic at this batch's shape, which may round otherwise than the decoder's loop in the last bits; it is computed
after the decoding and never changes a token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from nemo_fastdecode.greedy.state import BatchedGreedyState

__all__ = ["TokenLogprobs"]


class TokenLogprobs:
    """Teacher-forced log-probabilities of emitted tokens.

    Args:
        decoder: the model's prediction network (NeMo's ``RNNTDecoder`` or stateless decoder: ``predict``).
        joint: the model's joint (``project_encoder``, ``project_prednet``, ``joint_after_projection``).
        blank_index: the blank label (``V``): the token logits are the joint's first ``V + 1`` outputs.
    """

    def __init__(self, decoder: torch.nn.Module, joint: torch.nn.Module, blank_index: int):
        self.decoder, self.joint, self.num_tokens = decoder, joint, blank_index + 1

    def distributions(
        self, state: BatchedGreedyState, encoded: torch.Tensor, labels: torch.Tensor, frames: torch.Tensor
    ) -> torch.Tensor:
        """``[N, K, V + 1]`` float32 log-probabilities over the labels (blank included) at each token's step.

        Args:
            state: ``N`` rows: each stream's greedy state before the chunk (prediction-network state and its
                projected output).
            encoded: ``[N, T, D]`` the chunk's encoder frames of each stream.
            labels: ``[N, K]`` int64 the chunk's tokens of each stream, left-aligned (past a row's count: any label
                below ``V``; those steps are junk).
            frames: ``[N, K]`` int64 each token's frame within the chunk (clamped into ``[0, T)``).
        """
        count, steps = labels.shape
        rows = torch.arange(count, device=encoded.device)
        dtype = state.predictor_outputs.dtype
        with torch.inference_mode():
            projected = self.joint.project_encoder(encoded.to(dtype))  # [N, T, H]
            frames = frames.clamp(0, encoded.shape[1] - 1)
            predicted, predictor_state = state.predictor_outputs, list(state.predictor_states)  # [N, 1, H]
            out = torch.empty([count, steps, self.num_tokens], dtype=torch.float32, device=encoded.device)
            for step in range(steps):
                frame = projected[rows, frames[:, step]].unsqueeze(1)  # [N, 1, H]
                logits = self.joint.joint_after_projection(frame, predicted)[:, 0, 0, : self.num_tokens]
                out[:, step] = logits.float().log_softmax(dim=-1)
                if step + 1 < steps:  # the network's output after this token: the next token's
                    output, predictor_state = self.decoder.predict(
                        labels[:, step : step + 1], predictor_state, add_sos=False, batch_size=count
                    )
                    predicted = self.joint.project_prednet(output)
        return out

    def score(
        self, state: BatchedGreedyState, encoded: torch.Tensor, labels: torch.Tensor, frames: torch.Tensor
    ) -> torch.Tensor:
        """``[N, K]`` float32: each token's log-probability (arguments as :meth:`distributions`)."""
        return self.distributions(state, encoded, labels, frames).gather(2, labels.unsqueeze(2)).squeeze(2)
