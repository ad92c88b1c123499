"""MkDocs hook: the reference pages' tables and the CLI's help, generated at build time from the
code that defines them (one home for each contract value; the docs never restate them by hand).

A page asks for a generated part with a marker on a line of its own:
``<!-- hotswap:cli -->`` (every command's ``--help``), ``<!-- hotswap:exit-codes -->``,
``<!-- hotswap:worker-environment -->`` (the variables of ``hotswap.api.worker`` with the
comments that document them), ``<!-- hotswap:worker-exit-codes -->``, ``<!-- hotswap:metrics -->``
(the controllers' Prometheus metrics) and ``<!-- hotswap:readme-quickstart -->`` (the README's
Quickstart, so that the two never differ).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path
from typing import Any

MARKER = re.compile(r"^<!-- hotswap:([a-z-]+) -->$", re.M)
SOURCE = Path(__file__).resolve().parents[2] / "src" / "hotswap"


def on_page_markdown(markdown: str, **_: Any) -> str:
    return MARKER.sub(lambda found: GENERATORS[found.group(1)](), markdown)


def cli_help() -> str:
    """Each command's help as ``hotswap ... --help`` prints it, group by group."""
    import typer

    from hotswap.cli.app import app

    root = typer.main.get_command(app)
    parts: list[str] = []

    # typer builds on click (a copy of its own in recent releases): the commands' own classes.
    def visit(command: Any, path: list[str], parent: Any) -> None:
        context = command.context_class(command, info_name=path[-1], parent=parent, terminal_width=100, max_content_width=100)
        heading = f"{'#' * min(len(path), 4)} `{' '.join(path)}`\n\n" if parent is not None else ""
        parts.append(f"{heading}```text\n{command.get_help(context).rstrip()}\n```\n")
        if hasattr(command, "list_commands"):
            for name in command.list_commands(context):
                sub = command.get_command(context, name)
                if sub is not None and not sub.hidden:
                    visit(sub, [*path, name], context)

    visit(root, ["hotswap"], None)
    return "\n".join(parts)


def exit_codes() -> str:
    from hotswap.api.errors import EXIT_CODES

    rows = [f"| {code} | {meaning} |" for code, meaning in sorted(EXIT_CODES.items())]
    return "| Exit code | Meaning |\n|---:|---|\n" + "\n".join(rows)


def worker_environment() -> str:
    """The contract's variables with the comments beside and above them in ``api/worker.py``."""
    path = SOURCE / "api" / "worker.py"
    text = path.read_text()
    lines = text.splitlines()
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("# ").strip()
    rows = []
    for node in ast.parse(text).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        if not (isinstance(node.value, ast.Constant) and node.value.value == name):
            continue  # only the variables: NAME = "NAME"
        said = [comments[node.lineno]] if node.lineno in comments else []
        above, line = [], node.lineno - 1
        while line in comments and lines[line - 1].lstrip().startswith("#"):  # the block just above
            above.insert(0, comments[line])
            line -= 1
        meaning = " ".join(said or above).replace("|", "\\|")
        rows.append(f"| `{name}` | {meaning} |")
    return "| Variable | Meaning |\n|---|---|\n" + "\n".join(rows)


def metrics() -> str:
    from hotswap.backends.kit.metrics import METRICS

    rows = [f"| `{m.name}` | {m.kind} | {', '.join(m.labels) or '-'} | {m.help} |" for m in METRICS]
    return "| Metric | Type | Labels | Meaning |\n|---|---|---|---|\n" + "\n".join(rows)


def worker_exit_codes() -> str:
    from hotswap.api import worker

    rows = [
        (worker.CHECKPOINTED_EXIT_CODE, "stopped as asked (SIGTERM: preemption, drain, deletion) after saving its state; restarted, never a failure"),
        (worker.RESTART_EXIT_CODE, "cannot go on for a reason outside the training code (a non-elastic group lost a peer, no membership came): restart it, after it saved what it holds"),
        (worker.CHECKPOINTS_UNUSABLE_EXIT_CODE, "the job's checkpoints cannot be used (a refused directory, only damaged checkpoints without HOTSWAP_ALLOW_FRESH_START, or a final save that failed): the workload fails"),
    ]
    return "| Exit code | Meaning |\n|---:|---|\n" + "\n".join(f"| {code} | {meaning} |" for code, meaning in rows)


def readme_quickstart() -> str:
    """The README's Quickstart section, its heading dropped (the page has its own)."""
    text = (SOURCE.parents[1] / "README.md").read_text()
    start = text.index("\n## Quickstart\n") + len("\n## Quickstart\n")
    end = text.index("\n## ", start)
    return text[start:end].strip().replace("](docs/", "](") + "\n"  # the README's links, from docs/


GENERATORS = {
    "cli": cli_help,
    "exit-codes": exit_codes,
    "worker-environment": worker_environment,
    "worker-exit-codes": worker_exit_codes,
    "metrics": metrics,
    "readme-quickstart": readme_quickstart,
}
