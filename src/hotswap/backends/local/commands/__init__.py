"""The CLI's commands on a local cluster (the CLI's process): each checks what the user gave
before anything is written, then commits a request that the cluster's controller serves, and
waits for its committed outcome (``client.py``). Nothing here imports the controller."""
