"""Every shell command in the README and the docs that a test can run is run by a test (issue 34):
the local guide's session, with the runs page's and the xpk page's commands on its cluster, runs
as written here; the README's tour in test_docs.py; the demos in the demo tests. Every other
command line is listed below with the reason no test runs it, so a command added to the docs
is either run or says why not: this file fails until it does."""

from __future__ import annotations

import os
import re
import shutil
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from local_helpers import cleanup
from test_docs import PAGES, ROOT, bash_blocks, command_lines

TESTS = Path(__file__).resolve().parent
LOCAL_GUIDE = ROOT / "docs" / "guide" / "local.md"
RUNS_PAGE = ROOT / "docs" / "guide" / "workloads.md"
XPK_PAGE = ROOT / "docs" / "guide" / "xpk.md"
DEMO_TESTS = (TESTS / "test_demo.py", TESTS / "test_train_jax_demo.py", TESTS / "test_demo_gpu.py")

# Why a command line is not run by a test: the first rule that matches it.
NOT_RUN: tuple[tuple[str, str], ...] = (
    (r"(^|\s)\.\.\.(\s|$)|<[^>]+>|\[-", "a template: `...`, `<...>` and `[...]` stand for the reader's own values"),
    (r"^(python3? -m (pip|venv)|pip) |^\. \.venv/bin/activate", "installation: .ci/run installs the project on every CI machine"),
    (r"^python3? -m pytest|^lint-imports", "the suite itself: .ci/run runs it (the layer contracts in test_architecture.py)"),
    (r"^python3? benchmarks/", "a benchmark: it prints measurements for docs/performance.md, run by hand"),
    (r"^python3? docs/check_links\.py --online", "needs the internet (CI reaches PyPI only): test_docs_links.py checks the list offline and the checker against a local server"),
    (r"--backend kubernetes|--cluster trillium|kubectl", "needs a Kubernetes API server (the CLI against a fake one: test_kubernetes_cli.py)"),
    (r"--gpus|--cluster gpu|demo gpu", "needs NVIDIA GPUs: benchmarks/gpu_acceptance.sh on a GPU machine"),
    (r"hotswap dashboard|--follow|--watch|demo --dashboard", "runs until interrupted (the dashboard's own tests serve it)"),
)


def _written_lines() -> list[tuple[Path, int, str]]:
    return [(page, index, line) for page in PAGES for index, block in enumerate(bash_blocks(page)) for line in command_lines(block)]


def _demo_is_run(line: str) -> bool:
    """A `hotswap demo [SCENARIO] [flags]` line whose scenario and flags a demo test passes."""
    words = shlex.split(line, comments=True)
    args = words[words.index("demo") + 1:] if "demo" in words else []
    tests = "\n".join(path.read_text() for path in DEMO_TESTS if path.exists())
    scenario = args[0] if args and not args[0].startswith("-") else "hotswap"  # the default drill
    return f'"{scenario}"' in tests and all(f'"{word}"' in tests for word in args[1:] if not word.startswith("-") or word.startswith("--"))


def _run_here(page: Path, index: int) -> bool:
    """The blocks ``test_the_local_guide_runs_as_written`` runs, and the README's tour."""
    if page == ROOT / "README.md":
        return "node fail" in bash_blocks(page)[index]
    return page in (LOCAL_GUIDE, RUNS_PAGE) or (page == XPK_PAGE and index == 0)


def test_every_command_in_the_docs_is_run_by_a_test_or_says_why_not() -> None:
    unexplained = []
    for page, index, line in _written_lines():
        for part in re.split(r"\s*&&\s*", line):
            part = part.split("  #")[0].strip()
            if any(re.search(pattern, part) for pattern, _ in NOT_RUN):
                continue
            if _run_here(page, index) or ("hotswap demo" in part and _demo_is_run(part)):
                continue
            unexplained.append(f"{page.relative_to(ROOT)} block {index}: {part}")
    assert not unexplained, "neither run by a test nor listed in NOT_RUN with a reason:\n" + "\n".join(unexplained)


@pytest.fixture
def home(tmp_path: Path):  # type: ignore[no-untyped-def]
    state = tmp_path / "state"
    yield state
    cleanup(state)


def _runnable(line: str) -> str | None:
    """The line as a test can run it: optional ``[...]`` parts left out; None for a template or
    a command that runs until interrupted."""
    line = re.sub(r"\s*\[-[^\]]*\]", "", line)  # [--flag value]: optional
    if any(re.search(pattern, line) for pattern, _ in NOT_RUN):
        return None
    return line


def _until_running_jobs_trained(env: dict[str, str], timeout: float = 240.0) -> None:
    """Until every running workload of the guide's cluster has reported a step since it last
    started (a failure or a delete before the first step tests nothing the page says)."""
    import json
    import time

    def hotswap(*args: str) -> object:
        result = subprocess.run([sys.executable, "-m", "hotswap", *args, "--cluster", "demo", "-o", "json"],
                                capture_output=True, text=True, env=env, timeout=120, check=True)
        return json.loads(result.stdout)

    deadline = time.monotonic() + timeout
    while True:
        waiting = []
        for row in hotswap("workload", "list"):  # type: ignore[attr-defined]
            if row["status"] != "RUNNING":
                continue
            described = hotswap("workload", "describe", "--workload", row["name"])
            started = max(float(t) for t in described["progress"]["timeline_t"])  # type: ignore[index]
            if not any(t > started for t, _ in described["progress"]["steps"]):  # type: ignore[index]
                waiting.append(row["name"])
        if not waiting:
            return
        assert time.monotonic() < deadline, f"{waiting} reported no step in {timeout:.0f}s"
        time.sleep(0.5)


def test_the_local_guide_runs_as_written(home: Path) -> None:
    """docs/guide/local.md's session on the local backend from the repository root; before its
    last line (`cluster delete`), the runs page's delete-and-create-again and the xpk page's
    pipelines on the same cluster. Each command must succeed and say what its comment says."""
    pytest.importorskip("torch", reason="the guide trains PyTorch jobs (hotswap[torch])")
    [session] = [block for block in bash_blocks(LOCAL_GUIDE) if "cluster create" in block]
    lines = command_lines(session)
    assert lines[-1].startswith("hotswap cluster delete")
    lines[-1:-1] = [*command_lines(bash_blocks(RUNS_PAGE)[0]), *command_lines(bash_blocks(XPK_PAGE)[0])]
    # As in the user's activated virtual environment: `python` and `hotswap` are this interpreter's.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, "HOTSWAP_HOME": str(home), "HOTSWAP_WARM_WORKERS": "0"}
    outputs: dict[str, str] = {}
    for written in lines:
        line = _runnable(written)
        if line is None:
            continue
        if "jq " in line and shutil.which("jq") is None:
            continue  # the reader's jq; not every CI machine has it
        if re.search(r"hotswap (node fail|workload delete|cluster delete)", line):
            _until_running_jobs_trained(env)  # a reader types this after seeing the jobs train
        shell = "|" in line
        command = ["bash", "-c", line] if shell else [sys.executable, "-m", "hotswap", *shlex.split(line, comments=True)[1:]]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=240)
        assert result.returncode == 0, (line, result.stdout[-2000:], result.stderr[-2000:])
        outputs[line] = result.stdout + result.stderr
    described = next(out for line, out in outputs.items() if "workload describe" in line)
    assert "high" in described and "preempt" in described.lower(), described  # "preempted by high"
    recreated = next(out for line, out in outputs.items() if "workload create" in line and "--workload low" in line
                     and "--priority" not in line)
    assert "resumes from the migration checkpoint of run" in recreated, recreated
