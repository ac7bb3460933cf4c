"""``nemo-fastdecode serve`` / ``python -m nemo_fastdecode serve``: load the model, build the engine, serve.

The model: the shipped trained model (``trained-streaming``, the default; English), a ``.nemo`` checkpoint, a pretrained
name, or a synthetic preset (``tiny-streaming``: random weights, so its transcripts are gibberish; a banner says so).
Everything else: :class:`~nemo_fastdecode.serve.ServeConfig`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from nemo_fastdecode.apps.models import inference_device, load_model, model_banner
from nemo_fastdecode.apps.options import parse_config
from nemo_fastdecode.serve import REALTIME_PATH, RealtimeServer, ServeConfig, build_engines

__all__ = ["main", "serve"]


def serve(config: ServeConfig) -> None:
    """Load ``config.model`` and serve until SIGTERM / SIGINT (then a graceful shutdown)."""
    device = inference_device(config.cuda)
    model = load_model(config.model, device=device, seed=config.seed)
    banner = model_banner(config.model, model)
    if banner is not None:
        print(banner, flush=True)
    server = RealtimeServer(build_engines(model, config), config, model_name=config.model)

    def announce(server: RealtimeServer) -> None:
        # one line a supervisor (or a test) can wait for; port=0 shows the port picked
        workers = f", {config.network_workers} network workers" if config.network_workers else ""
        sizes = server.look_aheads.sizes
        slots = (
            f"{config.slots} slots"
            if len(sizes) == 1
            else f"{config.slots} slots per look-ahead {[list(s) for s in sizes]}"
        )
        print(
            f"nemo-fastdecode serve: ready on ws://{config.host}:{server.port}{REALTIME_PATH} "
            f"({slots}, {device}{workers}); /health /ready /metrics on the same port",
            flush=True,
        )

    asyncio.run(server.run(on_ready=announce))


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("websockets.server").setLevel(logging.WARNING)  # not a line per connection opened and closed
    serve(parse_config(ServeConfig, list(argv or []), "nemo-fastdecode serve"))
    return 0
