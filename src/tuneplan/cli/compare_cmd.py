"""`tuneplan compare MODEL [shared flags] --a "FLAGS" --b "FLAGS"`: two setups side by side, and why.

The numbers come from :mod:`tuneplan.plan.compare`; this module parses the two flag strings with the
same setup flags every command takes, and renders. Exit 0, or 2 on bad input.
"""

from __future__ import annotations

import shlex
from typing import Annotated, Any

import typer

from tuneplan.cli.options import with_setup_options
from tuneplan.cli.plan_layout import compact_table, show
from tuneplan.cli.render import console, print_json
from tuneplan.cli.wording import cli_texts
from tuneplan.errors import TuneplanError

_ACCEPTED = 'setup flags in quotes, e.g. --a "--seq 1024 --grad-accum 1" --b "--seq 2048 --grad-accum 4"'


def parse_flags(text: str, which: str) -> dict[str, Any]:
    """The setup fields of a flag string (the shared setup flags, and --gpu)."""
    out: dict[str, Any] = {}
    sub = typer.Typer(add_completion=False)

    @sub.command()
    @with_setup_options
    def _flags(gpu: Annotated[str | None, typer.Option("--gpu", "-g")] = None,
               setup_kw: dict[str, Any] | None = None) -> None:
        out.update(setup_kw or {})
        if gpu:
            out["gpu"] = gpu

    try:
        args = shlex.split(text or "")
        cmd = typer.main.get_command(sub)
        with cmd.make_context(f"--{which}", args) as ctx:  # parses only: click's errors, not typer's panel
            cmd.invoke(ctx)
    except TuneplanError:
        raise
    except Exception as exc:  # the parser's usage errors (typer bundles its own click): one line, field named
        fmt = getattr(exc, "format_message", None)
        raise TuneplanError(fmt() if callable(fmt) else str(exc), field=which, accepted=_ACCEPTED) from None
    return out


def _gib(v: int | None) -> str:
    return "-" if v is None else f"{v / 2**30:,.2f}"


def _signed(v: int | None) -> str:
    return "-" if v is None else f"{v / 2**30:+,.2f}"


def _value(v: Any) -> str:
    return "default" if v is None else str(v)


def render(d: dict[str, Any]) -> None:
    a, b = d["a"], d["b"]
    console.print(f"[bold]{d['model']}[/]")
    console.print(f"  A: {_short(d['a_fields'])}", highlight=False)
    console.print(f"  B: {_short(d['b_fields'])}", highlight=False)
    t = compact_table()
    for col in ("component", "A GiB", "B GiB", "B - A GiB"):
        t.add_column(col, justify="left" if col == "component" else "right", no_wrap=True)
    for r in d["components"]:
        if not (r["a_bytes"] or r["b_bytes"]):
            continue
        bold = r["component"] == "device peak"
        t.add_row(("[bold]" if bold else "") + r["component"], _gib(r["a_bytes"]), _gib(r["b_bytes"]),
                  _signed(r["delta_bytes"]))
    show(t, "Per-GPU memory, component by component")
    if a.get("gpu") and b.get("gpu"):
        console.print(f"fits: A {_words(a['verdict'])} on {a['gpu']['name']}, "
                      f"B {_words(b['verdict'])} on {b['gpu']['name']}")
    why = compact_table()
    for col in ("flag", "A", "B", "device peak\nB - A GiB", "largest change\n(GiB)"):
        number = "B - A" in col
        why.add_column(col, justify="right" if number else "left", no_wrap=number or col == "flag",
                       overflow="fold")
    for x in d["causes"]:
        top = max(x["components"].items(), key=lambda kv: abs(kv[1]), default=None)
        why.add_row(x["flag"], _value(x["from"]), _value(x["to"]),
                    _signed(x["delta_bytes"]) if x["error"] is None else "refused alone",
                    f"{top[0]} {_signed(top[1])}" if top else (x["error"] or "-"))
    why.add_row("[bold]together[/]", "", "", f"[bold]{_signed(d['delta_bytes'])}[/]", "")
    if d["interaction_bytes"]:
        why.add_row("interaction", "", "", _signed(d["interaction_bytes"]), "")
    show(why, "What made the difference: each flag alone, A towards B")
    if d["interaction_bytes"]:
        console.print("[dim]interaction: what the single changes do not add up to[/]")


def _words(verdict: str) -> str:
    return verdict.replace("_", " ")


def _short(fields: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in fields.items()) or "(defaults)"


def register(app: typer.Typer) -> None:
    @app.command("compare")
    @with_setup_options
    def compare_cmd(
        model: Annotated[str, typer.Argument(help="catalog name, HF id, or path to config.json")],
        a: Annotated[str, typer.Option("--a", help='setup A\'s own flags, in quotes: "--seq 1024"')],
        b: Annotated[str, typer.Option("--b", help='setup B\'s own flags: "--seq 2048 --grad-accum 4"')],
        gpu: Annotated[str | None,
                       typer.Option("--gpu", "-g", help="accelerator both run on (A/B may set one)")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
        setup_kw: dict[str, Any] | None = None,
    ) -> None:
        """Two setups side by side, component by component, and which changed flag made the difference."""
        from tuneplan.plan.compare import compare

        shared = dict(setup_kw or {})
        if gpu:
            shared["gpu"] = gpu
        d = cli_texts(compare(model, shared, parse_flags(a, "a"), parse_flags(b, "b")).to_dict())
        print_json(d) if as_json else render(d)
