"""Every process of a multi-process CPU job keeps its compiled programs in the persistent cache.

JAX writes persistent compilation cache entries from process 0 only: on TPU and GPU the key of
a program is the same in every process, so the others find process 0's entry and one writer
spares a shared filesystem the contention. On the CPU the key is not the same: it hashes the
topology of the devices as the process sees them (which are its own), so every other process
misses, finds nothing its own key names, and compiles again at every start. A JAX process that
moves to a new membership generation is a new process (:mod:`.handoff`): on emulated slices,
ranks 1.. then recompiled the training step at every grow-back (0.9 s of a 3 s stall on a busy
2-core machine, while rank 0 loaded it in milliseconds).

:func:`write_every_process_cpu_entries` lets each process write its own CPU entries, under its
own key: no two processes write the same file, so the reason for JAX's single writer does not
apply. JAX's own checks (host callbacks, minimum compile time, minimum entry size) still hold.
This wraps a private JAX function (``jax._src.compiler._cache_write``, its signature has
changed across releases); where it is missing, nothing changes.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("hotswap.train")


def write_every_process_cpu_entries() -> bool:
    """Install the wrapper (once); False where this JAX has no function to wrap."""
    try:
        from jax._src import compilation_cache, compiler, config, distributed
    except ImportError:
        return False
    original = getattr(compiler, "_cache_write", None)
    if original is None or not hasattr(compilation_cache, "put_executable_and_time"):
        return False
    if getattr(original, "_hotswap_every_process", False):
        return True

    @functools.wraps(original)
    def cache_write(cache_key: str, compile_time_secs: float, module_name: str, backend: Any, executable: Any, *rest: Any) -> None:
        if (
            distributed.global_state.process_id == 0
            or getattr(backend, "platform", None) != "cpu"
            or (rest and rest[0])  # host callbacks are baked into the program: JAX never caches those
            or compile_time_secs < config.persistent_cache_min_compile_time_secs.value
        ):
            original(cache_key, compile_time_secs, module_name, backend, executable, *rest)
            return
        _put(compilation_cache.put_executable_and_time, cache_key, module_name, executable, backend, compile_time_secs)

    cache_write._hotswap_every_process = True  # type: ignore[attr-defined]
    compiler._cache_write = cache_write
    return True


def _put(put: Callable[..., None], cache_key: str, module_name: str, executable: Any, backend: Any, seconds: float) -> None:
    try:
        put(cache_key, module_name, executable, backend, int(seconds))
    except Exception as error:  # a cache that cannot be written costs a compile, as JAX's own does
        log.warning("hotswap: cannot write the compilation cache entry of %s: %s", module_name, error)
