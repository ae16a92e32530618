"""Rich rendering of core results. Formats numbers; computes none."""

from __future__ import annotations

import errno
import re
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tuneplan.cli.json_out import print_json  # noqa: F401  (re-exported: the commands import it from here)
from tuneplan.cli.wording import flag_words  # noqa: F401  (re-exported, as print_json)
from tuneplan.estimator.types import COMPONENTS, GIB

# What a terminal would act on rather than show: ECMA-48 escape sequences (CSI "ESC [ ... final", OSC
# "ESC ] ... BEL|ST", and two-character "ESC x"), the other C0 controls but tab and newline, DEL, the C1
# controls, and the Unicode bidirectional overrides and isolates (text that reads in another order).
_TERMINAL_CONTROLS = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", re.DOTALL)


def for_terminal(text: str) -> str:
    """``text`` without anything a terminal would execute (colours, cursor moves, a new window title, a
    clear screen): the one sanitiser every line tuneplan prints as text goes through (both consoles
    below, the Python warnings and the error line)."""
    return _TERMINAL_CONTROLS.sub("", text)


class TerminalConsole(Console):
    """A rich console whose every string (printed, or a table cell) is cleaned by :func:`for_terminal`
    before markup is read: a value from a config file can neither move the cursor nor fake a colour;
    rich's own styling is added after, so it stays."""

    def render_str(self, text: str, **kw: Any) -> Text:
        return super().render_str(for_terminal(text), **kw)

    def on_broken_pipe(self) -> None:
        """The reader left (``| head``): to the command line's one handler (rich's own exits 1, the "does
        not fit" status)."""
        raise BrokenPipeError(errno.EPIPE, "the reader of the output has gone")


console = TerminalConsole()
err_console = TerminalConsole(stderr=True)


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
    """One screen by default: the verdict and the time first (what a reader acts on), then setup,
    memory, top findings; ``details``: the rest."""
    render_verdict(d)
    render_time_cost_line(d)
    render_setup(d)
    render_memory(d, details)
    if details:
        render_memory_details(d)
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


def outside_torch_words(d: dict[str, Any]) -> tuple[str, str]:
    """The card's names for the memory outside PyTorch (``Accelerator.outside_torch_words``)."""
    words = (d.get("gpu") or {}).get("outside_torch_words") or ("CUDA context", "NCCL")
    return words[0], words[1]


def render_memory(d: dict[str, Any], details: bool) -> None:
    pg = d["per_gpu"]
    cards = pg.get("per_card", [])
    fullest = max(cards, key=lambda c: c["device_peak_bytes"])["card"] if cards else None
    title = ("Per-GPU peak memory (GiB)" if fullest is None
             else f"Peak memory of card {fullest}, the fullest (GiB)")
    console.print(f"[bold]{title}[/], peak at {d['peak_instant']}", highlight=False)
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
    runtime, collectives = outside_torch_words(d)
    row(runtime, pg["cuda_context_bytes"], "outside PyTorch (driver, kernels)")
    if pg.get("nccl_bytes"):
        row(collectives, pg["nccl_bytes"], "communicator buffers, outside PyTorch")
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
                      f"({gib(c['allocated_peak_bytes'])} allocated, at {c['peak_instant']}): "
                      f"{escape(c['modules'])}", highlight=False)


def render_memory_details(d: dict[str, Any]) -> None:
    pg = d["per_gpu"]
    ph = "  ".join(f"{k} {gib(v)}" for k, v in pg["instants"].items())
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


def render_allocator_retries(d: dict[str, Any]) -> None:
    """The estimate's ``allocator_retries``: the step runs only as PyTorch's allocator frees cached
    segments and retries."""
    if d.get("allocator_retries"):
        peak = gib(d["per_gpu"]["device_peak_bytes"])
        console.print(f"[yellow]allocator retries:[/] the device peak ({peak} GiB) exceeds the card; the "
                      "allocator frees cached segments and retries (slower steps)", highlight=False)


def render_verdict(d: dict[str, Any]) -> None:
    """The first line: the verdict on the card (the card's name choice beside it when the name also
    names another board); the second: what the verdict turns on when it is not a plain FITS."""
    if "gpu" not in d:
        console.print(f"[bold]{gib(d['per_gpu']['device_peak_bytes'])} GiB[/] device peak per GPU "
                      "[dim](no --gpu: memory only; add --gpu for the verdict, time and cost)[/]",
                      highlight=False)
        return
    g = d["gpu"]
    card = escape(g["name"]) + (f" [dim]({escape(g['name_choice'])})[/]" if g.get("name_choice") else "")
    usable, headroom = gib(g["memory_bytes"]), gib(abs(d["headroom_bytes"]))
    verdict = d.get("verdict")
    if verdict == "fits":
        console.print(f"[green bold]FITS[/] on {card} ({usable} GiB usable): {headroom} GiB headroom",
                      highlight=False)
        render_allocator_retries(d)
    elif verdict == "runs_only_with":
        console.print(f"[yellow bold]RUNS ONLY WITH[/] {escape('; '.join(d['requires']))}", highlight=False)
        console.print(f"{card}: memory fits, {headroom} GiB headroom; --versions checks yours",
                      highlight=False)
    elif verdict == "cannot_run":
        errors = [f for f in d.get("findings", []) if f["level"] == "error"]
        console.print(f"[red bold]CANNOT RUN[/] on {card}: {escape(errors[0]['message'])}", highlight=False)
    else:
        console.print(f"[red bold]DOES NOT FIT[/] on {card} ({usable} GiB usable): short by {headroom} GiB",
                      highlight=False)
        step = d.get("next_step") or {}
        if step.get("largest_component"):
            ch = step.get("change")
            flag = change_flag(ch) if ch else None
            console.print(f"next step: the largest part is {step['largest_component']} "
                          f"({step['largest_component_bytes'] / GIB:,.2f} GiB); "
                          + (f"{flag} fits (device peak {ch['device_peak_bytes'] / GIB:,.2f} GiB)" if ch
                             else "no single change of framework, checkpointing, sequence, micro-batch "
                                  "or CPU offload fits: more or larger GPUs (`tuneplan gpus`)"),
                          highlight=False)


def change_flag(change: dict[str, Any]) -> str:
    """A planner's setup change as the flag that makes it: a switch turned on is the bare flag."""
    flag = "--" + change["field"].replace("_", "-")
    return flag if change["to"] is True else f"{flag} {change['to']}"


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
    if t.get("total_hours") is not None:
        parts.append(f"{t['total_hours']:,.2f} h")
        if c and c.get("cloud_usd") is not None:
            parts.append(f"{c['cloud_usd']:,.2f} USD rented"
                         + (f" (priced as {c['cloud_priced_as']})" if c.get("cloud_priced_as") else ""))
        elif c:
            parts.append("rented: no price known (--price)")
        if c and c.get("own_usd") is not None:
            parts.append(f"{c['own_usd']:,.2f} USD owned")
    else:
        parts.append("hours and cost: --samples N")
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
    console.print("[bold]Time[/] " + " · ".join(parts), highlight=False)


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
    return f"step {step:.3g} s = " + " + ".join(parts) + f"; {sec.get('bound') or '?'}-bound{unverified}"


def error_text(err: Any) -> str:
    """A TuneplanError as the CLI says it: the fields it names worded as flags."""
    return err.worded(flag_words)
