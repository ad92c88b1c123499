"""Run one worker and record how it ended, so a restarted controller still knows.

Started by the supervisor as the leader of the worker's own process group::

    python shim.py <worker-dir> <log-file> -- '<command>'

It writes ``<worker-dir>/pid`` (its pid and the kernel start time of the process), runs the
command in the same process group with stdout and stderr appended to the log file, and writes
the exit code (0-255; a signal N becomes 128+N, as container runtimes report it) to
``<worker-dir>/exit`` atomically. Signals to the group reach the command; the shim itself
outlives SIGTERM/SIGINT so that it can record the exit. Only SIGKILL stops it, and then the
supervisor knows the cause because it sent the kill.

A simple command (words only) is executed directly, so the process that gets SIGTERM is the
program itself and its exit code is the worker's. Anything needing a shell runs under
``/bin/sh -c``; a shell killed by SIGTERM may leave its children finishing their checkpoint,
so the shim is a child subreaper and waits for every descendant before it records the exit:
the worker is gone only when all of it is gone.

Standard library only, and run by path: it must start fast and import nothing of hotswap.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36
SHELL_SYNTAX = set("|&;<>()$`*?[]#~{}\n")


def start_ticks(pid: int) -> int:
    """The process start time in clock ticks since boot (/proc/<pid>/stat field 22)."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return int(fields[19])


def write_atomically(path: str, text: str) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def argv_of(command: str) -> list[str]:
    """The command's words when it needs no shell, else a shell running it."""
    if not SHELL_SYNTAX.intersection(command):
        try:
            words = shlex.split(command)
        except ValueError:  # unbalanced quotes: let the shell report it
            words = []
        if words and "=" not in words[0]:
            return words
    return ["/bin/sh", "-c", command]


def main(argv: list[str]) -> int:
    worker_dir, log_file, separator, *rest = argv
    if separator != "--" or len(rest) != 1:
        print("usage: shim.py <worker-dir> <log-file> -- '<command>'", file=sys.stderr)
        return 2
    command = argv_of(rest[0])
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
    pid = os.posix_spawnp(
        command[0],
        command,
        os.environ,
        file_actions=[(os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, log, 1), (os.POSIX_SPAWN_DUP2, log, 2)],
        setsigdef=forwarded,
    )
    os.close(log)
    os.close(null)
    code = None
    while True:  # reap the command and, as subreaper, every descendant it leaves behind
        try:
            reaped, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            break
        if reaped == pid:
            code = os.waitstatus_to_exitcode(status)
    assert code is not None
    code = 128 - code if code < 0 else code
    write_atomically(os.path.join(worker_dir, "exit"), f"{code}\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
