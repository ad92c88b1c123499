"""Runs are identities (issue 16, item 1), end to end through the CLI on the local backend with
real PyTorch workers: a workload created again under its name resumes only from a migration
checkpoint its predecessor left on SIGTERM; never from a finished run, even across `cluster
delete` / `cluster create`; `--fresh` and `--resume-from` say otherwise."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from local_helpers import home, hotswap, live_workers, wait_until, workloads  # noqa: F401 (home: a fixture)
from train_harness import TRAIN_EXAMPLE

from hotswap.api import worker as contract
from hotswap.api.runs import (
    RESUME_AUTO, RUN_DONE, RUN_OUTCOME_FILE, RUN_OWNER_FILE, RUN_RESUME, RUN_RUNNING, RUN_SIGNAL_FILE, is_run_id,
)
from hotswap.api.worker_output import RESTORE_SOURCES, parse_fields, restore_source, restored_line
from hotswap.api.launch import Run
from hotswap.backends.local.commands.runs import resolve
from hotswap.train.runs import resume_source

pytest.importorskip("torch")

SLOW = f"{sys.executable} {TRAIN_EXAMPLE} --steps 100000 --checkpoint-every 5 --step-sleep 0.05"
SHORT = f"{sys.executable} {TRAIN_EXAMPLE} --steps 8 --checkpoint-every 4"


def _cluster(home: Path) -> None:
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v4-8", "--num-slices", "1", check=True)


def _create(home: Path, command: str, *flags: str) -> str:
    """Create workload w; its one line, which says where its run starts from."""
    result = hotswap(home, "workload", "create", "--cluster", "c", "--workload", "w", "--command", command, *flags, check=True)
    [line] = result.stderr.splitlines()
    assert line.startswith("workload w created: ") and "; run " in line
    return line


def _describe(home: Path) -> dict:
    return json.loads(hotswap(home, "workload", "describe", "--cluster", "c", "--workload", "w", "-o", "json", check=True).stdout)


def _logs(home: Path) -> str:
    return hotswap(home, "workload", "logs", "--cluster", "c", "--workload", "w").stdout


def _steps(home: Path) -> int:
    return max((int(f["step"]) for line in _logs(home).splitlines() if "step" in (f := parse_fields(line)) and not line.startswith("restored")), default=0)


def _migrate_away(home: Path) -> int:
    """Let w train a few steps, delete it mid-run; the step its SIGTERM save holds."""
    directory = Path(_describe(home)["checkpoint_dir"])
    wait_until(lambda: _steps(home) >= 3, timeout=120, what="a few steps")
    hotswap(home, "workload", "delete", "--cluster", "c", "--workload", "w", check=True)
    wait_until(lambda: not live_workers(home, "c", "w"), timeout=60, what="the workers to save and exit")
    assert (directory / RUN_SIGNAL_FILE).read_text() == "resume\n"  # seed 004's
    marker = max(directory.glob("step-*/COMMIT"))
    assert json.loads(marker.read_text())["reason"] == "termination"
    return int(marker.parent.name.removeprefix("step-"))


def _finish(home: Path) -> None:
    wait_until(lambda: workloads(home, "c").get("w", {}).get("phase") == "SUCCESSFUL", timeout=120, what="w to finish")


def _restored(home: Path) -> dict[str, str] | None:
    wait_until(lambda: _steps(home) > 0 or "restored" in _logs(home), timeout=120, what="w to start")
    lines = [line for line in _logs(home).splitlines() if line.startswith("restored ")]
    return parse_fields(lines[0]) if lines else None


def test_a_deleted_run_is_resumed_a_finished_one_never(home: Path) -> None:
    _cluster(home)
    assert _create(home, SLOW).endswith("starts fresh")
    first = _describe(home)["run_id"]
    saved = _migrate_away(home)

    line = _create(home, SLOW)
    second = _describe(home)
    assert second["run_id"] != first and is_run_id(second["run_id"])
    assert second["resumed_from"]["run"] == first and second["resumed_from"]["kind"] == "migration"
    assert f"resumes from the migration checkpoint of run {first}" in line
    restored = _restored(home)
    assert restored == {"step": str(saved), "source": "migration", "cause": "resume"}
    listed = json.loads(hotswap(home, "workload", "list", "--cluster", "c", "-o", "json", check=True).stdout)
    assert listed[0]["run_id"] == second["run_id"] and listed[0]["resumed_from"]["run"] == first

    # The second run finishes: its successor starts fresh, even on a new cluster of that name.
    hotswap(home, "workload", "delete", "--cluster", "c", "--workload", "w", check=True)
    wait_until(lambda: not live_workers(home, "c", "w"), timeout=60, what="the workers to exit")
    assert _create(home, SHORT, "--resume-from", second["run_id"]).endswith(f"resumes from run {second['run_id']} ({second['checkpoint_dir']})")
    _finish(home)
    hotswap(home, "cluster", "delete", "--cluster", "c", check=True)
    _cluster(home)
    assert _create(home, SLOW).endswith("starts fresh")
    assert _describe(home)["resumed_from"] is None
    assert _restored(home) is None


def test_fresh_ignores_a_pending_migration_and_resume_from_takes_a_path(home: Path, tmp_path: Path) -> None:
    _cluster(home)
    _create(home, SLOW)
    first = _describe(home)
    _migrate_away(home)
    assert _create(home, SLOW, "--fresh").endswith("starts fresh")
    assert _restored(home) is None
    fresh = _describe(home)["run_id"]
    hotswap(home, "workload", "delete", "--cluster", "c", "--workload", "w", check=True)
    # Created again at once: the create waits for the deleted run's SIGTERM save, and the fresh
    # run (which started, then saved on SIGTERM) is the predecessor now.
    auto = _describe_after_create(home, SLOW)
    assert auto["resumed_from"]["run"] == fresh
    hotswap(home, "workload", "delete", "--cluster", "c", "--workload", "w", check=True)
    wait_until(lambda: not live_workers(home, "c", "w"), timeout=60, what="the workers to exit")
    directory = Path(first["checkpoint_dir"])
    line = _create(home, SLOW, "--resume-from", str(directory))
    assert line.endswith(f"resumes from run {first['run_id']} ({directory})")
    assert _restored(home)["cause"] == "resume"


def _describe_after_create(home: Path, command: str) -> dict:
    _create(home, command)
    return _describe(home)


def test_resume_from_something_missing_is_one_line_and_creates_nothing(home: Path) -> None:
    _cluster(home)
    for source in ("20200101-000000-abcdef", "/no/such/dir"):
        result = hotswap(home, "workload", "create", "--cluster", "c", "--workload", "w", "--command", "true", "--resume-from", source)
        assert result.returncode != 0 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "--resume-from" in result.stderr
    both = hotswap(home, "workload", "create", "--cluster", "c", "--workload", "w", "--command", "true", "--fresh", "--resume-from", "x")
    assert both.returncode != 0 and "--fresh" in both.stderr
    assert workloads(home, "c") == {}


def _run_dir(root: Path, name: str, signal: str | None) -> None:
    """A run's directory; ``signal`` "resume+failed": its workers saved on SIGTERM, its controller
    ended it failed (the outcome file); "resume@a": workload a wrote it ("@": no workload named,
    an earlier release's run; else workload w)."""
    (root / name).mkdir(parents=True)
    signal, _, writer = (signal or "").partition("@") if "@" in (signal or "") else (signal or "", "", "w")
    signal, _, outcome = signal.partition("+")
    if signal:
        (root / name / RUN_SIGNAL_FILE).write_text(signal + "\n")
        if writer:
            (root / name / RUN_OWNER_FILE).write_text(writer + "\n")
    if outcome:
        (root / name / RUN_OUTCOME_FILE).write_text(outcome + "\n")


@pytest.mark.parametrize(
    ("runs", "expected"),
    [
        ({}, None),
        ({"20260101-000000-aaaaaa": "resume"}, "20260101-000000-aaaaaa"),
        ({"20260101-000000-aaaaaa": "done"}, None),
        ({"20260101-000000-aaaaaa": "running"}, None),  # failed, or killed: never resumed
        # A later run that never started does not hide its predecessor's migration...
        ({"20260101-000000-aaaaaa": "resume", "20260102-000000-bbbbbb": None}, "20260101-000000-aaaaaa"),
        # ...one that started took it over.
        ({"20260101-000000-aaaaaa": "resume", "20260102-000000-bbbbbb": "running"}, None),
        ({"20260101-000000-aaaaaa": "done", "20260102-000000-bbbbbb": "resume"}, "20260102-000000-bbbbbb"),
        # A hang kill or a failed attempt's stop is a SIGTERM: the controller's outcome decides...
        ({"20260101-000000-aaaaaa": "resume+failed"}, None),
        ({"20260101-000000-aaaaaa": "resume", "20260102-000000-bbbbbb": "resume+failed"}, None),
        # ...and a run that failed before it started took nothing over.
        ({"20260101-000000-aaaaaa": "resume", "20260102-000000-bbbbbb": "+failed"}, "20260101-000000-aaaaaa"),
        # Only workload w's own runs: another's under the same root (or one naming none) is
        # passed over, and hides none of w's own...
        ({"20260101-000000-aaaaaa": "resume@a"}, None),
        ({"20260101-000000-aaaaaa": "resume@"}, None),
        ({"20260101-000000-aaaaaa": "resume", "20260102-000000-bbbbbb": "running@a"}, "20260101-000000-aaaaaa"),
        # ...nor is taken over by one of them.
        ({"20260101-000000-aaaaaa": "resume@a", "20260102-000000-bbbbbb": "done"}, None),
    ],
)
def test_only_the_newest_started_run_is_resumed_and_only_after_sigterm(tmp_path: Path, runs: dict, expected: str | None) -> None:
    for name, signal in runs.items():
        _run_dir(tmp_path, name, signal)
    (tmp_path / "step-0000000010").mkdir()  # a checkpoint of an earlier release's layout: never resumed
    resolved = resolve(Run.from_dict({"id": "20260103-000000-cccccc", "mode": "auto"}), tmp_path, lambda: True, 0, "w")
    assert (resolved.resumed_from or {}).get("run") == expected
    assert resolved.resume_from == (str(tmp_path / expected) if expected else "")
    passed_over = [name for name, signal in runs.items() if signal and (signal.startswith("resume+") or signal.startswith("resume@"))]
    assert (resolved.not_resumed or {}).get("run") == (passed_over[0] if passed_over else None)
    # The workers of Kubernetes apply the same rule to the same files.
    env = contract.WorkerEnv(workload="w", resume_from=RESUME_AUTO, checkpoint_dir=str(tmp_path / "20260103-000000-cccccc"))
    assert resume_source(env) == (tmp_path / expected if expected else None)


def test_a_hotswap_restore_says_so(home: Path) -> None:
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v4-8", "--num-slices", "2", check=True)
    _create(home, SLOW)
    wait_until(lambda: _steps(home) >= 7, timeout=120, what="a periodic checkpoint")
    [held] = workloads(home, "c")["w"]["slices"]
    hotswap(home, "node", "fail", "--cluster", "c", "--slice", held, check=True)
    wait_until(lambda: "restored " in _logs(home), timeout=120, what="the restart onto the spare slice")
    restored = _restored(home)
    assert restored is not None and restored["cause"] == "hotswap" and restored["source"] == "checkpoint", restored
    assert workloads(home, "c")["w"]["slices"] != [held]


@pytest.mark.parametrize(
    ("reason", "cause", "source"),
    [
        ("termination", "preemption", "migration"),
        ("termination", "hotswap", "migration"),  # drained: saved on SIGTERM, moved
        ("termination", "resume", "migration"),  # a new run takes its predecessor's
        ("termination", "failure", "checkpoint"),  # a crash after an earlier move: not a migration
        ("periodic", "failure", "checkpoint"),
        ("periodic", "hotswap", "checkpoint"),  # a node failed: the last periodic save
        ("final", None, "checkpoint"),
    ],
)
def test_restore_lines_say_what_happened_and_old_parsers_still_read_them(reason: str, cause: str | None, source: str) -> None:
    line = restored_line(12, restore_source(reason, cause), cause)
    fields = parse_fields(line)
    assert (fields["step"], fields["source"], fields.get("cause")) == ("12", source, cause)
    assert line.startswith(f"restored step=12 source={source}")  # seed 004-style readers match the prefix
    assert fields["source"] in RESTORE_SOURCES


@pytest.mark.parametrize(
    ("mode", "extra", "resume", "kind"),
    [
        ("auto", {}, "auto", "auto"),
        ("fresh", {}, "", None),
        ("from", {"source": "20260101-000000-aaaaaa"}, "/checkpoints/c/w/20260101-000000-aaaaaa", "explicit"),
        ("from", {"source": "/checkpoints/elsewhere"}, "/checkpoints/elsewhere", "explicit"),
    ],
)
def test_kubernetes_jobsets_carry_the_run(mode: str, extra: dict, resume: str, kind: str | None) -> None:
    from hotswap.api.spec import workload_spec
    from hotswap.backends.kubernetes import labels
    from hotswap.backends.kubernetes.checkpoint_volume import CheckpointVolume
    from hotswap.backends.kubernetes.render import render_jobset
    from hotswap.backends.kubernetes.settings import KubeSettings
    from hotswap.backends.kubernetes.views import view_of
    from hotswap.backends.kubernetes.live_objects import read_jobset

    run = {"id": "20260102-000000-bbbbbb", "mode": mode, **extra}
    spec = workload_spec(name="w", command="python3 train.py", device_type="v6e-16", num_slices=1)
    jobset = render_jobset(spec, "c", KubeSettings(), CheckpointVolume("pvc", "ckpt"), Run.from_dict(run))
    assert jobset["metadata"]["labels"][labels.RUN_ID_LABEL] == run["id"]
    container = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env[contract.HOTSWAP_RUN_ID] == run["id"]
    assert env[contract.HOTSWAP_CHECKPOINT_DIR] == f"/checkpoints/c/w/{run['id']}"
    assert env[contract.HOTSWAP_RESUME_FROM] == resume
    view = view_of(read_jobset(jobset), {})
    assert view["run_id"] == run["id"]
    assert (view["resumed_from"] or {}).get("kind") == kind


def test_the_sdk_reads_its_own_run_first_and_keeps_the_signal(tmp_path: Path) -> None:
    from test_train_state import Job

    from hotswap.train.torch.checkpointer import Checkpointer
    from hotswap.train.events import EventLog
    from hotswap.train.runs import read_signal, resume_source
    from hotswap.train.torch.store import CheckpointStore

    job = Job()
    earlier, own = tmp_path / "20260101-000000-aaaaaa", tmp_path / "20260102-000000-bbbbbb"
    Checkpointer(CheckpointStore(earlier), EventLog(None)).save(5, job.tree(5), "termination")
    assert read_signal(earlier) == RUN_RESUME  # seed 004's signal=resume
    env = contract.WorkerEnv.from_environ(
        {contract.HOTSWAP_CHECKPOINT_DIR: str(own), contract.HOTSWAP_RESUME_FROM: RESUME_AUTO}
    )
    assert resume_source(env) == earlier
    reader = Checkpointer(CheckpointStore(own), EventLog(None), fallback=CheckpointStore(earlier))
    tree, info = reader.restore_latest()
    assert info.step == 5 and reader.from_fallback(info)
    reader.save(7, job.tree(7), "periodic")
    assert read_signal(own) == RUN_RUNNING
    _, info = reader.restore_latest()  # a restart within the run: its own checkpoint, not the predecessor's
    assert info.step == 7 and not reader.from_fallback(info)
    reader.save(9, job.tree(9), "final")
    assert read_signal(own) == RUN_DONE
    assert resume_source(contract.WorkerEnv.from_environ({contract.HOTSWAP_CHECKPOINT_DIR: str(tmp_path / "next"),
                                                        contract.HOTSWAP_RESUME_FROM: "auto"})) is None


@pytest.mark.parametrize(
    ("actions", "state", "cause"),
    [
        ("admit1", None, "start"),
        ("admit2", None, "preemption"),
        ("restart_charged", {"start_cause": "start"}, "failure"),
        ("restart_infra", None, "hotswap"),
        ("scale_up", None, "elastic"),
        ("none", {"start_cause": "hotswap"}, "hotswap"),  # remembered on the JobSet until its pods are released
        ("none", {"start_cause": "bogus"}, None),
    ],
)
def test_kubernetes_pods_learn_why_their_attempt_started(actions: str, state: dict | None, cause: str | None) -> None:
    from hotswap.api.spec import workload_spec
    from hotswap.backends.kubernetes.planning import start_cause
    from hotswap.backends.kubernetes.state_annotation import decode_state, state_of
    from hotswap.core import actions as act
    from hotswap.core.effects import effects_of
    from hotswap.core.workload import Workload

    # The state annotation as it reads, with the start cause given.
    spec = workload_spec(name="w", command="python3 train.py", device_type="v6e-4", num_slices=2, min_slices=1)
    record = None
    if state is not None:
        record = decode_state(json.dumps({**state_of(Workload(spec=spec, seq=0, created_at=0.0), None, 0.0).to_json(), **state}), spec)
        assert record is not None

    made = {
        "admit1": [act.Admit("w", 1, ("s0",))],
        "admit2": [act.Admit("w", 2, ("s0",))],
        "restart_charged": [act.Restart("w", 2, ("s0",), "exit 42", charged=True)],
        "restart_infra": [act.Restart("w", 2, ("s1",), "node failed", charged=False)],
        "scale_up": [act.ScaleUp("w", ("s1",), ("s0", "s1"), 2, ("s0", "s1"))],
        "none": [],
    }[actions]
    assert start_cause(effects_of(made), record) == cause


@pytest.mark.parametrize(
    "record",
    [
        {"environ": {"A": "1"}, "cwd": "/w", "user_env": {}, "checkpoint_dir": "/c"},  # a release without runs
        {"environ": {}, "cwd": "/w", "user_env": {"U": "2"}, "checkpoint_dir": "/c/20260101-000000-aaaaaa",
         "run": {"id": "20260101-000000-aaaaaa", "mode": "from", "source": "/elsewhere", "resume_from": "/elsewhere",
                 "resumed_from": {"run": None, "path": "/elsewhere", "kind": "explicit"}},
         "held_start_cause": {"attempt": 3, "cause": "hotswap"}},
        {"environ": {}, "cwd": "/w", "user_env": {}, "checkpoint_dir": "/c/x", "checkpoint_volume": "pvc:ckpt",
         "run": {"id": "20260101-000000-aaaaaa", "mode": "fresh", "resume_from": "", "resumed_from": None}, "later": [1]},
    ],
)
def test_launch_records_of_existing_databases_read_back_and_write_the_same_json(record: dict) -> None:
    from hotswap.api.launch import Launch

    text = json.dumps(record, sort_keys=True)
    assert Launch.from_json(text).to_json() == text


def test_a_run_the_backend_names_failed_is_never_resumed_by_the_workers(tmp_path: Path) -> None:
    """Kubernetes' controller cannot write a run's outcome file (only the pods see the volume):
    the runs `workload delete` saw FAILED reach the next run's workers as HOTSWAP_FAILED_RUNS,
    and their save on SIGTERM (signal=resume) is then no migration checkpoint."""
    failed, earlier = "20260102-000000-bbbbbb", "20260101-000000-aaaaaa"
    _run_dir(tmp_path, earlier, "resume")
    _run_dir(tmp_path, failed, "resume")
    own = str(tmp_path / "20260103-000000-cccccc")
    told = contract.WorkerEnv.from_environ({
        contract.HOTSWAP_WORKLOAD: "w", contract.HOTSWAP_CHECKPOINT_DIR: own, contract.HOTSWAP_RESUME_FROM: RESUME_AUTO, contract.HOTSWAP_FAILED_RUNS: failed,
    })
    assert told.failed_runs == (failed,) and resume_source(told) is None  # the newest started run failed: fresh
    untold = contract.WorkerEnv.from_environ({
        contract.HOTSWAP_WORKLOAD: "w", contract.HOTSWAP_CHECKPOINT_DIR: own, contract.HOTSWAP_RESUME_FROM: RESUME_AUTO,
    })
    assert resume_source(untold) == tmp_path / failed  # what it did before
