"""A survivor's next program, started and imported while the survivor still trains.

Restarting into a new generation (:mod:`hotswap.train.jax.handoff`) costs a Python start and
the script's imports (JAX, optax, ...: ~2 s on a busy 2-core machine) before the new group can
form. Once the controller has published a generation this process is a member of, it starts
its *successor* (:meth:`Successor.start`): ``python -m hotswap.train.jax.successor``, which
imports what this program had imported from installed packages and waits. At the switch the
survivor writes its handoff as for a restart, the successor takes the file over and runs the
script from the top (``runpy``), and the survivor ``exec``s into a small keeper of its pid
(:data:`_KEEPER`): it passes SIGTERM, SIGINT and SIGHUP on to the successor and exits with its
exit status, so the process the supervisor started keeps its pid, its log and its place. The
successor dies with its keeper (``PR_SET_PDEATHSIG``) and, before the handover, with the
survivor (its input closes).

Run as ``python -m hotswap.train.jax.successor TOLD_FD PROGRAM...`` (``-m MODULE ARGS`` or ``SCRIPT
ARGS``); it reads the modules to import and the mark to leave once they are imported (one JSON
line), then the handoff's path.
"""

from __future__ import annotations

import ctypes
import json
import os
import runpy
import select
import signal
import subprocess
import sys
from typing import Any, NoReturn

from hotswap.train.formation import mark_ready
from hotswap.train.jax import handoff as handoffs

TAKE_OVER_S = 30.0  # how long the survivor waits for its successor to take the state

# The keeper of the pid: forwards the signals a supervisor sends, reports the successor's exit.
_KEEPER = (
    "import os,signal,sys\n"
    "child=int(sys.argv[1])\n"
    "def forward(number,frame):\n"
    "    try: os.kill(child,number)\n"
    "    except ProcessLookupError: pass\n"
    "for number in (signal.SIGTERM,signal.SIGINT,signal.SIGHUP): signal.signal(number,forward)\n"
    "signal.pthread_sigmask(signal.SIG_UNBLOCK,{signal.SIGTERM})\n"
    "status=os.waitpid(child,0)[1]\n"
    "code=os.waitstatus_to_exitcode(status)\n"
    "sys.exit(128-code if code<0 else code)\n"
)


class Successor:
    """This process's next program, started ahead (see the module)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._taken = -1  # read end of the pipe the successor says it took the state on

    @property
    def ready(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def started(self) -> bool:
        return self._process is not None

    def start(self, ready_mark: str | None) -> None:
        """Start the successor once (the main thread only: the successor dies with the thread
        that started it). Once it has imported, it creates the file ``ready_mark`` (the
        survivors move when every member of the new generation is ready)."""
        if self._process is not None:
            return
        flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
        program = handoffs.command_line()[1 + len(flags):]
        self._taken, told = os.pipe()  # the successor says here that it holds the state
        self._process = subprocess.Popen(
            [sys.executable, *flags, "-m", "hotswap.train.jax.successor", str(told), *program],
            stdin=subprocess.PIPE, cwd=handoffs._START_DIR, pass_fds=(told,),
        )
        os.close(told)
        assert self._process.stdin is not None
        told_first = {"modules": _installed_modules(), "ready_mark": ready_mark}
        self._process.stdin.write((json.dumps(told_first) + "\n").encode())
        self._process.stdin.flush()

    def take_over(self, handoff: handoffs.Handoff) -> None:
        """Hand the state to the successor and keep the pid for it (see the module); returns
        only if the successor did not take the state in time (it is stopped then)."""
        process = self._process
        assert process is not None and process.stdin is not None
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        fd = handoffs.write(handoff)
        process.stdin.write(f"/proc/{os.getpid()}/fd/{fd}\n".encode())
        process.stdin.flush()
        handoffs.flush_streams()
        ready, _, _ = select.select([self._taken], [], [], TAKE_OVER_S)  # once it opened the file
        if not ready or os.read(self._taken, 1) != b"1":
            self.stop()
            return
        os.execv(sys.executable, [sys.executable, "-S", "-c", _KEEPER, str(process.pid)])

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
        if self._taken >= 0:
            os.close(self._taken)
        self._process, self._taken = None, -1


def _installed_modules() -> list[str]:
    """The modules this program imported from files, in import order, but the script's own
    (those beside it: importing them may do what only the script should)."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    own = os.path.dirname(os.path.abspath(main)) + os.sep if main else None
    names = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name != "__main__" and path and not (own and os.path.abspath(path).startswith(own)):
            names.append(name)
    return names


def main(arguments: list[str]) -> Any:
    told, program = int(arguments[0]), arguments[1:]
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # as across an exec: the run unblocks it
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the keeper
    told_first = json.loads(sys.stdin.readline() or "{}")
    for name in told_first.get("modules", []):
        try:
            __import__(name)
        except BaseException:  # noqa: BLE001 - a module that fails here fails in the script, or not at all
            pass
    if told_first.get("ready_mark"):
        mark_ready(told_first["ready_mark"])
    path = sys.stdin.readline().strip()
    if not path:  # the survivor went away without handing over
        return 0
    fd = os.open(path, os.O_RDONLY)
    os.write(told, b"1")  # the survivor may go: this process holds the state now
    os.close(told)
    os.environ[handoffs.HANDOFF_FD] = str(fd)
    if program[0] == "-m":
        sys.argv = [program[1], *program[2:]]
        runpy.run_module(program[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = program
        sys.path.insert(0, os.path.dirname(os.path.abspath(program[0])))
        runpy.run_path(program[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
