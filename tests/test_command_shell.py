"""`--command` runs as a container's `bash -c` runs it (issue 16): builtins, pipes, `&&`,
quoting; and SIGTERM still reaches the program (a simple command is exec'd by the shell)."""

from __future__ import annotations

from pathlib import Path

import pytest
from local_helpers import PYTHON, alive, home, hotswap, live_workers, wait_until, workloads  # noqa: F401 (home: a fixture)

from hotswap.backends.kubernetes.render.container import container_command, needs_shell


def _cluster(home: Path) -> None:
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v4-8", "--num-slices", "2", check=True)


def _create(home: Path, name: str, command: str, *flags: str) -> None:
    hotswap(home, "workload", "create", "--cluster", "c", "--workload", name, "--command", command, *flags, check=True)


def _ended(home: Path, name: str) -> dict:
    return wait_until(
        lambda: (r := workloads(home, "c").get(name)) and r["phase"] in ("SUCCESSFUL", "FAILED") and r,
        timeout=60,
        what=f"{name} to end",
    )


def _logs(home: Path, name: str) -> str:
    return hotswap(home, "workload", "logs", "--cluster", "c", "--workload", name, check=True).stdout


def test_builtins_pipes_and_quoting_work_as_in_bash_c(home: Path, tmp_path: Path) -> None:
    _cluster(home)
    _create(home, "exits", "exit 3", "--max-restarts", "0")
    _create(home, "piped", "echo 'two  words' | tr a-z A-Z && cd / && pwd")
    failed, done = _ended(home, "exits"), _ended(home, "piped")
    assert failed["phase"] == "FAILED" and "exit code 3" in failed["status_message"], failed
    assert done["phase"] == "SUCCESSFUL", done
    assert "TWO  WORDS\n/\n" in _logs(home, "piped")


def test_sigterm_reaches_the_program_of_a_simple_command(home: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "waits.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (open(os.environ['MARK'], 'w').close(), sys.exit(143)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    _cluster(home)
    _create(home, "simple", f"{PYTHON} {script}", "--env", f"MARK={marks / 'simple'}")
    worker = wait_until(lambda: live_workers(home, "c", "simple"), what="the worker")[0]
    wait_until(lambda: "ready" in _logs(home, "simple"), what="the program to start")
    # The shim's one child is the program itself: bash exec'd it.
    children = Path(f"/proc/{worker['pid']}/task/{worker['pid']}/children").read_text().split()
    assert len(children) == 1
    assert Path(f"/proc/{children[0]}/cmdline").read_bytes().split(b"\0")[1] == str(script).encode()
    hotswap(home, "workload", "delete", "--cluster", "c", "--workload", "simple", check=True)
    wait_until(lambda: (marks / "simple").exists(), what="the program to get SIGTERM")
    wait_until(lambda: not alive(int(children[0])), what="the program to exit")


@pytest.mark.parametrize(
    ("command", "shell"),
    [
        ("python3 train.py --lr 0.1", False),
        ("exit 1", True),
        ("cd /work && python3 train.py", True),
        ("source env.sh", True),
        ("FOO=1 python3 train.py", True),
        ("echo a | wc -l", True),
    ],
)
def test_kubernetes_runs_builtins_in_the_shell_and_execs_programs(command: str, shell: bool) -> None:
    assert needs_shell(command) is shell
    argv = container_command(command)
    assert argv[:2] == ["/bin/sh", "-c"]
    assert argv[2].endswith(command) if shell else argv[2].endswith('exec "$@"')
