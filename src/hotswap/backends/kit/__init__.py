"""What both backends' controllers share (the Prometheus metrics); it imports neither backend."""
