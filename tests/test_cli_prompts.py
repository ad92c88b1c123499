"""Destructive prompts (issue 16): a shrink and a cluster delete that stops work list what they
affect; declining exits 0 with nothing changed; `--force` skips the question; without a
terminal to ask on, the command refuses in one line instead of hanging. Through the real entry
point, on a pseudo-terminal where a person would answer."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from local_helpers import PYTHON, home, hotswap, wait_until, workloads, write_sleeper  # noqa: F401 (home: a fixture)


def _on_terminal(home: Path, answer: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI with a terminal as stdin, typing ``answer``."""
    controller, terminal = os.openpty()
    try:
        os.write(controller, f"{answer}\n".encode())
        return subprocess.run(
            [PYTHON, "-m", "hotswap", *args], stdin=terminal, capture_output=True, text=True, timeout=120,
            env=dict(os.environ, HOTSWAP_HOME=str(home)),
        )
    finally:
        os.close(terminal)
        os.close(controller)


def _slices(home: Path) -> list[str]:
    nodes = json.loads(hotswap(home, "node", "list", "--cluster", "c", "-o", "json", check=True).stdout)
    return sorted({n["slice"] for n in nodes})


@pytest.fixture
def busy(home: Path, tmp_path: Path) -> Path:
    """Cluster c: 3 slices, workload job running on 2 of them."""
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v4-8", "--num-slices", "3", check=True)
    hotswap(home, "workload", "create", "--cluster", "c", "--workload", "job", "--num-slices", "2",
            "--command", write_sleeper(tmp_path), check=True)
    wait_until(lambda: workloads(home, "c").get("job", {}).get("phase") == "RUNNING", what="job running")
    return home


SHRINK = ("cluster", "create", "--cluster", "c", "--device-type", "v4-8", "--num-slices", "1")


def test_declining_a_shrink_lists_what_it_affects_and_changes_nothing(busy: Path) -> None:
    held = workloads(busy, "c")["job"]["slices"]
    declined = _on_terminal(busy, "n", *SHRINK)
    assert declined.returncode == 0, declined.stderr
    assert "shrink cluster c from 3 to 1 slices?" in declined.stderr
    assert "(free)" in declined.stderr  # the free slice goes first...
    assert any(f"remove slice {s}: workload job runs there" in declined.stderr for s in held)  # ...then one of job's
    assert "cluster c left at 3 slices; nothing changed" in declined.stderr and "error" not in declined.stderr
    assert len(_slices(busy)) == 3 and workloads(busy, "c")["job"]["phase"] == "RUNNING"


def test_a_shrink_without_a_terminal_refuses_in_one_line_and_force_skips_the_question(busy: Path) -> None:
    refused = hotswap(busy, *SHRINK)  # stdin is not a terminal here
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "stdin is not a terminal; add --force" in refused.stderr
    assert len(_slices(busy)) == 3
    accepted = _on_terminal(busy, "y", *SHRINK)
    assert accepted.returncode == 0, accepted.stderr
    assert len(_slices(busy)) == 1
    grown = ("cluster", "create", "--cluster", "c", "--device-type", "v4-8")
    hotswap(busy, *grown, "--num-slices", "3", check=True)
    forced = hotswap(busy, *grown, "--num-slices", "2", "--force")
    assert forced.returncode == 0 and "shrink" not in forced.stderr
    assert len(_slices(busy)) == 2


def test_deleting_a_cluster_with_running_work_asks_first(busy: Path) -> None:
    refused = hotswap(busy, "cluster", "delete", "--cluster", "c")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    # One colon: the question's own ':' (it ends the list's heading) is not doubled (issue 25 item 8).
    assert "have not finished and are stopped: this needs confirmation" in refused.stderr, refused.stderr
    assert "::" not in refused.stderr
    declined = _on_terminal(busy, "n", "cluster", "delete", "--cluster", "c")
    assert declined.returncode == 0, declined.stderr
    assert "delete cluster c? 1 workload(s) have not finished and are stopped:" in declined.stderr
    assert "job RUNNING on " in declined.stderr and "cluster c kept; nothing changed" in declined.stderr
    assert workloads(busy, "c")["job"]["phase"] == "RUNNING"
    forced = hotswap(busy, "cluster", "delete", "--cluster", "c", "--force")
    assert forced.returncode == 0, forced.stderr
    assert not (busy / "clusters" / "c").exists()


def test_an_idle_cluster_is_deleted_without_a_question(home: Path) -> None:
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v4-8", "--num-slices", "2", check=True)
    hotswap(home, "workload", "create", "--cluster", "c", "--workload", "done", "--command", "true", check=True)
    wait_until(lambda: workloads(home, "c")["done"]["phase"] == "SUCCESSFUL", what="done to finish")
    deleted = hotswap(home, "cluster", "delete", "--cluster", "c")
    assert deleted.returncode == 0, deleted.stderr
    assert not (home / "clusters" / "c").exists()


def test_a_bulk_workload_delete_lists_the_matches_and_asks_as_xpk_does(busy: Path, tmp_path: Path) -> None:
    """xpk's `workload delete` without --workload deletes what --filter-by-job/--filter-by-status
    match, after a question naming them; a named delete asks nothing (as xpk)."""
    for name, slices in (("job-b", "2"), ("other", "1")):  # job-b waits for 2 slices; other takes the third
        hotswap(busy, "workload", "create", "--cluster", "c", "--workload", name, "--num-slices", slices,
                "--command", write_sleeper(tmp_path), check=True)
    bulk = ("workload", "delete", "--cluster", "c", "--filter-by-job", "job")
    refused = hotswap(busy, *bulk)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "delete 2 workload(s) in cluster c: this needs confirmation" in refused.stderr
    declined = _on_terminal(busy, "n", *bulk)
    assert declined.returncode == 0, declined.stderr
    listed = [line.strip().split(" ")[0] for line in declined.stderr.splitlines()[1:3]]
    assert listed == ["job", "job-b"] and "other" not in declined.stderr, declined.stderr
    assert "nothing deleted in cluster c" in declined.stderr
    assert set(workloads(busy, "c")) == {"job", "job-b", "other"}
    both = hotswap(busy, "workload", "delete", "--cluster", "c", "--workload", "other", "--filter-by-job", "o")
    assert both.returncode == 2 and "not both" in both.stderr
    queued = hotswap(busy, *bulk, "--filter-by-status", "queued", "--force")
    assert queued.returncode == 0 and "workload job-b deleted" in queued.stderr and "workload job " not in queued.stderr
    accepted = _on_terminal(busy, "y", *bulk)
    assert accepted.returncode == 0 and "workload job deleted" in accepted.stderr, accepted.stderr
    none = hotswap(busy, *bulk)
    assert none.returncode == 0 and "no workload in cluster c matches; nothing deleted" in none.stderr
    assert set(workloads(busy, "c")) == {"other"}
