"""`tuneplan measure`: run N real training steps here and compare them with the estimate."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from tuneplan.cli.options import with_setup_options
from tuneplan.cli.render import console, print_json

MIB = 1024**2
GIB = 1024**3


def register(app: typer.Typer) -> None:
    @app.command("measure")
    @with_setup_options
    def measure_cmd(
        model: Annotated[str, typer.Argument(help="catalog name, HF id, or path to config.json")],
        steps: Annotated[
            int, typer.Option("--steps", help="optimizer steps to run (>= 2 to time without warm-up)")
        ] = 3,
        record: Annotated[
            str | None,
            typer.Option("--record", help="append a calibration row (measured.csv columns) to this CSV"),
        ] = None,
        weights: Annotated[
            str | None,
            typer.Option("--weights", help="local checkpoint folder; default: random weights from config"),
        ] = None,
        device: Annotated[str, typer.Option("--device", help="auto | cuda | cuda:N | cpu")] = "auto",
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
        force: Annotated[bool, typer.Option("--force", help="append to --record even when it is a symbolic "
                                            "link (the link is replaced by the file)")] = False,
        torch_era: Annotated[
            str | None,
            typer.Option("--torch-era", hidden=True,
                         help="calibration rows of older stacks: a comma list of keep_grads, "
                              "softmax_keeps_input, longest_batch_first"),
        ] = None,
        setup_kw: dict[str, Any] | None = None,
    ) -> None:
        """Run real training steps on this machine (GPU, or CPU with host memory figures) and compare.

        Builds the model from its config.json with random weights (no download), applies the setup as
        transformers + PEFT do, runs --steps optimizer steps on random tokens, reads the allocator's and
        NVML's peaks per phase and tokens/s, and sets them next to the analytic estimate.
        """
        from tuneplan.measure import measure

        if record and os.path.islink(record) and not force:
            from tuneplan.safe_write import check_targets

            check_targets([record], force=False, field="record")  # refuses the link, before the run
        fields: dict[str, Any] = {**(setup_kw or {}), **_torch_era(torch_era)}
        out = measure(model, steps=steps, device=device, weights=weights, record=record, **fields)
        if as_json:
            print_json(out)
            return
        _render(out)


def _torch_era(spec: str | None) -> dict[str, bool]:
    """``--torch-era keep_grads,softmax_keeps_input`` -> those switches on (specs/torch_era.py): only the
    calibration sweeps reproduce such stacks, so the option is not in the help."""
    from tuneplan.errors import TuneplanError
    from tuneplan.specs.torch_era import SWITCHES

    names = [n.strip() for n in (spec or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in SWITCHES]
    if unknown:
        raise TuneplanError(f"unknown switch(es) {', '.join(unknown)}", field="torch_era", accepted=SWITCHES)
    return dict.fromkeys(names, True)


def _render(out: dict[str, Any]) -> None:
    from rich.table import Table

    m = out["measured"]
    s = m["setup"]
    console.print(
        f"[bold]{m['model']}[/]  {s['method']}"
        + (f" r={s['rank']}" if s["method"] in ("lora", "qlora") else "")
        + f"  ·  batch {s['batch']} x seq {s['seq']}, GA {s['grad_accum']}  ·  {s['precision']}, "
        f"{m['details'].get('optimizer', s['optimizer'])}, attn {m['details'].get('attn_implementation')}, "
        f"checkpointing {m['details'].get('gradient_checkpointing')}  ·  on {m['device_name']}"
    )
    if m["outcome"] != "measured":
        console.print(f"[red bold]{m['outcome']}[/]: {m['error']}")
    host = m["memory_kind"] == "host"
    sizes = [r[k] or 0 for r in out["comparison"] for k in ("measured_bytes", "estimated_bytes")]
    unit, scale = ("GiB", GIB) if max(sizes, default=0) >= GIB else ("MiB", MIB)  # tiny models read in MiB

    def fmt(n: int | None) -> str:
        return "-" if n is None else f"{n / scale:,.2f}"

    t = Table(title=f"Measured vs estimated ({unit})" + (" — HOST memory, not GPU" if host else ""))
    for col, just in (
        ("quantity", "left"),
        ("measured", "right"),
        ("estimated", "right"),
        ("meas/est", "right"),
    ):
        t.add_column(col, justify="left" if just == "left" else "right")
    for r in out["comparison"]:
        ratio = r["measured_over_estimated"]
        t.add_row(
            r["quantity"],
            fmt(r["measured_bytes"]),
            fmt(r["estimated_bytes"]),
            "-" if ratio is None else f"{ratio:.2f}",
        )
    console.print(t)
    console.print(f"[dim]memory metric: {m['memory_metric']}[/]")
    if m["tokens_per_s"]:
        console.print(
            f"speed: [bold]{m['tokens_per_s']:,.0f}[/] tokens/s ({m['timed_steps']}); "
            f"steps took {', '.join(f'{x:.3f}' for x in m['step_seconds'])} s"
        )
    for n in m["notes"]:
        console.print(f"[yellow]note:[/] {n}")
    if "record_path" in out:
        console.print(f"appended 1 row to {out['record_path']}")
