"""Environment variables from the command line (``--env K=V``) and from files (``--env-file``).

Files follow Docker's ``--env-file`` syntax, as xpk's flag does: one ``NAME=value`` per line,
the value taken literally (no quotes removed, no ``$`` expansion); ``NAME`` alone copies the
variable from the caller's environment (and is skipped if it is not set there); blank lines
and lines starting with ``#`` are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from hotswap.api.errors import InvalidInputError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env_file(text: str, environ: Mapping[str, str], source: str = "env file") -> dict[str, str]:
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.lstrip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not _NAME.fullmatch(name):
            shown = name if len(name) <= 40 else name[:37] + "..."
            raise InvalidInputError(f"{source} line {number}: {shown!r} is not a valid variable name")
        if sep:
            values[name] = value
        elif name in environ:
            values[name] = environ[name]
    return values


def read_env_file(path: str | Path, environ: Mapping[str, str]) -> dict[str, str]:
    file = Path(path)
    try:
        text = file.read_text()
    except FileNotFoundError:
        raise InvalidInputError(f"--env-file {file}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as error:
        raise InvalidInputError(f"--env-file {file}: cannot read it ({error.__class__.__name__})") from None
    return parse_env_file(text, environ, source=f"--env-file {file}")


def parse_env_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """``--env NAME=value`` flags (the value may contain '=')."""
    values: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not _NAME.fullmatch(name):
            raise InvalidInputError(f"--env {pair!r}: use NAME=value with a valid variable name")
        values[name] = value
    return values
