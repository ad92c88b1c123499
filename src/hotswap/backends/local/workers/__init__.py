"""A local cluster's worker processes. The controller's side starts, signals, watches and
re-adopts them (``lifecycle.py``, ``supervisor.py``, ``spares.py``, ``zygotes.py``,
``gpu_handover.py``) with the environment of the worker contract (``environment.py``); three
modules run by path inside the processes themselves, before the user's command, with the
standard library only: the shim every worker runs under (``shim.py``), a warm spare (``warm.py``)
and the cluster's zygote (``zygote.py``)."""
