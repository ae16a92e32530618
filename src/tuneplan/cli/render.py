"""Rich rendering of core results. Formats numbers; computes none."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tuneplan.estimator.types import COMPONENTS, GIB

console = Console()
err_console = Console(stderr=True)


def gib(n: float | int | None) -> str:
    return "-" if n is None else f"{n / GIB:,.2f}"


def print_json(obj: Any) -> None:
    # plain print: rich would wrap long lines and break JSON for pipes
    print(json.dumps(obj, indent=2, default=str))


def findings_table(findings: list[dict[str, str]]) -> Table | None:
    if not findings:
        return None
    t = Table(title="Findings", show_lines=False)
    for c in ("level", "code", "message", "fix"):
        t.add_column(c, overflow="fold")
    colours = {"error": "red", "warning": "yellow", "info": "cyan"}
    for f in findings:
        t.add_row(f"[{colours.get(f['level'], 'white')}]{f['level']}[/]", f["code"], f["message"], f.get("fix", ""))
    return t


def render_estimate(d: dict[str, Any]) -> None:
    m, s, pg = d["model"], d["setup"], d["per_gpu"]
    console.print(
        f"[bold]{m['name']}[/]  {m['params_total'] / 1e9:.2f}B params, {m['params_trainable'] / 1e6:,.1f}M trainable"
        f"  ·  {s['method']}"
        + (f" {s['bits']}-bit" if s["method"] == "qlora" else "")
        + (f" r={s['rank']}" if s["method"] in ("lora", "qlora") else "")
        + f"  ·  batch {s['batch']} x seq {s['seq']}, GA {s['grad_accum']}"
        + f"  ·  {s['precision']}, {s['optimizer']}, attn {s['attn']}, checkpointing {'on' if s['gradient_checkpointing'] else 'off'}"
        + (f", loss {s['loss']}" if s.get("loss") else "")
        + (", compiled" if s.get("compile") else "")
        + (", activations offloaded" if s.get("activation_offload") else "")
        + f"  ·  {s['framework']} profile  ·  engine {d['engine']}"
    )
    defaults = [k for k, v in d.get("setup_sources", {}).items() if "default" in v]
    if defaults:
        console.print(f"[dim]profile defaults used for: {', '.join(sorted(defaults))}[/]")
    t = Table(title=f"Per-GPU peak memory (GiB) — peak at [bold]{d['peak_phase']}[/]")
    t.add_column("component")
    t.add_column("GiB", justify="right")
    t.add_column("what it is", style="dim")
    for k, desc in COMPONENTS.items():
        v = pg["components"].get(k, 0)
        if v:
            t.add_row(k, gib(v), desc)
    t.add_row("[bold]allocated peak[/]", f"[bold]{gib(pg['allocated_peak_bytes'])}[/]", "torch.cuda.max_memory_allocated")
    t.add_row("reserved peak", gib(pg["reserved_peak_bytes"]), "torch.cuda.max_memory_reserved (allocator emulation)")
    t.add_row("CUDA context", gib(pg["cuda_context_bytes"]), "outside PyTorch (driver, kernels)")
    if pg.get("nccl_bytes"):
        t.add_row("NCCL", gib(pg["nccl_bytes"]), "communicator buffers, outside PyTorch")
    t.add_row("[bold]device peak[/]", f"[bold]{gib(pg['device_peak_bytes'])}[/]", "what nvidia-smi shows; OOM is judged here")
    if pg.get("paged_bytes"):
        t.add_row("paged optimizer", gib(pg["paged_bytes"]), "unified memory, pages out instead of OOM")
    if pg.get("host_bytes"):
        t.add_row("host (CPU) memory", gib(pg["host_bytes"]), "offloaded states / params / checkpoints")
    console.print(t)
    ph = "  ".join(f"{k} {gib(v)}" for k, v in pg["phases"].items())
    console.print(f"[dim]allocated by instant (GiB): {ph}[/]")
    band = pg["bands"].get("allocated")
    if band:
        console.print(f"[dim]uncertainty: allocated {gib(band['low'])}–{gib(band['high'])} GiB ({band['why']}); "
                      f"reserved up to {gib(pg['bands']['reserved']['high'])}; context "
                      f"{gib(pg['bands']['cuda_context']['low'])}–{gib(pg['bands']['cuda_context']['high'])}[/]")
    for n in d.get("notes", []):
        console.print(f"[dim]note: {n}[/]")
    ft = findings_table(d.get("findings", []))
    if ft is not None:
        console.print(ft)
    for sec in ("time", "cost"):
        if sec in d and d[sec]:
            render_section(sec, d[sec])
    if "gpu" in d:
        g = d["gpu"]
        verdict = d.get("verdict")
        if verdict == "fits":
            console.print(f"[green bold]FITS[/] on {g['name']} ({gib(g['memory_bytes'])} GiB usable): "
                          f"{gib(d['headroom_bytes'])} GiB headroom")
        elif verdict == "cannot_run":
            errors = [f for f in d.get("findings", []) if f["level"] == "error"]
            console.print(f"[red bold]CANNOT RUN[/] on {g['name']}: {escape(errors[0]['message'])}")
        else:
            console.print(f"[red bold]DOES NOT FIT[/] on {g['name']} ({gib(g['memory_bytes'])} GiB usable): "
                          f"short by {gib(-d['headroom_bytes'])} GiB")
    trained = f" --method {s['method']}" + (f" --rank {s['rank']}" if s["method"] in ("lora", "qlora") else "")
    console.print(f"[dim]after training: tuneplan deploy {m['name']}{trained} --serve-precision int4"
                  f"{' --gpu ' + d['gpu']['id'] if 'gpu' in d else ''} (merge, serving memory, decode speed)[/]",
                  highlight=False)


def render_section(title: str, sec: dict[str, Any]) -> None:
    t = Table(title=title.capitalize())
    t.add_column("quantity")
    t.add_column("value", justify="right")
    for k, v in sec.items():
        if isinstance(v, (dict, list)):
            continue
        t.add_row(k, "-" if v is None else f"{v:,.4g}" if isinstance(v, float) else str(v))
    console.print(t)
    if title == "time" and sec.get("breakdown"):
        console.print(time_breakdown_line(sec), highlight=False)
    for a in sec.get("assumptions", []) if isinstance(sec.get("assumptions"), list) else []:
        console.print(f"[dim]assumes: {escape(str(a))}[/]", highlight=False)
    for u in sec.get("unknown", []) if isinstance(sec.get("unknown"), list) else []:
        console.print(f"[yellow]unknown:[/] {escape(str(u))}", highlight=False)


BREAKDOWN_LABELS = {"compute": "compute", "memory_bound": "memory-bound", "communication": "communication",
                    "offload": "offload", "overhead": "overhead"}


def time_breakdown_line(sec: dict[str, Any]) -> str:
    """One line: where the seconds of an optimizer step go, and what limits it (figures from the time section)."""
    bd, step = sec["breakdown"], sec.get("step_seconds") or 0.0
    parts = []
    for k, label in BREAKDOWN_LABELS.items():
        v = bd.get(k, 0.0)
        if v or k in ("compute", "memory_bound"):
            share = f" {v / step:.0%}" if step else ""
            extra = ""
            deq = sec.get("breakdown_detail", {}).get("dequantization")
            if k == "memory_bound" and deq:
                extra = f" (dequantization {deq:.3g} s)"
            parts.append(f"{label} {v:.3g} s{share}{extra}")
    unverified = "" if sec.get("figures_verified", True) else " [yellow](card figures not verified)[/]"
    return f"step {step:.3g} s = " + " + ".join(parts) + f"; limited by {BREAKDOWN_LABELS.get(sec.get('limited_by'), '?')}{unverified}"

