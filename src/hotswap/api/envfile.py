"""Environment variables from the command line (``--env K=V``) and from files (``--env-file``).

Files follow Docker's ``--env-file`` syntax, as xpk's flag does: one ``NAME=value`` per line,
the value taken literally (no quotes removed, no ``$`` expansion); ``NAME`` alone copies the
variable from the caller's environment (and is skipped if it is not set there); blank lines
and lines starting with ``#`` are ignored. A file is UTF-8 (a leading byte-order mark, as some
Windows editors write, is skipped; CRLF line ends are accepted) of at most
:data:`~hotswap.api.limits.MAX_ENV_FILE_BYTES`; a value may hold no control character but TAB
(a NUL byte cannot reach a process's environment at all).
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from hotswap.api.errors import InvalidInputError
from hotswap.api.limits import MAX_ENV_FILE_BYTES, MAX_ENV_VALUE_LENGTH, check_text

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env_file(text: str, environ: Mapping[str, str], source: str = "env file") -> dict[str, str]:
    values: dict[str, str] = {}
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.removesuffix("\r").lstrip(" \t")
        if not line or line.startswith("#"):
            continue
        where = f"{source} line {number}"
        name, sep, value = line.partition("=")
        if not _NAME.fullmatch(name):
            shown = name if len(name) <= 40 else name[:37] + "..."
            check_text(where, shown, max_length=40)  # a control character is named as such
            raise InvalidInputError(f"{where}: {shown!r} is not a valid variable name")
        if sep:
            values[name] = check_text(where, value, MAX_ENV_VALUE_LENGTH)
        elif name in environ:
            values[name] = check_text(f"{where} (${name} of this shell)", environ[name], MAX_ENV_VALUE_LENGTH)
    return values


def read_env_file(path: str | Path, environ: Mapping[str, str]) -> dict[str, str]:
    file = Path(path)
    source = f"--env-file {file}"
    try:
        with open(file, "rb") as handle:
            data = handle.read(MAX_ENV_FILE_BYTES + 1)
    except FileNotFoundError:
        raise InvalidInputError(f"{source}: no such file") from None
    except OSError as error:
        raise InvalidInputError(f"{source}: cannot read it ({error.strerror or error.__class__.__name__})") from None
    if len(data) > MAX_ENV_FILE_BYTES:
        raise InvalidInputError(f"{source}: larger than {MAX_ENV_FILE_BYTES // 1024} KiB; an env file holds variables")
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise InvalidInputError(f"{source} line {line}: not UTF-8 text") from None
    return parse_env_file(text, environ, source=source)


def parse_env_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """``--env NAME=value`` flags (the value may contain '=')."""
    values: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not _NAME.fullmatch(name):
            check_text("--env", pair[:80], max_length=80)
            raise InvalidInputError(f"--env {pair[:80]!r}: use NAME=value with a valid variable name")
        values[name] = check_text(f"--env {name}", value, MAX_ENV_VALUE_LENGTH)
    return values
