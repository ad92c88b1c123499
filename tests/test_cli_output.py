"""Output for people and for scripts, through the real entry point: tables that never wrap a
cell (terminals of 60 and 200 columns, through a pty), plain aligned columns in a pipe, full flag
names in ``--help`` at 80 columns, ``workload list --watch`` and ``--wait``."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from local_helpers import cleanup, hotswap, live_workers, wait_until, workloads, write_sleeper

from hotswap.cli.app import app
from hotswap.cli.output import fit, plain_table

PYTHON = sys.executable
LONG_NAME = "a-rather-long-workload-name-for-tables"


@pytest.fixture(scope="module")
def listed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cluster with a running, a preempted and a finished workload."""
    tmp = tmp_path_factory.mktemp("listed")
    home = tmp / "state"
    sleeper = write_sleeper(tmp)
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v4-8", "--num-slices", "1", check=True)
    hotswap(home, "workload", "create", "--cluster", "c", "--workload", "done", "--command", sleeper,
            "--env", "RUN_FOR=0", "--env", "EXIT_CODE=0", "--wait", "--until", "finished", "--timeout", "120", check=True)
    hotswap(home, "workload", "create", "--cluster", "c", "--workload", "low", "--command", sleeper,
            "--priority", "low", "--wait", "--timeout", "120", check=True)
    hotswap(home, "workload", "create", "--cluster", "c", "--workload", LONG_NAME, "--command", sleeper,
            "--priority", "high", "--wait", "--timeout", "120", check=True)
    wait_until(lambda: workloads(home, "c")["low"]["phase"] == "QUEUED", what="low preempted")
    yield home
    cleanup(home)


def run_in_pty(home: Path, columns: int, *args: str) -> tuple[str, str]:
    """Run the CLI with stdout on a terminal of ``columns`` columns; return (stdout, stderr)."""
    leader, follower = pty.openpty()
    env = dict(os.environ, HOTSWAP_HOME=str(home), COLUMNS=str(columns), LINES="40", TERM="xterm")
    process = subprocess.Popen([PYTHON, "-m", "hotswap", *args], stdout=follower, stderr=subprocess.PIPE, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the other end closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    err = process.stderr.read().decode()  # type: ignore[union-attr]
    assert process.wait(timeout=60) == 0, err
    os.close(leader)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode())
    return text.replace("\r\n", "\n"), err


@pytest.mark.parametrize("columns", [60, 200])
def test_terminal_table_never_wraps_a_cell(listed: Path, columns: int) -> None:
    out, err = run_in_pty(listed, columns, "workload", "list", "--cluster", "c")
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 4, out  # header + one line per workload, nothing wrapped onto a second line
    assert all(len(line.rstrip()) <= columns for line in lines), out
    names = [line.split()[0] for line in lines[1:]]
    assert sorted(names) == sorted(["done", "low", LONG_NAME])  # names stay whole
    assert all(line.split()[1] in ("Admitted", "Evicted", "Finished") for line in lines[1:]) or columns == 200
    if columns == 60:
        assert "hidden at this width" in err and "Created Time" in err
    else:
        assert "Evicted" in out and "Created Time" in lines[0] and "hidden" not in err


def test_piped_list_commands_print_plain_aligned_columns(listed: Path) -> None:
    result = hotswap(listed, "workload", "list", "--cluster", "c", check=True)
    lines = result.stdout.splitlines()
    assert len(lines) == 4 and "│" not in result.stdout and "…" not in result.stdout
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"(?:(?<=   )|^)\S", header)]
    for line in lines[1:]:
        for start in starts:  # every cell starts under its header
            assert line[start] != " " and (start == 0 or line[start - 1] == " "), (header, line)
    fields = {line.split()[0]: line.split() for line in lines[1:]}
    assert fields["low"][6] == "Evicted" and fields[LONG_NAME][6] == "Admitted" and fields["done"][6] == "Finished"
    assert "Preempted to accommodate a higher priority Workload" in result.stdout
    assert "JobSet finished successfully" in result.stdout
    for args in (("cluster", "list"), ("node", "list", "--cluster", "c")):
        out = hotswap(listed, *args, check=True).stdout.splitlines()
        assert len({len(line.split()) for line in out[1:]}) == 1 and not any("  " == line[:2] for line in out), out


def test_json_grows_xpk_words_and_keeps_the_contract(listed: Path) -> None:
    rows = {r["name"]: r for r in json.loads(hotswap(listed, "workload", "list", "--cluster", "c", "-o", "json", check=True).stdout)}
    contract = {"name", "priority", "status", "status_message", "status_time", "created_time", "slices", "num_slices", "restarts", "preemptions"}
    assert all(contract <= set(r) for r in rows.values())
    assert (rows["low"]["status"], rows["low"]["xpk_status"], rows["low"]["hotswap_state"]) == ("QUEUED", "Evicted", "QUEUED (preempted)")
    assert (rows["done"]["status"], rows["done"]["xpk_status_message"]) == ("SUCCESSFUL", "JobSet finished successfully")
    contains = json.loads(hotswap(listed, "workload", "list", "--cluster", "c", "-o", "json", "--filter-by-job", "long", check=True).stdout)
    assert [r["name"] for r in contains] == [LONG_NAME]  # xpk: the name contains it, not only starts with it
    queued = json.loads(hotswap(listed, "workload", "list", "--cluster", "c", "-o", "json", "--filter-by-status", "queued", check=True).stdout)
    assert [r["name"] for r in queued] == ["low"]


