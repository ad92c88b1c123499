"""The ``hotswap`` command line: xpk-style groups of commands.

Heavy modules (the simulator, matplotlib, torch, kubernetes) are imported inside the commands
that use them, so ``hotswap --help`` answers at once. Errors a user can cause arrive here as
:class:`~hotswap.api.errors.HotswapError` and leave as one line on stderr with a non-zero exit
code; nothing below this module ever exits the process.
"""

from __future__ import annotations

import sys

import typer

from hotswap import __version__
from hotswap.api.errors import HotswapError
from hotswap.cli import cluster, controller, demo, node, simulate, workload

app = typer.Typer(
    name="hotswap",
    help="Keep important ML training jobs running through hardware failures and contention.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(cluster.app, name="cluster")
app.add_typer(workload.app, name="workload")
app.add_typer(node.app, name="node")
app.add_typer(controller.app, name="controller")
app.command("simulate")(simulate.simulate)
app.command("demo")(demo.demo)


def _version(value: bool) -> None:
    if value:
        print(f"hotswap {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Keep important ML training jobs running through hardware failures and contention."""


def main() -> None:
    try:
        app()
    except HotswapError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
