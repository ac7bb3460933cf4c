"""nemo-fastdecode: exact, fast transducer decoding strategies for NeMo.

Importing the package registers the strategies (``decoding.strategy: fast_greedy``) with NeMo.
"""

from nemo_fastdecode.graphs import GraphMode
from nemo_fastdecode.logs import set_verbose
from nemo_fastdecode.registry import register, valid_strategies

register()

__version__ = "0.1.0"
__all__ = ["GraphMode", "register", "set_verbose", "valid_strategies", "__version__"]
