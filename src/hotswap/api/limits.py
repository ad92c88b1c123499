"""Bounds on what a user may hand hotswap, and the one check for free text.

Every value that enters (a flag, a line of an env file, a line on the controller's socket, a
row read back from the database) is held to these limits where it enters, so nothing past the
entry ever meets a NUL byte, a number too large for SQLite or ``select``, or a line without end.
"""

from __future__ import annotations

import math
import re

from hotswap.api.errors import InvalidInputError

# Numbers.
MAX_GRACE_PERIOD_S = 86_400.0  # one day; select() and timers overflow near 24.9 days
MAX_HANG_TIMEOUT_S = 7 * 86_400.0  # a week without a step: surely hung; timers stay far from overflow
MAX_RESTARTS = 10_000
MAX_SLICES = 65_536  # per workload; a cluster's own size bounds it further
# Text.
MAX_COMMAND_LENGTH = 32 * 1024
MAX_PATH_LENGTH = 4096  # PATH_MAX
MAX_IMAGE_LENGTH = 1024
MAX_ENV_VALUE_LENGTH = 128 * 1024  # Linux refuses a single argument or variable past 128 KiB
MAX_ENV_VARIABLES = 4096
MAX_ENV_TOTAL_LENGTH = 1024 * 1024
MAX_ENV_FILE_BYTES = 1024 * 1024
MAX_ARGUMENT_LENGTH = 4096  # any other flag value (node names, prefixes, ...)

# C0 controls except TAB, DEL, C1 controls, and lone surrogates (bytes that were not UTF-8).
_FORBIDDEN = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\ud800-\udfff]")


def check_text(what: str, value: str, max_length: int = MAX_ARGUMENT_LENGTH) -> str:
    """Return ``value`` if it is printable text of at most ``max_length`` characters; else one
    line naming ``what`` (a flag, or a place in a file) and the first offending character."""
    if len(value) > max_length:
        raise InvalidInputError(f"{what} is {len(value)} characters long; the limit is {max_length}")
    bad = _FORBIDDEN.search(value)
    if bad is not None:
        char = bad.group()
        kind = "a byte that is not UTF-8" if "\ud800" <= char <= "\udfff" else f"the control character {char!r}"
        hint = "; put a multi-line command in a script" if char == "\n" and what == "--command" else ""
        raise InvalidInputError(f"{what} contains {kind} at position {bad.start()}{hint}")
    return value


def check_number(what: str, value: float, low: float, high: float) -> float:
    """Return ``value`` if it is a finite number within ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or not low <= value <= high:
        raise InvalidInputError(f"{what} must be a number from {low:g} to {high:g}, not {_shown(value)}")
    return value


def _shown(value: object) -> str:
    """A short rendering of a rejected value (a 5,000-digit integer has no ``repr``)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18:
        return "a number that large"
    return repr(value)
