"""The setup flags every planning command shares, declared once.

``with_setup_options`` appends the flags to a command's signature (typer reads ``__signature__``) and
hands the command one dict, ``setup_kw``, of the flags the user actually gave (so profile defaults can
fill the rest and the output can say where each value came from).
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any

import typer

from tuneplan.specs.fields import Field, cli_fields

_P = "Setup"  # rich help panel


def _option(f: Field) -> tuple[str, Any, Any]:
    """A row of the field table as a typer option: ``(name, type | None, typer.Option)``."""
    opt = typer.Option(
        *f.flag,
        help=f.cli_help(),
        rich_help_panel=_P,
        show_default=False,
        metavar=None if f.is_switch else f.metavar,
    )
    return f.name, f.type | None, opt


# Generated from the field table (specs/fields.py): adding a field there adds its flag here.
SETUP_OPTIONS: list[tuple[str, Any, Any]] = [_option(f) for f in cli_fields()]


def with_setup_options(func: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(func)
    # Resolve string annotations (``from __future__ import annotations``) in the command's own module,
    # since typer would otherwise evaluate them in this module's namespace.
    hints = typing.get_type_hints(func, include_extras=True)
    params = [
        p.replace(annotation=hints.get(p.name, p.annotation))
        for p in sig.parameters.values()
        if p.name != "setup_kw"
    ]
    for name, ann, default in SETUP_OPTIONS:
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[ann, default]
            )
        )
    # typer wants the default inside Annotated or as the default, not both
    params = [p.replace(default=None) if p.name in {n for n, _, _ in SETUP_OPTIONS} else p for p in params]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        setup_kw = {n: kwargs.pop(n) for n, _, _ in SETUP_OPTIONS if kwargs.get(n) is not None}
        from tuneplan.specs.setup import check_fields

        check_fields(setup_kw)  # each flag alone, at the boundary, before a planner varies the rest
        for n, _, _ in SETUP_OPTIONS:
            kwargs.pop(n, None)
        warn_unused_lora_flags(setup_kw)
        return func(setup_kw=setup_kw, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return wrapper


LORA_ONLY = ("rank", "alpha", "dropout", "targets")


def warn_unused_lora_flags(setup_kw: dict[str, Any]) -> None:
    """``--rank 64 --method full`` says that the LoRA flags are ignored instead of dropping them silently."""
    method = setup_kw.get("method")
    unused = [n for n in LORA_ONLY if n in setup_kw]
    if method in ("full", "freeze") and unused:
        from tuneplan.cli.render import err_console

        flags = ", ".join("--" + n for n in unused)
        verb = "applies" if len(unused) == 1 else "apply"
        err_console.print(
            f"[yellow]warning:[/] {flags} only {verb} to --method lora or qlora; "
            f"ignored with --method {method}",
            highlight=False,
        )
