"""A warm spare worker: a Python process that has already imported the heavy modules (torch,
hotswap.train) and waits to be handed a worker's assignment.

Started by the controller under the shim, like any worker::

    python warm.py <spare-dir> <module>...

It imports the modules, opens ``<spare-dir>/assignment`` (a FIFO, read-write so that the open
does not wait for a writer), creates ``<spare-dir>/ready``, and blocks reading it. The controller writes one JSON line, ``{"argv", "env",
"cwd", "log"}``; the spare then becomes that worker: it takes the environment and working
directory, sends its output to the worker's log, and runs the script as ``__main__``. From the
outside it is then an ordinary worker (same process group, same exit-code record), minus the
seconds a cold start spends importing PyTorch.

Standard library only at start; run by path.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import time


CUDA_UNTOUCHED = "cuda-untouched"  # in the spare's directory: CUDA is not initialised in it


def cuda_untouched() -> bool:
    """Whether this process has not initialised CUDA (torch's lazy init). The pool starts spares
    with ``PYTORCH_NVML_BASED_CUDA_CHECK=1``, so that ``torch.cuda.is_available()`` during the
    imports asks NVML instead of initialising the driver under the spare's own
    ``CUDA_VISIBLE_DEVICES``."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "cuda"):
        return True
    try:
        return not torch.cuda.is_initialized()
    except Exception:
        return False


def main(argv: list[str]) -> int:
    spare_dir, *modules = argv
    for module in modules:
        importlib.import_module(module)
    become(wait_for_assignment(spare_dir))
    return 0


def wait_for_assignment(spare_dir: str) -> dict:
    """Say that the spare is ready (and whether CUDA is untouched), and wait for its assignment."""
    if cuda_untouched():
        # Nothing has initialised CUDA here: the GPUs the worker will see are still open, so
        # the spare can serve a GPU-backed worker (its CUDA_VISIBLE_DEVICES applies at hand-over).
        open(os.path.join(spare_dir, CUDA_UNTOUCHED), "w").close()
    channel = os.open(os.path.join(spare_dir, "assignment"), os.O_RDWR)
    with os.fdopen(os.open(os.path.join(spare_dir, "ready"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as ready:
        ready.write(str(os.getpid()))
    data = b""
    while not data.endswith(b"\n"):
        data += os.read(channel, 1 << 20)
    os.close(channel)
    return json.loads(data)


def become(assignment: dict) -> None:
    """Become the worker of ``assignment`` (``{"argv", "env", "cwd", "log"}``): its environment,
    working directory and log, then its script as ``__main__``."""
    os.environ.clear()
    os.environ.update(assignment["env"])
    os.environ["HOTSWAP_HANDED_OVER_AT"] = repr(time.time())  # api/worker.py HOTSWAP_HANDED_OVER_AT: the worker's "spawn"
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "cuda") and hasattr(torch.cuda, "_cached_device_count"):
        torch.cuda._cached_device_count = None  # counted under the spare's CUDA_VISIBLE_DEVICES, if at all
    os.chdir(assignment["cwd"])
    # What a cold start would take from the environment at start-up, applied now.
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[1:1] = [p for p in extra if p not in sys.path]
    threads = os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS")
    if threads and threads.isdigit() and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))
    log = os.open(assignment["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    script, *arguments = assignment["argv"][1:]
    sys.argv = [script, *arguments]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
