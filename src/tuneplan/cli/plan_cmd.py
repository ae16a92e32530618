"""`tuneplan fit | gpus | max-model | sweep`: the planner's answers (tuneplan.plan), rendered.

Every command takes the shared setup flags and ``--json``; the numbers come from ``tuneplan.plan``.
Exit status: 0 with an answer, 1 when nothing fits, 2 on bad input.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tuneplan.catalog.accelerators import HOST_DEFAULT_TEXT as DEFAULT_TEXT
from tuneplan.cli.fit_render import render_fit
from tuneplan.cli.from_option import FromFiles, resolve_from
from tuneplan.cli.options import with_setup_options
from tuneplan.cli.plan_render import print_cards, render_gpus, render_max_model, render_sweep
from tuneplan.cli.render import console, print_json

_D = "Dataset (time and cost)"


def _dataset(samples: int | None, avg_tokens: float | None, epochs: float | None, dataset_tokens: int | None,
             packing: bool | None) -> Any:
    from tuneplan.plan.timecost import make_dataset

    return make_dataset(samples=samples, avg_tokens=avg_tokens, epochs=epochs, dataset_tokens=dataset_tokens,
                        packing=packing)


SamplesOpt = Annotated[int | None, typer.Option("--samples", help="training samples", rich_help_panel=_D)]
AvgTokensOpt = Annotated[float | None, typer.Option("--avg-tokens", help="tokens per sample after the "
                                                    "template", rich_help_panel=_D)]
EpochsOpt = Annotated[float | None, typer.Option("--epochs", help="epochs [1]", rich_help_panel=_D)]
DatasetTokensOpt = Annotated[int | None, typer.Option("--dataset-tokens", help="tokens in one epoch",
                                                      rich_help_panel=_D)]
PackingOpt = Annotated[bool | None, typer.Option("--packing/--no-packing", help="pack samples into full rows",
                                                 rich_help_panel=_D)]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object")]
PreferOpt = Annotated[str, typer.Option("--prefer", help="balanced (the most faithful method within "
                                        "--max-slowdown of the fastest plan) | quality | speed | cost")]
SlowdownOpt = Annotated[float | None, typer.Option("--max-slowdown", help="how many times slower than the "
                                                   "fastest plan balanced accepts [2]")]
MaxHoursOpt = Annotated[float | None, typer.Option("--max-hours", help="hard limit on the run's hours (needs "
                                                   "the data size)", rich_help_panel=_D)]
BudgetOpt = Annotated[float | None, typer.Option("--budget", help="hard limit on the run's cloud cost in USD "
                                                 "(needs the data size)", rich_help_panel=_D)]
MarginOpt = Annotated[str, typer.Option("--margin", help="safety margin below the usable memory: band (the "
                                        "estimate's upper band), N GiB, N%, or 0")]
HostOpt = Annotated[float | None, typer.Option("--host-memory", help="host RAM per node in GiB, for CPU "
                                               "offload [this machine's RAM for its own card, else a typical "
                                               f"cloud instance's, else {DEFAULT_TEXT}]")]
GlobalBatchOpt = Annotated[int, typer.Option("--global-batch", help="target sequences per optimizer step")]
DetailsOpt = Annotated[bool, typer.Option("--details", help="the rest: limits, costs, switches, the rule")]
ModelArg = Annotated[str | None, typer.Argument(help="catalog name, HF id, or path to config.json")]


def register(app: typer.Typer) -> None:
    @app.command("fit")
    @with_setup_options
    def fit_cmd(
        gpu: Annotated[str, typer.Option("--gpu", "-g", help="accelerator, e.g. v100, rtx4090, a100-80gb")],
        model: ModelArg = None,
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
        model: ModelArg = None,
        only: Annotated[str | None, typer.Option("--only", help="comma list of cards, e.g. "
                                                 "rtx4090,a100-80gb")] = None,
        max_gpus: Annotated[int, typer.Option("--max-gpus", help="search up to this many cards")] = 64,
        prefer: PreferOpt = "balanced",
        sort: Annotated[str, typer.Option("--sort", help="prefer (by --prefer) | cards | memory")] = "prefer",
        global_batch: GlobalBatchOpt = 16,
        margin: MarginOpt = "band",
        host_memory: HostOpt = None,
        top: Annotated[int | None, typer.Option("--top", help="show the first N")] = None,
        list_cards: Annotated[bool, typer.Option("--list", help="list the accelerator catalog and "
                                                 "exit")] = False,
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
            print_cards(as_json)
            return
        if model is None:
            from tuneplan.errors import TuneplanError

            raise TuneplanError("a model is needed", field="model",
                                accepted="a catalog name, HF id or config.json")
        from tuneplan.plan import rank_gpus

        ds = _dataset(samples, avg_tokens, epochs, dataset_tokens, packing)
        names = [s.strip() for s in only.split(",") if s.strip()] if only else None
        d = rank_gpus(model, only=names, max_gpus=max_gpus, sort=sort, prefer=prefer,
                      global_batch=global_batch,
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
        """The largest model --gpus N cards of --gpu can fine-tune with --method (catalog and standard
        sizes)."""
        from tuneplan.plan import max_model

        # the table shows the answers alone: every catalog model's verdict is computed for --json only
        d = max_model(gpu, auto=auto, host_memory_gib=host_memory, catalog=as_json,
                      **(setup_kw or {})).to_dict()
        print_json(d) if as_json else render_max_model(d, details)
        if d["max_params"] is None and d["largest_catalog_model"] is None:
            raise typer.Exit(1)

    @app.command("sweep")
    @with_setup_options
    def sweep_cmd(
        model: Annotated[str, typer.Argument(help="catalog name, HF id, or path to config.json")],
        vary: Annotated[str, typer.Option("--vary", help="seq=512..8192 (doubling) | rank=8..64:8 | "
                                          "gpus=1,2,4,8")],
        gpu: Annotated[str | None, typer.Option("--gpu", "-g", help="draw this card's capacity")] = None,
        plot: Annotated[str | None, typer.Option("--plot", help="write a plot: .png / .svg (matplotlib) or "
                                                 ".html")] = None,
        force: Annotated[bool, typer.Option("--force", help="overwrite the --plot file (a symbolic link is "
                                            "replaced, never written through)")] = False,
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
