"""`tuneplan simulate`: the real transformers + PEFT step on fake tensors, printed like `estimate`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tuneplan.cli.from_option import FromFiles, resolve_from
from tuneplan.cli.options import with_setup_options
from tuneplan.cli.render import console, err_console, gib, print_json, render_estimate
from tuneplan.cli.wording import cli_texts


def _render_simulation(sim: dict[str, Any]) -> None:
    from rich.table import Table

    if sim.get("fallback"):
        return
    console.print(
        f"[bold]peak op[/]: {sim['peak_op']} in {sim['peak_module'] or '(autograd engine)'} "
        f"(step {sim['peak_step']}); simulated in {sim['seconds']:.1f} s "
        f"(model build {sim['build_seconds']:.1f} s)"
    )
    t = Table(title="Live at the peak, by module (GiB)")
    t.add_column("module / category")
    t.add_column("GiB", justify="right")
    for row in sim["by_module"]:
        t.add_row(row["module"], gib(row["bytes"]))
    console.print(t)
    t = Table(title="Largest tensors at the peak")
    for c in ("category", "module", "op", "shape", "dtype", "GiB"):
        t.add_column(c, justify="right" if c == "GiB" else "left", overflow="fold")
    for r in sim["top_tensors"]:
        t.add_row(r["category"], r["module"] or "-", r["op"], str(r["shape"]), r["dtype"], gib(r["bytes"]))
    console.print(t)
    if sim["kernel_workspaces"]:
        t = Table(title="Kernel-internal workspaces (counted in allocated; largest instance)")
        t.add_column("workspace")
        t.add_column("op")
        t.add_column("MiB", justify="right")
        for w in sim["kernel_workspaces"]:
            t.add_row(w["name"], w["op"], f"{w['bytes'] / 2**20:,.1f}")
        console.print(t)
    a = sim["allocator_emulation"]
    console.print(
        f"[dim]caching-allocator EMULATION (not yet confirmed on a GPU): max reserved "
        f"{gib(a['max_reserved_bytes'])} GiB in {a['segments_at_reserved_peak']} segments, "
        f"max allocated (whole blocks) {gib(a['max_allocated_bytes'])} GiB"
        + (", would run out of the given capacity" if a.get("would_oom") else "")
        + "[/]"
    )
    if len(a.get("reserved_by_stream_bytes", {})) > 1:
        console.print(
            f"[dim]reserved - allocated {gib(a['gap_bytes'])} GiB, of which "
            f"{gib(a['cross_stream_bytes'])} GiB cached per CUDA stream ("
            + ", ".join(f"{k} {gib(v)}" for k, v in a["reserved_by_stream_bytes"].items())
            + " GiB reserved)[/]"
        )
    o = sim["outside_pytorch"]
    console.print(
        f"[dim]outside PyTorch: CUDA context {gib(o['cuda_context_bytes'])} GiB"
        + (f", NCCL {gib(o['nccl_bytes'])} GiB" if o.get("nccl_bytes") else "")
        + "[/]"
    )


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    @with_setup_options
    def simulate_cmd(
        model: Annotated[
            str | None, typer.Argument(help="catalog name, HF id, or path to config.json")
        ] = None,
        gpu: Annotated[
            str | None,
            typer.Option("--gpu", "-g", help="accelerator: verdict, and the allocator emulation's capacity"),
        ] = None,
        from_files: FromFiles = None,
        snapshot: Annotated[
            Path | None,
            typer.Option(
                "--snapshot",
                help="write a torch.cuda.memory._snapshot()-compatible pickle "
                "(open it at pytorch.org/memory_viz)",
            ),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
        force: Annotated[bool, typer.Option("--force", help="overwrite --snapshot (a symbolic link is "
                                            "replaced, never written through)")] = False,
        setup_kw: dict[str, Any] | None = None,
    ) -> None:
        """Run the real training step (transformers + PEFT, two optimizer steps) on fake tensors and count
        every allocation: the exact allocated peak of that code path, the op at the peak, and what is live.

        Needs the optional extra 'simulate' (torch, transformers, peft, accelerate).
        Exit status as `estimate`.
        """
        from dataclasses import replace

        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from tuneplan.api import estimate
        from tuneplan.simulate import simulate_report

        if snapshot:
            from tuneplan.safe_write import check_targets

            check_targets([snapshot], force=force, field="snapshot")  # before minutes of simulation
        frm = resolve_from(from_files, model, setup_kw)
        # The result is built exactly as `estimate` builds it (model as built for the framework and head,
        # setup, findings, trainable parameters, time and cost); only the memory comes from the simulation.
        built = estimate(frm.model, frm.base, gpu=gpu, **frm.setup_kw)
        spec, setup, acc = built.model, built.setup, built.gpu
        with Progress(
            TextColumn("simulating"),
            BarColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
            disable=as_json,
        ) as bar:
            task = bar.add_task("importing torch / transformers / peft", total=1.0)

            def progress(fraction: float, message: str) -> None:
                bar.update(task, completed=fraction, description=message)

            rep = simulate_report(
                spec,
                setup,
                progress=progress,
                snapshot_path=str(snapshot) if snapshot else None,
                capacity_bytes=acc.memory_bytes if acc else None,
            )
        sections = {**built.extras.get("sections", {}), "simulation": rep.to_dict()}
        est = replace(built, breakdown=rep.breakdown, extras={**built.extras, "sections": sections})
        d = cli_texts(est.to_dict())
        if as_json:
            print_json(d)
        else:
            render_estimate(d)
            _render_simulation(d["simulation"])
            if snapshot and not rep.fallback:
                console.print(f"snapshot written to {snapshot} (drag it onto https://pytorch.org/memory_viz)")
        if est.fits is False:
            raise typer.Exit(1)
