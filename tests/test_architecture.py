"""The layers of DESIGN.md, enforced: import-linter contracts from pyproject.toml (the one that
forbids import cycles shown to break on a throwaway package's cycle, and the one kind of cycle it
cannot see checked here with grimp), plus the start-up cost of the CLI (heavy libraries are
imported only where they are used)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
from local_helpers import home, hotswap  # noqa: F401 (home is a fixture)

ROOT = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_are_kept() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports())"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" not in result.stdout.split("Contracts:")[-1].split(",")[0]
    assert "0 broken" in result.stdout


def test_cli_help_imports_no_heavy_library() -> None:
    """``hotswap --help`` must not pay for the simulator, matplotlib, torch or kubernetes."""
    probe = (
        "import sys, io, contextlib\n"
        "from hotswap.cli import app\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    sys.argv = ['hotswap', '--help']; app.main()\n"
        "heavy = [m for m in ('matplotlib', 'torch', 'kubernetes', 'numpy', 'hotswap.sim.simulation',"
        " 'hotswap.core.scheduler') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


def test_workload_list_reads_without_pydantic_or_heavy_libraries(home: Path) -> None:
    """``workload list`` is what people and scripts run most: it reads the store and loads no
    pydantic (~60 ms; typer >= 0.29 loads it for every option, hence the pin), the core's
    scheduler, or any heavy library."""
    hotswap(home, "cluster", "create", "--cluster", "reads", "--device-type", "v4-8", "--num-slices", "1", check=True)
    hotswap(home, "workload", "create", "--cluster", "reads", "--workload", "job", "--command", "sleep 60", check=True)
    probe = (
        "import sys, io, contextlib\n"
        "from hotswap.cli import app\n"
        "for argv in (['workload', 'list', '--cluster', 'reads'], ['workload', 'list', '--cluster', 'reads', '-o', 'json']):\n"
        "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "        sys.argv = ['hotswap', *argv]; app.main()\n"
        "    assert 'job' in out.getvalue(), out.getvalue()\n"
        "heavy = [m for m in ('pydantic', 'matplotlib', 'torch', 'kubernetes', 'numpy', 'hotswap.core.scheduler')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env={**os.environ, "HOTSWAP_HOME": str(home)}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def _write_package(root: Path, files: dict[str, str]) -> Path:
    """A throwaway package under ``root`` (each file's path and text); ``root`` returned."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_cycle_contract_breaks_on_a_cycle_closed_only_by_a_type_checking_import(tmp_path: Path) -> None:
    """pyproject.toml's ``no-import-cycles`` contract, with that file's settings unchanged (the
    throwaway package is named hotswap for them), on two modules that import each other, one of
    them only for type checking."""
    cycle = {
        "hotswap/__init__.py": "",
        "hotswap/blue.py": "from hotswap.green import GREEN\n\nBLUE = GREEN\n",
        "hotswap/green.py": "from typing import TYPE_CHECKING\n\nGREEN = 1\nif TYPE_CHECKING:\n    from hotswap.blue import BLUE\n",
    }
    _write_package(tmp_path, cycle)
    call = f"lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, limit_to_contracts=('no-import-cycles',), no_cache=True)"
    result = subprocess.run(
        [sys.executable, "-c", f"import sys; from importlinter.cli import lint_imports; sys.exit({call})"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Contracts: 0 kept, 1 broken." in result.stdout
    assert "No cycles are allowed in hotswap." in result.stdout


def _cycles_through_a_package_and_its_own_modules(graph: grimp.ImportGraph) -> list[str]:
    """The acyclic_siblings contract compares the children of each package with each other,
    never with the package's own ``__init__``: a cycle of a package with modules under it only
    (``hotswap.train`` imports ``hotswap.train.data``, which would import ``hotswap.train``) is
    the one kind it cannot see."""
    return sorted(
        f"{package} -> {module} -> ... -> {package}"
        for package in graph.modules
        for module in graph.find_modules_directly_imported_by(package)
        if module.startswith(f"{package}.") and graph.chain_exists(importer=module, imported=package)
    )


def test_no_package_is_in_a_cycle_with_its_own_modules_even_through_type_checking_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the cycle contract leaves to this test: first shown to catch such a cycle (closed
    by a ``TYPE_CHECKING`` import) in a throwaway package, then held for hotswap."""
    cycle = {
        "throwaway/__init__.py": "",
        "throwaway/red/__init__.py": "from throwaway.red.yellow import YELLOW\n",
        "throwaway/red/yellow.py": "from typing import TYPE_CHECKING\n\nYELLOW = 1\nif TYPE_CHECKING:\n    import throwaway.red\n",
    }
    monkeypatch.syspath_prepend(str(_write_package(tmp_path, cycle)))
    throwaway = grimp.build_graph("throwaway", exclude_type_checking_imports=False, cache_dir=None)
    assert _cycles_through_a_package_and_its_own_modules(throwaway) == [
        "throwaway.red -> throwaway.red.yellow -> ... -> throwaway.red"
    ]
    graph = grimp.build_graph("hotswap", exclude_type_checking_imports=False, cache_dir=None)
    assert _cycles_through_a_package_and_its_own_modules(graph) == []
