"""Run one worker and record how it ended, so a restarted controller still knows.

Started by the supervisor as the leader of the worker's own process group::

    python shim.py <worker-dir> <log-file> <lock-fd> -- '<command>'

``<lock-fd>`` is the worker's start lock, taken by the supervisor before it forked the shim
and held by the shim for its whole life: a controller restarted before the shim wrote its pid
can tell that this worker has started (see ``supervisor.py``), so it never starts a second one.
It writes ``<worker-dir>/pid`` (its pid and the kernel start time of the process), runs the
command in the same process group with stdout and stderr appended to the log file, marks the
start complete in ``<worker-dir>/started`` once every process of the command runs, and writes
the exit code (0-255; a signal N becomes 128+N, as container runtimes report it) to
``<worker-dir>/exit`` atomically. Signals to the group reach the command; the shim itself
outlives SIGTERM/SIGINT so that it can record the exit. Only SIGKILL stops it, and then the
supervisor knows the cause because it sent the kill.

The command runs as a container's ``bash -c`` runs it (``/bin/sh -c`` where there is no
bash): builtins, pipes, ``&&`` and quoting mean what they mean there (``exit 1`` exits 1). For
a simple command the shell execs the program, so the process that gets SIGTERM is the program
itself and its exit code is the worker's; a compound command's processes get SIGTERM too (it
is sent to the worker's process group). A shell killed by SIGTERM may leave its children
finishing their checkpoint, so the shim is a child subreaper and waits for every descendant
before it records the exit: the worker is gone only when all of it is gone. Once the command
has exited, what it leaves behind gets SIGTERM and, a few seconds later, SIGKILL. A command
that cannot be run is reported in the log by the shell and ends with 127.

A host with several GPUs runs the command once per GPU (``<worker-dir>/local.json`` lists the
other processes: what each changes in the environment, and its log), as torchrun's local agent
does. The worker's exit code is the first non-zero one; when one process fails, the others get
SIGTERM (they save) and SIGKILL after the grace period (``HOTSWAP_TERMINATION_GRACE_S``), so a
host never lingers half-dead.

With ``HOTSWAP_DEBUG_DUMP_TO`` set (``workload create --debug-dump-gcs DIR``), each process gets
``--xla_dump_to=<worker-dir>/xla_dump/process-<i>`` in ``XLA_FLAGS`` and, once the worker has
ended, whatever XLA dumped there is copied to
``$HOTSWAP_DEBUG_DUMP_TO/<workload>/attempt-<N>/replica-<R>-host-<H>`` (names of
``hotswap.api.worker``); a failed copy is reported in the log and never changes the exit code.

Standard library only, and run by path: it must start fast and import nothing of hotswap.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
CANNOT_RUN = 127  # a shell's code for a command it cannot run
STRAGGLER_GRACE_S = 5.0


def start_ticks(pid: int) -> int:
    """The process start time in clock ticks since boot (/proc/<pid>/stat field 22)."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return int(fields[19])


def write_atomically(path: str, text: str, sync: bool = True) -> None:
    temporary = f"{path}.tmp"
    with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        handle.write(text)
        handle.flush()
        if sync:  # (a mark that only a killed process must not lose needs no fsync)
            os.fsync(handle.fileno())
    os.replace(temporary, path)


def argv_of(command: str) -> list[str]:
    """The shell running the command, as ``bash -c`` in a container (bash execs a simple
    command: no shell stays between the program and its signals)."""
    return [shutil.which("bash") or "/bin/sh", "-c", command]


