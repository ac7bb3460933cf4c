"""NeMo's causal ``dw_striding`` subsampling convolutions with fewer passes over their activations.

``ConvSubsampling`` (``subsampling: dw_striding``, ``causal_downsampling: true``, the cache-aware FastConformers)
runs ``MaskedConvSequential``: ``[CausalConv2D(1 -> C), ReLU, (CausalConv2D depthwise, Conv2d 1x1, ReLU) x (n - 1)]``,
multiplying by a time mask before every layer. :class:`CausalSubsampling` runs the same convolutions (NeMo's own
modules and calls, so the same arithmetic) and does the work between them in fewer passes: each ReLU with the masks
around it and the next ``CausalConv2D``'s zero padding is one :func:`~nemo_fastdecode.kernels.masked_relu.masked_relu_pad`,
and masks whose zeros the next masked ReLU would restore anyway are skipped. The output equals NeMo's ``self.conv(x, lengths)``.

``fuse_convolutions`` (the ``tf32x3`` streaming path, and bf16 compute with Triton, in fp32) goes further: each strided depthwise convolution runs with the
masked ReLU before it in one kernel (:func:`~nemo_fastdecode.kernels.masked_depthwise.masked_depthwise_conv`), the
first one with the first convolution too, so the largest activation ``[B, C, T/2, F/2]`` is never stored. Its sums
run in another order than cuDNN's: equal to NeMo's output to fp32 rounding, not bit for bit.

The flattening and the output Linear are left to the caller, which keeps only the frames it needs before the GEMM.
"""

from __future__ import annotations

import torch
from nemo.collections.asr.parts.submodules.causal_convs import CausalConv2D
from nemo.collections.asr.parts.submodules.subsampling import ConvSubsampling, calculate_conv_output_size

from nemo_fastdecode.kernels.masked_depthwise import FirstConv, masked_depthwise_conv
from nemo_fastdecode.kernels.masked_relu import masked_relu_pad, masked_relu_pad_reference

__all__ = ["CausalSubsampling"]


