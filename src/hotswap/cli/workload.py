"""``hotswap workload create|delete|describe|list|logs``, with xpk's flags."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from hotswap.api.errors import Declined, InvalidInputError, NotFoundError
from hotswap.api.worker import DEFAULT_GRACE_PERIOD_S
from hotswap.cli.output import Format, document, goodput_words, note, table
from hotswap.cli.waiting import Until, check_timeout, wait_for_state, wait_until_gone, watch
from hotswap.core.hang import FLOOR_S as HANG_FLOOR_S, SAFETY_FACTOR as HANG_SAFETY_FACTOR

if TYPE_CHECKING:
    from hotswap.backends.views import WorkloadRow

app = typer.Typer(help="Submit, inspect and delete training workloads.", no_args_is_help=True)


def run_origin(view: WorkloadRow) -> str:
    """Where a run's state came from, in words (``resumed_from`` of its view)."""
    origin = view.get("resumed_from")
    if not origin:
        skipped = view.get("not_resumed")
        if skipped:  # a checkpoint the user may expect to be resumed: say why not, and how
            return (
                f"starts fresh: run {skipped['run']} {skipped['reason']} and is never resumed automatically"
                f" (--resume-from {skipped['run']} resumes it)"
            )
        return "starts fresh"
    if origin.get("kind") == "auto":
        return f"resumes a migration checkpoint its predecessor left, if any, under {origin['path']} (decided by the workers)"
    what = "the migration checkpoint of run" if origin.get("kind") == "migration" else "run"
    return f"resumes from {what} {origin['run']} ({origin['path']})" if origin.get("run") else f"resumes from {origin['path']}"

STATUS_HELP = "EVERYTHING, FINISHED, RUNNING, QUEUED, FAILED or SUCCESSFUL."


