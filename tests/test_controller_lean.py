"""The controller of a local cluster stays lean (issue 36, item 4): only the spares and the zygote
import the preload list (torch, hotswap.train); the controller that starts them never does, not
even to find out which of the modules exist (``importlib.util.find_spec("torch.distributed")``
imports torch, and its seconds of CPU on a busy host left the cluster unanswered)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from local_helpers import home_in_env as home  # noqa: F401 (a fixture)
from local_helpers import query, wait_until

from hotswap.backends.local.settings import DEFAULT_PRELOAD
from hotswap.store.paths import ClusterPaths

HEAVY = ("torch", "jax", "jaxlib")


def _mapped_packages(pid: int) -> set[str]:
    """The heavy packages whose files (shared libraries, extension modules) process ``pid`` maps."""
    found = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        path = line.split(maxsplit=5)[5] if len(line.split(maxsplit=5)) == 6 else ""
        found.update(name for name in HEAVY if f"/{name}/" in path or f"/{name}.libs/" in path)
    return found


def test_finding_the_preload_list_imports_none_of_it() -> None:
    script = (
        "import sys; from hotswap.backends.local.workers.spares import preload_modules; "
        f"found = preload_modules({(*DEFAULT_PRELOAD, 'jax.numpy', 'no_such_module.child')!r}); "
        "print(sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] in ('torch', 'jax')), found)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    imported, _, found = out.partition(" ")
    assert imported == "[]", out  # nothing of torch or JAX was imported to find them
    assert "'torch.distributed'" in found and "no_such_module.child" not in found


@pytest.mark.parametrize("zygote", [False, True], ids=["spares", "zygote"])
def test_the_controller_never_maps_torch_or_jax(home: Path, zygote: bool) -> None:
    pytest.importorskip("torch")
    from hotswap.backends.local.commands import clusters as cluster_commands

    cluster_commands.create_cluster(
        "c", "v4-8", 1, True, lambda _: True, warm_workers=1, warm_preload=list(DEFAULT_PRELOAD), zygote=zygote
    )
    paths = ClusterPaths.of("c", home)
    # The controller has worked out the preload list and started the spare (or the zygote) with it.
    if zygote:
        wait_until((paths.root / "zygote" / "env.json").exists, timeout=120, what="the zygote to be started")
    else:
        wait_until(lambda: query(home, "c", "SELECT 1 FROM workers WHERE state = 'warm' AND pid IS NOT NULL"),
                   timeout=120, what="a spare to be started")
    controller = paths.controller_pid()
    assert controller is not None
    assert _mapped_packages(controller) == set()
