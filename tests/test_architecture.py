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
