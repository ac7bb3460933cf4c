"""Host-to-device copies that do not wait for the GPU: a reusable pinned staging buffer per kind of upload.

A copy from pageable host memory (``torch.from_numpy(x).to("cuda", non_blocking=True)``) first waits for all the
work already queued on the stream (CUDA stages pageable memory synchronously), so the host could not queue the next
kernels while the GPU runs the previous ones. :class:`HostStaging` copies out of a pinned buffer instead: the copy is
queued like a kernel and the host goes on. The buffer is handed out again only once its previous copy is done (an
event, long recorded by then). On the CPU nothing is copied: the "device" tensor is the staging buffer itself, valid
until the next upload.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["HostStaging"]

_TORCH_DTYPES = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32, np.dtype(np.float32): torch.float32}


class HostStaging:
    """A reusable host staging buffer (pinned on a GPU host, for one asynchronous copy) and its device copy.

    ``host(n)`` waits until the previous copy out of the staging buffer is done before handing it out again;
    both buffers grow (to the next power of two) when a cycle needs more. The device tensor of one upload is valid
    until the next upload through the same staging (read it in the kernels queued before then).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._staging = torch.empty(0, dtype=torch.uint8)
        self._received = torch.empty(0, dtype=torch.uint8, device=device)
        self._copied = torch.cuda.Event() if device.type == "cuda" else None
        self._pending = False  # a copy out of the staging buffer may still run

    def host(self, nbytes: int) -> np.ndarray:
        """``[nbytes]`` uint8 host buffer to fill."""
        self.reserve(nbytes)
        return self._staging[:nbytes].numpy()

    def reserve(self, nbytes: int, keep: int = 0) -> None:
        """Make the host buffer writable and at least ``nbytes`` long: wait for the previous copy out of it, grow it
        (to the next power of two) keeping its first ``keep`` bytes."""
        if self._pending:
            self._copied.synchronize()  # the previous cycle's copy has long finished in practice
            self._pending = False
        if self._staging.numel() < nbytes:
            size = 1 << max(nbytes - 1, 1).bit_length()
            grown = torch.empty(size, dtype=torch.uint8, pin_memory=self.device.type == "cuda")
            grown[:keep] = self._staging[:keep]
            self._staging = grown

    @property
    def staging(self) -> torch.Tensor:
        """The whole host buffer (valid until the next :meth:`reserve` that grows it)."""
        return self._staging

    @property
    def pending(self) -> bool:
        """A copy out of the host buffer may still run: wait (:meth:`reserve`) before writing to it."""
        return self._pending

    def send(self, nbytes: int, into: torch.Tensor | None = None) -> torch.Tensor:
        """The first ``nbytes`` of the host buffer on the device: one copy (none on the CPU).

        ``into``: a contiguous CUDA tensor of at least ``nbytes`` to copy into (a CUDA graph's static input) instead
        of the staging's own device buffer; returns its first ``nbytes`` as uint8.
        """
        if self.device.type != "cuda":
            return self._staging[:nbytes]
        if into is not None:
            received = into.view(-1).view(torch.uint8)[:nbytes]
        else:
            if self._received.numel() < nbytes:
                self._received = torch.empty(self._staging.numel(), dtype=torch.uint8, device=self.device)
            received = self._received[:nbytes]
        received.copy_(self._staging[:nbytes], non_blocking=True)
        self._copied.record(torch.cuda.current_stream(self.device))
        self._pending = True
        return received

    def upload(self, array: np.ndarray) -> torch.Tensor:
        """``array`` (int64, int32 or float32, any shape) on the device, through the staging buffer: one copy."""
        dtype = _TORCH_DTYPES.get(array.dtype)
        if dtype is None:
            raise TypeError(
                f"cannot stage an array of dtype {array.dtype}; valid: {', '.join(map(str, _TORCH_DTYPES))}"
            )
        host = self.host(array.nbytes)
        host.view(array.dtype).reshape(array.shape)[...] = array
        return self.send(array.nbytes).view(dtype).reshape(array.shape)
