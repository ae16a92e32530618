"""`tuneplan fit | gpus | max-model | sweep`: the planner's answers (tuneplan.plan), rendered.

Every command takes the shared setup flags and ``--json``; the numbers come from ``tuneplan.plan``.
Exit status: 0 with an answer, 1 when nothing fits, 2 on bad input.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from tuneplan.cli.from_option import FromFiles, resolve_from
from tuneplan.cli.options import with_setup_options
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
PreferOpt = Annotated[str, typer.Option("--prefer", help="quality | speed | cost: what the recommendation optimises")]
MarginOpt = Annotated[str, typer.Option("--margin", help="safety margin below the usable memory: band (the "
                                                         "estimate's upper band), N GiB, N%, or 0")]
HostOpt = Annotated[float | None, typer.Option("--host-memory", help="host RAM per node in GiB, for CPU offload "
                                                                     "[2 x the node's GPU memory, at least 64]")]
GlobalBatchOpt = Annotated[int, typer.Option("--global-batch", help="target sequences per optimizer step")]


def _num(v: Any, fmt: str = "{:,.3g}") -> str:
    return "-" if v is None else fmt.format(v)


def _limit(v: int | None, by: str | None) -> str:
    if v is None:
        return "-"
    return f"{v:,}" + (" (cap)" if by == "cap" else "")


def _verdict(m: dict[str, Any]) -> str:
    if m["fits"]:
        return "[yellow]tight[/]" if m["tight"] else "[green]yes[/]"
    return "[red]cannot run[/]" if m["blocked_by"] else "[red]no[/]"


def render_fit(d: dict[str, Any]) -> None:
    g = d["gpu"]
    console.print(f"[bold]{d['model']}[/] on {d['world_size']} x {g['name']} ({gib(g['memory_bytes'])} GiB usable), "
                  f"target global batch {d['global_batch']}, host memory {gib(d['host_memory_bytes'])} GiB per node")
    t = Table(title="Best setup per method (limits: one field moved, the others as in that setup)")
    for c in ("method", "fits", "strategy", "also", "batch x accum", "peak GiB", "high GiB", "host GiB", "tokens/s",
              "max batch", "max seq", "max rank"):
        t.add_column(c, justify="left" if c in ("method", "fits", "strategy", "also") else "right",
                     overflow="fold")
    for m in d["methods"]:
        lb = m["limited_by"]
        also = [r for r in m["requires"] if not r.startswith(("zero-", "fsdp", "no-fsdp", "offload-"))]
        need = (", ".join(also) or "-") if m["fits"] else "cannot run (below)" if m["blocked_by"] else "nothing fits"
        t.add_row(m["method"], _verdict(m), m["strategy"] or "-", need,
                  f"{m['micro_batch']} x {m['grad_accum']}" if m["fits"] else "-",
                  gib(m["device_peak_bytes"]), gib(m["device_peak_high_bytes"]),
                  gib(m["host_bytes"]) if m.get("host_bytes") else "-", _num(m["tokens_per_second"], "{:,.0f}"),
                  _limit(m["max_batch"], lb.get("batch")), _limit(m["max_seq"], lb.get("seq")),
                  _limit(m["max_rank"], lb.get("rank")))
    console.print(t)
    for msg in sorted({msg for m in d["methods"] for msg in m["blocked_by"]}):
        console.print(f"[red]cannot run:[/] {msg}")
    if d["world_size"] > 1 and d["methods"] and d["methods"][0]["strategies"]:
        st = Table(title=f"Per strategy on {d['world_size']} GPUs (micro-batch x accumulation of its best setup)")
        st.add_column("method")
        names = [s["strategy"] for s in d["methods"][0]["strategies"]]
        for n in names:
            st.add_column(n, overflow="fold")
        for m in d["methods"]:
            by = {s["strategy"]: s for s in m["strategies"]}
            cells = []
            for n in names:
                s = by.get(n)
                if s is None or not s["fits"]:
                    cells.append("[red]no[/]" if s is None or not s["cannot_run"] else "[red]cannot[/]")
                else:
                    cells.append(("[yellow]tight[/]" if s["tight"] else "[green]yes[/]")
                                 + f" {s['micro_batch']}x{s['grad_accum']}")
            st.add_row(m["method"], *cells)
        console.print(st)
    r = d["recommended"]
    if r:
        head = "[bold yellow]Recommended (tight):[/]" if r["tight"] else "[bold green]Recommended:[/]"
        console.print(f"{head} {r['method']} ({r['strategy']}), micro-batch {r['micro_batch']} x grad-accum "
                      f"{r['grad_accum']} x {r['world_size']} GPU(s) = global batch {r['global_batch']}"
                      + (f" (target {r['target_global_batch']})" if r["global_batch"] != r["target_global_batch"] else "")
                      + f", peak {gib(r['device_peak_bytes'])} GiB (upper band {gib(r['device_peak_high_bytes'])} GiB)")
        tps = r.get("tokens_per_second")
        if tps:
            console.print(f"  time: {tps:,.0f} tokens/s" + (f", {r['total_hours']:,.2g} h" if r.get("total_hours") else "")
                          + (f", cloud {r['cloud_usd']:,.2f} USD" if r.get("cloud_usd") is not None else ""))
        console.print(f"  why: {r['reason']}")
        console.print(f"  rule: {d['rule']}")
        console.print(f"  run: [cyan]{r['command']}[/]")
    else:
        console.print("[red bold]Nothing fits[/] in the whole candidate space (every method, strategy, offload, "
                      "optimizer, checkpointing, micro-batch 1); try more GPUs (`tuneplan gpus`).")
    eq = d.get("equal_memory")
    if eq and eq["qlora"]:
        ranks = ", ".join(f"{k} r={v}" for k, v in eq["qlora"].items() if v)
        if ranks:
            console.print(f"Within the memory LoRA r={eq['lora_rank']} needs here ({gib(eq['budget_bytes'])} GiB): {ranks}")


def render_gpus(d: dict[str, Any], top: int | None) -> None:
    rows = d["ranking"][:top] if top else d["ranking"]
    t = Table(title=f"{d['model']}: cards ranked by {d['prefer'] if d['sort'] == 'prefer' else d['sort']} "
              f"(fewest cards searched up to {d['max_gpus']}" + ("" if d["auto"] else ", setup as given") + ")")
    for c in ("card", "GiB", "fits", "cards", "method", "strategy", "peak GiB", "tokens/s", "hours", "cloud $",
              "own $", "$/M tok", "break-even h"):
        t.add_column(c, justify="left" if c in ("card", "fits", "method", "strategy") else "right",
                     overflow="fold" if c == "strategy" else "ellipsis")
    for c in rows:
        fits = ("[yellow]tight[/]" if c["tight"] else "[green]yes[/]") if c["fits"] else "[red]no[/]"
        t.add_row(c["gpu"], gib(c["memory_bytes"]), fits, _num(c["min_gpus"], "{}"), c["method"] or "-",
                  c["strategy"] or "-", gib(c["per_gpu_peak_bytes"]), _num(c["tokens_per_second"], "{:,.0f}"),
                  _num(c["total_hours"]), _num(c["cloud_usd"], "{:,.2f}"), _num(c["own_usd"], "{:,.2f}"),
                  _num(c["cloud_usd_per_million_tokens"], "{:,.2f}"), _num(c["break_even_hours"], "{:,.0f}"))
    console.print(t)
    console.print(f"[dim]rule: {d['rule']}; break-even: hours of use after which owning the cards costs less than "
                  "renting them[/]")
    if not d["time_model"]:
        console.print("[dim]hours and run cost need the data size: --samples N [--avg-tokens T] or --dataset-tokens N[/]")


def render_max_model(d: dict[str, Any]) -> None:
    g = d["gpu"]
    console.print(f"[bold]{d['world_size']} x {g['name']}[/] ({gib(g['memory_bytes'])} GiB usable each)"
                  + ("  ·  the candidate space searched (--auto)" if d["auto"] else "  ·  setup as given"))
    t = Table(title="Largest model that fits, per method")
    for c in ("method", "largest catalog model", "params (B)", "largest standard size (B)", "next size (B)",
              "switch on"):
        t.add_column(c, justify="right" if "(B)" in c else "left")
    for m in d["by_method"]:
        cm = m["largest_catalog_model"]
        t.add_row(("[bold]" if m["method"] == d["method"] else "") + m["method"], cm["model"] if cm else "-",
                  _num(cm["params"] / 1e9 if cm else None, "{:.2f}"),
                  _num(m["max_params"] / 1e9 if m["max_params"] else None, "{:.2f}"),
                  _num(m["next_params"] / 1e9 if m["next_params"] else None, "{:.2f}"),
                  ", ".join(m["requires"]) or "-")
    console.print(t)
    for msg in sorted({msg for m in d["by_method"] for msg in m["blocked_by"]}):
        console.print(f"[red]cannot run:[/] {msg}")
    if d["max_shape"]:
        s = d["max_shape"]
        console.print(f"[dim]standard size for {d['method']}: Llama-3-style, hidden {s['hidden']}, {s['layers']} layers, "
                      f"{s['heads']} heads ({s['kv_heads']} KV), intermediate {s['intermediate']}, vocab {s['vocab']}[/]")


# Short column heads for the sweep table (the JSON keeps the component names of estimator.types.COMPONENTS).
SHORT = {"weights": "weights", "quant_meta": "quant", "lora_adapters": "lora", "gradients": "grads",
         "optimizer_states": "optim", "optimizer_temp": "opt tmp", "activations": "acts", "autocast_copies": "autocast",
         "logits_loss": "logits", "backward_temp": "bwd tmp", "parallel_buffers": "gathered", "framework": "cublas",
         "allocator_reserve": "reserve", "cuda_context": "context", "nccl": "nccl"}


def render_sweep(d: dict[str, Any]) -> None:
    t = Table(title=f"{d['model']}: per-GPU memory vs {d['variable']}"
              + (f" on {d['gpu']['name']} ({gib(d['capacity_bytes'])} GiB)" if d["gpu"] else ""))
    parts = [k for k in (d["points"][0]["stack"] if d["points"] else {})
             if any(p["stack"].get(k) for p in d["points"])]
    for c in (d["variable"], *[SHORT.get(k, k) for k in parts], "device peak", "fits", "hours"):
        t.add_column(c, justify="right")
    for p in d["points"]:
        if p["error"]:
            t.add_row(str(p["value"]), *["-"] * len(parts), "-", "[red]refused[/]", "-")
            continue
        t.add_row(str(p["value"]), *[gib(p["stack"].get(k, 0)) for k in parts], f"[bold]{gib(p['device_peak_bytes'])}[/]",
                  "-" if p["fits"] is None else "[green]yes[/]" if p["fits"] else "[red]no[/]", _num(p["total_hours"]))
    console.print(t)
    for p in d["points"]:
        if p["error"]:
            console.print(f"[red]{d['variable']}={p['value']}:[/] {p['error']}")


def register(app: typer.Typer) -> None:
    @app.command("fit")
    @with_setup_options
    def fit_cmd(
        gpu: Annotated[str, typer.Option("--gpu", "-g", help="accelerator, e.g. v100, rtx4090, a100-80gb")],
        model: Annotated[str | None, typer.Argument(help="catalog name, HF id, or path to config.json")] = None,
        global_batch: GlobalBatchOpt = 16,
        prefer: PreferOpt = "quality",
        margin: MarginOpt = "band",
        host_memory: HostOpt = None,
        samples: SamplesOpt = None, avg_tokens: AvgTokensOpt = None, epochs: EpochsOpt = None,
        dataset_tokens: DatasetTokensOpt = None, packing: PackingOpt = None,
        from_files: FromFiles = None,
        as_json: JsonOpt = False,
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
                host_memory_gib=host_memory, **frm.setup_kw).to_dict()
        print_json(d) if as_json else render_fit(d)
        if d["recommended"] is None:
            raise typer.Exit(1)

    @app.command("gpus")
    @with_setup_options
    def gpus_cmd(
        model: Annotated[str | None, typer.Argument(help="catalog name, HF id, or path to config.json")] = None,
        only: Annotated[str | None, typer.Option("--only", help="comma list of cards, e.g. rtx4090,a100-80gb")] = None,
        max_gpus: Annotated[int, typer.Option("--max-gpus", help="search up to this many cards")] = 64,
        prefer: PreferOpt = "quality",
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
        print_json(d) if as_json else render_gpus(d, top)
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
        setup_kw: dict[str, Any] | None = None,
    ) -> None:
        """The largest model --gpus N cards of --gpu can fine-tune with --method (catalog and standard sizes)."""
        from tuneplan.plan import max_model

        d = max_model(gpu, auto=auto, host_memory_gib=host_memory, **(setup_kw or {})).to_dict()
        print_json(d) if as_json else render_max_model(d)
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
        print_json(res.to_dict()) if as_json else render_sweep(res.to_dict())


def _list_cards(as_json: bool) -> None:
    from tuneplan.catalog.accelerators import accelerators

    cards = sorted(accelerators().values(), key=lambda a: (a.memory_bytes, a.id))
    if as_json:
        print_json([a.to_dict() for a in cards])
        return
    t = Table(title=f"Accelerator catalog ({len(cards)} cards)")
    for c in ("id", "name", "GiB usable", "CC", "bf16 TFLOPS", "$/GPU-h"):
        t.add_column(c, justify="right" if c not in ("id", "name") else "left")
    for a in cards:
        d = a.to_dict()
        t.add_row(a.id, a.name, gib(a.memory_bytes), d["compute_capability"] or "-", _num(a.bf16_tflops_dense, "{:g}"),
                  _num(a.cloud_usd_per_gpu_hr, "{:.2f}"))
    console.print(t)
