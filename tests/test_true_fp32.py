"""``true_fp32`` under either of PyTorch's TF32 APIs (each case in a fresh process: once a process has set one API,
reading the other raises, so the cases cannot share one)."""

from __future__ import annotations

import subprocess
import sys

import pytest

LEGACY = """
import torch
from nemo_fastdecode.decode_call import true_fp32
torch.set_float32_matmul_precision("high")  # as NeMo's streaming pipelines do
torch.backends.cudnn.allow_tf32 = True
with true_fp32():
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "highest"  # oneDNN's CPU matmuls too
assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
assert torch.get_float32_matmul_precision() == "high"
print("ok")
"""

NEW_API = """
import torch
from nemo_fastdecode.decode_call import true_fp32
torch.backends.cuda.matmul.fp32_precision = "tf32"
torch.backends.cudnn.conv.fp32_precision = "tf32"
torch.backends.mkldnn.matmul.fp32_precision = "tf32"
with true_fp32():
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"
    assert torch.backends.mkldnn.matmul.fp32_precision == "ieee"  # the CPU's
    assert torch.backends.cudnn.conv.fp32_precision == torch.backends.cudnn.rnn.fp32_precision == "ieee"
assert torch.backends.cuda.matmul.fp32_precision == torch.backends.cudnn.conv.fp32_precision == "tf32"
assert torch.backends.mkldnn.matmul.fp32_precision == "tf32"
print("ok")
"""


@pytest.mark.parametrize("script", [LEGACY, NEW_API], ids=["legacy_allow_tf32", "fp32_precision"])
def test_true_fp32_turns_tf32_off_and_restores_it(script):
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
