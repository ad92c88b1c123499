"""The layers of DESIGN.md, enforced: import-linter contracts from pyproject.toml, plus the
start-up cost of the CLI (heavy libraries are imported only where they are used)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def _import_cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative), each
    sorted: every one is at least one import cycle."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(imports):
        if root in order:
            continue
        work = [(root, iter(sorted(imports[root])))]
        order[root] = low[root] = len(order)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, successors = work[-1]
            for successor in successors:
                if successor not in order:
                    order[successor] = low[successor] = len(order)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(imports[successor]))))
                    break
                if successor in on_stack:
                    low[module] = min(low[module], order[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == order[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def test_no_import_cycles_even_through_type_checking_imports() -> None:
    """A cycle, even one closed only by an ``if TYPE_CHECKING:`` import, means two modules
    cannot be understood (or moved) apart: the shared type belongs in the lower one."""
    import grimp

    graph = grimp.build_graph("hotswap", exclude_type_checking_imports=False, cache_dir=None)
    imports = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    cycles = _import_cycles(imports)
    assert not cycles, "import cycles among hotswap's modules:\n" + "\n".join(
        " <-> ".join(cycle) for cycle in cycles
    )
