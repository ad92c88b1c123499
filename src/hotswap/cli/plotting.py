"""What a ``--plot`` costs, said while it happens: the first time matplotlib is used under a
user's cache directory it builds its font cache, a scan of every font on the machine (here, 0.5 s for
38 font files, 18.6 s for 3,000 at load 9: minutes with larger collections or a slow home directory),
before drawing anything. Without a word, a command that has already said
"cluster deleted" looks hung.

matplotlib is imported here only when a plot is asked for; the CLI's start stays light."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO


@dataclasses.dataclass
class Drawing:
    """How long the plot took (``seconds``, set when it is done) and whether matplotlib built
    its font cache for it (``font_cache``: the directory it built it in, else None)."""

    font_cache: Path | None = None
    seconds: float = 0.0


def font_cache_missing() -> Path | None:
    """matplotlib's cache directory when it holds no font cache yet (the next use of pyplot
    builds one there), else None. ``import matplotlib`` alone does not build it: importing its
    ``font_manager`` does, so the cache's file name (``fontlist-v<version>.json``, its version
    a constant of that module) is matched by pattern."""
    import matplotlib

    cache = Path(matplotlib.get_cachedir())
    return None if any(cache.glob("fontlist-v*.json")) else cache


@contextmanager
def drawing(say: Callable[[str], None] | None = None, clock: Callable[[], float] = time.perf_counter) -> Iterator[Drawing]:
    """Around the drawing of a plot: one line on stderr first if matplotlib is about to build
    its font cache; the :class:`Drawing` it yields holds the time it took once the block ends."""
    tell = say or _stderr(sys.stderr)
    started = clock()
    result = Drawing(font_cache=font_cache_missing())
    if result.font_cache is not None:
        tell(f"building matplotlib's font cache in {result.font_cache} (first use only: it scans every font on this machine)")
    try:
        yield result
    finally:
        result.seconds = clock() - started


def _stderr(stream: TextIO) -> Callable[[str], None]:
    return lambda line: print(line, file=stream, flush=True)
