"""What both backends' controllers share: the Prometheus metrics (``metrics.py``) and one
definition of each figure a round reports (``figures.py``); it imports neither backend."""
