"""The whole-machine loss drill (issue 36, item 1): every process of a cluster (controller,
zygote, spares, shims, commands) frozen and killed at once, as a power loss, a reboot or the OOM
killer would, is no workload's fault. The next command's controller must restart each workload
uncharged (with the default ``--max-restarts 0`` one charge fails it for good), say why in its
status and timeline, and resume from the newest committed checkpoint (the crash drill's trainer
logs its saves and resumes, and ``Drill.check`` holds every resume to them).

What still is the job's: a worker killed while the rest of the cluster lives on (charged), and a
worker that outlived its controller (it did not die with it).

``HOTSWAP_HOST_LOSS_ROUNDS`` sets how many losses each drill takes (default 2; the issue's 50:
``benchmarks/bench_infra_faults.py``).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hardening_helpers import controllers, freeze_and_kill
from local_helpers import live_workers, query, wait_until, workloads
from test_controller_crash_drill import Drill

from hotswap.backends.local.controller.host_loss import HostLoss, Predecessor
from hotswap.backends.local.tables import WorkerIdentity, WorkerRow

ROUNDS = int(os.environ.get("HOTSWAP_HOST_LOSS_ROUNDS", "2"))
LOST_WITH_HOST = "was lost with the host"


@pytest.fixture
def drill(tmp_path: Path) -> Iterator[Drill]:
    drill = Drill(tmp_path)
    yield drill
    drill.close()


def lose_the_host(drill: Drill, rounds: int, trainer: bool = True) -> None:
    """``rounds`` times: freeze and kill every process of the cluster, then let the next command
    bring it back; nothing may be charged, and every restart names the loss."""
    for done in range(1, rounds + 1):
        commands_run(drill)
        attempts = {name: record["attempt"] for name, record in workloads(drill.home, "c").items()}
        assert freeze_and_kill(drill.root) >= 2  # the controller and a shim at least
        drill.settle()
        records = workloads(drill.home, "c")
        for name, record in records.items():
            assert record["phase"] == "RUNNING", f"round {done}: {name}: {record['status_message']}"
            assert record["restarts"] == 0, f"round {done}: {name} charged: {record['status_message']}"
            assert record["attempt"] > attempts[name], f"round {done}: {name} was not restarted"
        lost = query(drill.home, "c", "SELECT message FROM events WHERE kind = 'worker-lost'")
        assert sum(LOST_WITH_HOST in r["message"] for r in lost) >= done * len(records), [r["message"] for r in lost]
    if trainer:
        drill.check()  # every resume from the newest checkpoint committed before it


def commands_run(drill: Drill) -> None:
    """Wait until every worker's command runs (its shim's mark): a shim killed before that is
    started again in the same attempt, which would be no loss to look at."""
    wait_until(
        lambda: all((Path(row["dir"]) / "started").exists() for row in live_workers(drill.home, "c")),
        timeout=60, what="the workers' commands to run",
    )


def test_a_whole_machine_loss_under_the_trainer_is_not_charged(drill: Drill) -> None:
    drill.cluster(2)
    drill.create("a")
    drill.create("b")
    drill.settle()
    time.sleep(0.5)  # a checkpoint or two committed
    lose_the_host(drill, ROUNDS)


def test_a_whole_machine_loss_under_sleep_is_not_charged(drill: Drill) -> None:
    drill.cluster(1)
    drill.cli("workload", "create", "--cluster", "c", "--workload", "a", "--command", "sleep 1000")
    drill.settle()
    lose_the_host(drill, ROUNDS, trainer=False)
    assert "host" in drill.cli("workload", "describe", "--cluster", "c", "--workload", "a").stdout


def test_a_reboot_is_told_by_the_boot_id(drill: Drill) -> None:
    """One worker killed with its shim, others alive: charged, unless the machine booted since
    its controller recorded itself (then none of the pids it recorded can be alive anyway)."""
    drill.cluster(2)
    drill.create("a")
    drill.create("b")
    drill.settle()
    drill.kill_controller_then_worker("a")
    forge_controller_record(drill, boot_id="an-earlier-boot")
    drill.settle()
    record = workloads(drill.home, "c")["a"]
    assert record["phase"] == "RUNNING" and record["restarts"] == 0, record["status_message"]
    assert "machine restarted" in record["status_message"]


def test_a_worker_killed_while_the_cluster_lives_on_is_still_charged(drill: Drill) -> None:
    """The controller crashed alone; a's shim and command were killed while b's ran on: that is
    no machine loss, and a (max restarts 0) fails as before."""
    drill.cluster(2)
    drill.create("a")
    drill.create("b")
    drill.settle()
    drill.kill_controller_then_worker("a")
    drill.settle()
    records = workloads(drill.home, "c")
    assert records["a"]["phase"] == "FAILED", records["a"]["status_message"]
    assert "137" in records["a"]["status_message"]
    assert records["b"]["phase"] == "RUNNING" and records["b"]["restarts"] == 0


def test_a_command_killed_under_its_live_shim_is_still_charged(drill: Drill) -> None:
    """SIGKILL to the command alone (an OOM kill of the job) while its shim and controller live."""
    drill.cluster(1)
    drill.create("a")
    drill.settle()
    shim = live_workers(drill.home, "c", "a")[0]["pid"]
    command = int(Path(f"/proc/{shim}/task/{shim}/children").read_text().split()[0])
    os.kill(command, signal.SIGKILL)
    wait_until(lambda: workloads(drill.home, "c")["a"]["phase"] == "FAILED", what="a to fail")
    assert "137" in workloads(drill.home, "c")["a"]["status_message"]


def test_a_worker_that_outlived_its_controller_did_not_die_with_it(drill: Drill) -> None:
    """Everything is dead now, but the worker wrote long after its controller's last beat: it
    ran on alone and ended later, which the machine's loss does not explain: charged."""
    drill.cluster(1)
    drill.create("a")
    drill.settle()
    drill.kill_controllers()
    wait_until(lambda: not controllers(drill.root), what="the controller to die")
    beat = drill.root / "controller.alive"
    assert beat.exists(), "the controller keeps no liveness record"
    long_ago = time.time() - 600
    os.utime(beat, (long_ago, long_ago))  # its last beat, as if it died ten minutes ago
    freeze_and_kill(drill.root)
    drill.settle()
    record = workloads(drill.home, "c")["a"]
    assert record["phase"] == "FAILED" and "137" in record["status_message"], record["status_message"]


