"""The local backend: a cluster on this machine, its workers real processes, its state in SQLite.

Its code is in rooms by the process it runs in (``pyproject.toml``'s contracts keep them apart):

- ``backend.py``, ``commands/`` and ``queries/``: the CLI's process. A command checks what the
  user gave, then commits a request the cluster's controller serves (``commands/client.py``); a
  query reads the cluster's database and never starts anything.
- ``controller/``: the cluster's daemon (one per cluster), which decides with the core and acts.
- ``workers/``: the worker processes: how the controller starts, stops and re-adopts them
  (``lifecycle.py``, ``supervisor.py``, the warm spares and the zygote) and what runs inside one
  before the user's command (``shim.py``, ``warm.py``, ``zygote.py``, run by path).
- ``gpu/``: the GPUs behind a GPU-backed cluster (the mapping, the machine-wide claims, NVML and
  its health probe).
- Between the rooms and the bottom, the typed records every process reads: the requests the CLI
  makes of the controller (``requests.py``) and a cluster's settings (``settings.py``).
- At the bottom, shared by every room: the socket's protocol (``protocol.py``), the tables
  (``tables.py``), a workload's files (``workload_files.py``), the timeline's entries
  (``timeline.py``), the one-controller claim (``claim.py``), the resize rule (``resize.py``),
  ``/proc`` (``proc.py``) and the test-only crash points (``crash_points.py``).
"""
