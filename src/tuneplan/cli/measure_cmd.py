"""`tuneplan measure`: run N real training steps here and compare them with the estimate."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from tuneplan.cli.options import with_setup_options
from tuneplan.cli.render import console, print_json
from tuneplan.cli.time_options import with_machine_options

MIB = 1024**2
GIB = 1024**3


def register(app: typer.Typer) -> None:
    _register_calibration(app)

    @app.command("measure")
    @with_setup_options
    @with_machine_options
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
        calibrate: Annotated[bool, typer.Option(
            "--calibrate", help="store the measured step time so that the next estimate, fit and gpus for "
            "this card use it (`tuneplan calibration list|remove`)")] = False,
        torch_era: Annotated[
            str | None,
            typer.Option("--torch-era", hidden=True,
                         help="calibration rows of older stacks: a comma list of keep_grads, "
                              "softmax_keeps_input, longest_batch_first"),
        ] = None,
        setup_kw: dict[str, Any] | None = None,
        time_options: Any = None,
    ) -> None:
        """Run real training steps on this machine (GPU, or CPU with host memory figures) and compare.

        Builds the model from its config.json with random weights (no download), applies the setup as
        transformers + PEFT do, runs --steps optimizer steps on random tokens, reads the allocator's and
        NVML's peaks per phase and tokens/s, and sets them next to the analytic estimate. With --calibrate,
        --link and --inter-node-gbs say how this machine's cards are connected; the step is stored with them.
        """
        from tuneplan.measure import measure

        if record and os.path.islink(record) and not force:
            from tuneplan.safe_write import check_targets

            check_targets([record], force=False, field="record")  # refuses the link, before the run
        if time_options is not None and not calibrate:
            from tuneplan.cli.render import err_console

            err_console.print("[yellow]warning:[/] --link and --inter-node-gbs describe the machine for "
                              "--calibrate; ignored without it", highlight=False)
        fields: dict[str, Any] = {**(setup_kw or {}), **_torch_era(torch_era)}
        out = measure(model, steps=steps, device=device, weights=weights, record=record, **fields)
        if calibrate:
            out["calibration"] = _calibrate(out, time_options)
        if as_json:
            print_json(out)
            return
        _render(out)


def _calibrate(out: dict[str, Any], time_options: Any = None) -> dict[str, Any]:
    """Store the run's median timed step (steps 2..N) for the card it ran on, predicted on the machine as
    described (``time_options``: the stated link, the network between nodes)."""
    import statistics

    from tuneplan.api import estimate
    from tuneplan.catalog.accelerators import resolve_accelerator
    from tuneplan.errors import TuneplanError
    from tuneplan.measure.calibration import record_step

    m = out["measured"]
    timed = m["step_seconds"][1:] or m["step_seconds"]
    if m["outcome"] != "measured" or m["memory_kind"] == "host" or not timed:
        raise TuneplanError("no GPU step was measured, so nothing was calibrated", field="calibrate",
                            accepted="a run on a CUDA GPU that completes its steps")
    acc = resolve_accelerator(m["device_name"])
    est = estimate(out["estimate"]["model"]["name"], gpu=acc, timing=False, **_setup_of(out["estimate"]))
    return record_step(est.run, acc, statistics.median(timed), "tuneplan measure", options=time_options)


def _setup_of(est: dict[str, Any]) -> dict[str, Any]:
    from tuneplan.specs.setup import TrainSetup

    names = set(TrainSetup.__dataclass_fields__)
    return {k: v for k, v in est["setup"].items() if k in names}


def _register_calibration(app: typer.Typer) -> None:
    cal = typer.Typer(help="Step times measured on this machine, used by estimate, fit and gpus: list, add, "
                      "remove.",
                      no_args_is_help=True, add_completion=False, rich_markup_mode=None)
    app.add_typer(cal, name="calibration")

    @cal.command("list")
    def list_cmd(as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False
                 ) -> None:
        """The stored measurements per card and framework, and the correction each mechanism gets."""
        from tuneplan.estimator.step_calibration import store_path
        from tuneplan.measure.calibration import list_entries

        rows = list_entries()
        if as_json:
            print_json({"store": store_path(), "entries": rows})
            return
        if not rows:
            console.print(f"no calibration stored ({store_path()})", highlight=False)
            return
        for r in rows:
            f = ", ".join(f"{k} x{v:.2f}" for k, v in r["factors"].items())
            console.print(f"[bold]{r['card']}[/] {r['framework']}: {len(r['measurements'])} measured "
                          f"step(s); {f}", highlight=False)
            for m in r["measurements"]:
                console.print(f"  {m['model']} {m['method']} batch {m['batch']} x seq {m['seq']}, GA "
                              f"{m['grad_accum']}, {m['gpus']} GPU(s): measured "
                              f"{m['measured_step_seconds']:.3f} s, predicted "
                              f"{m['predicted_step_seconds']:.3f} s ({m['source']}"
                              f"{_machine_words(m.get('time_options') or {})})", highlight=False)
        console.print(f"[dim]store: {store_path()}[/]", highlight=False)

    @cal.command("remove")
    def remove_cmd(
        gpu: Annotated[str | None, typer.Option("--gpu", help="only this card")] = None,
        framework: Annotated[str | None, typer.Option("--framework", help="only this framework")] = None,
        all_: Annotated[bool, typer.Option("--all", help="every card and framework")] = False,
    ) -> None:
        """Forget stored measurements: one card (and framework), or --all."""
        from tuneplan.catalog.accelerators import resolve_accelerator
        from tuneplan.errors import TuneplanError
        from tuneplan.measure.calibration import remove_entries

        if not all_ and gpu is None:
            raise TuneplanError("say what to remove", field="gpu",
                                accepted="--gpu CARD [--framework F], or --all")
        card = resolve_accelerator(gpu).id if gpu else None
        gone = remove_entries(card, framework)
        console.print(f"removed {len(gone)} entr{'y' if len(gone) == 1 else 'ies'}"
                      + (f": {', '.join(gone)}" if gone else ""), highlight=False)

    @cal.command("add")
    @with_setup_options
    @with_machine_options
    def add_cmd(
        model: Annotated[str, typer.Argument(help="catalog name, HF id, or path to config.json")],
        gpu: Annotated[str, typer.Option("--gpu", help="the card the step ran on")],
        step_seconds: Annotated[float, typer.Option("--step-seconds", help="measured seconds per optimizer "
                                                    "step (steady state, from your training log)")],
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
        setup_kw: dict[str, Any] | None = None,
        time_options: Any = None,
    ) -> None:
        """Store a step time you measured yourself (the setup flags say what ran; --link and
        --inter-node-gbs how the machine's cards are connected, when not as the catalog says)."""
        from tuneplan.api import estimate
        from tuneplan.measure.calibration import record_step

        est = estimate(model, gpu=gpu, timing=False, **(setup_kw or {}))
        assert est.gpu is not None
        m = record_step(est.run, est.gpu, step_seconds, "given", options=time_options)
        if as_json:
            print_json(m)
            return
        console.print(f"stored for {est.gpu.id} / {est.setup.framework}: measured {step_seconds:.3f} s per "
                      f"step, predicted {m['predicted_step_seconds']:.3f} s", highlight=False)


# how ``calibration list`` names each stored time option (measure/calibration.TIME_OPTION_FIELDS)
_OPTION_WORDS = {"peer_link": "link {}", "inter_node_gbs": "{:g} GB/s per GPU between nodes",
                 "compiled": "compiled", "peak_tflops": "{:g} TFLOPS peak", "gemm_efficiency": "GEMM at {:g}"}


def _machine_words(options: dict[str, Any]) -> str:
    """``; link pcie3x8`` for a measurement stored with a stated link, empty for one on the catalog's."""
    words = [_OPTION_WORDS.get(k, k + " {}").format(v) if v is not True else _OPTION_WORDS.get(k, k)
             for k, v in options.items()]
    return "".join("; " + w for w in words)


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
