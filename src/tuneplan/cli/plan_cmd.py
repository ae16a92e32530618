"""`tuneplan fit | gpus | max-model | sweep`: the planner's answers (tuneplan.plan), rendered.

Every command takes the shared setup flags and ``--json``; the numbers come from ``tuneplan.plan``.
Exit status: 0 with an answer, 1 when nothing fits, 2 on bad input.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tuneplan.catalog.accelerators import HOST_DEFAULT_TEXT as DEFAULT_TEXT
from tuneplan.cli.from_option import FromFiles, resolve_from
from tuneplan.cli.options import with_setup_options
from tuneplan.cli.plan_layout import compact_table, short_strategy, show, split_id, strategy_legend
from tuneplan.cli.render import console, gib, print_json

_D = "Dataset (time and cost)"


def _dataset(samples: int | None, avg_tokens: float | None, epochs: float | None, dataset_tokens: int | None,
             packing: bool | None) -> Any:
    from tuneplan.plan.timecost import make_dataset

    return make_dataset(samples=samples, avg_tokens=avg_tokens, epochs=epochs, dataset_tokens=dataset_tokens,
                        packing=packing)


SamplesOpt = Annotated[int | None, typer.Option("--samples", help="training samples", rich_help_panel=_D)]
AvgTokensOpt = Annotated[float | None, typer.Option("--avg-tokens", help="tokens per sample after the template",
                                                    rich_help_panel=_D)]
EpochsOpt = Annotated[float | None, typer.Option("--epochs", help="epochs [1]", rich_help_panel=_D)]
DatasetTokensOpt = Annotated[int | None, typer.Option("--dataset-tokens", help="tokens in one epoch",
                                                      rich_help_panel=_D)]
PackingOpt = Annotated[bool | None, typer.Option("--packing/--no-packing", help="pack samples into full rows",
                                                 rich_help_panel=_D)]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object")]
PreferOpt = Annotated[str, typer.Option("--prefer", help="balanced (the most faithful method within --max-slowdown "
                                                         "of the fastest plan) | quality | speed | cost")]
SlowdownOpt = Annotated[float | None, typer.Option("--max-slowdown", help="how many times slower than the fastest "
                                                                          "plan balanced accepts [2]")]
MaxHoursOpt = Annotated[float | None, typer.Option("--max-hours", help="hard limit on the run's hours (needs the "
                                                                       "data size)", rich_help_panel=_D)]
BudgetOpt = Annotated[float | None, typer.Option("--budget", help="hard limit on the run's cloud cost in USD (needs "
                                                                  "the data size)", rich_help_panel=_D)]
MarginOpt = Annotated[str, typer.Option("--margin", help="safety margin below the usable memory: band (the "
                                                         "estimate's upper band), N GiB, N%, or 0")]
HostOpt = Annotated[float | None, typer.Option("--host-memory", help="host RAM per node in GiB, for CPU offload "
                                                                     f"[this machine's RAM for its own card, else a "
                                                                     f"typical cloud instance's, else {DEFAULT_TEXT}]")]
GlobalBatchOpt = Annotated[int, typer.Option("--global-batch", help="target sequences per optimizer step")]
DetailsOpt = Annotated[bool, typer.Option("--details", help="the rest: limits, costs, switches, the rule")]


def _num(v: Any, fmt: str = "{:,.3g}") -> str:
    return "-" if v is None else fmt.format(v)


def _limit(v: int | None, by: str | None) -> str:
    if v is None:
        return "-"
    return f"{v:,}" + (" (cap)" if by == "cap" else "")


def _verdict(m: dict[str, Any]) -> str:
    if m["fits"]:
        return "[yellow]tight[/]" if m["tight"] else "[green]yes[/]"
    return "[red]cannot[/]" if m["blocked_by"] else "[red]no[/]"


def _extras(requires: list[str]) -> list[str]:
    """The switches of a setup besides its strategy (checkpointing, optimizer): the strategy has its own column."""
    return [r for r in requires if not r.startswith(("zero-", "fsdp", "no-fsdp", "offload-"))]


def _legend(names: list[str | None]) -> None:
    text = strategy_legend(names)
    if text:
        console.print(f"[dim]{text}[/]")


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
        cells = [r["method"] + over, f"{r['quality_rank']}", _num(r["tokens_per_second"], "{:,.0f}"),
                 _num(r["slowdown"], "{:.1f}x")]
        if timed:
            cells += [_hours(r["total_hours"]), _num(r["cloud_usd"], "{:,.2f}")]
        t.add_row(*cells, gib(r["device_peak_bytes"]), gib(r["device_peak_high_bytes"]))
    show(t, "Trade-off (quality 1 = most faithful; slower: than the fastest plan)")


def render_fit(d: dict[str, Any], details: bool = False) -> None:
    g = d["gpu"]
    console.print(f"[bold]{d['model']}[/] on {d['world_size']} x {g['name']} ({gib(g['memory_bytes'])} GiB usable), "
                  f"target global batch {d['global_batch']}, host memory {gib(d['host_memory_bytes'])} GiB per node "
                  f"({_host_source(d['host_memory'])})")
    t = compact_table()
    for c in ("method", "fits", "strategy", "batch\nx accum", "peak\nGiB", "high\nGiB", "tokens/s"):
        t.add_column(c, justify="left" if c in ("method", "fits", "strategy") else "right", no_wrap=True)
    for m in d["methods"]:
        t.add_row(m["method"], _verdict(m), short_strategy(m["strategy"]),
                  f"{m['micro_batch']} x {m['grad_accum']}" if m["fits"] else "-",
                  gib(m["device_peak_bytes"]), gib(m["device_peak_high_bytes"]),
                  _num(m["tokens_per_second"], "{:,.0f}"))
    show(t, "Best setup per method")
    console.print("[dim]peak: device peak per GPU; high: its upper band; batch x accum: micro-batch x gradient "
                  "accumulation[/]")
    _legend([m["strategy"] for m in d["methods"]])
    extras = [f"{m['method']}: {', '.join(_extras(m['requires']))}" for m in d["methods"]
              if m["fits"] and _extras(m["requires"])]
    if extras:
        console.print("besides the strategy, switched on: " + "; ".join(extras))
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
            console.print(f"Within the memory LoRA r={eq['lora_rank']} needs here ({gib(eq['budget_bytes'])} GiB): {ranks}")
    if not details:
        console.print("[dim]--details: the trade-off per method (time, cost), the limits (max batch, seq, rank), "
                      "host memory, " + ("each strategy, " if d["world_size"] > 1 else "") + "the rule[/]")


def _fit_limits(d: dict[str, Any]) -> None:
    t = compact_table()
    for c in ("method", "host\nGiB", "max\nbatch", "max\nseq", "max\nrank", "switched on"):
        t.add_column(c, justify="left" if c in ("method", "switched on") else "right", no_wrap=c != "switched on")
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
    if not r:
        console.print("[red bold]Nothing fits[/] in the whole candidate space (every method, strategy, offload, "
                      "optimizer, checkpointing, micro-batch 1); try more GPUs (`tuneplan gpus`).")
        return
    head = "[bold yellow]Recommended (tight):[/]" if r["tight"] else "[bold green]Recommended:[/]"
    console.print(f"{head} {r['method']} ({r['strategy']}), micro-batch {r['micro_batch']} x grad-accum "
                  f"{r['grad_accum']} x {r['world_size']} GPU(s) = global batch {r['global_batch']}"
                  + (f" (target {r['target_global_batch']})" if r["global_batch"] != r["target_global_batch"] else "")
                  + f", peak {gib(r['device_peak_bytes'])} GiB (upper band {gib(r['device_peak_high_bytes'])} GiB)")
    tps = r.get("tokens_per_second")
    if tps:
        console.print(f"  time: {tps:,.0f} tokens/s" + (f", {r['total_hours']:,.3g} h" if r.get("total_hours") else "")
                      + (f", cloud {r['cloud_usd']:,.2f} USD" if r.get("cloud_usd") is not None else ""))
    console.print(f"  why: {r['reason']}")
    if left := _memory_left(r):
        console.print(f"  memory left: {left}")
    if details:
        console.print(f"  rule: {d['rule']}")
    console.print(f"  run: [cyan]{r['command']}[/]")


def _hours(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


def render_gpus(d: dict[str, Any], top: int | None, details: bool = False) -> None:
    rows = d["ranking"][:top] if top else d["ranking"]
    console.print(f"[bold]{d['model']}[/]: cards ranked by {d['prefer'] if d['sort'] == 'prefer' else d['sort']} "
                  f"(fewest cards searched up to {d['max_gpus']}" + ("" if d["auto"] else ", setup as given") + ")")
    timed = d["time_model"]
    t = compact_table()
    cols = ["card", "cards", "method", "strategy", "peak\nGiB", "tok/s"]
    cols += ["hours", "cloud\nUSD"] if timed else ["cloud USD\nper M tok"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("card", "cards", "method", "strategy") else "right",
                     no_wrap=col != "card", overflow="fold")
    for c in rows:
        count = _num(c["min_gpus"], "{}")
        cards = (f"[yellow]{count} tight[/]" if c["tight"] else f"[green]{count}[/]") if c["fits"] else "[red]no[/]"
        cells = [split_id(c["gpu"], 14), cards, c["method"] or "-", short_strategy(c["strategy"]),
                 gib(c["per_gpu_peak_bytes"]), _num(c["tokens_per_second"], "{:,.0f}")]
        cells += ([_hours(c["total_hours"]), _num(c["cloud_usd"], "{:,.2f}")] if timed
                  else [_num(c["cloud_usd_per_million_tokens"], "{:,.2f}")])
        t.add_row(*cells)
    console.print(t)
    console.print("[dim]cards: the fewest that fit (tight: not within the upper band); peak: device peak per GPU; "
                  "tok/s: tokens per second[/]")
    _legend([c["strategy"] for c in rows])
    if details:
        _gpus_costs(rows)
        console.print(f"[dim]rule: {d['rule']}[/]")
    if not timed:
        console.print("[dim]hours and run cost need the data size: --samples N [--avg-tokens T] or --dataset-tokens N[/]")
    if not details:
        console.print("[dim]--details: card memory, owning vs renting, other switches, the rule[/]")


def _gpus_costs(rows: list[dict[str, Any]]) -> None:
    t = compact_table()
    for col in ("card", "GiB\nusable", "cloud USD\nper M tok", "own USD\nper M tok", "own\nUSD", "break-even\nhours"):
        t.add_column(col, justify="left" if col == "card" else "right", no_wrap=col != "card", overflow="fold")
    for c in rows:
        t.add_row(split_id(c["gpu"], 14), gib(c["memory_bytes"]), _num(c["cloud_usd_per_million_tokens"], "{:,.2f}"),
                  _num(c.get("own_usd_per_million_tokens"), "{:,.2f}"), _num(c["own_usd"], "{:,.2f}"),
                  _num(c["break_even_hours"], "{:,.0f}"))
    show(t, "Rent or own (break-even: hours of use after which owning costs less than renting)")
    by_switches: dict[str, list[str]] = {}
    for c in rows:
        if _extras(c["requires"]):
            by_switches.setdefault(", ".join(_extras(c["requires"])), []).append(c["gpu"])
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
                 _num(cm["params"] / 1e9 if cm else None, "{:.2f}")]
        if d["auto"]:
            cells.append(_hours(cm.get("hours") if cm else None))
        t.add_row(*cells, _num(m["max_params"] / 1e9 if m["max_params"] else None, "{:.2f}"),
                  _num(m["next_params"] / 1e9 if m["next_params"] else None, "{:.2f}"))
    show(t, "Largest model that fits, per method (B: billions of parameters)")
    if d["auto"]:
        u = d.get("usable") or {}
        console.print(f"[dim]--auto: trains at {u.get('tokens_per_second', 0):,.0f} tokens/s or more (hours: "
                      f"{u.get('samples', 0):,} samples of {u.get('avg_tokens', 0)} tokens, one epoch, within "
                      f"{u.get('hours', 0):g} h), within {gib(d.get('host_memory_bytes'))} GiB of host memory "
                      "per node (--host-memory sets it)[/]")
    for m in d["by_method"]:
        if m["requires"]:
            console.print(f"{m['method']} switches on {', '.join(m['requires'])}")
    for msg in sorted({msg for m in d["by_method"] for msg in m["blocked_by"]}):
        console.print(f"[red]cannot run:[/] {msg}")
    if d["max_shape"] and details:
        s = d["max_shape"]
        console.print(f"[dim]standard size for {d['method']}: Llama-3-style, hidden {s['hidden']}, {s['layers']} layers, "
                      f"{s['heads']} heads ({s['kv_heads']} KV), intermediate {s['intermediate']}, vocab {s['vocab']}[/]")
    elif d["max_shape"]:
        console.print("[dim]--details: the shape of the largest standard size[/]")


# Short row heads for the sweep table (the JSON keeps the component names of estimator.types.COMPONENTS).
SHORT = {"weights": "weights", "quant_meta": "quant", "lora_adapters": "lora", "gradients": "grads",
         "optimizer_states": "optim", "optimizer_temp": "opt tmp", "activations": "acts", "autocast_copies": "autocast",
         "logits_loss": "logits", "backward_temp": "bwd tmp", "parallel_buffers": "gathered", "framework": "cublas",
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
            t.add_row("hours", *[_hours(p["total_hours"]) for p in chunk])
        console.print(t)
    for p in pts:
        if p["error"]:
            console.print(f"[red]{d['variable']}={p['value']}:[/] {p['error']}")
    if details:
        console.print("[dim]" + "; ".join(f"{SHORT.get(k, k)}: {k}" for k in parts if SHORT.get(k, k) != k) + "[/]")
    else:
        console.print("[dim]--details: the full component names[/]")


def register(app: typer.Typer) -> None:
    @app.command("fit")
    @with_setup_options
    def fit_cmd(
        gpu: Annotated[str, typer.Option("--gpu", "-g", help="accelerator, e.g. v100, rtx4090, a100-80gb")],
        model: Annotated[str | None, typer.Argument(help="catalog name, HF id, or path to config.json")] = None,
        global_batch: GlobalBatchOpt = 16,
        prefer: PreferOpt = "balanced",
        max_slowdown: SlowdownOpt = None,
        margin: MarginOpt = "band",
        host_memory: HostOpt = None,
        samples: SamplesOpt = None, avg_tokens: AvgTokensOpt = None, epochs: EpochsOpt = None,
        dataset_tokens: DatasetTokensOpt = None, packing: PackingOpt = None,
        max_hours: MaxHoursOpt = None, budget: BudgetOpt = None,
        from_files: FromFiles = None,
        as_json: JsonOpt = False,
        details: DetailsOpt = False,
        setup_kw: dict[str, Any] | None = None,
    ) -> None:
        """What fits on a card (or --gpus N): the best setup per method and the one the rule recommends.

        The planner searches method x strategy (with CPU offload) x optimizer x checkpointing x
        micro-batch x accumulation; --method, --optimizer, --zero ... pin their field. Exit 0 with a
        recommendation when anything fits, 1 when nothing does.
        """
        from tuneplan.plan import fit

        frm = resolve_from(from_files, model, setup_kw)
        ds = _dataset(samples, avg_tokens, epochs, dataset_tokens, packing)
        d = fit(frm.model, gpu, global_batch=global_batch, prefer=prefer, margin=margin, dataset=ds,
                host_memory_gib=host_memory, max_slowdown=max_slowdown, max_hours=max_hours, budget=budget,
                **frm.setup_kw).to_dict()
        print_json(d) if as_json else render_fit(d, details)
        if d["recommended"] is None:
            raise typer.Exit(1)

    @app.command("gpus")
    @with_setup_options
    def gpus_cmd(
        model: Annotated[str | None, typer.Argument(help="catalog name, HF id, or path to config.json")] = None,
        only: Annotated[str | None, typer.Option("--only", help="comma list of cards, e.g. rtx4090,a100-80gb")] = None,
        max_gpus: Annotated[int, typer.Option("--max-gpus", help="search up to this many cards")] = 64,
        prefer: PreferOpt = "balanced",
        sort: Annotated[str, typer.Option("--sort", help="prefer (by --prefer) | cards | memory")] = "prefer",
        global_batch: GlobalBatchOpt = 16,
        margin: MarginOpt = "band",
        host_memory: HostOpt = None,
        top: Annotated[int | None, typer.Option("--top", help="show the first N")] = None,
        list_cards: Annotated[bool, typer.Option("--list", help="list the accelerator catalog and exit")] = False,
        as_given_: Annotated[bool, typer.Option("--as-given", help="no measures: the setup exactly as given "
                                                                   "(the card count is still searched)")] = False,
        samples: SamplesOpt = None, avg_tokens: AvgTokensOpt = None, epochs: EpochsOpt = None,
        dataset_tokens: DatasetTokensOpt = None, packing: PackingOpt = None,
        as_json: JsonOpt = False,
        details: DetailsOpt = False,
        setup_kw: dict[str, Any] | None = None,
    ) -> None:
        """Rank the card catalog for a fine-tune: fewest cards, the recommended setup, time, rent vs own cost.

        --gpus N fixes the card count instead of searching the fewest.
        """
        if list_cards:
            _list_cards(as_json)
            return
        if model is None:
            from tuneplan.errors import TuneplanError

            raise TuneplanError("a model is needed", field="model", accepted="a catalog name, HF id or config.json")
        from tuneplan.plan import rank_gpus

        ds = _dataset(samples, avg_tokens, epochs, dataset_tokens, packing)
        names = [s.strip() for s in only.split(",") if s.strip()] if only else None
        d = rank_gpus(model, only=names, max_gpus=max_gpus, sort=sort, prefer=prefer, global_batch=global_batch,
                      margin=margin, dataset=ds, auto=not as_given_, host_memory_gib=host_memory,
                      **(setup_kw or {})).to_dict()
        print_json(d) if as_json else render_gpus(d, top, details)
        if not any(c["fits"] for c in d["ranking"]):
            raise typer.Exit(1)

    @app.command("max-model")
    @with_setup_options
    def max_model_cmd(
        gpu: Annotated[str, typer.Option("--gpu", "-g", help="accelerator, e.g. v100, a100-80gb")],
        auto: Annotated[bool, typer.Option("--auto", help="search the candidate space (checkpointing, 8-bit "
                                                          "optimizers, ZeRO/FSDP, offload) as fit does")] = False,
        host_memory: HostOpt = None,
        as_json: JsonOpt = False,
        details: DetailsOpt = False,
        setup_kw: dict[str, Any] | None = None,
    ) -> None:
        """The largest model --gpus N cards of --gpu can fine-tune with --method (catalog and standard sizes)."""
        from tuneplan.plan import max_model

        d = max_model(gpu, auto=auto, host_memory_gib=host_memory, **(setup_kw or {})).to_dict()
        print_json(d) if as_json else render_max_model(d, details)
        if d["max_params"] is None and d["largest_catalog_model"] is None:
            raise typer.Exit(1)

    @app.command("sweep")
    @with_setup_options
    def sweep_cmd(
        model: Annotated[str, typer.Argument(help="catalog name, HF id, or path to config.json")],
        vary: Annotated[str, typer.Option("--vary", help="seq=512..8192 (doubling) | rank=8..64:8 | gpus=1,2,4,8")],
        gpu: Annotated[str | None, typer.Option("--gpu", "-g", help="draw this card's capacity")] = None,
        plot: Annotated[str | None, typer.Option("--plot", help="write a plot: .png / .svg (matplotlib) or .html")] = None,
        force: Annotated[bool, typer.Option("--force", help="overwrite the --plot file (a symbolic link is replaced, never written through)")] = False,
        samples: SamplesOpt = None, avg_tokens: AvgTokensOpt = None, epochs: EpochsOpt = None,
        dataset_tokens: DatasetTokensOpt = None, packing: PackingOpt = None,
        as_json: JsonOpt = False,
        details: DetailsOpt = False,
        setup_kw: dict[str, Any] | None = None,
    ) -> None:
        """Memory by component (and time) against one variable, as a table and a plot."""
        from tuneplan.plan import sweep

        ds = _dataset(samples, avg_tokens, epochs, dataset_tokens, packing)
        res = sweep(model, vary, gpu=gpu, dataset=ds, **(setup_kw or {}))
        if plot:
            from tuneplan.plan.sweep_plot import write_plot

            path = write_plot(res, plot, force=force)
            if not as_json:
                console.print(f"plot written to {path}")
        print_json(res.to_dict()) if as_json else render_sweep(res.to_dict(), details)


def _list_cards(as_json: bool) -> None:
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
                  _num(a.bf16_tflops_dense, "{:g}"), _num(a.cloud_usd_per_gpu_hr, "{:.2f}"))
    show(t, f"Accelerator catalog ({len(cards)} cards)")
