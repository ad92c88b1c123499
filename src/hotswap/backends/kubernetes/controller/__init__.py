"""The controller of a Kubernetes cluster: ``entry.py`` starts it, ``loop.py`` reconciles,
``leader.py`` keeps the Lease that lets one controller act."""
