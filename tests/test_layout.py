"""The repository's layout: the library under the apps, the lab outside the wheel, no circles in the import graph.

* ``nemo_fastdecode`` (the wheel) = the decode-time library + ``nemo_fastdecode.apps`` (console script, server app,
  transcription, load test). The library never imports the apps; nothing in the wheel imports ``fastdecode_lab``.
* Every import counts, function-level ones included: no module is part of an import circle, and the library's
  packages (``greedy``, ``streaming``, ``nemo``, ...) import each other one way only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tomllib

import nemo_fastdecode

ROOT = Path(nemo_fastdecode.__file__).parents[1]
WHEEL, LAB, APPS = "nemo_fastdecode", "fastdecode_lab", "nemo_fastdecode.apps"
# entry points (``python -m``) and the root package, which registers everything: they may import anything
ENTRY_POINTS = {"nemo_fastdecode", "nemo_fastdecode.__main__", "fastdecode_lab.__main__"}


def _imported_modules(source: str, package: str) -> list[str]:
    """Every module an ``import`` or ``from ... import`` in ``source`` names, relative imports resolved."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.append(module)
            names += [f"{module}.{alias.name}" for alias in node.names]  # `from package import module`
    return names


def _modules(top: str) -> dict[str, Path]:
    """``dotted name -> file`` of every module of the package ``top`` (a package is its ``__init__``)."""
    modules = {}
    for path in (ROOT / top).rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _import_graph(tops: tuple[str, ...] = (WHEEL, LAB)) -> dict[str, set[str]]:
    """``module -> modules of ``tops`` it imports`` (function-level and ``TYPE_CHECKING`` imports included)."""
    modules = {name: path for top in tops for name, path in _modules(top).items()}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        graph[name] = {m for m in _imported_modules(path.read_text(), package) if m in modules and m != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _library_unit(module: str) -> str:
    """The library package (or top-level module) a module belongs to: ``nemo_fastdecode.greedy.steps`` ->
    ``nemo_fastdecode.greedy``."""
    return ".".join(module.split(".")[:2])


def test_the_graph_has_modules_and_imports_to_check():
    graph = _import_graph()
    assert len(graph) > 150 and "nemo_fastdecode.nemo.registry" in graph and "fastdecode_lab.synthetic" in graph
    assert "nemo_fastdecode.greedy.label_loop" in graph["nemo_fastdecode.greedy.infer"]


def test_nothing_in_the_wheel_imports_the_lab():
    offenders = {
        module: sorted(i for i in imported if i.split(".")[0] == LAB)
        for module, imported in _import_graph((WHEEL, LAB)).items()
        if module.startswith(WHEEL) and any(i.split(".")[0] == LAB for i in imported)
    }
    assert not offenders, f"modules of the wheel importing the lab: {offenders}"


def test_the_library_never_imports_the_apps():
    offenders = {
        module: sorted(i for i in imported if i.startswith(APPS))
        for module, imported in _import_graph((WHEEL,)).items()
        if not module.startswith(APPS) and module not in ENTRY_POINTS and any(i.startswith(APPS) for i in imported)
    }
    assert not offenders, f"library modules importing the apps: {offenders}"


def test_no_module_is_part_of_an_import_circle():
    graph = {m: i for m, i in _import_graph().items() if m not in ENTRY_POINTS}
    assert _circles(graph) == []


def test_the_library_packages_import_each_other_one_way():
    graph: dict[str, set[str]] = {}
    for module, imported in _import_graph((WHEEL,)).items():
        if module in ENTRY_POINTS:
            continue
        unit = _library_unit(module)
        graph.setdefault(unit, set()).update(_library_unit(i) for i in imported if _library_unit(i) != unit)
    for unit in graph.values():
        unit.discard(WHEEL)  # `from nemo_fastdecode import x`: counted through x itself
    assert {"nemo_fastdecode.greedy", "nemo_fastdecode.streaming", "nemo_fastdecode.nemo"} <= set(graph)
    assert _circles(graph) == []


def test_the_checks_see_circles_and_every_import_form():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
    sources = {
        "import fastdecode_lab.synthetic": "fastdecode_lab.synthetic",
        "from ..apps import models": "nemo_fastdecode.apps.models",
        "from nemo_fastdecode import apps": "nemo_fastdecode.apps",
        "def f():\n    from . import geometry": "nemo_fastdecode.streaming.geometry",
    }
    for source, module in sources.items():
        assert module in _imported_modules(source, "nemo_fastdecode.streaming"), source


def test_the_wheel_ships_the_library_and_apps_only():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == [WHEEL]
    assert (ROOT / LAB / "__init__.py").is_file() and not (ROOT / WHEEL / LAB).exists()
    scripts = project["project"]["scripts"]
    assert all(target.startswith(APPS) for target in scripts.values()), scripts
