"""A JAX survivor's next program (``train/jax/successor.py``): started and imported while the
survivor trains, it takes the state handed over and runs under the survivor's pid; run ahead, it
runs the script up to the state and takes the state when the script asks for it (each with a
spawned Python script that plays the survivor and starts its successor, a second process running
the same script, as the SDK does); a successor whose watchdog asks for a restart while it waits
for its state ends instead of starting a fresh program (in this process, the exit and the
restart replaced by fakes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from jax_helpers import ROOT, ends, jax  # noqa: F401 (jax is a fixture)


_SURVIVOR = """
import os, signal, sys, time
from hotswap.train.jax import handoff as handoffs
from hotswap.train.jax.successor import Successor
taken = handoffs.take()
if taken is None:  # the survivor: its successor starts (and imports) while it trains on
    print("survivor", os.getpid(), flush=True)
    successor = Successor()
    successor.start(sys.argv[1])
    change = handoffs.MembershipChange(1, 2, time.monotonic(), False)
    successor.take_over(handoffs.Handoff(change, {"step": 7}, None, None, None))
    raise SystemExit("the successor did not take the state")
print("successor", os.getpid(), "took step", taken.counters["step"], "marked", os.path.exists(sys.argv[1]), flush=True)
signal.signal(signal.SIGTERM, lambda *_: (print("SIGTERM at the successor", flush=True), os._exit(143)))
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
time.sleep(120)
"""


def test_a_survivors_successor_takes_its_state_and_runs_under_its_pid(tmp_path: Path) -> None:
    """The next program of a survivor, started and imported ahead, takes the state handed
    over; the survivor's pid stays (what the supervisor knows): SIGTERM sent to it reaches the
    successor and the pid exits with the successor's status."""
    import signal
    import time

    script = tmp_path / "survivor.py"
    script.write_text(_SURVIVOR)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    mark = tmp_path / "ready-mark"  # what the survivors wait for before they move (see formation)
    worker = subprocess.Popen([sys.executable, str(script), str(mark)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert worker.stdout is not None
    survivor = worker.stdout.readline().split()
    successor = worker.stdout.readline().split()
    assert survivor == ["survivor", str(worker.pid)]
    assert successor[0] == "successor" and successor[1] != str(worker.pid) and successor[2:] == ["took", "step", "7", "marked", "True"]
    time.sleep(0.5)
    assert worker.poll() is None  # the pid lives on, keeping the successor's place
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=30)
    assert "SIGTERM at the successor" in out and worker.returncode == 143, err[-2000:]
    assert ends(int(successor[1]))


_AHEAD = """
import os, sys, time
from hotswap.train.jax import handoff as handoffs
from hotswap.train.jax.successor import Ahead, Successor
mark = sys.argv[1]
taken = handoffs.take()
if taken is None:  # the survivor: its successor runs the script ahead while it trains on
    successor = Successor()
    successor.start(mark, Ahead(after_generation=1, generation=2, attempts=3, service=None))
    while not os.path.exists(mark):  # what the survivors wait for before they move
        time.sleep(0.01)
    print("survivor hands over", flush=True)
    change = handoffs.MembershipChange(1, 2, time.monotonic(), False)
    successor.take_over(handoffs.Handoff(change, {"step": 7}, None, None, None, attempts=3))
    raise SystemExit("the successor did not take the state")
preview = taken.preview  # a successor run ahead: what it knows before the state
print("ahead of the state: after", preview.change.after_generation, "attempts", preview.attempts, flush=True)
state = taken.wait()
print("took step", state.counters["step"], "previous slices", state.change.previous_slices, flush=True)
"""


def test_a_successor_runs_the_script_ahead_and_takes_the_state_when_it_wants_it(tmp_path: Path) -> None:
    """Run ahead, a survivor's next program runs the script before the survivor hands over
    (joining the new generation and building the model meanwhile), marks itself ready only
    when the script wants the state, and then takes the state the survivor held."""
    script = tmp_path / "survivor.py"
    script.write_text(_AHEAD)
    mark = tmp_path / "2-a-0-0"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, str(script), str(mark)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "ahead of the state: after 1 attempts 3",
        "survivor hands over",
        "took step 7 previous slices 2",
    ]


def test_a_successor_asked_to_restart_while_it_waits_for_its_state_ends_instead(
    jax, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A successor run ahead waits for its survivor's state; if its watchdog moves it on
    meanwhile (a newer generation), it must end, not replace itself by a fresh program: its
    survivor still runs, and restarts plainly (two workers of one slice otherwise)."""
    from hotswap.train.jax import handoff as handoffs
    from hotswap.train.jax import run as runs_module

    run = object.__new__(runs_module.JaxRun)
    restarted: list[object] = []
    monkeypatch.setattr(handoffs, "restart", lambda handoff: restarted.append(handoff))

    def ended(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(runs_module.os, "_exit", ended)

    class Waiting:
        preview = None

        def wait(self) -> None:  # the watchdog acts while the state has not come
            run._restart(handoffs.Handoff(handoffs.MembershipChange(1, 2, 0.0, True), None, None, None, None))

    run._pending = Waiting()  # type: ignore[attr-defined]
    with pytest.raises(SystemExit) as ending:
        run._take_over()  # type: ignore[attr-defined]
    assert ending.value.code == runs_module.RESTART_EXIT_CODE and restarted == []
