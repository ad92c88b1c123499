"""The code's shape, kept: no module past the size guide and no class past its guide without a
reason written at its top, and every module ``docs/architecture.md`` names exists (so the page
stays true when code moves)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "hotswap"
MAX_MODULE_LINES = 450
MAX_CLASS_LINES = 250
# A module or class over its guide says why at its top, in its docstring, on a line starting so.
REASON = "Size:"


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "static" not in p.parts)


def _has_reason(docstring: str | None) -> bool:
    return any(line.strip().startswith(REASON) for line in (docstring or "").splitlines())


def test_modules_and_classes_keep_to_the_size_guide_or_say_why() -> None:
    over = []
    for path in _modules():
        text = path.read_text()
        tree = ast.parse(text)
        module_reason = _has_reason(ast.get_docstring(tree))
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES and not module_reason:
            over.append(f"{path.relative_to(ROOT)}: {lines} lines")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_CLASS_LINES and not (_has_reason(ast.get_docstring(node)) or module_reason):
                    over.append(f"{path.relative_to(ROOT)}: class {node.name} {length} lines")
    assert not over, "over the size guide without a 'Size:' reason at the top:\n" + "\n".join(over)


def test_the_size_check_sees_a_long_module() -> None:
    """The check above reads real line counts: a synthetic long class is caught."""
    body = "class Big:\n" + "    x = 1\n" * (MAX_CLASS_LINES + 1)
    node = next(n for n in ast.walk(ast.parse(body)) if isinstance(n, ast.ClassDef))
    assert (node.end_lineno or 0) - node.lineno + 1 > MAX_CLASS_LINES
    assert _has_reason('"""Title.\n\nSize: a table of data."""'.strip('"'))


# Module paths in backquotes, written whole from src/hotswap (`backends/local/controller/enactment.py`,
# `core/`) or from the repository (`tests/...`, `benchmarks/...`); or dotted (`hotswap.core.actions`).
_PATH = re.compile(r"`([a-z_][a-z0-9_]*(?:/[a-z0-9_]+)*(?:\.py|\.sh|/))`")
_DOTTED = re.compile(r"`(hotswap(?:\.[a-z_][a-z0-9_]*)+)`")


def _dotted_exists(dotted: str) -> bool:
    """A module or package, or a name defined in one (``hotswap.core.actions.dispatch``)."""
    parts = dotted.split(".")[1:]
    for n in (len(parts), len(parts) - 1):
        if n > 0 and (SRC.joinpath(*parts[:n]).with_suffix(".py").exists() or SRC.joinpath(*parts[:n]).is_dir()):
            return True
    return False


def test_every_module_the_architecture_page_names_exists() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    named = _PATH.findall(page)
    missing = [p for p in named if not ((SRC / p).exists() or (ROOT / p).exists())]
    missing += [d for d in _DOTTED.findall(page) if not _dotted_exists(d)]
    assert len(named) > 50, "the page names modules by their whole path from src/hotswap"
    assert not missing, "docs/architecture.md names modules that do not exist: " + ", ".join(sorted(set(missing)))


def _is_module(dotted: str) -> bool:
    parts = dotted.split(".")[1:]
    return bool(parts) and (SRC.joinpath(*parts).with_suffix(".py").exists() or SRC.joinpath(*parts).is_dir())


def _private_names_imported(path: Path) -> list[str]:
    """Private names (``_x``, not dunders) this module takes from another hotswap module: by
    ``from m import _x``, or as ``alias._x`` of a module it imported."""
    tree = ast.parse(path.read_text())
    found, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hotswap"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{node.module}.{alias.name}")
                elif _is_module(f"{node.module}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("hotswap") and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
            and node.attr.startswith("_") and not node.attr.startswith("__")
        ):
            found.append(f"{modules[node.value.id]}.{node.attr}")
    return found


def test_no_module_takes_a_private_name_of_another() -> None:
    """A name starting with ``_`` is its module's own: a second module that needs it needs it
    public, in the module that is its one home."""
    taken = [f"{p.relative_to(ROOT)}: {name}" for p in _modules() for name in _private_names_imported(p)]
    assert not taken, "private names imported across modules:\n" + "\n".join(taken)


def test_the_private_name_check_sees_both_forms(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from hotswap.core import actions as act\nfrom hotswap.core.effects import _Effects\nact._private\n")
    assert _private_names_imported(module) == ["hotswap.core.effects._Effects", "hotswap.core.actions._private"]
