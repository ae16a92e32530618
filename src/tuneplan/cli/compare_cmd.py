"""`tuneplan compare MODEL [shared flags] --a "FLAGS" --b "FLAGS"`: two setups side by side, and why they differ.

The numbers come from :mod:`tuneplan.plan.compare`; this module parses the two flag strings with the
same setup flags every command takes, and renders. Exit 0, or 2 on bad input.
"""

from __future__ import annotations

import shlex
from typing import Annotated, Any

import typer
from rich.table import Table

from tuneplan.cli.options import with_setup_options
from tuneplan.cli.render import console, print_json
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


def render(d: dict[str, Any]) -> None:
    a, b = d["a"], d["b"]
    console.print(f"[bold]{d['model']}[/]: A = {_short(d['a_fields'])}   B = {_short(d['b_fields'])}")
    t = Table(title="Per-GPU memory, component by component (GiB)")
    for c in ("component", "A", "B", "B - A"):
        t.add_column(c, justify="left" if c == "component" else "right")
    for r in d["components"]:
        if not (r["a_bytes"] or r["b_bytes"]):
            continue
        bold = r["component"] == "device peak"
        t.add_row(("[bold]" if bold else "") + r["component"], _gib(r["a_bytes"]), _gib(r["b_bytes"]),
                  _signed(r["delta_bytes"]))
    console.print(t)
    if a.get("gpu") and b.get("gpu"):
        console.print(f"fits: A {a['verdict']} on {a['gpu']['name']}, B {b['verdict']} on {b['gpu']['name']}")
    c = Table(title="What made the difference (each changed flag alone, from A towards B; then together)")
    for col in ("flag", "A", "B", "device peak B - A GiB", "largest component change"):
        c.add_column(col, justify="right" if "GiB" in col else "left", overflow="fold")
    for x in d["causes"]:
        top = max(x["components"].items(), key=lambda kv: abs(kv[1]), default=None)
        c.add_row(x["flag"], str(x["from"]), str(x["to"]),
                  _signed(x["delta_bytes"]) if x["error"] is None else "refused alone",
                  f"{top[0]} {_signed(top[1])}" if top else (x["error"] or "-"))
    c.add_row("[bold]together[/]", "", "", f"[bold]{_signed(d['delta_bytes'])}[/]", "")
    if d["interaction_bytes"]:
        c.add_row("interaction", "", "", _signed(d["interaction_bytes"]),
                  "what the single changes do not add up to")
    console.print(c)


def _short(fields: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in fields.items()) or "(defaults)"


def register(app: typer.Typer) -> None:
    @app.command("compare")
    @with_setup_options
    def compare_cmd(
        model: Annotated[str, typer.Argument(help="catalog name, HF id, or path to config.json")],
        a: Annotated[str, typer.Option("--a", help='setup A\'s own flags, in quotes: "--seq 1024 --grad-accum 1"')],
        b: Annotated[str, typer.Option("--b", help='setup B\'s own flags, in quotes: "--seq 2048 --grad-accum 4"')],
        gpu: Annotated[str | None, typer.Option("--gpu", "-g", help="accelerator both run on (A/B may set their own)")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
        setup_kw: dict[str, Any] | None = None,
    ) -> None:
        """Two setups side by side, component by component, and which changed flag made the difference."""
        from tuneplan.plan.compare import compare

        shared = dict(setup_kw or {})
        if gpu:
            shared["gpu"] = gpu
        d = compare(model, shared, parse_flags(a, "a"), parse_flags(b, "b")).to_dict()
        print_json(d) if as_json else render(d)
