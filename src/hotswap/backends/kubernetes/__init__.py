"""The Kubernetes backend: workloads as JobSets with PriorityClasses (and optionally Kueue), applied
with the official ``kubernetes`` client, and a controller that runs the same scheduling core.

Rendering (:mod:`.render`), node discovery (:mod:`.discovery`) and the translation between live
objects and the core (:mod:`.translate`) are pure functions over plain dicts and never import
``kubernetes``; only :mod:`.client` talks to an API server.
"""
