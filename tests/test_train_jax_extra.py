"""The JAX extra as a user meets it: without JAX, ``hotswap.train.jax`` names the extra to
install on first use (checked in a spawned Python that has JAX hidden) and the JAX drills say so
in one line (the CLI run in this process, JAX hidden from ``find_spec``); with JAX, the hotswap
drill, which trains PyTorch jobs, is refused for ``--framework jax`` (in this process)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from hotswap.cli.app import main
from jax_helpers import ROOT


def test_without_jax_the_sdk_names_the_extra_to_install() -> None:
    probe = (
        "import sys\n"
        "sys.modules.update(jax=None, orbax=None)\n"  # as if not installed
        "import hotswap.train.jax as hj\n"
        "try:\n"
        "    hj.init\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}
    )
    assert result.stdout.strip() == "hotswap.train.jax needs JAX and orbax: pip install 'hotswap[jax]'"


def hotswap(args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run the CLI in this process; its exit code and stderr."""
    monkeypatch.setattr(sys, "argv", ["hotswap", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    return int(exited.value.code or 0), capsys.readouterr().err


def test_without_jax_the_jax_drills_say_what_to_install_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    hidden = ("jax", "orbax")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.split(".")[0] in hidden else real(name, *a))
    code, errors = hotswap(["demo", "elastic", "--framework", "jax"], monkeypatch, capsys)
    assert code != 0
    [line] = errors.strip().splitlines()
    assert "pip install 'hotswap[jax]'" in line


def test_the_shrink_drill_is_not_offered_for_jax(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec("jax") is None:
        pytest.skip("JAX is not installed: the missing extra is reported first")
    code, errors = hotswap(["demo", "shrink", "--framework", "jax"], monkeypatch, capsys)
    assert code != 0
    assert errors.strip() == "error: --framework jax runs the elastic, hotswap, migration drills; the shrink drill trains PyTorch jobs"
