"""Settings for the whole suite."""

from __future__ import annotations

import os

# A new local cluster keeps warm spare workers by default (``--warm-workers auto``: each one a
# Python process that imports PyTorch). The suite creates hundreds of clusters on small CI
# machines: they start none unless a test asks (explicitly, or by setting this variable).
os.environ.setdefault("HOTSWAP_WARM_WORKERS", "0")
# Nor a zygote (one process importing PyTorch per cluster) unless a test asks for one.
os.environ.setdefault("HOTSWAP_ZYGOTE", "0")
