"""The typer app: the root group that lists every command and loads a command's module on first use.

``tuneplan <command>`` for a command of ``cli/app.CLICK_COMMANDS`` does not come here (``app.run`` calls the
click command without loading typer); the group still lists those commands in its help and hands them their
command line when the app is invoked in-process (typer's test runner).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer
from typer.core import TyperGroup

from tuneplan.cli.app import CLICK_COMMANDS, COMMANDS


class LazyCommands(TyperGroup):
    """The root group: lists every command, imports a command's module on first use."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(dict.fromkeys([*COMMANDS, *self.commands]))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.load(COMMANDS[cmd_name])
        return self.commands.get(cmd_name)

    def main(self, args: Any = None, prog_name: str | None = None, *rest: Any, **kw: Any) -> Any:
        """A command of CLICK_COMMANDS parses its own command line (typer's copy of click cannot run a click
        command as a subcommand: the two have different exception classes)."""
        args = list(sys.argv[1:] if args is None else args)
        if args and args[0] in CLICK_COMMANDS:
            standalone = kw.get("standalone_mode", True)
            return self.get_command(None, args[0]).main(args[1:], f"{prog_name or 'tuneplan'} {args[0]}",
                                                        standalone_mode=standalone)
        return super().main(args, prog_name, *rest, **kw)

    def load(self, module: str) -> None:
        mod = importlib.import_module(module)
        if module in CLICK_COMMANDS.values():  # built from flag rows with click (listed in the help)
            cmd = mod.command()
            self.commands.setdefault(cmd.name, cmd)
            return
        sub = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
        mod.register(sub)
        for name, cmd in typer.main.get_group(sub).commands.items():
            self.commands.setdefault(name, cmd)


def print_version(value: bool) -> None:
    """``--version``: the installed distribution's version (package metadata), then exit 0."""
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("tuneplan")
    except PackageNotFoundError:  # run from a source tree without installing
        v = "unknown (not installed)"
    typer.echo(f"tuneplan {v}")
    raise typer.Exit()


def _root(version: bool = typer.Option(False, "--version", callback=print_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Plan an LLM fine-tune before spending a GPU-hour: memory, compatibility, time, cost, config."""


app = typer.Typer(
    name="tuneplan",
    help="Plan an LLM fine-tune before spending a GPU-hour: memory, compatibility, time, cost, config.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: option names never cut, no type column, descriptions wrap to the terminal
    rich_markup_mode=None,
    cls=LazyCommands,
    callback=_root,  # a group even before any command module is loaded
)
