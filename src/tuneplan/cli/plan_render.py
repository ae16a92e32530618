"""`tuneplan gpus | max-model | sweep` and the card list for people: tables of the planner's answers.

Formatting only: every figure is the planner's (``tuneplan.plan``), read from its JSON form.
"""

from __future__ import annotations

from typing import Any

from tuneplan.cli.plan_layout import compact_table, extras, hours, legend, num, short_strategy, show, split_id
from tuneplan.cli.render import console, gib, print_json


def render_gpus(d: dict[str, Any], top: int | None, details: bool = False) -> None:
    rows = d["ranking"][:top] if top else d["ranking"]
    order = d["prefer"] if d["sort"] == "prefer" else d["sort"]
    console.print(f"[bold]{d['model']}[/]: cards ranked by {order} (fewest cards searched up to "
                  f"{d['max_gpus']}" + ("" if d["auto"] else ", setup as given") + ")")
    timed = d["time_model"]
    t = compact_table()
    cols = ["card", "cards", "method", "strategy", "peak\nGiB", "tok/s"]
    cols += ["hours", "cloud\nUSD"] if timed else ["cloud USD\nper M tok"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("card", "cards", "method", "strategy") else "right",
                     no_wrap=col != "card", overflow="fold")
    for c in rows:
        count = num(c["min_gpus"], "{}")
        cards = ((f"[yellow]{count} tight[/]" if c["tight"] else f"[green]{count}[/]") if c["fits"]
                 else "[red]no[/]")
        cells = [split_id(c["gpu"], 14), cards, c["method"] or "-", short_strategy(c["strategy"]),
                 gib(c["per_gpu_peak_bytes"]), num(c["tokens_per_second"], "{:,.0f}")]
        cells += ([hours(c["total_hours"]), num(c["cloud_usd"], "{:,.2f}")] if timed
                  else [num(c["cloud_usd_per_million_tokens"], "{:,.2f}")])
        t.add_row(*cells)
    console.print(t)
    console.print("[dim]cards: the fewest that fit (tight: not within the upper band); peak: device peak per "
                  "GPU; "
                  "tok/s: tokens per second[/]")
    legend([c["strategy"] for c in rows])
    if details:
        _gpus_costs(rows)
        console.print(f"[dim]rule: {d['rule']}[/]")
    if not timed:
        console.print("[dim]hours and run cost need the data size: --samples N [--avg-tokens T] or "
                      "--dataset-tokens N[/]")
    if not details:
        console.print("[dim]--details: card memory, owning vs renting, other switches, the rule[/]")


def _gpus_costs(rows: list[dict[str, Any]]) -> None:
    t = compact_table()
    for col in ("card", "GiB\nusable", "cloud USD\nper M tok", "own USD\nper M tok", "own\nUSD",
                "break-even\nhours"):
        t.add_column(col, justify="left" if col == "card" else "right", no_wrap=col != "card",
                     overflow="fold")
    for c in rows:
        t.add_row(split_id(c["gpu"], 14), gib(c["memory_bytes"]),
                  num(c["cloud_usd_per_million_tokens"], "{:,.2f}"),
                  num(c.get("own_usd_per_million_tokens"), "{:,.2f}"), num(c["own_usd"], "{:,.2f}"),
                  num(c["break_even_hours"], "{:,.0f}"))
    show(t, "Rent or own (break-even: hours of use after which owning costs less than renting)")
    by_switches: dict[str, list[str]] = {}
    for c in rows:
        if extras(c["requires"]):
            by_switches.setdefault(", ".join(extras(c["requires"])), []).append(c["gpu"])
    for sw, cards in by_switches.items():
        console.print(f"besides the strategy, {sw}: {', '.join(cards)}")


