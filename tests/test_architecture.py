"""The layers of DESIGN.md, enforced: import-linter contracts from pyproject.toml, plus the
start-up cost of the CLI (heavy libraries are imported only where they are used)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
