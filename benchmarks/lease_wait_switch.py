"""A training script run with or without the save-lease wait, for ``bench_slice_loss.py``::

    python benchmarks/lease_wait_switch.py wait|nowait SCRIPT [ARG...]

``nowait`` restores as the SDK did before the leases: the restoring rank's
``SaveLeases.wait_for_earlier`` returns at once, so the newest checkpoint already committed is
taken. Everything else (the lease itself, the saves, the script) is the SDK's own. Both modes
go through this runner, so the two sides of the comparison start the same way. Run by path,
also by a warm spare (which runs it as ``__main__``).
"""

from __future__ import annotations

import os
import runpy
import sys


def restore_without_waiting() -> None:
    from hotswap.train.save_leases import SaveLeases

    def no_wait(self: SaveLeases, limit_s: float, *_: object, **__: object) -> float:
        return 0.0

    SaveLeases.wait_for_earlier = no_wait  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    mode, script, *arguments = argv
    if mode not in ("wait", "nowait"):
        raise SystemExit(f"the first argument is wait or nowait, not {mode!r}")
    if mode == "nowait":
        restore_without_waiting()
    sys.argv = [script, *arguments]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