@app.command("create")
def create(
    workload: str = typer.Option(..., "--workload", help="Workload name (DNS-1035 label, at most 40 characters)."),
    cluster: str = typer.Option(..., "--cluster", help="Cluster to run on."),
    command: str = typer.Option(..., "--command", help="Shell command each worker runs."),
    num_slices: int = typer.Option(1, "--num-slices", help="Slices (replicas), one per slice."),
    device_type: str | None = typer.Option(None, "--device-type", "--tpu-type", help="Slice type; default: the cluster's."),
    priority: str = typer.Option("medium", "--priority", help="very-low, low, medium, high or very-high."),
    max_restarts: int = typer.Option(0, "--max-restarts", help="Restarts allowed for restartable exit codes."),
    restart_strategy: str = typer.Option("Recreate", "--restart-strategy", help="Recreate or BlockingRecreate."),
    restart_on_exit_codes: str = typer.Option("42,127-255", "--restart-on-exit-codes", help="Exit codes that restart, e.g. 42,127-255."),
    min_slices: int | None = typer.Option(None, "--min-slices", help="Elastic: keep running on at least this many slices."),
    termination_grace_period: float = typer.Option(DEFAULT_GRACE_PERIOD_S, "--termination-grace-period", help="Seconds between SIGTERM and SIGKILL."),
    hang_timeout: float | None = typer.Option(None, "--hang-timeout", help=f"Seconds without a completed step before the workload counts as hung; sets the limit (default: {HANG_SAFETY_FACTOR:g} x its longest recent step interval, at least {HANG_FLOOR_S:g} s; 0: no hang detection)."),
    checkpoint_dir: str | None = typer.Option(None, "--checkpoint-dir", help="Checkpoint root: each run writes in <root>/<run id>; default keyed by cluster and workload."),
    resume_from: str | None = typer.Option(None, "--resume-from", help="Start from this run's checkpoints (a run id under the checkpoint root) or this checkpoint directory."),
    fresh: bool = typer.Option(False, "--fresh", help="Start fresh, even if a deleted or preempted predecessor left a migration checkpoint."),
    env: list[str] = typer.Option([], "--env", help="NAME=value for the workers (repeatable)."),
    env_file: Path | None = typer.Option(None, "--env-file", help="Docker-style env file for the workers."),
    docker_image: str | None = typer.Option(None, "--docker-image", help="Image (used on Kubernetes; recorded locally)."),
    base_docker_image: str | None = typer.Option(None, "--base-docker-image", help="Base image (used on Kubernetes; recorded locally)."),
    script_dir: str | None = typer.Option(None, "--script-dir", help="Directory the workers run in (default: here)."),
    docker_name: str | None = typer.Option(None, "--docker-name", help="Kubernetes: the workers' container name (default: worker)."),
    debug_dump_gcs: str | None = typer.Option(None, "--debug-dump-gcs", help="Set XLA_FLAGS --xla_dump_to and copy the dumps here when each worker ends: gs://... on Kubernetes, a directory locally."),
    checkpoint_volume: str | None = typer.Option(None, "--checkpoint-volume", help="Kubernetes: pvc:<claim> or gcsfuse:<bucket>, mounted at /checkpoints."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and show what would run; change nothing."),
    backend: str | None = typer.Option(None, "--backend", help="With --dry-run and no cluster record: local or kubernetes."),
    output: Format = typer.Option(Format.TABLE, "--output", "-o", help="table, json or yaml."),
    wait: bool = typer.Option(False, "--wait", help="Return only when every worker has started and none failed (see --until), with a progress line on stderr; exit 125 if it fails, 124 after --timeout."),
    until: Until = typer.Option(Until.RUNNING, "--until", help="With --wait: running (every worker started, none failed, for 1 s; or already finished) or finished (successfully)."),
    timeout: float | None = typer.Option(None, "--timeout", help="With --wait: give up after this many seconds (exit 124); default: wait on."),
) -> None:
    """Submit a workload: it is queued by priority, then FIFO, and admitted onto whole slices."""
    from hotswap.backends.requests import WorkloadRequest
    from hotswap.cli.workload_request import target_of, user_env_of

    check_timeout(timeout)
    request = WorkloadRequest(
        workload=workload,
        cluster=cluster,
        command=command,
        num_slices=num_slices,
        device_type=device_type,
        priority=priority,
        max_restarts=max_restarts,
        restart_strategy=restart_strategy,
        restart_on_exit_codes=restart_on_exit_codes,
        min_slices=min_slices,
        termination_grace_period_s=termination_grace_period,
        hang_timeout_s=hang_timeout,
        checkpoint_dir=checkpoint_dir,
        resume_from=resume_from,
        fresh=fresh,
        user_env=user_env_of(env, env_file),
        docker_image=docker_image,
        base_docker_image=base_docker_image,
        script_dir=script_dir,
        docker_name=docker_name,
        debug_dump_gcs=debug_dump_gcs,
        checkpoint_volume=checkpoint_volume,
        dry_run=dry_run,
        backend=backend,
    )
    target = target_of(request)
    chosen = target.backend
    prepared = chosen.prepare_workload(request, target.record)
    if dry_run:
        document(chosen.dry_run(prepared.dry_run_cluster, prepared.spec, prepared.launch), Format.YAML if output is Format.TABLE else output)
        return
    view = chosen.create_workload(cluster, prepared.spec, prepared.launch)
    for line in prepared.notes:
        note(line)
    run = f"; run {view['run_id']} {run_origin(view)}" if view.get("run_id") else ""
    if wait:
        note(f"workload {workload} created: {view['status']} ({view['status_message']}){run}")
        view = wait_for_state(lambda: chosen.describe_workload(cluster, workload), workload, until, timeout)
        if output is Format.TABLE:
            return
    if output is not Format.TABLE:
        document(view, output)
        return
    note(f"workload {workload} created: {view['status']} ({view['status_message']}){run}")


@app.command("delete")
def delete(
    workload: str | None = typer.Option(
        None, "--workload", help="Workload name. Without it: every workload the filters match (as xpk), after a question listing them."
    ),
    cluster: str = typer.Option(..., "--cluster", help="Cluster name."),
    filter_by_status: str | None = typer.Option(None, "--filter-by-status", help="Without --workload: " + STATUS_HELP),
    filter_by_job: str | None = typer.Option(None, "--filter-by-job", help="Without --workload: names containing this."),
    force: bool = typer.Option(False, "--force", help="Delete the matching workloads without asking (xpk's)."),
    wait: bool = typer.Option(False, "--wait", help="Return only when its workers have stopped (checkpoint written), with a progress line on stderr."),
    timeout: float | None = typer.Option(None, "--timeout", help="With --wait: give up after this many seconds (exit 124); default: wait on."),
) -> None:
    """Delete a workload, or every workload the filters match: its workers get SIGTERM (they
    checkpoint), then SIGKILL after the grace period."""
    from hotswap.cli.backends import for_cluster
    from hotswap.cli.prompts import confirmation

    check_timeout(timeout)
    if workload is not None and (filter_by_status is not None or filter_by_job is not None):
        raise InvalidInputError("give --workload or the filters (--filter-by-status, --filter-by-job), not both")
    chosen = for_cluster(cluster)
    if workload is not None:
        names = [workload]
    else:
        status = _status_filter(filter_by_status or "EVERYTHING")  # checked before anything is asked or changed
        names = [v["name"] for v in chosen.list_workloads(cluster, status, filter_by_job)]
        if not names:
            note(f"no workload in cluster {cluster} matches; nothing deleted")
            return
        question = f"delete {len(names)} workload(s) in cluster {cluster}?\n" + "\n".join(f"  {n}" for n in names)
        if not confirmation(force)(question):
            raise Declined(f"nothing deleted in cluster {cluster}")
    for name in names:
        try:
            chosen.delete_workload(cluster, name)
        except NotFoundError:
            if workload is not None:
                raise
            note(f"workload {name} was already gone")  # deleted by someone else since the question
            continue
        note(f"workload {name} deleted")
    if wait:
        for name in names:
            wait_until_gone(lambda name=name: chosen.workload_gone(cluster, name), name, timeout)


def _status_filter(value: str) -> str:
    from hotswap.backends.views import STATUS_FILTERS

    status = value.upper()
    if status not in STATUS_FILTERS:
        raise InvalidInputError(f"--filter-by-status {value!r}: use one of {', '.join(STATUS_FILTERS)}")
    return status


@app.command("list")
def list_(
    cluster: str = typer.Option(..., "--cluster", help="Cluster name."),
    filter_by_status: str = typer.Option("EVERYTHING", "--filter-by-status", help=STATUS_HELP),
    filter_by_job: str | None = typer.Option(None, "--filter-by-job", help="Only workloads whose name contains this (as xpk)."),
    output: Format = typer.Option(Format.TABLE, "--output", "-o", help="table, json or yaml."),
    watch_: bool = typer.Option(False, "--watch", "-w", help="Keep showing the list, redrawn when it changes (a new block or document per change when piped); Ctrl-C stops."),
    interval: float = typer.Option(1.0, "--interval", help="With --watch: seconds between looks."),
) -> None:
    """Workloads of a cluster, xpk's table (or a JSON/YAML array)."""
    from hotswap.backends.views import TABLE_COLUMNS, TABLE_HIDE_ORDER, table_row
    from hotswap.cli.backends import for_cluster

    status = _status_filter(filter_by_status)
    if not interval > 0:
        raise InvalidInputError(f"--interval {interval:g}: must be a positive number of seconds")
    chosen = for_cluster(cluster)
    if watch_:
        fetch = lambda: chosen.list_workloads(cluster, status, filter_by_job)  # noqa: E731
        watch(fetch, TABLE_COLUMNS, table_row, TABLE_HIDE_ORDER, output, interval)
        return
    views = chosen.list_workloads(cluster, status, filter_by_job)
    if output is not Format.TABLE:
        document(views, output)
        return
    table(TABLE_COLUMNS, [table_row(v) for v in views], hide_first=TABLE_HIDE_ORDER)


@app.command("describe")
def describe(
    workload: str = typer.Option(..., "--workload", help="Workload name."),
    cluster: str = typer.Option(..., "--cluster", help="Cluster name."),
    output: Format = typer.Option(Format.TABLE, "--output", "-o", help="table, json or yaml."),
) -> None:
    """Spec, placement, workers, goodput and the event timeline of a workload."""
    from hotswap.cli.backends import for_cluster

    view = for_cluster(cluster).describe_workload(cluster, workload)
    if output is not Format.TABLE:
        document(view, output)
        return
    spec = view["spec"]
    print(f"Workload {view['name']} on cluster {cluster}: {view['status']} ({view['status_message']})")
    print(
        f"  priority {view['priority']}, {spec['num_slices']} x {spec['device_type']}"
        + (f", elastic down to {spec['min_slices']}" if spec["min_slices"] else "")
        + f", restart strategy {spec['restart_strategy']}, max restarts {spec['max_restarts']}"
        f" (used {view['restarts']}), restart on exit codes {spec['restart_on_exit_codes'] or 'none'}"
    )
    print(f"  command: {spec['command']}")
    print(f"  attempt {view['attempt']}, preemptions {view['preemptions']}, infrastructure disruptions {view['disruptions']}")
    print(f"  grace period {spec['termination_grace_period_s']:g}s, checkpoints in {view['checkpoint_dir']}")
    print(f"  run {view.get('run_id') or 'unknown (created by an earlier release)'}: {run_origin(view)}")
    if spec.get("docker_image") or spec.get("base_docker_image"):
        print(f"  image: {spec.get('docker_image') or spec.get('base_docker_image')} (used on Kubernetes)")
    print(f"  logs: {view['logs']}")
    good = view["goodput"]
    why = f": {good['reason']}" if good.get("reason") else ""
    figure, spent = goodput_words(good)
    print(f"  goodput {figure} of {good['wall_s']:.0f}s (from {good['source']}{why}); {spent}")
    progress = view.get("progress") or {}
    if progress.get("mttr_s") is not None:  # from the records (core/recovery.py), as the dashboard's
        done = sum(1 for r in progress.get("recoveries") or [] if r.get("seconds") is not None)
        print(f"  MTTR {progress['mttr_s']:.2f}s over {done} recovery(ies): a failure to the first training step after it")
    if view["placement"]:
        table(
            ["Replica", "Slice", "Nodes"],
            [[p["replica"], p["slice"], ", ".join(f"{n['name']}={n['state']}" for n in p["nodes"])] for p in view["placement"]],
            title="Placement",
        )
    if view["workers"]:
        table(
            ["Attempt", "Replica", "Host", "Slice", "PID", "State", "Exit"],
            [[w["attempt"], w["replica"], w["host"], w["slice"], w["pid"], w["state"], w["exit_code"]] for w in view["workers"]],
            title="Workers",
        )
    table(["Time", "Event", "Message"], [[e["time"], e["event"], e["message"]] for e in view["timeline"]], title="Timeline")


@app.command("logs")
def logs(
    workload: str = typer.Option(..., "--workload", help="Workload name."),
    cluster: str = typer.Option(..., "--cluster", help="Cluster name."),
    slice_: str | None = typer.Option(None, "--slice", help="Replica index or slice name (default: replica 0)."),
    host: int = typer.Option(0, "--host", help="Host within the slice."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing as the log grows."),
) -> None:
    """The log of one worker (default: replica 0 host 0, i.e. rank 0), across attempts; of a
    deleted workload, what was kept at its deletion (until its cluster is deleted)."""
    from hotswap.cli.backends import for_cluster

    def write(chunk: bytes) -> None:
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()

    where = for_cluster(cluster).logs(cluster, workload, slice_, host, follow, write)
    if where:
        note(where)
