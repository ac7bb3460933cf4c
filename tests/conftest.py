"""Shared fixtures: tiny random prediction/joint networks and encoder outputs, NeMo's baseline decoders."""

from __future__ import annotations

import os
import platform

# Triton's CPU interpreter computes tl.dot with numpy, i.e. OpenBLAS. Its Haswell/Zen SGEMM kernels round a row
# differently depending on where it sits in the block (remainder rows take another path), which a GPU's tensor
# cores never do and which the look-ahead's bit-exactness tests would catch. Its Sandy Bridge kernels (any x86-64
# CPU with AVX runs them) do not: pinned here (over any OPENBLAS_CORETYPE the machine sets, e.g. Haswell), before
# torch loads numpy and OpenBLAS reads this variable.
if platform.machine().lower() in ("x86_64", "amd64"):
    os.environ["OPENBLAS_CORETYPE"] = "Sandybridge"

import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # without a GPU, Triton kernels run in its CPU interpreter
from nemo.collections.asr.modules import RNNTDecoder, RNNTJoint, StatelessTransducerDecoder

import fastdecode_lab.models  # noqa: F401  (the lab's synthetic presets as model names: tiny-rnnt, ...)
import nemo_fastdecode  # noqa: F401  (registers the strategies)
from nemo_fastdecode.apps.streaming_reference import nemo_alone  # noqa: F401  (the streaming tests' reference)
from nemo_fastdecode.decode_call import true_fp32

VOCAB_SIZE = 12
ENCODER_DIM = 16
HIDDEN = 24
TDT_DURATIONS = [0, 1, 2, 3, 4]
# with max_symbols=None most random networks get stuck emitting forever (NeMo then never returns):
# (seed, blank shift) of one-layer networks whose greedy decoding always comes back to blank on the test inputs
GREEDY_UNBOUNDED_SAFE = {"rnnt": (3, 1.7), "tdt": (31, 0.6)}


def make_networks(
    tdt: bool = False,
    seed: int = 0,
    blank_bias: float = 0.0,
    pred_layers: int = 1,
    vocab_size: int = VOCAB_SIZE,
    context_size: int | None = None,
):
    """A random NeMo RNNTDecoder (LSTM) + RNNTJoint; ``blank_bias`` shifts the blank logit (+ more blanks).

    ``context_size``: a StatelessTransducerDecoder of that context instead of the LSTM (its state: the last
    ``context_size - 1`` labels).
    """
    torch.manual_seed(seed)
    if context_size is None:
        decoder = RNNTDecoder(
            prednet={"pred_hidden": HIDDEN, "pred_rnn_layers": pred_layers, "dropout": 0.0},
            vocab_size=vocab_size,
            blank_as_pad=True,
        )
    else:
        decoder = StatelessTransducerDecoder(
            prednet={"pred_hidden": HIDDEN, "dropout": 0.0}, vocab_size=vocab_size, context_size=context_size
        )
    joint = RNNTJoint(
        jointnet={
            "encoder_hidden": ENCODER_DIM,
            "pred_hidden": HIDDEN,
            "joint_hidden": HIDDEN,
            "activation": "relu",
            "dropout": 0.0,
        },
        num_classes=vocab_size,
        num_extra_outputs=len(TDT_DURATIONS) if tdt else 0,
    )
    with torch.no_grad():
        joint.joint_net[-1].bias[vocab_size] += blank_bias
    decoder.eval()
    joint.eval()
    return decoder, joint


def random_encoder_output(batch_size: int, max_time: int, seed: int = 0, lengths=None, device="cpu"):
    """``[B, D, T]`` random encoder output and ``[B]`` lengths (ragged unless given)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch_size, ENCODER_DIM, max_time, generator=generator)
    if lengths is None:
        lengths = torch.randint(1, max_time + 1, [batch_size], generator=generator)
        lengths[0] = max_time
    return x.to(device), torch.as_tensor(lengths, dtype=torch.long).to(device)


def calibrated_model(preset: str, audio, target_tokens_per_frame: float = 0.3) -> torch.nn.Module:
    """A synthetic model whose blank bias is calibrated on its own encoder outputs of ``audio``."""
    from fastdecode_lab import synthetic

    model = synthetic.build_synthetic_model(preset, seed=0)
    encoded, lengths = synthetic.encode(model, audio, batch_size=len(audio), device="cpu")
    synthetic.calibrate_blank_bias(model, encoded, lengths, target_tokens_per_frame)
    return model


def tiny_streaming_model(preset: str = "tiny-streaming"):
    """A tiny cache-aware model (random weights), blank bias calibrated to ~0.3 tokens per frame (CPU)."""
    from fastdecode_lab import synthetic

    model = synthetic.build_synthetic_model(preset, seed=0)
    audio = synthetic.synthetic_audio([2.0, 1.5], seed=7)
    encoded, lengths = synthetic.encode(model, audio, batch_size=2, device="cpu")
    synthetic.calibrate_blank_bias(model, encoded, lengths, 0.3, iterations=4, tolerance=0.05)
    return model


def whole_file_features(model, pcm) -> torch.Tensor:
    """``[feat_in, T]`` NeMo's features of one whole int16 stream (read as NeMo reads a 16-bit WAV file)."""
    import numpy as np

    device = next(model.parameters()).device
    signal = torch.from_numpy(pcm.astype(np.float32) / 32768)[None].to(device)
    with torch.inference_mode():
        length = torch.tensor([signal.shape[1]], device=device)
        feats, length = model.preprocessor(input_signal=signal, length=length)
    return feats[0, :, : int(length)]


def transcribe(model, audio, **kwargs):
    """``model.transcribe`` on ``audio`` (batch 2), its best hypotheses, the modules left in eval mode."""
    hyps = model.transcribe(audio, batch_size=2, verbose=False, **kwargs)
    model.eval()  # NeMo 3.0's transcribe leaves modules in train mode
    return hyps[0] if isinstance(hyps, tuple) else hyps


@pytest.fixture(scope="module")
def preprocessor():
    """The tiny cache-aware preset's preprocessor (normalize NA, NeMo's streaming settings; the joint's balancing is
    not needed for features), in eval mode."""
    from fastdecode_lab.synthetic import build_synthetic_model

    return build_synthetic_model("tiny-streaming", balance_joint=False).eval().preprocessor


@pytest.fixture(scope="module")
def single_thread():
    """Tiny models are dominated by per-op overhead: several threads on a busy 2-core CPU just spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def exact_fp32():
    """True fp32 GEMMs and cuDNN RNNs for a test (PyTorch lets cuDNN use TF32 by default), restored afterwards."""
    with true_fp32():
        yield


@pytest.fixture(autouse=True)
def restore_precision_flags():
    """Tests stay independent of their order: NeMo's pipeline builder sets the process's matmul precision (TF32 on
    CUDA and, through oneDNN, on the CPU) and never restores it."""
    try:
        saved = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    except RuntimeError:  # the process switched to the newer per-backend API; nothing of the legacy one to keep
        yield
        return
    yield
    try:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cudnn.allow_tf32 = saved[1]
    except RuntimeError:
        pass


@pytest.fixture
def networks():
    return make_networks


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
