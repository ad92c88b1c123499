"""Printing results: tables for people, JSON or YAML documents for scripts.

With ``--output json|yaml`` stdout holds only that document; messages go to stderr.
"""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Sequence
from typing import Any


class Format(str, enum.Enum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


def document(data: Any, fmt: Format) -> None:
    if fmt is Format.JSON:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    else:
        import yaml

        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    grid = Table(title=title, title_justify="left", box=None, header_style="bold", pad_edge=False)
    for column in columns:
        grid.add_column(column, overflow="fold")
    for row in rows:
        grid.add_row(*("" if cell is None else str(cell) for cell in row))
    Console(width=max(120, _terminal_width())).print(grid)


def _terminal_width() -> int:
    import shutil

    return shutil.get_terminal_size((160, 24)).columns


def note(message: str) -> None:
    """A message for people (stderr), never part of a document."""
    print(message, file=sys.stderr)
