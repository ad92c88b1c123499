"""Confirmation of destructive commands (a cluster shrink, a cluster delete that stops work),
as xpk asks: the question lists what is affected; ``--force`` answers yes; without a terminal
to ask on, the command refuses in one line instead of waiting for an answer that cannot come.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def confirmation(force: bool) -> Callable[[str], bool]:
    """The ``confirm(question)`` a backend calls before it changes anything: the question's
    first line is the summary, the next ones list what it affects."""

    def confirm(question: str) -> bool:
        if force:
            return True
        summary = question.splitlines()[0]
        if not sys.stdin.isatty():
            from hotswap.api.errors import InvalidInputError

            raise InvalidInputError(f"{summary.rstrip('?:')}: this needs confirmation and stdin is not a terminal; add --force")
        import typer

        return typer.confirm(question, default=False, err=True)

    return confirm
