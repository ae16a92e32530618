"""`tuneplan fit` for people: the best setup per method, the trade-off, the limits and the recommendation.

Formatting only: every figure is the planner's (``tuneplan.plan.fit``), read from its JSON form.
"""

from __future__ import annotations

from typing import Any

from tuneplan.catalog.accelerators import HOST_DEFAULT_TEXT as DEFAULT_TEXT
from tuneplan.cli.plan_layout import compact_table, extras, hours, legend, num, short_strategy, show
from tuneplan.cli.render import console, gib


def _limit(v: int | None, by: str | None) -> str:
    if v is None:
        return "-"
    return f"{v:,}" + (" (cap)" if by == "cap" else "")


def _verdict(m: dict[str, Any]) -> str:
    if m["fits"]:
        return "[yellow]tight[/]" if m["tight"] else "[green]yes[/]"
    return "[red]cannot[/]" if m["blocked_by"] else "[red]no[/]"


def _host_source(h: dict[str, Any]) -> str:
    """Where the host memory figure comes from, in words."""
    src = h.get("source")
    if src == "given":
        return "--host-memory"
    if src == "this machine":
        return "this machine's RAM"
    if src == "cloud instance":
        return f"as a cloud {h['instance']}; --host-memory sets it"
    return f"assumed: {DEFAULT_TEXT}; --host-memory sets it"


def _memory_left(r: dict[str, Any]) -> str | None:
    """What the memory left buys, worded as the flags that take it."""
    left = r.get("memory_left") or {}
    parts = []
    if "seq" in left:
        parts.append(f"--seq up to {left['seq']['to']:,}")
    if "batch" in left:
        b = left["batch"]
        parts.append(f"--batch {b['to']} --grad-accum {b['grad_accum_to']} (fewer accumulation steps)")
    return " or ".join(parts) if parts else None


def _fit_frontier(d: dict[str, Any]) -> None:
    """Per method: quality rank, time (and hours and USD with the data size), peak and its band."""
    rows = d.get("frontier") or []
    if not rows:
        return
    timed = any(r["total_hours"] is not None for r in rows)
    t = compact_table()
    cols = ["method", "quality", "tokens/s", "slower"] + (["hours", "cloud\nUSD"] if timed else []) + [
        "peak\nGiB", "high\nGiB"]
    for c in cols:
        t.add_column(c, justify="left" if c == "method" else "right", no_wrap=True)
    for r in rows:
        over = {"max_hours": " [red](over --max-hours)[/]", "budget": " [red](over --budget)[/]"}.get(
            r["over_limit"] or "", "")
        cells = [r["method"] + over, f"{r['quality_rank']}", num(r["tokens_per_second"], "{:,.0f}"),
                 num(r["slowdown"], "{:.1f}x")]
        if timed:
            cells += [hours(r["total_hours"]), num(r["cloud_usd"], "{:,.2f}")]
        t.add_row(*cells, gib(r["device_peak_bytes"]), gib(r["device_peak_high_bytes"]))
    show(t, "Trade-off (quality 1 = most faithful; slower: than the fastest plan)")


