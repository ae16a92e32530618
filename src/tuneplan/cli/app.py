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
    "tuneplan.cli.plan_cmd",
    "tuneplan.cli.compare_cmd",
    "tuneplan.cli.measure_cmd",
    "tuneplan.cli.simulate_cmd",
    "tuneplan.cli.deploy_cmd",
    "tuneplan.cli.export_cmd",
    "tuneplan.cli.serve_cmd",
    "tuneplan.cli.doctor_cmd",
)

for _mod in COMMAND_MODULES:
    importlib.import_module(_mod).register(app)


def main() -> None:
    """Console entry point: bad input -> message + exit 2, never a traceback."""
    # Standalone mode lets click report usage errors itself (exit 2); our own input errors surface here.
    try:
        app()
    except TuneplanError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
