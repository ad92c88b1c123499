"""The controller of a local cluster: one daemon per cluster (``entry.py`` starts it,
``assembly.py`` builds it from its collaborators, ``loop.py`` runs it) and the watchers it runs
(``hangs.py``, ``gpu_health.py``)."""
