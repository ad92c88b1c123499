"""Printing results: tables for people, plain columns for pipes, JSON or YAML documents for scripts.

With ``--output json|yaml`` stdout holds only that document; messages go to stderr. A table on
a terminal is drawn by rich to the terminal's width, each cell on one line: free-text columns
(messages, node lists) are cut with an ellipsis first, names and numbers are kept whole as long
as anything else can give way. When stdout is not a terminal (a pipe, a file) the same rows are
printed as plain aligned columns, one row per line, every cell whole and never empty
(``<none>``), so ``awk '{print $1, $7}'`` reads them.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from collections.abc import Sequence
from typing import Any

EMPTY = "<none>"
GAP = "   "  # between plain columns, as xpk's own table
# Free text: given up first when a terminal is too narrow (cut with an ellipsis, never wrapped).
FREE_TEXT_MIN = 12
RICH_GAP = 2  # rich's padding between columns of a box-less table
FREE_TEXT_COLUMNS = frozenset({"Status Message", "Message", "Nodes", "Reason", "GPUs (index UUID)", "Hotswap State"})


class Format(str, enum.Enum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


def document(data: Any, fmt: Format) -> None:
    sys.stdout.write(render_document(data, fmt))
    sys.stdout.flush()


def render_document(data: Any, fmt: Format, compact: bool = False) -> str:
    if fmt is Format.JSON:
        return (json.dumps(data, default=str) if compact else json.dumps(data, indent=2, default=str)) + "\n"
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def table(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None, hide_first: Sequence[str] = ()
) -> None:
    """Print a table: fitted to the terminal (see :func:`fit`) on a terminal, plain aligned
    columns otherwise. ``hide_first`` names the columns to leave out first when even cut free
    text does not fit (default: from the right, never the first)."""
    if sys.stdout.isatty():
        from rich.console import Console

        layout = fit(columns, rows, terminal_width(), hide_first)
        if layout.hidden:
            note(f"(hidden at this width: {', '.join(layout.hidden)}; widen the terminal or use -o json)")
        Console(width=terminal_width()).print(rich_table(layout, rows, title))
    else:
        sys.stdout.write(plain_table(columns, rows, title))
        sys.stdout.flush()


def cell_text(cell: Any) -> str:
    """One line of text for a cell: never empty, never more than one line."""
    text = "" if cell is None else " ".join(str(cell).split())
    return text or EMPTY


def plain_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> str:
    """Aligned columns, one row per line, every cell whole (for pipes and files)."""
    cells = [[cell_text(c) for c in row] for row in rows]
    widths = [max([len(name), *(len(row[i]) for row in cells)]) for i, name in enumerate(columns)]
    lines = [title] if title else []
    for row in [list(columns), *cells]:
        lines.append(GAP.join(value.ljust(width) for value, width in zip(row, widths)).rstrip())
    return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which columns a terminal table shows, and how wide each is."""

    shown: tuple[int, ...]  # indices into the columns
    widths: tuple[int, ...]  # one per shown column
    names: tuple[str, ...]
    hidden: tuple[str, ...]


def fit(columns: Sequence[str], rows: Sequence[Sequence[Any]], width: int, hide_first: Sequence[str] = ()) -> Layout:
    """Fit a table into ``width`` characters with every cell on one line: cut free-text columns
    down to :data:`FREE_TEXT_MIN` (an ellipsis marks the cut), then leave out whole columns,
    ``hide_first`` first, then from the right; the first column always stays, whole."""
    cells = [[cell_text(c) for c in row] for row in rows]
    natural = [max([len(name), *(len(row[i]) for row in cells)]) for i, name in enumerate(columns)]
    floor = [min(n, max(FREE_TEXT_MIN, len(name))) if name in FREE_TEXT_COLUMNS else n for n, name in zip(natural, columns)]
    order = [columns.index(name) for name in hide_first if name in columns]
    order += [i for i in reversed(range(1, len(columns))) if i not in order]
    shown = list(range(len(columns)))
    gaps = lambda count: RICH_GAP * (count - 1)  # noqa: E731
    while len(shown) > 1 and sum(floor[i] for i in shown) + gaps(len(shown)) > width:
        shown.remove(next(i for i in order if i in shown))
    widths = {i: natural[i] for i in shown}
    excess = sum(widths.values()) + gaps(len(shown)) - width
    for i in sorted((i for i in shown if columns[i] in FREE_TEXT_COLUMNS), key=lambda i: -natural[i]):
        if excess <= 0:
            break
        cut = min(excess, widths[i] - floor[i])
        widths[i] -= cut
        excess -= cut
    return Layout(
        shown=tuple(shown),
        widths=tuple(widths[i] for i in shown),
        names=tuple(columns[i] for i in shown),
        hidden=tuple(columns[i] for i in range(len(columns)) if i not in shown),
    )


def rich_table(layout: Layout, rows: Sequence[Sequence[Any]], title: str | None = None) -> Any:
    """The rich table of a :class:`Layout`: fixed widths, each cell on one line."""
    from rich.table import Table

    grid = Table(title=title, title_justify="left", box=None, header_style="bold", pad_edge=False)
    for name, column_width in zip(layout.names, layout.widths):
        grid.add_column(name, no_wrap=True, overflow="ellipsis", width=column_width)
    for row in rows:
        grid.add_row(*(cell_text(row[i]) for i in layout.shown))
    return grid


def terminal_width() -> int:
    import shutil

    return shutil.get_terminal_size((160, 24)).columns


def note(message: str) -> None:
    """A message for people (stderr), never part of a document."""
    print(message, file=sys.stderr)


def goodput_words(good: dict[str, Any], at_least: float = 0.0) -> tuple[str, str]:
    """A goodput view (``describe``'s ``goodput``) in words: its figure, "unknown" when its
    workers reported no step (never a 0 % nobody measured), and the time it spent otherwise:
    each badput over ``at_least``, then the share its workers were up with no step reported."""
    value = good.get("goodput")
    figure = "unknown" if value is None else f"{value:.1%}"
    spent = ", ".join(f"{k} {v:.1%}" for k, v in good["badput"].items() if v > at_least) or "none"
    running = good.get("running_share")
    unreported = f"; running with no step reported {running:.1%}" if value is None and running else ""
    return figure, f"badput: {spent}{unreported}"
