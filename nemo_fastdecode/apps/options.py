"""Command-line options of the apps: ``key=value`` overrides of a dataclass config (OmegaConf's dot-list syntax, as
Hydra takes them: ``port=9000``, ``att_context_size=[70,1]``, ``limits.max_outgoing_events=64``), over an optional YAML
file (``--config configs/serve.yaml``). Unknown keys and bad values are errors that name them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

__all__ = ["parse_config"]

T = TypeVar("T")


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
