"""``nemo-fastdecode``: the console script. ``nemo-fastdecode serve ...`` / ``nemo-fastdecode loadtest ...``.

Options are ``key=value`` overrides of the command's dataclass config, over an optional YAML file
(:func:`~nemo_fastdecode.apps.options.parse_config`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]

USAGE = """usage: nemo-fastdecode COMMAND [--config FILE.yaml] [key=value ...]

commands:
  serve      the streaming ASR server (WebSocket, OpenAI Realtime transcription protocol); configs/serve.yaml
  loadtest   N concurrent clients streaming audio to a server, latency and exactness report; configs/loadtest.yaml
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "serve":
        from nemo_fastdecode.apps.serve import main as serve

        return serve(rest)
    if command == "loadtest":
        from nemo_fastdecode.apps.loadtest.app import main as loadtest

        return loadtest(rest)
    print(f"nemo-fastdecode: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