def render_fit(d: dict[str, Any], details: bool = False) -> None:
    g = d["gpu"]
    console.print(f"[bold]{d['model']}[/] on {d['world_size']} x {g['name']} ({gib(g['memory_bytes'])} GiB "
                  f"usable), target global batch {d['global_batch']}, host memory "
                  f"{gib(d['host_memory_bytes'])} GiB per node ({_host_source(d['host_memory'])})")
    _framework_line(d.get("framework") or {})
    t = compact_table()
    for c in ("method", "fits", "strategy", "batch\nx accum", "peak\nGiB", "high\nGiB", "tokens/s"):
        t.add_column(c, justify="left" if c in ("method", "fits", "strategy") else "right", no_wrap=True)
    for m in d["methods"]:
        t.add_row(m["method"], _verdict(m), short_strategy(m["strategy"]),
                  f"{m['micro_batch']} x {m['grad_accum']}" if m["fits"] else "-",
                  gib(m["device_peak_bytes"]), gib(m["device_peak_high_bytes"]),
                  num(m["tokens_per_second"], "{:,.0f}"))
    show(t, "Best setup per method")
    console.print("[dim]peak: device peak per GPU; high: its upper band; batch x accum: micro-batch x "
                  "gradient accumulation[/]")
    legend([m["strategy"] for m in d["methods"]])
    switched = [f"{m['method']}: {', '.join(extras(m['requires']))}" for m in d["methods"]
                if m["fits"] and extras(m["requires"])]
    if switched:
        console.print("besides the strategy, switched on: " + "; ".join(switched))
    for msg in sorted({msg for m in d["methods"] for msg in m["blocked_by"]}):
        console.print(f"[red]cannot run:[/] {msg}")
    if details:
        _fit_frontier(d)
        _fit_limits(d)
        _fit_strategies(d)
    _fit_recommended(d, details)
    eq = d.get("equal_memory")
    if eq and eq["qlora"]:
        ranks = ", ".join(f"{k} r={v}" for k, v in eq["qlora"].items() if v)
        if ranks:
            console.print(f"Within the memory LoRA r={eq['lora_rank']} needs here "
                          f"({gib(eq['budget_bytes'])} GiB): {ranks}")
    if not details:
        console.print("[dim]--details: the trade-off per method (time, cost), the limits (max batch, seq, "
                      "rank), host memory, " + ("each strategy, " if d["world_size"] > 1 else "")
                      + "the rule[/]")


def _framework_line(fw: dict[str, Any]) -> None:
    """Which framework the answer is for, when it is not the setup's own."""
    if fw.get("chosen") and fw["chosen"] != fw.get("default"):
        why = {"max_hours": "every plan breaks --max-hours", "budget": "every plan breaks --budget"}.get(
            fw.get("default_decided_by") or "", "nothing fits")
        console.print(f"[bold]framework {fw['chosen']}[/]: {why} with {fw['default']}, the setup's "
                      f"own (searched: {', '.join(fw['searched'])}); --framework pins one")


def _fit_limits(d: dict[str, Any]) -> None:
    t = compact_table()
    for c in ("method", "host\nGiB", "max\nbatch", "max\nseq", "max\nrank", "switched on"):
        t.add_column(c, justify="left" if c in ("method", "switched on") else "right",
                     no_wrap=c != "switched on")
    for m in d["methods"]:
        lb = m["limited_by"]
        t.add_row(m["method"], gib(m["host_bytes"]) if m.get("host_bytes") else "-",
                  _limit(m["max_batch"], lb.get("batch")), _limit(m["max_seq"], lb.get("seq")),
                  _limit(m["max_rank"], lb.get("rank")), ", ".join(m["requires"]) or "-")
    show(t, "Limits: one field moved, the rest as in that setup")


def _fit_strategies(d: dict[str, Any]) -> None:
    """One row per strategy, one column per method: whether it fits, and micro-batch x accumulation."""
    if d["world_size"] <= 1 or not d["methods"] or not d["methods"][0]["strategies"]:
        return
    t = compact_table()
    t.add_column("strategy", no_wrap=True)
    for m in d["methods"]:
        t.add_column(m["method"], no_wrap=True)
    by_method = [{s["strategy"]: s for s in m["strategies"]} for m in d["methods"]]
    for n in [s["strategy"] for s in d["methods"][0]["strategies"]]:
        cells = []
        for by in by_method:
            s = by.get(n)
            if s is None or not s["fits"]:
                cells.append("[red]no[/]" if s is None or not s["cannot_run"] else "[red]cannot[/]")
            else:
                cells.append(("[yellow]tight[/]" if s["tight"] else "[green]yes[/]")
                             + f" {s['micro_batch']}x{s['grad_accum']}")
        t.add_row(short_strategy(n), *cells)
    show(t, f"Per strategy on {d['world_size']} GPUs (micro-batch x accumulation of its best setup)")


