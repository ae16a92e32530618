"""Rich rendering of core results. Formats numbers; computes none."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tuneplan.cli.json_out import print_json  # noqa: F401  (re-exported: the commands import it from here)
from tuneplan.estimator.types import COMPONENTS, GIB

console = Console()
err_console = Console(stderr=True)


def gib(n: float | int | None) -> str:
    return "-" if n is None else f"{n / GIB:,.2f}"


LEVEL_ORDER = {"error": 0, "warning": 1, "info": 2}
LEVEL_COLOUR = {"error": "red", "warning": "yellow", "info": "cyan"}


def print_findings(findings: list[dict[str, str]], limit: int | None = None) -> None:
    """Findings as wrapped lines, most severe first; ``limit`` keeps the top ones and says how many more."""
    ordered = sorted(findings, key=lambda f: LEVEL_ORDER.get(f["level"], 3))
    shown = ordered if limit is None else ordered[:limit]
    for f in shown:
        colour = LEVEL_COLOUR.get(f["level"], "white")
        console.print(f"[{colour}]{f['level']}[/] [bold]{escape(f['code'])}[/]: {escape(f['message'])}",
                      highlight=False)
        if f.get("fix") and (limit is None or f["level"] == "error"):
            console.print(f"  [dim]fix: {escape(f['fix'])}[/]", highlight=False)
    if len(ordered) > len(shown):
        console.print(f"[dim]{len(ordered) - len(shown)} more finding(s): --details[/]")


def render_estimate(d: dict[str, Any], details: bool = False) -> None:
    """One screen by default (setup, memory, verdict, time and cost, top findings); ``details``: the rest."""
    render_setup(d)
    render_memory(d, details)
    render_verdict(d)
    if details:
        render_memory_details(d)
    render_time_cost_line(d)
    print_findings(d.get("findings", []), limit=None if details else 3)
    if details:
        render_time_details(d)
        render_deploy_hint(d)
    else:
        console.print("[dim]--details: what each component is, memory by instant, uncertainty, all findings, "
                      "the time and cost tables[/]")


def render_setup(d: dict[str, Any]) -> None:
    m, s = d["model"], d["setup"]
    console.print(f"[bold]{escape(m['name'])}[/]  {m['params_total'] / 1e9:.2f}B params, "
                  f"{m['params_trainable'] / 1e6:,.1f}M trainable  ·  engine {d['engine']}", highlight=False)
    console.print(
        f"{s['method']}"
        + (f" {s['bits']}-bit" if s["method"] == "qlora" else "")
        + (f" r={s['rank']}" if s["method"] in ("lora", "qlora") else "")
        + f"  ·  batch {s['batch']} x seq {s['seq']}, GA {s['grad_accum']}"
        + f"  ·  {s['precision']}, {s['optimizer']}, attn {s['attn']}"
        + f", checkpointing {'on' if s['gradient_checkpointing'] else 'off'}"
        + (f", loss {s['loss']}" if s.get("loss") else "")
        + (", compiled" if s.get("compile") else "")
        + (", activations offloaded" if s.get("activation_offload") else "")
        + (f"  ·  device_map {s['device_map']} over {s['gpus']} GPUs" if s.get("device_map", "none") != "none"
           else "")
        + f"  ·  {s['framework']} profile",
        highlight=False,
    )
    defaults = [k for k, v in d.get("setup_sources", {}).items() if "default" in v]
    if defaults:
        console.print(f"[dim]profile defaults used for: {', '.join(sorted(defaults))}[/]")


def render_memory(d: dict[str, Any], details: bool) -> None:
    pg = d["per_gpu"]
    cards = pg.get("per_card", [])
    fullest = max(cards, key=lambda c: c["device_peak_bytes"])["card"] if cards else None
    title = ("Per-GPU peak memory (GiB)" if fullest is None
             else f"Peak memory of card {fullest}, the fullest (GiB)")
    console.print(f"[bold]{title}[/], peak at {d['peak_phase']}", highlight=False)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    t.add_column("component")
    t.add_column("GiB", justify="right")
    if details:
        t.add_column("what it is", style="dim")

    def row(name: str, n: int, desc: str, bold: bool = False) -> None:
        cells = [f"[bold]{name}[/]", f"[bold]{gib(n)}[/]"] if bold else [name, gib(n)]
        t.add_row(*cells, *([desc] if details else []))

    for k, desc in COMPONENTS.items():
        v = pg["components"].get(k, 0)
        if v:
            row(k, v, desc)
    row("allocated peak", pg["allocated_peak_bytes"], "torch.cuda.max_memory_allocated", bold=True)
    row("reserved peak", pg["reserved_peak_bytes"], "torch.cuda.max_memory_reserved (allocator emulation)")
    row("CUDA context", pg["cuda_context_bytes"], "outside PyTorch (driver, kernels)")
    if pg.get("nccl_bytes"):
        row("NCCL", pg["nccl_bytes"], "communicator buffers, outside PyTorch")
    row("device peak", pg["device_peak_bytes"], "what nvidia-smi shows; OOM is judged here", bold=True)
    if pg.get("paged_bytes"):
        row("paged optimizer", pg["paged_bytes"], "unified memory, pages out instead of OOM")
    if pg.get("host_bytes"):
        row("host (CPU) memory", pg["host_bytes"], "offloaded states / params / checkpoints")
    console.print(t)
    render_cards(cards)


def render_cards(cards: list[dict[str, Any]]) -> None:
    """A device_map run: one line per card (the table above is the fullest card's)."""
    for c in cards:
        console.print(f"card {c['card']}: {gib(c['device_peak_bytes'])} GiB device peak "
                      f"({gib(c['allocated_peak_bytes'])} allocated, at {c['peak_phase']}): "
                      f"{escape(c['modules'])}", highlight=False)


def render_memory_details(d: dict[str, Any]) -> None:
    pg = d["per_gpu"]
    ph = "  ".join(f"{k} {gib(v)}" for k, v in pg["phases"].items())
    console.print(f"[dim]allocated by instant (GiB): {ph}[/]")
    band = pg["bands"].get("allocated")
    if band:
        console.print(f"[dim]uncertainty: allocated {gib(band['low'])}–{gib(band['high'])} GiB "
                      f"({band['why']}); "
                      f"reserved up to {gib(pg['bands']['reserved']['high'])} GiB; context "
                      f"{gib(pg['bands']['cuda_context']['low'])}–"
                      f"{gib(pg['bands']['cuda_context']['high'])} GiB[/]")
    for n in d.get("notes", []):
        console.print(f"[dim]note: {escape(n)}[/]")


def render_verdict(d: dict[str, Any]) -> None:
    if "gpu" not in d:
        console.print("[dim]no --gpu: memory only (add --gpu for the verdict, time and cost)[/]")
        return
    g = d["gpu"]
    verdict = d.get("verdict")
    if verdict == "fits":
        console.print(f"[green bold]FITS[/] on {g['name']} ({gib(g['memory_bytes'])} GiB usable): "
                      f"{gib(d['headroom_bytes'])} GiB headroom", highlight=False)
    elif verdict == "cannot_run":
        errors = [f for f in d.get("findings", []) if f["level"] == "error"]
        console.print(f"[red bold]CANNOT RUN[/] on {g['name']}: {escape(errors[0]['code'])} (below)",
                      highlight=False)
    else:
        console.print(f"[red bold]DOES NOT FIT[/] on {g['name']} ({gib(g['memory_bytes'])} GiB usable): "
                      f"short by {gib(-d['headroom_bytes'])} GiB", highlight=False)


def _num(v: float | None, fmt: str = ",.0f") -> str:
    return "-" if v is None else format(v, fmt)


def render_time_cost_line(d: dict[str, Any]) -> None:
    """Time and cost in one line: speed, what bounds it, hours and money when the dataset size is known."""
    t, c = d.get("time"), d.get("cost")
    if not t:
        return
    parts = [f"{_num(t.get('tokens_per_second'))} tokens/s", f"{_num(t.get('step_seconds'), ',.2f')} s/step"]
    if t.get("bound"):
        parts[-1] += f" ({t['bound']}-bound)"
    comm = (t.get("components_seconds") or {}).get("communication_exposed")
    if comm:
        parts.append(f"communication {comm:,.2f} s/step exposed")
    if t.get("total_hours") is not None:
        parts.append(f"{t['total_hours']:,.2f} h")
        if c and c.get("cloud_usd") is not None:
            parts.append(f"{c['cloud_usd']:,.2f} USD rented")
        if c and c.get("own_usd") is not None:
            parts.append(f"{c['own_usd']:,.2f} USD owned")
    else:
        parts.append("hours and cost: give --samples or --dataset-tokens")
    band = t.get("band") or {}
    if band:
        span = (f"{band['total_hours_low']:,.2f}-{band['total_hours_high']:,.2f} h"
                if "total_hours_high" in band
                else f"{band['step_seconds_low']:,.2f}-{band['step_seconds_high']:,.2f} s/step")
        parts.append(f"plan for {span}")
    if t.get("calibration"):
        parts.append(t["calibration"]["label"])
    elif t.get("card_throughput_known") == "proxy":
        parts.append("card throughput from proxy figures")
    console.print("[bold]Time[/] " + "  ·  ".join(parts), highlight=False)


def render_time_details(d: dict[str, Any]) -> None:
    """--details: the time and cost tables, the links used, and (slot) the time breakdown."""
    for sec in ("time", "cost"):
        if sec in d and d[sec]:
            render_section(sec, d[sec])
    links = (d.get("time") or {}).get("links") or {}
    for where, text in links.items():
        console.print(f"[dim]link {where.replace('_', '-')}: {escape(str(text))}[/]", highlight=False)


def render_deploy_hint(d: dict[str, Any]) -> None:
    """After a plan that fits: the command that plans serving the result (none when it does not fit)."""
    if d.get("verdict") not in (None, "fits"):
        return
    m, s = d["model"], d["setup"]
    lora = s["method"] in ("lora", "qlora")
    trained = f" --method {s['method']}" + (f" --rank {s['rank']}" if lora else "")
    console.print(f"[dim]after training: tuneplan deploy {m['name']}{trained} --serve-precision int4"
                  f"{' --gpu ' + d['gpu']['id'] if 'gpu' in d else ''}"
                  " (merge, serving memory, decode speed)[/]",
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
    """One line: where the seconds of an optimizer step go, and what limits it (figures from the time
    section)."""
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
    limited_by = sec.get("limited_by")
    limit = BREAKDOWN_LABELS.get(limited_by, "?") if limited_by is not None else "?"
    return f"step {step:.3g} s = " + " + ".join(parts) + f"; limited by {limit}{unverified}"



def flag_words(name: str, value: str | None) -> str | None:
    """The CLI's wording of a field an error refers to (tuneplan.errors): its flag, with the value.

    A setup field is its flag from the field table (``--method qlora``; a switch is ``--compile`` or
    ``--no-compile``); a setup field without a flag keeps its name (None); any other name is the flag of
    the same name (``from`` -> ``--from``, ``avg_tokens`` -> ``--avg-tokens``).
    """
    from tuneplan.specs.fields import BY_NAME

    if not name[:1].isalpha():  # already a flag
        return None
    row = BY_NAME.get(name)
    if row is not None and not row.flag:
        return None
    on, _, off = (row.flag[0] if row else "--" + name.replace("_", "-")).partition("/")
    if row is not None and row.is_switch:
        return off if value is not None and value.lower() in ("false", "off", "no") else on
    return on if value is None else f"{on} {value}"


def error_text(err: Any) -> str:
    """A TuneplanError as the CLI says it: the fields it names worded as flags."""
    return err.worded(flag_words)
