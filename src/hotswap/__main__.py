"""``python -m hotswap``: the same as the ``hotswap`` command."""

from hotswap.cli.app import main

main()
