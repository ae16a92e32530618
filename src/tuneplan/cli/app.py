"""The `tuneplan` command: one typer app, one module per command (each exposes ``register(app)``)."""

from __future__ import annotations

import importlib
import sys

import typer

from tuneplan.errors import TuneplanError

app = typer.Typer(
    name="tuneplan",
    help="Plan an LLM fine-tune before spending a GPU-hour: memory, compatibility, time, cost, config.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Command modules, in help order. A module registers its commands on the app.
COMMAND_MODULES = (
    "tuneplan.cli.estimate_cmd",
    "tuneplan.cli.catalog_cmd",
)

for _mod in COMMAND_MODULES:
    importlib.import_module(_mod).register(app)


def main() -> None:
    """Console entry point: bad input -> message + exit 2, never a traceback."""
    try:
        app(standalone_mode=False)
    except TuneplanError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except Exception as exc:  # click usage errors and friends
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(2 if isinstance(exc, click.UsageError) else exc.exit_code)
        raise


if __name__ == "__main__":  # pragma: no cover
    main()
