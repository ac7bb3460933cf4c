"""Help texts and unknown-key errors of the apps' options, from their dataclass configs.

* :func:`attribute_docs` / :func:`format_options` -- each option with its default and the description of the
  dataclass docstring's ``Attributes:`` section (Google style): the ``--help`` of ``nemo-fastdecode serve`` /
  ``loadtest`` and of the Hydra scripts.
* :func:`unknown_key_message` -- a misspelled key: the closest valid keys (``difflib``) and every valid one.
* :func:`check_hydra_argv` -- run before a Hydra script's ``hydra_runner``: ``--help`` printed from the config's
  docstring, and an unknown key stopped with that message instead of Hydra's "Key 'x' is not in struct" traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

__all__ = ["attribute_docs", "check_hydra_argv", "format_options", "unknown_key_message", "unknown_keys"]

_ATTRIBUTE = re.compile(r"^(?P<names>[A-Za-z_][\w]*(?:\s*,\s*[A-Za-z_][\w]*)*)\s*:\s*(?P<text>.*)$")


def _plain(text: str) -> str:
    """reStructuredText roles and literals as plain text: ``:class:`~a.B``` -> ``B``, ````x```` -> ``x``."""
    text = re.sub(r":\w+:`~?([^`]*)`", lambda m: m.group(1).rsplit(".", 1)[-1], text)
    return re.sub(r"``([^`]*)``", r"\1", text)


def attribute_docs(schema: type) -> dict[str, str]:
    """``{option: description}`` from the ``Attributes:`` section of ``schema``'s docstring (Google style; an entry
    may name several options, ``a, b, c: as ...``; continuation lines are indented deeper)."""
    doc = inspect.cleandoc(schema.__doc__ or "")
    lines = doc.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
    except StopIteration:
        return {}
    docs: dict[str, str] = {}
    current: list[str] = []
    base_indent = None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if base_indent is None:
            base_indent = indent
        if indent < base_indent:  # the section ended
            break
        match = _ATTRIBUTE.match(line.strip()) if indent == base_indent else None
        if match:
            current = [n.strip() for n in match.group("names").split(",")]
            for name in current:
                docs[name] = match.group("text").strip()
        else:
            for name in current:
                docs[name] = f"{docs[name]} {line.strip()}".strip()
    return {name: _plain(text) for name, text in docs.items()}


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return "???"


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if dataclasses.is_dataclass(value):
        return "(section)"
    return str(value)


def format_options(schema: type, width: int = 100, prefix: str = "") -> str:
    """Each option of ``schema`` (a dataclass) with its default and description, nested sections as
    ``section.option``."""
    docs = attribute_docs(schema)
    blocks = []
    for field in dataclasses.fields(schema):
        default = _default(field)
        name = f"{prefix}{field.name}"
        blocks.append(f"  {name}={_shown(default)}")
        if docs.get(field.name):
            blocks.append(textwrap.fill(docs[field.name], width, initial_indent=" " * 6, subsequent_indent=" " * 6))
        if dataclasses.is_dataclass(default):
            blocks.append(format_options(type(default), width, prefix=f"{name}."))
    return "\n".join(blocks)


def _fields(schema: type) -> dict[str, Any]:
    """``{name: default}`` of a dataclass's fields."""
    return {f.name: _default(f) for f in dataclasses.fields(schema)}


def unknown_key_message(key: str, valid: Sequence[str], prog: str) -> str:
    """``prog: unknown option 'x'; did you mean 'y'? Valid options: ...``."""
    leaves = {name.rsplit(".", 1)[-1]: name for name in valid}
    close = [leaves[c] for c in difflib.get_close_matches(key.rsplit(".", 1)[-1], list(leaves), n=3, cutoff=0.6)]
    suggestion = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else "."
    return (
        f"{prog}: unknown option {key!r}{suggestion}\nValid options{' here' if '.' in key else ''}: "
        f"{', '.join(valid)} (see --help)"
    )


def unknown_keys(schema: type, keys: Sequence[str], open_sections: Sequence[str] = ()) -> list[tuple[str, list[str]]]:
    """``(key, valid keys at the level where it went wrong)`` of each dotted ``key`` that ``schema`` (a dataclass,
    nested dataclasses as sections) does not have; keys under ``open_sections`` (free-form sections) are not
    checked below the section's name."""
    bad = []
    for key in keys:
        node: Any = schema
        parts = key.split(".")
        for depth, part in enumerate(parts):
            fields = _fields(node)
            if part not in fields:
                parent = "".join(f"{p}." for p in parts[:depth])
                bad.append((key, [f"{parent}{name}" for name in fields]))
                break
            if ".".join(parts[: depth + 1]) in open_sections or not dataclasses.is_dataclass(fields[part]):
                break
            node = type(fields[part])
    return bad


#: Hydra's command-line flags that take a value (the next argument)
_HYDRA_FLAGS_WITH_VALUE = (
    "--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd", "--cfg", "-c", "--package", "-p",
    "--experimental-rerun",
)  # fmt: skip


def check_hydra_argv(
    schema: type, prog: str, argv: Sequence[str] | None = None, open_sections: Sequence[str] = ("decoding",)
) -> None:
    """Before ``hydra_runner`` parses ``argv`` (``sys.argv[1:]``): ``--help`` / ``-h`` prints ``schema``'s options
    with their descriptions and defaults and exits; an override of an unknown key exits with
    :func:`unknown_key_message` (Hydra's own error would be a traceback without a suggestion). Hydra's flags,
    ``hydra.*`` overrides and keys under ``open_sections`` (passed through to NeMo) are left to Hydra.

    Raises:
        SystemExit: after ``--help`` (0), or naming an unknown key (2).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(
            f"usage: {prog} [key=value ...]  (Hydra overrides; --hydra-help for Hydra's own flags)\n\n"
            f"{_plain(inspect.cleandoc(schema.__doc__ or '').splitlines()[0])}\n\noptions (default, then description):\n"
            f"{format_options(schema)}"
        )
        raise SystemExit(0)
    keys = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg.startswith("-"):
            skip = arg in _HYDRA_FLAGS_WITH_VALUE
            continue
        key = arg.split("=", 1)[0].lstrip("+~")
        if key and not key.startswith("hydra.") and key != "hydra":
            keys.append(key.split("@", 1)[0])
    for key, valid in unknown_keys(schema, keys, open_sections):
        print(unknown_key_message(key, valid, prog), file=sys.stderr)
        raise SystemExit(2)
