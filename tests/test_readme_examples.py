"""The README's command examples work as written from the repository root (issue 25 item 1).

A user copies a `hotswap ... --command "python X"` line from a README code block and runs it in
a clone: the local backend runs the command in the directory `workload create` was called from,
so every script an example names must exist there. Examples that run in a container image
(`--docker-image`, Kubernetes) name paths inside the image and are not checked.
"""

from __future__ import annotations

import py_compile
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]  # the front door and the documentation site


def _text() -> str:
    """The README and every page of the documentation, one after another."""
    return "\n\n".join(page.read_text(encoding="utf-8") for page in PAGES)


def _bash_commands() -> list[str]:
    """Every command of the README's ```bash blocks, continuation lines joined, comments cut."""
    commands: list[str] = []
    for block in re.findall(r"^```(?:bash|sh|console)\n(.*?)^```", _text(), re.M | re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def _command_scripts() -> list[tuple[str, str]]:
    """(example, script) for each `--command "python[3] SCRIPT ..."` run on this machine."""
    found = []
    for line in _bash_commands():
        if not line.startswith("hotswap ") or "--docker-image" in line or "--base-docker-image" in line:
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        for flag, value in zip(words, words[1:]):
            if flag == "--command":
                parts = value.split()
                if parts and re.fullmatch(r"python3?", parts[0]) and len(parts) > 1 and parts[1].endswith(".py"):
                    found.append((line, parts[1]))
    return found


def test_readme_names_scripts_in_some_examples() -> None:
    assert len(_command_scripts()) >= 3  # the local backend's, runs' and GPU sections' examples


def test_every_script_a_readme_example_runs_exists_from_the_repository_root() -> None:
    missing = [(line, script) for line, script in _command_scripts() if not (ROOT / script).is_file()]
    assert not missing, f"README examples name scripts that do not exist relative to the repository root: {missing}"
    for _, script in _command_scripts():
        py_compile.compile(str(ROOT / script), cfile=None, doraise=True, optimize=-1)


def test_every_relative_path_a_readme_command_names_exists() -> None:
    """`python path.py`, `bash path.sh` and the like, as a user would type them in the clone."""
    missing = []
    for line in _bash_commands():
        if "--docker-image" in line:
            continue
        for word in re.findall(r"(?<![\w/.:-])((?:examples|tests|benchmarks|src)/[\w./-]+\.(?:py|sh))", line):
            if not (ROOT / word).exists():
                missing.append((line, word))
    assert not missing, missing


def _limits_rows() -> dict[str, str]:
    """The Security section's table of input limits: first cell -> second cell."""
    section = _text().split("| Input | Limit |", 1)[1].split("\n\n", 1)[0]
    rows = [line.strip("|").split("|") for line in section.strip().splitlines()[1:]]
    return {cells[0].strip(): cells[1].strip() for cells in rows if len(cells) >= 2}


def test_the_limits_table_states_the_local_clusters_cap_on_slices() -> None:
    """A local cluster refuses more than MAX_LOCAL_SLICES slices; the README says so (item 7)."""
    from hotswap.backends.local.protocol import MAX_LOCAL_SLICES

    rows = {name: limit for name, limit in _limits_rows().items() if "cluster create --num-slices" in name}
    assert rows, "the README's limits table has no row for a cluster's slices"
    assert any(limit.startswith(f"1-{MAX_LOCAL_SLICES:,}") for limit in rows.values()), rows


def test_no_page_writes_the_exit_codes_by_hand() -> None:
    """Scripts rely on the codes: the pages that list them have the table generated from
    EXIT_CODES when the site is built (docs/_hooks/reference.py), never a copy that can drift."""
    text = _text()
    assert "| Code | Meaning |" not in text and "| Exit code | Meaning |" not in text
    assert text.count("<!-- hotswap:exit-codes -->") >= 1


def test_every_error_of_either_backend_exits_with_a_code_of_the_one_table() -> None:
    """No backend has a code of its own that the table lacks (Kubernetes' 7 once had none)."""
    import importlib
    import pkgutil

    import hotswap
    from hotswap.api.errors import EXIT_CODES, HotswapError

    for module in pkgutil.walk_packages(hotswap.__path__, "hotswap."):
        if any(part in module.name for part in (".train.", ".dashboard", "__main__", ".controller.entry")):
            continue
        try:
            importlib.import_module(module.name)
        except ImportError:  # an extra that is not installed
            continue
    seen, todo = set(), [HotswapError]
    while todo:
        cls = todo.pop()
        seen.add(cls)
        todo += [sub for sub in cls.__subclasses__() if sub not in seen]
    codes = {cls: cls.exit_code for cls in seen}
    assert {c.__module__ for c in seen} >= {"hotswap.api.errors", "hotswap.backends.kubernetes.client.connection"}
    assert all(code in EXIT_CODES for code in codes.values()), {f"{c.__module__}.{c.__name__}": v for c, v in codes.items() if v not in EXIT_CODES}


def test_each_script_a_readme_example_runs_starts_from_the_repository_root() -> None:
    """What `--command "python examples/train.py"` runs in a clone: the script starts (its
    `--help`, so no training), rather than `can't open file`."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    for script in sorted({script for _, script in _command_scripts()}):
        result = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"python {script} from the repository root: {result.stderr[-500:]}"


# ---------------------------------------------------------------- the README can be followed (issue 34, item 8)


def _block_with(text: str) -> str:
    """The README's ```bash block that contains ``text``."""
    [block] = [b for b in re.findall(r"^```bash\n(.*?)^```", _text(), re.M | re.S) if text in b]
    return block


def _flag(words: list[str], flag: str, default: str) -> str:
    return words[words.index(flag) + 1] if flag in words else default


def test_the_local_quickstart_jobs_run_long_enough_to_fail_a_node_under_them() -> None:
    """Typing `workload list` and `node fail` after the creates takes a person a minute: the
    jobs must still be training then, not long finished."""
    block = _block_with("hotswap node fail --cluster demo")
    defaults = dict(re.findall(r'add_argument\("--(steps|step-sleep)", type=\w+, default=([\d.]+)', (ROOT / "examples/train.py").read_text()))
    assert set(defaults) == {"steps", "step-sleep"}, defaults  # the example's defaults, as this test reads them
    jobs = [shlex.split(line)[shlex.split(line).index("--command") + 1].split() for line in block.splitlines() if "workload create" in line]
    assert len(jobs) == 2 and all(job[1] == "examples/train.py" for job in jobs), jobs
    for job in jobs:
        seconds = int(_flag(job, "--steps", defaults["steps"])) * float(_flag(job, "--step-sleep", defaults["step-sleep"]))
        assert seconds >= 120, f"{' '.join(job)}: its steps end in {seconds:g} s of sleep, before `node fail` can be typed"


def _install_extras(block: str) -> list[str]:
    return re.findall(r'pip install -e "\.\[([^\]]*)\]"', block)


def test_development_installs_what_quickstart_step_2_installs() -> None:
    [quickstart] = _install_extras(_block_with("# 2. install and run the test suite"))
    [development] = _install_extras(_block_with("lint-imports"))
    assert development == quickstart
    text = README.read_text(encoding="utf-8")
    start = text.index("## Quickstart")
    quick = text[start:text.index("\n## ", start)]
    assert "venv" in quick and "minutes" in quick  # a fresh machine needs one; the suite's duration is said


def test_the_xpk_example_table_shows_each_job_s_slices() -> None:
    """The `workload list` example is of the laptop block's cluster: high asked for 2 slices."""
    text = _text()
    example = text[text.index("$ hotswap workload list --cluster demo"):]
    header, *rows = example.split("```")[0].splitlines()[1:]
    columns = re.split(r"\s{2,}", header.strip())
    needed, running = columns.index("Slices Needed"), columns.index("Slices Running/Ran")
    table = {row.split()[0]: re.split(r"\s{2,}", row.strip()) for row in rows if row.strip()}
    high = next(line for line in _block_with("hotswap node fail --cluster demo").splitlines() if "--workload high" in line)
    assert table["high"][needed] == _flag(shlex.split(high), "--num-slices", "1") == "2"
    for name, cells in table.items():
        assert cells[running] == "<none>" or int(cells[running]) <= int(cells[needed]), name
