"""The decode-time library never imports the tools wing (synthetic models, benchmarks, simulations, apps)."""

from __future__ import annotations

import ast
from pathlib import Path

import nemo_fastdecode

PACKAGE = Path(nemo_fastdecode.__file__).parent
TOOLS = "nemo_fastdecode.tools"


def _package_of(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])


def _imported_modules(source: str, package: str) -> list[str]:
    """Every module an ``import`` or ``from ... import`` in ``source`` names, relative imports resolved."""
    tree = ast.parse(source)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.append(module)
            names += [f"{module}.{alias.name}" for alias in node.names]  # `from nemo_fastdecode import tools`
    return names


def _library_files() -> list[Path]:
    # `python -m` entry points (`__main__.py`) run the tools' CLIs; nothing imports them
    return [p for p in PACKAGE.rglob("*.py") if "tools" not in p.relative_to(PACKAGE).parts and p.name != "__main__.py"]


def test_the_library_has_modules_to_check():
    files = _library_files()
    assert len(files) > 20 and PACKAGE / "registry.py" in files and not any("tools" in str(p) for p in files)


def test_no_library_module_imports_the_tools():
    offenders = {
        str(path.relative_to(PACKAGE.parent)): name
        for path in _library_files()
        for name in _imported_modules(path.read_text(), _package_of(path))
        if name == TOOLS or name.startswith(TOOLS + ".")
    }
    assert not offenders, f"library modules importing the tools wing: {offenders}"


def test_the_check_sees_an_import_of_the_tools():
    # the scanner itself: absolute, relative and `from package import tools` forms are all seen
    sources = [
        "import nemo_fastdecode.tools.timing",
        "from ..tools import synthetic",
        "from nemo_fastdecode import tools",
    ]
    for source in sources:
        assert any(name.startswith(TOOLS) for name in _imported_modules(source, "nemo_fastdecode.streaming")), source
    assert not any(
        name.startswith(TOOLS) for name in _imported_modules("from . import geometry", "nemo_fastdecode.streaming")
    )
