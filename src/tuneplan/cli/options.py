"""The setup flags every planning command shares, declared once.

``with_setup_options`` appends the flags to a command's signature (typer reads ``__signature__``) and
hands the command one dict, ``setup_kw``, of the flags the user actually gave (so profile defaults can
fill the rest and the output can say where each value came from). ``setup_flags`` are the same flags as
rows for the commands built with click directly (``cli/flags.py``); ``take_setup`` is the one boundary
both kinds of command pass the given values through.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any

from tuneplan.cli.flags import Flag, typer_option
from tuneplan.specs.fields import cli_fields

_P = "Setup"  # rich help panel


def setup_flags() -> list[Flag]:
    """The field table's flags as rows, in its order: the typer options of ``with_setup_options`` and the
    click options of the commands built with click directly are both made from these."""
    return [Flag(f.name, f.type, f.flag, f.cli_help(), metavar=None if f.is_switch else f.metavar, panel=_P)
            for f in cli_fields()]


@functools.cache
def _setup_options() -> list[tuple[str, Any, Any]]:
    # Generated from the field table (specs/fields/): adding a field there adds its flag here.
    return [(fl.name, fl.annotation(), typer_option(fl)) for fl in setup_flags()]


def __getattr__(name: str) -> Any:  # ``SETUP_OPTIONS``, built (with typer) on first use
    if name == "SETUP_OPTIONS":
        return _setup_options()
    raise AttributeError(name)


def take_setup(kwargs: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """Pops the setup flags out of a command's keyword arguments; the ones given, each checked alone at the
    boundary (before a planner varies the rest), and a warning for LoRA flags the method ignores."""
    setup_kw = {n: kwargs.pop(n) for n in names if kwargs.get(n) is not None}
    from tuneplan.specs.setup import check_fields

    check_fields(setup_kw)
    for n in names:
        kwargs.pop(n, None)
    warn_unused_lora_flags(setup_kw)
    return setup_kw


def with_setup_options(func: Callable[..., Any]) -> Callable[..., Any]:
    options = _setup_options()
    sig = inspect.signature(func)
    # Resolve string annotations (``from __future__ import annotations``) in the command's own module,
    # since typer would otherwise evaluate them in this module's namespace.
    hints = typing.get_type_hints(func, include_extras=True)
    params = [
        p.replace(annotation=hints.get(p.name, p.annotation))
        for p in sig.parameters.values()
        if p.name != "setup_kw"
    ]
    for name, ann, default in options:
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[ann, default]
            )
        )
    # typer wants the default inside Annotated or as the default, not both
    params = [p.replace(default=None) if p.name in {n for n, _, _ in options} else p for p in params]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        setup_kw = take_setup(kwargs, [n for n, _, _ in options])
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
