"""The Kubernetes backend: workloads as JobSets with PriorityClasses (and optionally Kueue), applied
with the official ``kubernetes`` client, and a controller that runs the same scheduling core.

Rendering (:mod:`.render`), node discovery (:mod:`.discovery`) and the translation between live
objects and the core are pure functions over plain dicts and never import ``kubernetes``; only
:mod:`.client` talks to an API server. The translation, one step per module: live objects are
parsed (:mod:`.live_objects`, a JobSet's state annotation into its typed record:
:mod:`.state_annotation`), observed as the core's snapshot and events (:mod:`.observation`),
and the core's decision is planned
(:mod:`.planning`) as operations (:mod:`.operations`) that the controller applies.
"""
