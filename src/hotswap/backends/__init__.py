"""Backends: where workloads really run. Each implements :class:`hotswap.backends.base.Backend`."""