def forge_controller_record(drill: Drill, **fields: object) -> None:
    connection = sqlite3.connect(drill.root / "state.db")
    (value,) = connection.execute("SELECT value FROM meta WHERE key = 'controller'").fetchone()
    connection.execute("UPDATE meta SET value = ? WHERE key = 'controller'", (json.dumps({**json.loads(value), **fields}),))
    connection.commit()
    connection.close()


# ---------------------------------------------------------------------- the rule, on its own


def dead_worker(directory: Path, written_at: float) -> WorkerRow:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "started").write_text("")
    os.utime(directory / "started", (written_at, written_at))
    os.utime(directory, (written_at, written_at))
    return WorkerRow(1, WorkerIdentity("w", 0, 1, "s0", 0, 0, "s0-0"), str(directory), 4242, 1, "running", None, 0.0, None, None, None)


@pytest.mark.parametrize(
    ("boot_before", "everything_died", "beat_age_s", "written_age_s", "lost"),
    [
        ("old-boot", False, None, 0, "machine restarted"),  # a reboot: whatever else is known
        ("this-boot", True, 5, 5, "killed at once"),  # died with its controller
        ("this-boot", True, 100, 90, "killed at once"),  # wrote within the margin after the last beat
        ("this-boot", True, 600, 0, None),  # wrote long after its controller's last beat: outlived it
        ("this-boot", False, 5, 5, None),  # something of the cluster lives: no machine loss
        ("this-boot", True, None, 5, None),  # a predecessor that kept no liveness record
        (None, True, None, 5, None),  # nothing recorded at all
    ],
)
def test_what_the_records_prove(
    tmp_path: Path, boot_before: str | None, everything_died: bool, beat_age_s: float | None, written_age_s: float, lost: str | None
) -> None:
    now = time.time()
    beat = None if beat_age_s is None else now - beat_age_s
    loss = HostLoss(Predecessor(boot_before, beat), this_boot="this-boot")
    loss.everything_died = everything_died
    reason = loss.reason(dead_worker(tmp_path / "w", now - written_age_s))
    assert (reason is None) == (lost is None) and (lost is None or lost in reason), reason
    assert reason is None or reason.endswith("(not the workload's fault)")
