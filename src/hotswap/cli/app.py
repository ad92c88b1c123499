"""The ``hotswap`` command line: xpk-style groups of commands.

Heavy modules (the simulator, matplotlib, torch, kubernetes) are imported inside the commands
that use them, so ``hotswap --help`` answers at once. Errors a user can cause arrive here as
:class:`~hotswap.api.errors.HotswapError` and leave as one line on stderr with a non-zero exit
code; so do usage errors (click's, printed without a box) and faults of the machine under the
state directory (``store/faults.py``). Nothing below this module ever exits the process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from hotswap import __version__
from hotswap.api.errors import EXIT_INTERRUPTED, Declined, HotswapError, UsageError
from hotswap.cli import cluster, controller, dashboard, demo, node, simulate, workload

app = typer.Typer(
    name="hotswap",
    help="Keep important ML training jobs running through hardware failures and contention.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: it never truncates a flag name to fit a narrow terminal (rich's
    # option panel does) and needs no rich import to answer --help.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(cluster.app, name="cluster")
app.add_typer(workload.app, name="workload")
app.add_typer(node.app, name="node")
app.add_typer(controller.app, name="controller")
app.command("simulate")(simulate.simulate)
app.command("demo")(demo.demo)
app.command("dashboard")(dashboard.dashboard)


def _version(value: bool) -> None:
    if value:
        print(f"hotswap {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Keep important ML training jobs running through hardware failures and contention."""


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(argv))


def run(argv: list[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default: the process's); return its exit code, one of
    :data:`~hotswap.api.errors.EXIT_CODES`. Every error leaves as one line on stderr."""
    try:
        result = app(args=argv, prog_name="hotswap", standalone_mode=False)
        return result if isinstance(result, int) and not isinstance(result, bool) else 0
    except Declined as declined:  # a prompt answered no: nothing changed, as asked
        print(str(declined), file=sys.stderr)
        return declined.exit_code
    except HotswapError as error:
        return _fail(str(error), error.exit_code)
    except _usage_errors() as error:
        if type(error).__name__ == "NoArgsIsHelpError":
            print(error.format_message())  # the help the user asked for by giving nothing
            return UsageError.exit_code
        return _fail(_usage_line(error), UsageError.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        return _fail("interrupted", EXIT_INTERRUPTED)
    except Exception as error:
        from hotswap.store import faults

        if not faults.is_fault(error):
            raise  # a bug: the traceback is for us
        fault = faults.explain(error, _state_dir())
        return _fail(str(fault), fault.exit_code)


def _usage_errors() -> tuple[type[Exception], ...]:
    """click's exceptions (typer >= 0.2x carries its own copy of click, earlier ones use it)."""
    found: list[type[Exception]] = []
    if hasattr(typer, "TyperException"):
        found.append(typer.TyperException)
    try:
        import click

        found.append(click.ClickException)
    except ImportError:
        pass
    return tuple(found)


def _fail(message: str, code: int) -> int:
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    return code


def _usage_line(error: Exception) -> str:
    """A usage error as one line, naming the command whose --help lists the right flags."""
    context = getattr(error, "ctx", None)
    command = getattr(context, "command_path", None) or "hotswap"
    return f"{error.format_message()}{_output_hint(error)} (see `{command} --help`)"  # type: ignore[attr-defined]


def _output_hint(error: Exception) -> str:
    """``--json``/``--yaml`` given to a command that prints documents with ``-o`` (kubectl's and
    xpk's way): name the flag that does it."""
    name = getattr(error, "option_name", None)
    command = getattr(getattr(error, "ctx", None), "command", None)
    if name not in ("--json", "--yaml") or command is None:
        return ""
    if not any("--output" in getattr(param, "opts", ()) for param in command.params):
        return ""
    return f"; use -o {name[2:]} (--output {name[2:]})"


def _state_dir() -> Path | None:
    from hotswap.store import paths

    try:
        return paths.home()
    except HotswapError:
        return None