class CausalSubsampling:
    """The convolutions of a causal ``dw_striding`` ``ConvSubsampling``: ``__call__(x [B, T, F], lengths [B])``.

    Build it with :meth:`from_module`, which returns ``None`` for any other subsampling (callers then run NeMo's
    module). ``use_triton``: the fused elementwise kernel (CUDA, or ``TRITON_INTERPRET=1``) or its torch reference.
    ``max_frames``: the most input frames a row can have; with it, each stage's output lengths come from a table
    computed once (NeMo's float arithmetic, exact on these small integers) by one gather per step, instead of five
    small kernels per stage. ``fuse_convolutions`` (needs ``use_triton``): the depthwise convolutions with their
    masked ReLUs (and the first convolution) in one kernel each.
    """

    def __init__(
        self,
        pre_encode: ConvSubsampling,
        use_triton: bool,
        max_frames: int | None = None,
        fuse_convolutions: bool = False,
    ):
        self.pre_encode = pre_encode
        self.stages = _stages(pre_encode)
        if self.stages is None:
            raise ValueError("not a causal dw_striding ConvSubsampling; use CausalSubsampling.from_module")
        if fuse_convolutions and not use_triton:
            raise ValueError("fuse_convolutions=True runs Triton kernels: it needs use_triton=True")
        # fusing needs NeMo's usual shapes (checked, not assumed); any other layout keeps the per-layer path
        self.fuse_convolutions = fuse_convolutions and _fusable(*self.stages)
        self.relu_pad = masked_relu_pad if use_triton else masked_relu_pad_reference
        self.length_table = None
        if max_frames is not None:  # [max_frames + 1, stages]: row L holds every stage's output length for input L
            columns = self._stage_lengths(torch.arange(max_frames + 1, dtype=torch.float32))
            self.length_table = torch.stack(columns, dim=1).to(self.stages[0].weight.device)

    @classmethod
    def from_module(
        cls,
        pre_encode: torch.nn.Module,
        use_triton: bool,
        max_frames: int | None = None,
        fuse_convolutions: bool = False,
    ) -> CausalSubsampling | None:
        if _stages(pre_encode) is None:
            return None
        return cls(pre_encode, use_triton, max_frames, fuse_convolutions)

    def __call__(
        self, x: torch.Tensor, lengths: torch.Tensor, input_masked: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """NeMo's ``pre_encode.conv(x, lengths)``.

        Args:
            x: ``[B, T, F]`` float32 features (time before frequency, as ``ConvSubsampling`` passes them).
            lengths: ``[B]`` valid frames of each row (at most ``max_frames`` when given).
            input_masked: ``x`` is already zero from each row's length on (NeMo's first mask is then a no-op).

        Returns:
            ``(y [B, C, T', F'], lengths [B] int64)``: the last ReLU's output, masked past each row's length.
        """
        first, strided = self.stages
        if self.length_table is not None:
            stage_lengths = list(self.length_table.index_select(0, lengths.long()).unbind(1))
        else:
            stage_lengths = self._stage_lengths(lengths.float())
        if self.fuse_convolutions:
            return self._fused(x, lengths, stage_lengths)
        if not input_masked:
            x = x * _time_mask(lengths.float(), x.shape[1], x.dtype)[:, :, None]
        x = first(x.unsqueeze(1))  # CausalConv2D(1 -> C): pads its (small) input itself
        for (depthwise, pointwise), length in zip(strided, stage_lengths, strict=False):
            # ReLU (masked before and after) and the depthwise convolution's causal padding in one pass
            pads = depthwise._left_padding, depthwise._right_padding
            x = depthwise._conv_forward(self.relu_pad(x, length, pads, pads), depthwise.weight, depthwise.bias)
            # NeMo masks the 1x1 convolution's input too: no need, each output frame reads only its own input frame
            # and frames past the length are zeroed by the next masked ReLU
            x = pointwise(x)
        return self.relu_pad(x, stage_lengths[-1]), stage_lengths[-1]

    def _fused(
        self, x: torch.Tensor, lengths: torch.Tensor, stage_lengths: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``__call__`` with each (first conv,) masked ReLU and depthwise convolution in one kernel."""
        first_conv, strided = self.stages
        first = FirstConv(first_conv.weight, first_conv.bias, first_conv.stride[0], lengths.long())
        for (depthwise, pointwise), length in zip(strided, stage_lengths, strict=False):
            x = masked_depthwise_conv(x, length, depthwise.weight, depthwise.bias, depthwise.stride[0], first)
            x, first = pointwise(x), None
        return masked_relu_pad(x, stage_lengths[-1]), stage_lengths[-1]

    def _stage_lengths(self, lengths: torch.Tensor) -> list[torch.Tensor]:
        """Each strided stage's output lengths (int64) for float input ``lengths``, with NeMo's float arithmetic
        (``MaskedConvSequential`` tracks lengths in float)."""
        first, strided = self.stages
        stage_lengths = []
        for conv in [first] + [depthwise for depthwise, _ in strided]:
            lengths = _output_lengths(conv, lengths)
            stage_lengths.append(lengths.long())
        return stage_lengths


def _stages(pre_encode: torch.nn.Module):
    """``(first conv, [(depthwise, pointwise), ...])`` of a causal dw_striding subsampling with ReLUs, else None."""
    if not isinstance(pre_encode, ConvSubsampling) or pre_encode._subsampling != "dw_striding":
        return None
    if not (pre_encode.is_causal and pre_encode.conv2d_subsampling):
        return None
    layers = list(pre_encode.conv)
    if len(layers) < 2 or (len(layers) - 2) % 3 or not isinstance(layers[0], CausalConv2D):
        return None
    relus = [layers[1]] + layers[4::3]
    if not all(type(layer) is torch.nn.ReLU for layer in relus):
        return None
    strided = list(zip(layers[2::3], layers[3::3], strict=True))
    for depthwise, pointwise in strided:
        if not (isinstance(depthwise, CausalConv2D) and type(pointwise) is torch.nn.Conv2d):
            return None
        if pointwise.stride != (1, 1) or pointwise.padding != (0, 0):
            return None
    return layers[0], strided


def _fusable(first: CausalConv2D, strided: list) -> bool:
    """The layout :func:`masked_depthwise_conv` computes: a ``1 -> C`` first convolution, then depthwise ``C -> C``
    convolutions, all with biases and without dilation (at least one strided stage)."""
    channels = first.out_channels
    convs = [first] + [depthwise for depthwise, _ in strided]
    return (
        bool(strided)
        and first.in_channels == 1
        and all(c.bias is not None and c.dilation == (1, 1) and c.out_channels == channels for c in convs)
        and all(d.in_channels == d.groups == channels for d, _ in strided)
    )


def _output_lengths(conv: CausalConv2D, lengths: torch.Tensor) -> torch.Tensor:
    """NeMo's length update after a strided causal convolution (float lengths, as ``MaskedConvSequential``)."""
    if conv.stride == (1, 1):
        return lengths
    padding = (conv._left_padding, conv._right_padding)
    return calculate_conv_output_size(lengths, conv.kernel_size[0], conv.stride[0], padding)


def _time_mask(lengths: torch.Tensor, time: int, dtype: torch.dtype) -> torch.Tensor:
    """``[B, T]`` 1.0 where ``t < lengths.long()``, as ``MaskedConvSequential._create_mask``."""
    return (torch.arange(time, device=lengths.device)[None, :] < lengths.long()[:, None]).to(dtype)
