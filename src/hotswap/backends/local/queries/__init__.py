"""The CLI's reads of a local cluster (the CLI's process): straight from the cluster's
database. A query changes nothing and starts nothing (no controller, no worker)."""