def _fit_recommended(d: dict[str, Any], details: bool) -> None:
    r = d["recommended"]
    searched = (d.get("framework") or {}).get("searched") or []
    frameworks = f" (frameworks {', '.join(searched)})" if len(searched) > 1 else ""
    if not r and any(m["fits"] for m in d["methods"]):  # plans fit, a hard limit rules each out
        console.print(f"[red bold]No plan within the limits[/]{frameworks}: every setup that fits breaks "
                      "--max-hours or --budget (--details: each method's hours and cloud USD)")
        return
    if not r:
        console.print("[red bold]Nothing fits[/] in the whole candidate space (every method asked, strategy, "
                      "offload, optimizer, checkpointing, micro-batch 1"
                      + (f"; frameworks {', '.join(searched)}" if len(searched) > 1 else "") + ").")
        _fit_next_step(d.get("next_step"))
        return
    head = "[bold yellow]Recommended (tight):[/]" if r["tight"] else "[bold green]Recommended:[/]"
    target = (f" (target {r['target_global_batch']})" if r["global_batch"] != r["target_global_batch"]
              else "")
    console.print(f"{head} {r['method']} ({r['strategy']}), micro-batch {r['micro_batch']} x grad-accum "
                  f"{r['grad_accum']} x {r['world_size']} GPU(s) = global batch {r['global_batch']}{target}, "
                  f"peak {gib(r['device_peak_bytes'])} GiB "
                  f"(upper band {gib(r['device_peak_high_bytes'])} GiB)")
    if r.get("tokens_per_second"):
        console.print(f"  time: {_time_words(r)}")
    console.print(f"  why: {r['reason']}")
    if left := _memory_left(r):
        console.print(f"  memory left: {left}")
    if details:
        console.print(f"  rule: {d['rule']}")
    console.print(f"  run: [cyan]{r['command']}[/]")


def _time_words(r: dict[str, Any]) -> str:
    """Tokens/s, hours and cloud cost, and which hours they are: with a safety margin the plan's hours
    and money are the time band's upper end, while the `run:` line's estimate prints the central hours."""
    out = f"{r['tokens_per_second']:,.0f} tokens/s"
    total, usd = r.get("total_hours"), r.get("cloud_usd")
    cost = f", cloud {usd:,.2f} USD" if usd is not None else ""
    if not total:
        return out + cost
    if r.get("hours_basis") == "time band upper end" and r.get("central_hours"):
        return (f"{out}; plan for {total:,.3g} h{cost} (upper end of the time band; the run: line's "
                f"estimate prints the central {r['central_hours']:,.3g} h)")
    return f"{out}, {total:,.3g} h{cost}"


# How each change of a next step is written as flags.
_CHANGE_FLAGS = {"seq": "--seq {to}", "host_memory": "--host-memory {to}", "method": "--method {to}",
                 "gpus": "--gpus {to}"}


def _fit_next_step(step: dict[str, Any] | None) -> None:
    """What is largest, what is short, and the one change that makes something fit."""
    if not step:
        return
    short = (f"host memory short by {gib(step['short_by_bytes'])} GiB for {step['method']} "
             f"({step['strategy']})" if step["short_of"] == "host"
             else f"{gib(step['short_by_bytes'])} GiB over the card with {step['method']} "
             f"({step['strategy']}), micro-batch 1")
    largest = (f"; largest component {step['largest_component']} {gib(step['largest_component_bytes'])} GiB"
               if step.get("largest_component") and step["short_of"] == "device" else "")
    console.print(f"  closest: {short}{largest}")
    ch = step.get("change")
    if ch is None:
        console.print("  no single change of sequence, host memory, method or GPUs per node makes it fit: "
                      "`tuneplan gpus` searches more cards")
        return
    to = ch["to"]
    if ch["field"] == "method" and str(to).startswith("qlora-"):  # the label qlora-N is two flags
        to = f"qlora --bits {to.split('-')[1]}"
    console.print(f"  next step: [cyan]{_CHANGE_FLAGS[ch['field']].format(to=to)}[/] fits ({ch['method']}, "
                  f"{ch['strategy']}, peak {gib(ch['device_peak_bytes'])} GiB)")
