"""A command-line flag declared once, as data; the typer option and the click option are built from it.

Why both: typer is the CLI's framework, but typer (0.2x) builds a pydantic validator for every option of
the command it parses, which costs more start-up than the estimate itself. The commands whose start-up
matters (``cli/app.CLICK_COMMANDS``) are therefore built from these rows with click directly; the others
keep their typer signatures, which read the same rows through :func:`typer_option`. Neither framework is
imported until a builder runs. (typer >= 0.20 parses with a reduced copy of click that has no options of its
own, so a click command here is built with the ``click`` package.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The type column of typer's plain help (``<int>``), kept where a row names no metavar so that a command
# reads the same whichever framework built it.
_TYPE_NAMES = {int: "<int>", float: "<float>", str: "<str>"}


@dataclass(frozen=True)
class Flag:
    """One flag. ``decls``: its names, ``"--x/--no-x"`` for an on/off switch; ``type``: int, float, str or
    bool (a switch), the type of each value when ``repeat`` (``--from a --from b``)."""

    name: str
    type: type
    decls: tuple[str, ...]
    help: str
    default: Any = None
    metavar: str | None = None
    repeat: bool = False
    show_default: bool = False
    panel: str | None = None  # typer's help panel (rich help only; the plain help ignores it)

    @property
    def is_switch(self) -> bool:
        return self.type is bool

    def annotation(self) -> Any:
        """The type typer reads: ``int | None``, ``list[str] | None``; a switch with a default is ``bool``."""
        if self.repeat:
            return list[self.type] | None  # type: ignore[name-defined]
        if self.is_switch and self.default is not None:
            return bool
        return self.type | None

    def shown_metavar(self) -> str | None:
        if self.metavar is not None or self.is_switch:
            return self.metavar
        return f"<list[{self.type.__name__}]>" if self.repeat else _TYPE_NAMES.get(self.type)


def typer_option(flag: Flag) -> Any:
    """The row as ``typer.Option`` (for a signature: ``Annotated[flag.annotation(), typer_option(flag)]``)."""
    import typer

    return typer.Option(*flag.decls, help=flag.help, rich_help_panel=flag.panel, metavar=flag.metavar,
                        show_default=flag.show_default)


def click_option(flag: Flag) -> Any:
    """The row as ``click.Option``."""
    import click

    kind = {int: click.INT, float: click.FLOAT, str: click.STRING, bool: click.BOOL}[flag.type]
    if flag.is_switch:
        return click.Option([flag.name, *flag.decls], is_flag=True, default=flag.default, help=flag.help,
                            show_default=flag.show_default)
    return click.Option([flag.name, *flag.decls], type=kind, multiple=flag.repeat,
                        default=flag.default, help=flag.help, metavar=flag.shown_metavar(),
                        show_default=flag.show_default)


def click_command(name: str, callback: Any, *, doc: str, argument: tuple[str, str], flags: list[Flag]) -> Any:
    """A click command with one optional argument (``(name, help)``), listed under "Arguments:" in the help
    as typer's plain help does, and the given flags in order."""
    import click

    arg_name, arg_help = argument

    class Command(click.Command):
        def format_options(self, ctx: Any, formatter: Any) -> None:
            with formatter.section("Arguments"):
                formatter.write_dl([(f"{arg_name} <str>", arg_help)])
            super().format_options(ctx, formatter)

    params = [click.Argument([arg_name], required=False, metavar=f"[{arg_name}]"),
              *(click_option(f) for f in flags)]
    return Command(name, callback=callback, params=params, help=doc)
