"""The zygote of a local cluster: one long-lived process that has imported the heavy modules
(torch, hotswap.train...) without initialising CUDA, and makes worker processes by fork().

Started by the controller (``zygotes.py``) in a session of its own, with no GPU visible and
``PYTORCH_NVML_BASED_CUDA_CHECK=1``, as a warm spare is::

    python zygote.py <zygote-dir> <module>...

It imports the modules, listens on ``<zygote-dir>/socket`` and writes ``<zygote-dir>/ready``
(JSON: its pid, and why it cannot fork, if it cannot). A request is one JSON line
``{"dir", "log", "env", "cwd", "spare" | "assignment"}`` with the worker's start lock as the
one descriptor passed (SCM_RIGHTS). The zygote forks a child that is exactly the shim of a
worker (``shim.supervise`` in-process: a session and process group of its own, the pid file
with its start ticks, the ``started`` mark, child subreaper, the exit record, 128+N for a
signal; it holds the start lock) and that child forks the worker's one process, which either
waits as a warm spare on ``<spare>/assignment`` or becomes the ``assignment`` at once
(``warm.become``). The zygote answers ``{"pid", "ticks"}`` of the shim (or ``{"error"}``) and
reaps its children.

The child becomes the shim only once the controller, having read that answer, sends ``go`` on
the same connection; an end of file instead (the controller gave up waiting and starts the
worker cold, or died) makes it exit at once, before it writes any record: a zygote that forks
late never leaves a second, unrecorded process of a worker or spare.

Fork safety: before every fork the zygote checks that it runs one thread
(``threading.active_count()`` and ``/proc/self/task``) and that CUDA is not initialised in
it; otherwise it refuses (the controller then starts the worker cold). A forked worker gets
fresh seeds (``random`` reseeds itself at fork; numpy's global generator is reseeded here:
numpy 2.4 already draws anew in each fork, older releases did not). Imports may start thread
pools (numpy's OpenBLAS does): the zygote stops them (:func:`quiesce`) before it serves.

It ends when its ``ready`` file is gone (the controller stopped it, or the cluster's directory
was removed): checked every second. Standard library only until the preloads; run by path.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).parent
ACCEPT_TICK_S = 1.0
MAX_REQUEST = 1 << 22
GO = b"go\n"  # the controller's word that it recorded this fork (see the module)
SLOW_FORK_VARIABLE = "HOTSWAP_TEST_ZYGOTE_SLOW_S"  # test-only: seconds to wait before each fork


def _sibling(name: str):  # type: ignore[no-untyped-def]
    """shim.py and warm.py of this directory, under private names (a worker's own ``import
    shim`` must not find ours)."""
    spec = importlib.util.spec_from_file_location(f"_hotswap_zygote_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shim = _sibling("shim")
warm = _sibling("warm")


class BecomeWorker(BaseException):
    """Raised in the forked worker process: unwinds the zygote's stack to ``__main__``, which
    then runs the worker (so that it exits as a Python program does: atexit, threads)."""

    def __init__(self, request: dict) -> None:
        super().__init__()
        self.request = request

    def run(self) -> int:
        request = self.request
        if "numpy" in sys.modules:  # the global generator was seeded once, in the zygote
            sys.modules["numpy"].random.seed()
        assignment = request.get("assignment") or warm.wait_for_assignment(request["spare"])
        warm.become(assignment)
        return 0


def quiesce() -> None:
    """Stop the thread pools that imports started: OpenBLAS (numpy's, started at import) starts
    its workers at load; ``blas_thread_shutdown_`` stops them, and a forked process starts its
    own at its first BLAS call."""
    import ctypes

    with open("/proc/self/maps") as maps:
        libraries = {line.split()[-1] for line in maps if "openblas" in line.rsplit("/", 1)[-1]}
    for library in sorted(libraries):
        try:
            ctypes.CDLL(library).blas_thread_shutdown_()
        except (OSError, AttributeError):
            continue


def fork_problem() -> str | None:
    """Why forking now would not be safe (None: it is)."""
    threads = threading.active_count()
    tasks = len(os.listdir("/proc/self/task"))
    if threads != 1 or tasks != 1:
        return f"the zygote runs {max(threads, tasks)} threads"
    if not warm.cuda_untouched():
        return "CUDA is initialised in the zygote"
    return None


def receive(connection: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(connection, MAX_REQUEST, 1)
    while not data.endswith(b"\n") and len(data) < MAX_REQUEST:
        more = connection.recv(MAX_REQUEST)
        if not more:
            break
        data += more
    return json.loads(data), list(fds)


def shim_child(request: dict, lock: int) -> int:
    """The shim of the requested worker, in the forked child, already leader of its own
    session (see the module)."""
    os.environ.clear()
    os.environ.update(request["env"])
    cwd = request["cwd"] if os.path.isdir(request["cwd"]) else request["dir"]
    os.chdir(cwd)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # as the controller starts a shim: nothing of the zygote's output
        os.dup2(null, fd)
    os.close(null)

    def start(log: int, null: int, forwarded: tuple[int, ...]) -> list[int]:
        pid = os.fork()
        if pid:
            return [pid]
        # The worker's process: its signals at their defaults, its output to its log, the
        # start lock (the shim's alone) closed.
        for number in forwarded:  # as Python starts: SIGINT raises KeyboardInterrupt
            signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(lock)
        raise BecomeWorker(request)

    return shim.supervise(request["dir"], request["log"], start)


def serve(connection: socket.socket, server: socket.socket) -> None:
    request, fds = receive(connection)
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        connection.sendall(json.dumps({"error": "no start lock was passed"}).encode() + b"\n")
        return
    lock = fds[0]
    problem = fork_problem()
    if problem is not None and problem.endswith("threads"):
        quiesce()
        problem = fork_problem()
    if problem is not None:
        os.close(lock)
        connection.sendall(json.dumps({"error": problem}).encode() + b"\n")
        return
    # The answer waits until the child leads a process group of its own: the controller signals
    # a worker's group, and a shim answered before its setsid() could not be signalled at all
    # (a spare forked just before a `cluster delete` then never stopped).
    in_session, said_so = os.pipe()
    slow_s = float(os.environ.get(SLOW_FORK_VARIABLE) or 0)  # (test-only: a zygote that answers late)
    if slow_s:
        time.sleep(slow_s)
    pid = os.fork()
    if pid == 0:
        server.close()
        os.close(in_session)
        os.setsid()
        os.close(said_so)
        if not told_to_go(connection):
            os._exit(shim.CANNOT_RUN)  # nothing was recorded or started: the controller starts it cold
        try:  # (a BecomeWorker passes through: the worker's process unwinds to __main__)
            code = shim_child(request, lock)
        except Exception:  # the shim could not even start: as a command that cannot run
            code = shim.CANNOT_RUN
        os._exit(code)
    os.close(said_so)
    os.read(in_session, 1)  # end of file once the child has closed its end (or died)
    os.close(in_session)
    os.close(lock)
    connection.sendall(json.dumps({"pid": pid, "ticks": shim.start_ticks(pid)}).encode() + b"\n")


def told_to_go(connection: socket.socket) -> bool:
    """Whether the controller took this fork (in the child, which then closes the connection:
    the worker must not hold it)."""
    connection.settimeout(None)  # the controller sends "go" or closes; a dead one closes too
    received = b""
    with connection:
        while len(received) < len(GO):
            try:
                more = connection.recv(len(GO) - len(received))
            except OSError:
                return False
            if not more:
                return False
            received += more
    return received == GO


def reap_children() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str]) -> int:
    directory, *modules = argv
    for module in modules:
        importlib.import_module(module)
    quiesce()
    path = os.path.join(directory, "socket")
    ready = os.path.join(directory, "ready")
    if os.path.exists(path):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o600)
    server.listen(64)
    server.settimeout(ACCEPT_TICK_S)
    shim.write_atomically(ready, json.dumps({"pid": os.getpid(), "problem": fork_problem(), "modules": modules}))
    while os.path.exists(ready):
        reap_children()
        try:
            connection, _ = server.accept()
        except TimeoutError:
            continue
        with connection:
            connection.settimeout(10.0)
            try:
                serve(connection, server)
            except (OSError, ValueError, KeyError) as error:
                print(f"zygote: a request failed: {error!r}", file=sys.stderr, flush=True)
    server.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BecomeWorker as worker:
        sys.exit(worker.run())
