"""nemo-fastdecode: exact, fast transducer decoding strategies for NeMo.

Importing the package registers the strategies (``decoding.strategy: fast_greedy``) with NeMo, replaces NeMo's NVRTC
helper with one that does not overwrite CPython's shared ``b" "`` (:mod:`nemo_fastdecode.nemo.nvrtc`), pauses
the garbage collector while NeMo's decoders capture CUDA graphs (:mod:`nemo_fastdecode.nemo.captures`), and on a
GPU starts Triton's once-per-process set-up on a background thread (:mod:`nemo_fastdecode.kernels.warm_up`).
"""

from nemo_fastdecode.graphs import GraphMode
from nemo_fastdecode.kernels.warm_up import start_triton_warm_up
from nemo_fastdecode.logs import set_verbose
from nemo_fastdecode.nemo.captures import guard_nemo_captures
from nemo_fastdecode.nemo.nvrtc import guard_nemo_nvrtc
from nemo_fastdecode.nemo.registry import register, valid_strategies

register()
guard_nemo_nvrtc()
guard_nemo_captures()
start_triton_warm_up()

__version__ = "0.1.0"
__all__ = ["GraphMode", "register", "set_verbose", "valid_strategies", "__version__"]
