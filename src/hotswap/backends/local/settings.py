"""A local cluster's settings, as one typed, versioned record: its warm spares and zygote, its
recovery policy and the GPUs of this machine that back its slices.

They live in the cluster record's ``settings`` object (:class:`~hotswap.store.state.ClusterRecord`,
where the Kubernetes backend keeps its own). ``cluster create`` writes a new cluster's, the
controller's round that serves a resize changes them, and each reader parses them once
(:meth:`LocalSettings.of`): the controller when it starts, that round, the queries. Their JSON
is the object earlier releases wrote: a key for each setting that is not its default (so a
default a later release changes reaches the clusters that never chose), plus ``"version"``
(:data:`SETTINGS_VERSION`; none is version 0, the same shape); keys this release does not know
are kept. A record read and written again says the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hotswap.backends.local.gpu.backing import SETTINGS_KEY as GPUS_KEY
from hotswap.backends.local.gpu.backing import Backing

SETTINGS_VERSION = 1
VERSION_KEY = "version"

# What a training worker imports before its first step, in a warm spare or the zygote;
# torch._dynamo comes with the first optimizer (about a second by itself).
DEFAULT_PRELOAD = ("torch", "torch.distributed", "torch.optim", "torch._dynamo", "hotswap.train", "hotswap.train.torch.run")


@dataclasses.dataclass(frozen=True)
class LocalSettings:
    """A local cluster's settings; each field's default is what a cluster that never chose has."""

    warm_workers: int = 0  # warm spare workers kept (workers/spares.py)
    warm_preload: tuple[str, ...] = DEFAULT_PRELOAD  # what the spares and the zygote import
    hotswap: bool = True  # a workload that loses a slice moves at once (else it waits for the repair)
    elastic: bool = True  # an elastic workload above its floor scales down instead of restarting
    zygote: bool = False  # workers and spares are forked from the cluster's zygote (workers/zygotes.py)
    backing: Backing | None = None  # the GPUs behind the slices (key "gpus"); None: emulated
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # keys of other releases, kept

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> LocalSettings:
        """The settings a cluster record holds (written by this release or an earlier one)."""
        default = cls()

        def given(key: str) -> Any:
            value = settings.get(key)
            return getattr(default, key) if value is None else value

        return cls(
            warm_workers=int(given("warm_workers")),
            warm_preload=tuple(str(module) for module in given("warm_preload")),
            hotswap=bool(given("hotswap")),
            elastic=bool(given("elastic")),
            zygote=bool(given("zygote")),
            backing=Backing.of(settings),
            extra={key: value for key, value in settings.items() if key not in _KEYS},
        )

    def to_settings(self) -> dict[str, Any]:
        """The JSON object a cluster record holds (see the module)."""
        default = LocalSettings()
        value: dict[str, Any] = dict(self.extra)
        for key in ("warm_workers", "hotswap", "elastic", "zygote"):
            if getattr(self, key) != getattr(default, key):
                value[key] = getattr(self, key)
        if self.warm_preload != default.warm_preload:
            value["warm_preload"] = list(self.warm_preload)
        if self.backing is not None:
            value[GPUS_KEY] = self.backing.to_settings()
        value[VERSION_KEY] = SETTINGS_VERSION
        return value


_KEYS = {"warm_workers", "warm_preload", "hotswap", "elastic", "zygote", GPUS_KEY, VERSION_KEY}