def render_max_model(d: dict[str, Any], details: bool = False) -> None:
    g = d["gpu"]
    console.print(f"[bold]{d['world_size']} x {g['name']}[/] ({gib(g['memory_bytes'])} GiB usable each)"
                  + ("  ·  the candidate space searched (--auto)" if d["auto"] else "  ·  setup as given"))
    t = compact_table()
    cols = ["method", "largest catalog model", "size B"] + (["hours"] if d["auto"] else []) + [
        "largest\nstandard B", "next\nsize B"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("method", "largest catalog model") else "right",
                     no_wrap=c != "largest catalog model")
    for m in d["by_method"]:
        cm = m["largest_catalog_model"]
        cells = [("[bold]" if m["method"] == d["method"] else "") + m["method"],
                 split_id(cm["model"], 30 if d["auto"] else 34) if cm else "-",
                 num(cm["params"] / 1e9 if cm else None, "{:.2f}")]
        if d["auto"]:
            cells.append(hours(cm.get("hours") if cm else None))
        t.add_row(*cells, num(m["max_params"] / 1e9 if m["max_params"] else None, "{:.2f}"),
                  num(m["next_params"] / 1e9 if m["next_params"] else None, "{:.2f}"))
    show(t, "Largest model that fits, per method (B: billions of parameters)")
    if d["auto"]:
        u = d.get("usable") or {}
        console.print(f"[dim]--auto: trains at {u.get('tokens_per_second', 0):,.0f} tokens/s or more "
                      f"(hours: {u.get('samples', 0):,} samples of {u.get('avg_tokens', 0)} tokens, one "
                      f"epoch, within {u.get('hours', 0):g} h), within {gib(d.get('host_memory_bytes'))} GiB "
                      "of host memory per node (--host-memory sets it)[/]")
    for m in d["by_method"]:
        if m["requires"]:
            console.print(f"{m['method']} switches on {', '.join(m['requires'])}")
    for msg in sorted({msg for m in d["by_method"] for msg in m["blocked_by"]}):
        console.print(f"[red]cannot run:[/] {msg}")
    if d["max_shape"] and details:
        s = d["max_shape"]
        console.print(f"[dim]standard size for {d['method']}: Llama-3-style, hidden {s['hidden']}, "
                      f"{s['layers']} layers, {s['heads']} heads ({s['kv_heads']} KV), intermediate "
                      f"{s['intermediate']}, vocab {s['vocab']}[/]")
    elif d["max_shape"]:
        console.print("[dim]--details: the shape of the largest standard size[/]")


# Short row heads for the sweep table (the JSON keeps the component names of estimator.types.COMPONENTS).
SHORT = {"weights": "weights", "quant_meta": "quant", "lora_adapters": "lora", "gradients": "grads",
         "optimizer_states": "optim", "optimizer_temp": "opt tmp", "activations": "acts",
         "autocast_copies": "autocast", "logits_loss": "logits", "backward_temp": "bwd tmp",
         "parallel_buffers": "gathered", "framework": "cublas",
         "allocator_reserve": "reserve", "cuda_context": "context", "nccl": "nccl"}
_SWEEP_COLS = 8  # values per table: 8 columns of "123.45" and the row heads fit in 80 columns


def render_sweep(d: dict[str, Any], details: bool = False) -> None:
    """One row per memory component (GiB per GPU), one column per value of the variable."""
    console.print(f"[bold]{d['model']}[/]: per-GPU memory (GiB) vs {d['variable']}"
                  + (f" on {d['gpu']['name']} ({gib(d['capacity_bytes'])} GiB usable)" if d["gpu"] else ""))
    pts = d["points"]
    parts = [k for k in (pts[0]["stack"] if pts else {}) if any(p["stack"].get(k) for p in pts)]
    for i in range(0, len(pts), _SWEEP_COLS):
        chunk = pts[i:i + _SWEEP_COLS]
        t = compact_table()
        t.add_column(d["variable"], no_wrap=True)
        for p in chunk:
            t.add_column(str(p["value"]), justify="right", no_wrap=True)
        for k in parts:
            t.add_row(SHORT.get(k, k), *["-" if p["error"] else gib(p["stack"].get(k, 0)) for p in chunk])
        t.add_row("[bold]device peak[/]", *["-" if p["error"] else f"[bold]{gib(p['device_peak_bytes'])}[/]"
                                            for p in chunk])
        t.add_row("fits", *["[red]refused[/]" if p["error"] else "-" if p["fits"] is None
                            else "[green]yes[/]" if p["fits"] else "[red]no[/]" for p in chunk])
        if any(p["total_hours"] is not None for p in chunk):
            t.add_row("hours", *[hours(p["total_hours"]) for p in chunk])
        console.print(t)
    for p in pts:
        if p["error"]:
            console.print(f"[red]{d['variable']}={p['value']}:[/] {p['error']}")
    if details:
        names = "; ".join(f"{SHORT.get(k, k)}: {k}" for k in parts if SHORT.get(k, k) != k)
        console.print(f"[dim]{names}[/]")
    else:
        console.print("[dim]--details: the full component names[/]")


def print_cards(as_json: bool) -> None:
    from tuneplan.catalog.accelerators import accelerators

    cards = sorted(accelerators().values(), key=lambda a: (a.memory_bytes, a.id))
    if as_json:
        print_json({"accelerators": [a.to_dict() for a in cards]})
        return
    t = compact_table()
    for c in ("id", "name", "GiB\nusable", "CC", "bf16\nTFLOPS", "cloud USD\nper GPU-h"):
        t.add_column(c, justify="left" if c in ("id", "name") else "right", no_wrap=c not in ("id", "name"),
                     overflow="fold")
    for a in cards:
        d = a.to_dict()
        t.add_row(split_id(a.id), a.name, gib(a.memory_bytes), d["compute_capability"] or "-",
                  num(a.bf16_tflops_dense, "{:g}"), num(a.cloud_usd_per_gpu_hr, "{:.2f}"))
    show(t, f"Accelerator catalog ({len(cards)} cards)")
