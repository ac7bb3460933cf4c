"""``nemo-fastdecode``: the console script. ``nemo-fastdecode serve ...`` / ``nemo-fastdecode loadtest ...``.

Options are ``key=value`` overrides of the command's dataclass config (OmegaConf's dot-list syntax, as Hydra takes
them: ``port=9000``, ``att_context_size=[70,1]``, ``limits.max_outgoing_events=64``), over an optional YAML file
(``--config configs/serve.yaml``). Unknown keys and bad values are errors that name them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

__all__ = ["main", "parse_config"]

T = TypeVar("T")

USAGE = """usage: nemo-fastdecode COMMAND [--config FILE.yaml] [key=value ...]

commands:
  serve      the streaming ASR server (WebSocket, OpenAI Realtime transcription protocol); configs/serve.yaml
  loadtest   N concurrent clients streaming audio to a server, latency and exactness report; configs/loadtest.yaml
"""


def parse_config(schema: type[T], argv: Sequence[str], prog: str) -> T:
    """``schema``'s defaults, then ``--config FILE`` (if given), then ``key=value`` overrides -> a ``schema`` object.

    Raises:
        SystemExit: ``--help`` (prints the defaults), or a bad key or value (names it).
    """
    args = list(argv)
    if any(a in ("-h", "--help") for a in args):
        print(f"usage: {prog} [--config FILE.yaml] [key=value ...]\n\ndefaults:\n")
        print(OmegaConf.to_yaml(OmegaConf.structured(schema)))
        raise SystemExit(0)
    layers = [OmegaConf.structured(schema)]
    if "--config" in args:
        at = args.index("--config")
        if at + 1 >= len(args):
            raise SystemExit(f"{prog}: --config needs a YAML file")
        layers.append(OmegaConf.load(args[at + 1]))
        del args[at : at + 2]
    bad = [a for a in args if "=" not in a]
    if bad:
        raise SystemExit(f"{prog}: options are key=value overrides, got {' '.join(bad)!r} (see --help)")
    try:
        layers.append(OmegaConf.from_dotlist(args))
        return OmegaConf.to_object(OmegaConf.merge(*layers))
    except (OmegaConfBaseException, ValueError) as error:
        raise SystemExit(f"{prog}: {error}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "serve":
        from nemo_fastdecode.tools.serve_cli import main as serve

        return serve(rest)
    if command == "loadtest":
        from nemo_fastdecode.tools.loadtest.app import main as loadtest

        return loadtest(rest)
    print(f"nemo-fastdecode: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
