"""The documentation (issue 34): the README is a front door, and the site under docs/ builds with
MkDocs in strict mode (a broken link or anchor, a page left out of the navigation: the build
fails); its reference pages are generated from the code. Every `hotswap ...` command line in the
README and the docs names a command that exists with flags it has, and the README's tour runs
as written on the local backend."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from local_helpers import cleanup

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
FRONT_DOOR_LINES = 300


def bash_blocks(path: Path) -> list[str]:
    return re.findall(r"^```(?:bash|sh|console)\n(.*?)^```", path.read_text(encoding="utf-8"), re.M | re.S)


def command_lines(block: str) -> list[str]:
    """A block's commands: continuation lines joined, comments and prompts cut."""
    lines = []
    for line in re.sub(r"\\\n\s*", " ", block).splitlines():
        line = line.strip().removeprefix("$ ")
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def hotswap_lines() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for block in bash_blocks(page):
            for line in command_lines(block):
                for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line):
                    if part.startswith("hotswap "):
                        found.append((str(page.relative_to(ROOT)), part))
    return found


def test_the_readme_is_a_front_door() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= FRONT_DOOR_LINES
    for needed in ("## Quickstart", "docs/"):
        assert needed in text


def test_every_documented_hotswap_command_exists_with_the_flags_it_shows() -> None:
    """Checked against the command tree itself: a renamed command or flag fails here."""
    import typer

    from hotswap.cli.app import app

    root = typer.main.get_command(app)
    problems, checked = [], 0
    for page, line in hotswap_lines():
        try:
            words = shlex.split(line.replace("[", " ").replace("]", " "), comments=True)
        except ValueError:
            continue
        command, context, path = root, None, ["hotswap"]
        for word in words[1:]:
            if word.startswith("-") or not hasattr(command, "list_commands"):
                break
            context = command.context_class(command, info_name=path[-1], parent=context)
            sub = command.get_command(context, word)
            if sub is None:
                problems.append(f"{page}: `{line}`: no command {' '.join([*path, word])!r}")
                break
            command, path = sub, [*path, word]
        else:
            pass
        known = {name for parameter in command.params for name in (*parameter.opts, *parameter.secondary_opts)}
        known |= {"-h", "--help"}
        for word in words[len(path):]:
            flag = word.split("=", 1)[0]
            if re.fullmatch(r"--?[a-zA-Z][\w-]*", flag) and flag not in known:
                problems.append(f"{page}: `{line}`: {' '.join(path)} has no {flag}")
        checked += 1
    assert checked >= 40
    assert not problems, "\n".join(problems)


@pytest.mark.skipif(not os.environ.get("CI") and not __import__("importlib").util.find_spec("mkdocs"), reason="mkdocs is in hotswap[dev]")
def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    """Warnings are errors: links and anchors between pages, pages missing from the navigation;
    the generated reference pages hold what the code defines."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    from hotswap.api.errors import EXIT_CODES
    from hotswap.backends.kit.metrics import METRICS

    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    for command in ("hotswap cluster create", "hotswap workload create", "hotswap node fail", "hotswap simulate"):
        assert command in cli
    codes = (tmp_path / "site" / "reference" / "exit-codes" / "index.html").read_text()
    assert all(re.search(rf"<td[^>]*>{code}</td>", codes) for code in EXIT_CODES)
    metrics = (tmp_path / "site" / "reference" / "metrics" / "index.html").read_text()
    assert all(metric.name in metrics for metric in METRICS)
    environment = (tmp_path / "site" / "reference" / "environment" / "index.html").read_text()
    for name in ("RANK", "HOTSWAP_ATTEMPT", "HOTSWAP_CHECKPOINT_DIR", "MEGASCALE_NUM_SLICES"):
        assert f"<code>{name}</code>" in environment


@pytest.fixture
def home(tmp_path: Path):  # type: ignore[no-untyped-def]
    state = tmp_path / "state"
    yield state
    cleanup(state)


def test_the_readme_tour_runs_as_written(home: Path) -> None:
    """The front door's five-minute tour, command by command, on the local backend from the
    repository root (each must succeed), with a state directory of its own."""
    [tour] = [block for block in bash_blocks(README) if "node fail" in block and "cluster create" in block]
    pytest.importorskip("torch", reason="the tour trains PyTorch jobs (hotswap[torch])")
    # As in the user's activated virtual environment: `python` is this interpreter.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, "HOTSWAP_HOME": str(home), "HOTSWAP_WARM_WORKERS": "0"}
    outputs: list[tuple[str, str]] = []
    for line in command_lines(tour):
        if "--follow" in line or "--watch" in line:
            continue  # they run until interrupted
        result = subprocess.run(
            [sys.executable, "-m", "hotswap", *shlex.split(line, comments=True)[1:]],
            cwd=ROOT, capture_output=True, text=True, env=env, timeout=240,
        )
        assert result.returncode == 0, (line, result.stdout[-2000:], result.stderr[-2000:])
        outputs.append((line, result.stdout))
    # What the tour's comments promise after the failure: high hotswapped onto low's slice.
    failed = next(i for i, (line, _) in enumerate(outputs) if " node fail " in f" {line} ")
    listed = next(out for line, out in outputs[failed:] if "workload list" in line)
    rows = {row.split()[0]: row for row in listed.splitlines()[1:] if row.strip()}
    assert "HOTSWAPPED" in rows["high"] and "QUEUED (preempted)" in rows["low"], listed
