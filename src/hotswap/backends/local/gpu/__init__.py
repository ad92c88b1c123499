"""The GPUs behind a GPU-backed local cluster: which GPUs back which slice (``backing.py``,
read by every room), the machine-wide claims of ``cluster create --gpus`` (``claims.py``, the
CLI's process), NVML behind a small interface (``nvml.py``) and the health probe the controller
runs as a child process (``probe.py``)."""