def reap(pids: list[int], log: int, grace_s: float) -> int:
    """Wait for the command's processes; then give what they left behind a bounded time.

    The first process to fail makes the others stop: SIGTERM, SIGKILL ``grace_s`` later. As a
    child subreaper the shim inherits every orphaned descendant; once the command's processes
    have exited they get SIGTERM and, after STRAGGLER_GRACE_S, SIGKILL (as do the processes
    orphaned by those kills), so a worker whose program has finished is not kept alive by a
    forgotten child.
    """
    codes: dict[int, int] = {}
    first_failure: int | None = None
    stop_at: float | None = None  # SIGKILL for the command's processes still running
    stragglers_at: float | None = None  # SIGKILL for what they left behind
    while True:
        deadlines = [d for d in (stop_at, stragglers_at) if d is not None]
        try:
            reaped, status = os.waitpid(-1, os.WNOHANG if deadlines else 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            break
        if reaped in pids and reaped not in codes:
            codes[reaped] = os.waitstatus_to_exitcode(status)
            running = [p for p in pids if p not in codes]
            if codes[reaped] != 0 and first_failure is None:
                first_failure = codes[reaped]
                if running:
                    os.write(log, f"hotswap: a process of this host failed; stopping its {len(running)} other(s)\n".encode())
                    for pid in running:
                        signal_quietly(pid, signal.SIGTERM)
                    stop_at = time.monotonic() + grace_s
            if not running:
                stop_at = None
                stragglers = children()
                if stragglers:
                    os.write(log, f"hotswap: the command exited; stopping {len(stragglers)} process(es) it left\n".encode())
                    for child in stragglers:
                        signal_quietly(child, signal.SIGTERM)
                    stragglers_at = time.monotonic() + STRAGGLER_GRACE_S
        elif reaped == 0:  # nothing ended yet: act on the deadline that passed
            now = time.monotonic()
            if stop_at is not None and now >= stop_at:
                for pid in pids:
                    if pid not in codes:
                        signal_quietly(pid, signal.SIGKILL)
                stop_at = None
            if stragglers_at is not None and now >= stragglers_at:
                # Every tick from now on: a killed straggler's own children are orphaned to
                # the shim only after it dies, and they are stragglers too.
                for child in children():
                    signal_quietly(child, signal.SIGKILL)
            time.sleep(0.05)
    assert len(codes) == len(pids)
    if first_failure is not None:
        return first_failure
    return 0


def children() -> list[int]:
    """The shim's direct children (orphans are re-parented to it as subreaper)."""
    found: list[int] = []
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{task}/children") as listing:
                found.extend(int(p) for p in listing.read().split())
        except FileNotFoundError:
            continue
    return found


def signal_quietly(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def local_processes(worker_dir: str) -> list[dict]:
    """The host's other processes (local ranks 1 and up), if it has several."""
    try:
        with open(os.path.join(worker_dir, "local.json")) as listing:
            return json.load(listing)
    except FileNotFoundError:
        return []


def spawn(command: list[str], env: dict[str, str], log: int, null: int, forwarded: tuple[int, ...]) -> int:
    return os.posix_spawnp(
        command[0],
        command,
        env,
        file_actions=[(os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, log, 1), (os.POSIX_SPAWN_DUP2, log, 2)],
        setsigdef=forwarded,
    )


def dump_environment(env: dict[str, str], worker_dir: str, process: int) -> dict[str, str]:
    """``env`` with this process's XLA dump directory in XLA_FLAGS (with --debug-dump-gcs)."""
    if not env.get("HOTSWAP_DEBUG_DUMP_TO"):
        return env
    directory = os.path.join(worker_dir, "xla_dump", f"process-{process}")
    flags = " ".join(part for part in (f"--xla_dump_to={directory}", env.get("XLA_FLAGS", "")) if part)
    return {**env, "XLA_FLAGS": flags}


def copy_dumps(worker_dir: str, log: int) -> None:
    """Copy the worker's XLA dumps to the --debug-dump-gcs directory, if it asked for that."""
    target = os.environ.get("HOTSWAP_DEBUG_DUMP_TO")
    source = os.path.join(worker_dir, "xla_dump")
    if not target or not os.path.isdir(source):
        return
    import shutil

    env = os.environ
    place = os.path.join(
        target, env.get("HOTSWAP_WORKLOAD", "workload"), f"attempt-{env.get('HOTSWAP_ATTEMPT', '0')}",
        f"replica-{env.get('JOB_INDEX', '0')}-host-{env.get('JOB_COMPLETION_INDEX', '0')}",
    )
    try:
        shutil.copytree(source, place, dirs_exist_ok=True)
    except OSError as error:
        os.write(log, f"hotswap: could not copy XLA dumps to {place}: {error}\n".encode())


def main(argv: list[str]) -> int:
    if len(argv) != 5 or argv[3] != "--" or not argv[2].isdigit():
        print("usage: shim.py <worker-dir> <log-file> <lock-fd> -- '<command>'", file=sys.stderr)
        return 2
    worker_dir, log_file, lock_fd, _, command_line = argv
    os.set_inheritable(int(lock_fd), False)  # held by the shim alone, not by the command it runs
    command = argv_of(command_line)

    def start(log: int, null: int, forwarded: tuple[int, ...]) -> list[int]:
        pids: list[int] = []
        try:
            pids.append(spawn(command, dump_environment(dict(os.environ), worker_dir, 0), log, null, forwarded))
            for number, process in enumerate(local_processes(worker_dir), start=1):
                own_log = os.open(process["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    env = dump_environment({**os.environ, **process["env"]}, worker_dir, number)
                    pids.append(spawn(command, env, own_log, null, forwarded))
                finally:
                    os.close(own_log)
        except OSError as error:  # not found, not executable: say so where the user looks, as a shell would
            os.write(log, f"hotswap: cannot run {command[0]!r}: {error.strerror}\n".encode())
            for pid in pids:
                signal_quietly(pid, signal.SIGKILL)
            raise
        return pids

    return supervise(worker_dir, log_file, start)


def supervise(worker_dir: str, log_file: str, start) -> int:  # type: ignore[no-untyped-def]
    """The shim's life around ``start(log, null, forwarded) -> pids`` (the command's processes,
    started with the ``forwarded`` signals at their default): subreaper, pid file, ``started``
    mark, reaping, exit record. Also run in-process by a child of the zygote (zygote.py)."""
    with_libc = ctypes.CDLL(None, use_errno=True)
    with_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    write_atomically(os.path.join(worker_dir, "pid"), f"{os.getpid()} {start_ticks(os.getpid())}\n")
    # A handler (not SIG_IGN, which the command would inherit) keeps the shim alive; the
    # command starts with the default dispositions (setsigdef).
    forwarded = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    for number in forwarded:
        signal.signal(number, lambda *_: None)
    log = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        pids = start(log, null, forwarded)
    except OSError:
        write_atomically(os.path.join(worker_dir, "exit"), f"{CANNOT_RUN}\n")
        return CANNOT_RUN
    finally:
        os.close(null)
    # The start is complete: the command runs. Killed before this mark, the shim ran nothing of
    # the workload that is not killed with it (see supervisor.Supervisor.ending).
    write_atomically(os.path.join(worker_dir, "started"), f"{' '.join(map(str, pids))}\n", sync=False)
    grace_s = float(os.environ.get("HOTSWAP_TERMINATION_GRACE_S") or 30.0)
    code = reap(pids, log, grace_s)
    code = 128 - code if code < 0 else code
    copy_dumps(worker_dir, log)
    write_atomically(os.path.join(worker_dir, "exit"), f"{code}\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
