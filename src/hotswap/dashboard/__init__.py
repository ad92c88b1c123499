"""The live web view of a cluster (``hotswap dashboard``, ``hotswap[dashboard]``): a source that
reads the cluster through the Backend interface, a pure page model, and a Starlette app."""
