"""Durable state: one SQLite database (WAL) per cluster, under the user's state directory."""
