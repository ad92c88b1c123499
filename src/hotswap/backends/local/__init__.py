"""The embedded local backend: a cluster of emulated slices whose workers are real processes."""
