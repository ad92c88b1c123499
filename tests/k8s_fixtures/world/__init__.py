"""A Kubernetes cluster for the Kubernetes backend's tests: an HTTP-level API server and the
controllers hotswap depends on (JobSet, the Job controller, kube-scheduler, the kubelets and node
lifecycle, the garbage collector, Kueue), each ported from its upstream source in its own module
and cited there function by function. See :mod:`.world`."""

from k8s_fixtures.world.world import World, jobset_crd, load_crd, load_nodes, set_ready

__all__ = ["World", "jobset_crd", "load_crd", "load_nodes", "set_ready"]
