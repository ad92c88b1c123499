"""``hotswap demo``: real drills of hotswap, elastic slices and migration on a local cluster."""
