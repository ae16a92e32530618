"""`tuneplan estimate`: per-GPU peak memory by component, and the verdict on a GPU."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tuneplan.cli.from_option import FromFiles, resolve_from
from tuneplan.cli.options import with_setup_options
from tuneplan.cli.time_options import with_time_options


def register(app: typer.Typer) -> None:
    @app.command("estimate")
    @with_setup_options
    @with_time_options
    def estimate_cmd(
        model: Annotated[
            str | None,
            typer.Argument(help="catalog name, HF id, or path to config.json (optional with --from)"),
        ] = None,
        from_files: FromFiles = None,
        gpu: Annotated[
            str | None, typer.Option("--gpu", "-g", help="accelerator, e.g. rtx4090, a100-80gb")
        ] = None,
        engine: Annotated[str, typer.Option("--engine", help="analytic | simulate")] = "analytic",
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
        details: Annotated[
            bool,
            typer.Option(
                "--details",
                help="everything: component descriptions, memory by "
                "instant, uncertainty, all findings, time and cost tables",
            ),
        ] = False,
        hardware_file: Annotated[
            str | None,
            typer.Option("--hardware-file", help="TOML/YAML file adding or overriding accelerators"),
        ] = None,
        setup_kw: dict[str, Any] | None = None,
        time_kw: dict[str, Any] | None = None,
    ) -> None:
        """Per-GPU peak memory of a fine-tune, by component, and whether it fits the GPU.

        Exit status: 0 fits (or no --gpu), 1 does not fit or cannot run there, 2 bad input.
        """
        from tuneplan.api import estimate
        from tuneplan.cli.json_out import print_json

        frm = resolve_from(from_files, model, setup_kw)
        est = estimate(
            frm.model,
            frm.base,
            gpu=gpu,
            engine=engine,
            hardware_file=hardware_file,
            **frm.time_kw(time_kw),
            **frm.setup_kw,
        )
        d = frm.annotate(est.to_dict())
        if as_json:
            print_json(d)
        else:
            from tuneplan.cli.render import render_estimate  # rich: only for the tables

            frm.render(d)
            render_estimate(d, details=details)
        if est.fits is False:
            raise typer.Exit(1)
