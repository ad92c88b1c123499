"""The controller of a local cluster: one daemon per cluster (``entry.py`` starts it, ``loop.py``
runs it) and the watchers it runs (``hangs.py``, ``gpu_health.py``)."""
