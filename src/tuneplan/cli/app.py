"""The `tuneplan` command: one typer app, one module per command (each exposes ``register(app)``)."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer
from typer.core import TyperGroup

from tuneplan.errors import TuneplanError

# Commands in help order, and the module that registers each (``register(app)``). A module is imported only
# when one of its commands runs, or for the full help: `tuneplan estimate --json` loads neither the
# planner, the web page, the simulator nor the tables of the other commands.
COMMANDS: dict[str, str] = {
    "estimate": "tuneplan.cli.estimate_cmd",
    "models": "tuneplan.cli.catalog_cmd",
    "table": "tuneplan.cli.catalog_cmd",
    "fit": "tuneplan.cli.plan_cmd",
    "gpus": "tuneplan.cli.plan_cmd",
    "max-model": "tuneplan.cli.plan_cmd",
    "sweep": "tuneplan.cli.plan_cmd",
    "measure": "tuneplan.cli.measure_cmd",
    "simulate": "tuneplan.cli.simulate_cmd",
    "deploy": "tuneplan.cli.deploy_cmd",
    "export": "tuneplan.cli.export_cmd",
    "serve": "tuneplan.cli.serve_cmd",
    "doctor": "tuneplan.cli.doctor_cmd",
    "accelerators": "tuneplan.cli.doctor_cmd",
}
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))


class LazyCommands(TyperGroup):
    """The root group: lists every command, imports a command's module on first use."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(dict.fromkeys([*COMMANDS, *self.commands]))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.load(COMMANDS[cmd_name])
        return self.commands.get(cmd_name)

    def load(self, module: str) -> None:
        sub = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        importlib.import_module(module).register(sub)
        for name, cmd in typer.main.get_group(sub).commands.items():
            self.commands.setdefault(name, cmd)


def _root() -> None:
    """Plan an LLM fine-tune before spending a GPU-hour: memory, compatibility, time, cost, config."""


app = typer.Typer(
    name="tuneplan",
    help="Plan an LLM fine-tune before spending a GPU-hour: memory, compatibility, time, cost, config.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=LazyCommands,
    callback=_root,  # a group even before any command module is loaded
)


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
