"""Command-line options of the apps: ``key=value`` overrides of a dataclass config (OmegaConf's dot-list syntax, as
Hydra takes them: ``port=9000``, ``att_context_size=[70,1]``, ``limits.max_outgoing_events=64``), over an optional YAML
file (``--config configs/serve.yaml``). Unknown keys (with the closest valid ones) and bad
values are errors that name them; ``--help`` lists the options with their descriptions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nemo_fastdecode.apps.confighelp import format_options, unknown_key_message, unknown_keys

__all__ = ["parse_config"]

T = TypeVar("T")


def parse_config(schema: type[T], argv: Sequence[str], prog: str) -> T:
    """``schema``'s defaults, then ``--config FILE`` (if given), then ``key=value`` overrides -> a ``schema`` object.

    Raises:
        SystemExit: ``--help`` (prints each option's default and description), or a bad key (names it, with the
            closest valid keys) or value.
    """
    args = list(argv)
    if any(a in ("-h", "--help") for a in args):
        print(f"usage: {prog} [--config FILE.yaml] [key=value ...]\n\noptions (default, then description):")
        print(format_options(schema))
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
    for key, valid in unknown_keys(schema, [a.split("=", 1)[0] for a in args]):
        raise SystemExit(unknown_key_message(key, valid, prog))
    try:
        layers.append(OmegaConf.from_dotlist(args))
        return OmegaConf.to_object(OmegaConf.merge(*layers))
    except (OmegaConfBaseException, ValueError) as error:
        raise SystemExit(f"{prog}: {error}") from None