def test_watch_prints_a_block_only_on_change(listed: Path, tmp_path: Path) -> None:
    env = dict(os.environ, HOTSWAP_HOME=str(listed))
    out = tmp_path / "watch.txt"
    with out.open("w") as sink:
        process = subprocess.Popen(
            [PYTHON, "-m", "hotswap", "workload", "list", "--cluster", "c", "--watch", "--interval", "0.2", "-o", "json"],
            stdout=sink, stderr=subprocess.PIPE, env=env,
        )
        try:
            wait_until(lambda: out.read_text().count("\n") >= 1, timeout=60, what="first document")
            time.sleep(1.0)  # several looks, nothing changed
            assert out.read_text().count("\n") == 1
            hotswap(listed, "workload", "delete", "--cluster", "c", "--workload", "done", check=True)
            wait_until(lambda: out.read_text().count("\n") >= 2, timeout=60, what="a second document after a change")
        finally:
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=60) == 0  # Ctrl-C is how a watch ends
    documents = [json.loads(line) for line in out.read_text().splitlines()]
    assert "done" in {r["name"] for r in documents[0]} and "done" not in {r["name"] for r in documents[-1]}
    assert all(a != b for a, b in zip(documents, documents[1:]))


def test_wait_times_out_and_a_failure_exits_125(tmp_path: Path) -> None:
    home = tmp_path / "state"
    sleeper = write_sleeper(tmp_path)
    try:
        hotswap(home, "cluster", "create", "--cluster", "w", "--device-type", "v4-8", "--num-slices", "1", check=True)
        hotswap(home, "workload", "create", "--cluster", "w", "--workload", "holder", "--command", sleeper, "--wait", check=True)
        blocked = hotswap(home, "workload", "create", "--cluster", "w", "--workload", "blocked", "--command", sleeper,
                          "--wait", "--timeout", "1")
        assert blocked.returncode == 124 and blocked.stderr.strip().splitlines()[-1].startswith("error: timed out after 1s"), blocked.stderr
        assert "waiting for workload blocked to be running: QUEUED" in blocked.stderr
        assert workloads(home, "w")["blocked"]["phase"] == "QUEUED"  # created; only the waiting stopped
        deleted = hotswap(home, "workload", "delete", "--cluster", "w", "--workload", "holder", "--wait", "--timeout", "90")
        assert deleted.returncode == 0 and "workload holder is gone" in deleted.stderr, deleted.stderr
        assert not live_workers(home, "w", "holder")
        hotswap(home, "workload", "delete", "--cluster", "w", "--workload", "blocked", "--wait", "--timeout", "90", check=True)
        failing = hotswap(home, "workload", "create", "--cluster", "w", "--workload", "failing", "--command", sleeper,
                          "--env", "RUN_FOR=0", "--env", "EXIT_CODE=3", "--wait", "--until", "finished", "--timeout", "90")
        assert failing.returncode == 125 and "error: workload failing failed" in failing.stderr, failing.stderr
        bad = hotswap(home, "workload", "create", "--cluster", "w", "--workload", "x", "--command", "true", "--wait", "--timeout", "0")
        assert bad.returncode == 2 and "x" not in workloads(home, "w")  # refused before anything changed
    finally:
        cleanup(home)


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    if hasattr(command, "commands"):  # a group (typer may carry its own copy of click)
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))


def test_help_shows_full_flag_names_at_80_columns(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    checked = 0
    for path, command in _commands(typer.main.get_command(app)):
        from hotswap.cli.app import run

        assert run([*path, "--help"]) == 0
        text = capsys.readouterr().out
        assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80, (path, text)
        for param in command.params:
            for flag in param.opts if param.param_type_name == "option" else ():
                assert re.search(rf"(^|[\s,]){re.escape(flag)}([\s,=]|$)", text, re.M), (path, flag)
        checked += 1
    assert checked > 20


def test_fit_cuts_free_text_before_hiding_columns() -> None:
    columns = ["Name", "Status", "Status Message"]
    rows = [["job", "Evicted", "Preempted to accommodate a higher priority Workload"]]
    wide = fit(columns, rows, 200)
    assert wide.hidden == () and wide.widths == (4, 7, 51)
    narrow = fit(columns, rows, 40)
    assert narrow.hidden == () and narrow.widths[:2] == (4, 7) and sum(narrow.widths) + 4 <= 40
    tiny = fit(columns, rows, 20)
    assert tiny.names == ("Name", "Status") and tiny.hidden == ("Status Message",)
    assert plain_table(columns, [["job", "", None]]).splitlines()[1].split() == ["job", "<none>", "<none>"]


def test_watch_on_a_terminal_redraws_in_place(listed: Path) -> None:
    leader, follower = pty.openpty()
    env = dict(os.environ, HOTSWAP_HOME=str(listed), COLUMNS="200", LINES="40", TERM="xterm")
    process = subprocess.Popen([PYTHON, "-m", "hotswap", "workload", "list", "--cluster", "c", "--watch", "--interval", "0.2"],
                               stdout=follower, stderr=subprocess.PIPE, env=env)
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        # The header and the rows may come in separate reads: read until both are there.
        while not (b"Hotswap State" in seen and LONG_NAME.encode() in seen) and time.monotonic() < deadline:
            seen += os.read(leader, 65536)
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        os.close(leader)
    assert b"Hotswap State" in seen and LONG_NAME.encode() in seen
