"""The masked prediction-network state update (kernels/masked_state.py) against its torch path (NeMo's
``batch_replace_states_mask`` for LSTM states), in Triton's interpreter on the CPU (conftest) or on a GPU."""

from __future__ import annotations

import pytest
import torch

from nemo_fastdecode.kernels.masked_state import masked_state_update

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("layers", [1, 2])
def test_masked_state_update_kernel_matches_reference(layers):
    g = torch.Generator().manual_seed(layers)
    mask = torch.tensor([True, False, True, False], device=DEVICE)

    def state():
        states = [torch.randn([layers, 4, 6], generator=g).to(DEVICE) for _ in range(2)]
        return states, torch.randn([4, 1, 9], generator=g).to(DEVICE)

    (dst_states, dst_out), (src_states, src_out) = state(), state()
    reference = ([s.clone() for s in dst_states], dst_out.clone())
    masked_state_update(mask, reference[0], src_states, reference[1], src_out, fused=False)
    masked_state_update(mask, dst_states, src_states, dst_out, src_out, fused=True)
    for expected, actual in zip([*reference[0], reference[1]], [*dst_states, dst_out], strict=True):
        assert torch.equal(expected, actual)
    assert torch.equal(dst_out[1], reference[1][1]) and not torch.equal(dst_out[1], src_out[1])
