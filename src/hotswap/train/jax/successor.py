"""A survivor's next program, started while the survivor still trains, and run ahead.

Restarting into a new generation (:mod:`hotswap.train.jax.handoff`) costs a Python start, the
script's imports (JAX, optax, ...: ~2 s on a busy 2-core machine), forming the new group and
everything the script does before it wants its state (building the mesh, the optimizer, the
checkpoint manager). Once the controller has published a generation this process is a member
of, it starts its *successor* (:meth:`Successor.start`): ``python -m hotswap.train.jax.successor``,
which imports what this program had imported from installed packages.

*Ahead* (where the generation has readiness marks: the local backend), the successor then runs
the script at once: ``hotswap.train.jax.init()`` joins the new generation (with the joiners and
the other survivors' successors), and the script goes on until it wants the state (its first
step, or ``restore()``). On a CPU-only platform that is where it waits; elsewhere it waits right
after joining, before JAX creates a backend, since the survivor still holds the accelerator's
memory. Waiting, it creates its readiness mark: the survivors move once every member of the new
generation is ready. Without marks (Kubernetes) the successor only imports and waits for the
state before running the script.

At the switch the survivor writes its handoff as for a restart, the successor takes the file
over, and the survivor ``exec``s into a small keeper of its pid (:data:`_KEEPER`): it passes
SIGTERM, SIGINT and SIGHUP on to the successor and exits with its exit status, so the process
the supervisor started keeps its pid, its log and its place. The successor dies with its keeper
(``PR_SET_PDEATHSIG``) and, before the handover, with the survivor. A successor that cannot take
over (its generation was superseded, or it failed) exits instead of restarting itself, and its
survivor restarts plainly.

Run as ``python -m hotswap.train.jax.successor TOLD_FD PROGRAM...`` (``-m MODULE ARGS`` or ``SCRIPT
ARGS``); it reads the modules to import, its mark and what it runs ahead for (one JSON line),
then the handoff's path. On ``TOLD_FD`` it says ``R`` when it wants the state, ``1`` once it
holds it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import time
from typing import Any

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
        self._taken = -1  # read end of the pipe the successor says it wants, then took, the state on
        self.generation: int | None = None  # the generation it runs ahead for (None: it only imports)

    @property
    def ready(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def started(self) -> bool:
        return self._process is not None

    def start(self, ready_mark: str | None, ahead: Ahead | None = None) -> None:
        """Start the successor once (the main thread only: the successor dies with the thread
        that started it). It creates the file ``ready_mark`` when it wants the state; with
        ``ahead`` it runs the script until then (see the module)."""
        if self._process is not None:
            return
        flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
        program = handoffs.command_line()[1 + len(flags):]
        self._taken, told = os.pipe()
        self._process = subprocess.Popen(
            [sys.executable, *flags, "-m", "hotswap.train.jax.successor", str(told), *program],
            stdin=subprocess.PIPE, cwd=handoffs.START_DIR, pass_fds=(told,),
        )
        os.close(told)
        self.generation = ahead.generation if ahead else None
        assert self._process.stdin is not None
        told_first = {
            "modules": _installed_modules(),
            "ready_mark": ready_mark,
            "ahead": dataclasses.asdict(ahead) if ahead else None,
        }
        self._process.stdin.write((json.dumps(told_first) + "\n").encode())
        self._process.stdin.flush()

    def take_over(self, handoff: handoffs.Handoff) -> None:
        """Hand the state to the successor and keep the pid for it (see the module); returns
        only if the successor did not want or take the state in time (it is stopped then)."""
        process = self._process
        assert process is not None and process.stdin is not None
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        if not self._told(b"R"):
            self.stop()
            return
        fd = handoffs.write(handoff)
        process.stdin.write(f"/proc/{os.getpid()}/fd/{fd}\n".encode())
        process.stdin.flush()
        handoffs.flush_streams()
        if not self._told(b"1"):  # once it opened the file
            self.stop()
            return
        os.execv(sys.executable, [sys.executable, "-S", "-c", _KEEPER, str(process.pid)])

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
        if self._taken >= 0:
            os.close(self._taken)
        self._process, self._taken, self.generation = None, -1, None

    def _told(self, word: bytes) -> bool:
        ready, _, _ = select.select([self._taken], [], [], TAKE_OVER_S)
        return bool(ready) and os.read(self._taken, 1) == word


@dataclasses.dataclass(frozen=True)
class Ahead:
    """What a successor run ahead knows before the handoff: the move it will finish."""

    after_generation: int  # its survivor's generation
    generation: int  # the generation it joins
    attempts: int  # elastic retries so far, this move included
    service: tuple[int, int] | None  # (port, pid): the coordination service its survivor started ahead


class Pending:
    """In a successor run ahead: the handoff to come (see the module)."""

    def __init__(self, told: int, ready_mark: str | None, ahead: Ahead) -> None:
        self._told = told
        self._ready_mark = ready_mark
        change = handoffs.MembershipChange(ahead.after_generation, None, time.monotonic(), False)
        # What the run needs before the state: the move (completed at the handoff) and the service.
        self.preview = handoffs.Handoff(change, None, None, None, None, ahead.attempts, ahead.service)

    def wait(self) -> handoffs.Handoff:
        """Say this process is ready, and wait for the survivor's state."""
        return _receive(self._told, self._ready_mark)


def _receive(told: int, ready_mark: str | None) -> handoffs.Handoff:
    if ready_mark:
        mark_ready(ready_mark)
    os.write(told, b"R")
    path = sys.stdin.readline().strip()
    if not path:  # the survivor went away without handing over (or restarts plainly)
        handoffs.flush_streams()
        os._exit(0)
    fd = os.open(path, os.O_RDONLY)
    os.write(told, b"1")  # the survivor may go: this process holds the state now
    os.close(told)
    return handoffs.read(fd)


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
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the thread that started it
    told_first = json.loads(sys.stdin.readline() or "{}")
    for name in told_first.get("modules", []):
        try:
            __import__(name)
        except BaseException:  # noqa: BLE001 - a module that fails here fails in the script, or not at all
            pass
    ahead = told_first.get("ahead")
    if ahead:
        service = ahead.pop("service")
        # Kept in the handoff module: this one runs as __main__, the script's run imports another copy.
        handoffs.hold(Pending(told, told_first.get("ready_mark"), Ahead(**ahead, service=tuple(service) if service else None)))
    else:
        handoffs.hold(_receive(told, told_first.get("ready_mark")))
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
