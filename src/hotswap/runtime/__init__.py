"""Controllers: the loops that run the core against the real world (local daemon, Kubernetes)."""
