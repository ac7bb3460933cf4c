"""nemo-fastdecode: exact, fast transducer decoding strategies for NeMo.

Importing the package registers the strategies (``decoding.strategy: fast_greedy``) with NeMo and applies our other
patches to NeMo (:data:`nemo_fastdecode.nemo.PATCHES`: NeMo's NVRTC helper without its write into CPython's shared
``b" "``, the collector paused while NeMo's decoders capture CUDA graphs, portable ``.nemo`` saves, ...), nothing
else. Work that only a decode needs starts when it is needed: Triton's once-per-process set-up, for instance, on a
background thread when one of our strategies or the streaming engine is first built where a GPU is present
(:mod:`nemo_fastdecode.kernels.warm_up`).
"""

from nemo_fastdecode.graphs import GraphMode
from nemo_fastdecode.logs import set_verbose
from nemo_fastdecode.nemo.registry import register, valid_strategies

register()

__version__ = "0.1.0"
__all__ = ["GraphMode", "register", "set_verbose", "valid_strategies", "__version__"]
