"""``HostStaging.upload`` puts host arrays on the device through one reused staging buffer, values and shapes
unchanged, growing when an upload is larger (on a GPU too where one is present)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nemo_fastdecode.streaming.staging import HostStaging

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_uploads_equal_their_arrays_one_after_another(device):
    staging = HostStaging(torch.device(device))
    rng = np.random.default_rng(0)
    arrays = [
        rng.integers(-(2**40), 2**40, (2, 5)),
        rng.integers(0, 100, 3).astype(np.int32),
        rng.standard_normal((4, 3, 2)).astype(np.float32),
        rng.integers(0, 7, (2, 300)),  # larger: the buffers grow
        np.zeros((2, 0), dtype=np.int64),
    ]
    for array in arrays:
        uploaded = staging.upload(array)
        assert uploaded.device.type == device and tuple(uploaded.shape) == array.shape
        np.testing.assert_array_equal(uploaded.cpu().numpy(), array)  # read before the next upload reuses it


def test_other_dtypes_are_refused_naming_the_valid_ones():
    with pytest.raises(TypeError, match=r"dtype float64; valid: int64, int32, float32"):
        HostStaging(torch.device("cpu")).upload(np.zeros(3))
