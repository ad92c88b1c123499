"""A local cluster's settings as one typed, versioned record (``backends/local/settings.py``):
the exact settings earlier releases wrote read back, a record read and written again says the
same, and the defaults have one home."""

from __future__ import annotations

import json

import pytest

from hotswap.backends.local.controller.state import scheduler_config
from hotswap.backends.local.gpu.backing import Backing
from hotswap.backends.local.gpu.nvml import GpuInfo
from hotswap.backends.local.settings import DEFAULT_PRELOAD, SETTINGS_VERSION, LocalSettings
from hotswap.core.policy import SchedulerConfig

# Settings exactly as the previous release wrote them (a new cluster's, before its first
# resize; after `cluster create --warm-workers 1` with a preload, hotswap off, no zygote; a
# GPU-backed cluster's), and one an operator may have written by hand (elastic off).
GPU = {"index": 0, "memory_bytes": 80, "name": "Fake H100", "uuid": "GPU-aaaa"}
OLD_SETTINGS = [
    ("{}", LocalSettings()),
    (
        '{"hotswap": false, "warm_preload": ["json"], "warm_workers": 1, "zygote": false}',
        LocalSettings(warm_workers=1, warm_preload=("json",), hotswap=False),
    ),
    (
        '{"gpus": {"per_host": 1, "slices": {"g-np-0": [{"index": 0, "memory_bytes": 80, "name": "Fake H100", "uuid":'
        ' "GPU-aaaa"}]}}, "warm_workers": 2, "zygote": true}',
        LocalSettings(warm_workers=2, zygote=True, backing=Backing(1, {"g-np-0": (GpuInfo(0, "GPU-aaaa", "Fake H100", 80),)})),
    ),
    ('{"gpus": {"per_host": 2, "slices": {}}}', LocalSettings(backing=Backing(2))),
    ('{"elastic": false}', LocalSettings(elastic=False)),
]


@pytest.mark.parametrize(("text", "expected"), OLD_SETTINGS)
def test_the_settings_of_the_previous_release_read_back_and_keep_their_meaning(text: str, expected: LocalSettings) -> None:
    settings = LocalSettings.of(json.loads(text))
    assert settings == expected
    written = settings.to_settings()
    assert written["version"] == SETTINGS_VERSION
    assert LocalSettings.of(json.loads(json.dumps(written))) == settings  # read and written again: the same
    assert {k: v for k, v in json.loads(text).items() if v != getattr(LocalSettings(), k, None)} == {
        k: v for k, v in written.items() if k != "version"
    }  # every key that said something is written as it was


def test_only_what_is_not_a_default_is_written_with_the_version() -> None:
    assert LocalSettings().to_settings() == {"version": SETTINGS_VERSION}
    assert LocalSettings(warm_workers=3, warm_preload=("json",), hotswap=False, zygote=True).to_settings() == {
        "warm_workers": 3, "warm_preload": ["json"], "hotswap": False, "zygote": True, "version": SETTINGS_VERSION,
    }
    assert LocalSettings(backing=Backing(1, {"s": (GpuInfo(0, "GPU-aaaa", "Fake H100", 80),)})).to_settings() == {
        "gpus": {"per_host": 1, "slices": {"s": [GPU]}}, "version": SETTINGS_VERSION,
    }


def test_keys_of_another_release_are_kept() -> None:
    settings = LocalSettings.of({"warm_workers": 1, "future_knob": {"a": 1}, "version": 7})
    assert settings.extra == {"future_knob": {"a": 1}}
    assert settings.to_settings() == {"warm_workers": 1, "future_knob": {"a": 1}, "version": SETTINGS_VERSION}


def test_the_defaults_have_one_home() -> None:
    default = LocalSettings()
    assert (default.warm_workers, default.warm_preload, default.hotswap, default.elastic, default.zygote) == (
        0, DEFAULT_PRELOAD, True, True, False,
    )
    assert default.backing is None  # an emulated cluster
    assert LocalSettings.of({"warm_preload": None}).warm_preload == DEFAULT_PRELOAD


def test_the_recovery_policy_follows_the_settings() -> None:
    assert scheduler_config(LocalSettings()) == SchedulerConfig(hotswap=True, elastic=True)
    assert scheduler_config(LocalSettings.of({"hotswap": False, "elastic": False})) == SchedulerConfig(hotswap=False, elastic=False)
