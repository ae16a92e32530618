"""`tuneplan models` (the model catalog) and `tuneplan table` (the size x method memory table)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from tuneplan.cli.options import with_setup_options
from tuneplan.cli.render import console, gib, print_json


def register(app: typer.Typer) -> None:
    @app.command("models")
    def models_cmd(
        search: Annotated[str | None, typer.Argument(help="filter by substring")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    ) -> None:
        """List the built-in model catalog (works offline)."""
        from tuneplan.catalog.models import catalog_entries

        rows = [
            e
            for e in catalog_entries()
            if not search or search.lower() in e.hf_id.lower() or any(search.lower() in a for a in e.aliases)
        ]
        if as_json:
            print_json({"models": [asdict(e) for e in rows]})
            return
        console.print(f"[bold]Model catalog[/] ({len(rows)} models)", highlight=False)
        t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        t.add_column("HF id", overflow="fold", max_width=36)
        t.add_column("aliases", overflow="fold", min_width=16)
        t.add_column("family", no_wrap=True)
        t.add_column("params (B)", justify="right", no_wrap=True)
        for e in rows:
            p = e.params_transformers or e.params_published
            t.add_row(e.hf_id, ", ".join(e.aliases[:3]), e.family, f"{p / 1e9:.2f}" if p else "?")
        console.print(t)

    @app.command("table")
    @with_setup_options
    def table_cmd(
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
        setup_kw: dict[str, Any] | None = None,
    ) -> None:
        """Peak memory per GPU for 7B-70B models x full, LoRA, QLoRA-8, QLoRA-4."""
        from tuneplan.plan.table import METHODS, SIZES, size_method_table

        cells = size_method_table(**(setup_kw or {}))
        if as_json:
            print_json({"table": [asdict(c) for c in cells]})
            return
        console.print(
            "[bold]Device peak memory per GPU, GiB[/] (rule-of-thumb range in brackets, GB)", highlight=False
        )
        t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        t.add_column("size", no_wrap=True)
        for label, _ in METHODS:
            t.add_column(label, justify="right")
        for size, _ in SIZES:
            row = [c for c in cells if c.size == size]
            t.add_row(
                f"{size}\n", *[f"{gib(c.device_peak_bytes)}\n[dim][{c.rule_of_thumb_gb}][/]" for c in row]
            )
        console.print(t)
        console.print(
            "[dim]models: " + ", ".join(f"{size} {model_id}" for size, model_id in SIZES) + "[/]",
            highlight=False,
        )
        s = (
            ", ".join(f"{k}={v}" for k, v in (setup_kw or {}).items())
            or "defaults (batch 1, seq 512, hf profile)"
        )
        console.print(f"[dim]setup: {s}[/]")
