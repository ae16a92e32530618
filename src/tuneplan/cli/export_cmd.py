"""`tuneplan export`: write the plan as a runnable recipe (HF script, LLaMA-Factory, DeepSpeed,
accelerate)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tuneplan.cli.from_option import FromFiles, resolve_from
from tuneplan.cli.options import with_setup_options
from tuneplan.cli.wording import cli_texts
from tuneplan.errors import TuneplanError


def register(app: typer.Typer) -> None:
    @app.command("export")
    @with_setup_options
    def export_cmd(
        model: Annotated[str | None, typer.Argument(
            help="catalog name, HF id, or path to config.json (optional with --from)")] = None,
        from_files: FromFiles = None,
        fmt: Annotated[str, typer.Option(
            "--format", "-f",
            help="hf-script | llamafactory | deepspeed | accelerate | fsdp-qlora")] = "hf-script",
        output: Annotated[str | None, typer.Option(
            "--output", "-o",
            help="file to write (companions go beside it), or a folder (ending in / or existing) to write "
                 "the format's own file names into; without it the main file is printed")] = None,
        gpu: Annotated[str | None, typer.Option(
            "--gpu", "-g", help="accelerator the recipe is for (refuses a plan it cannot run)")] = None,
        dataset: Annotated[str | None, typer.Option(
            "--dataset",
            help="dataset the recipe trains on (a file, a Hub id, or a LLaMA-Factory dataset name)")] = None,
        force: Annotated[bool, typer.Option("--force", help="overwrite existing files")] = False,
        as_json: Annotated[bool, typer.Option(
            "--json", help="print one JSON object (files written, notes)")] = False,
        setup_kw: dict[str, Any] | None = None,
    ) -> None:
        """Write the planned fine-tune as a recipe: a runnable HF training script, a LLaMA-Factory YAML, a
        DeepSpeed JSON or an accelerate YAML (plus the DeepSpeed JSON a ZeRO plan points at).

        Never overwrites a file or writes through a symbolic link unless --force (which replaces the link
        itself); all files are written or none. Exit status: 0 written, 2 bad input or a file exists.
        """
        from rich.markup import escape

        from tuneplan.api import estimate
        from tuneplan.catalog.accelerators import resolve_accelerator
        from tuneplan.catalog.models import resolve_model
        from tuneplan.cli.render import console, err_console, print_json
        from tuneplan.export import DEFAULT_NAMES, build_export
        from tuneplan.safe_write import OutFile, write_files
        from tuneplan.specs.setup import TrainSetup

        frm = resolve_from(from_files, model, setup_kw)
        spec = resolve_model(frm.model)
        acc = resolve_accelerator(gpu) if gpu else None
        # every field given (flag or file) is explicit: profile defaults fill only the rest
        sources = frm.base.sources if frm.base is not None else {k: "flag" for k in frm.setup_kw}
        setup = TrainSetup(sources=dict(sources), **frm.setup_kw)
        plan = estimate(spec, setup, gpu=acc, timing=False)  # the recipe quotes its memory and findings
        bundle = build_export(fmt, plan, _main_file(output, DEFAULT_NAMES.get(fmt, "recipe")),
                              dataset=dataset)
        warnings = list(frm.resolved.warnings) if frm.resolved else []
        bundle.notes = cli_texts(bundle.notes)
        if output is None:
            if len(bundle.files) > 1:
                raise TuneplanError(f"this plan needs {len(bundle.files)} files "
                                    f"({', '.join(p.name for p, _ in bundle.files)})", field="output",
                                    accepted="-o PATH (companions are written beside it)")
            if as_json:  # one JSON object: the file's text inside it
                print_json({"format": fmt, "files": [], "name": bundle.files[0][0].name,
                            "text": bundle.files[0][1], "notes": warnings + bundle.notes,
                            "setup": bundle.setup.to_dict()})
                return
            print(bundle.files[0][1], end="")
            for n in warnings + bundle.notes:
                err_console.print(f"[yellow]note:[/] {escape(n)}")
            return
        # all files or none, each atomically; an existing file or a symbolic link only with --force, and
        # then the link itself is replaced (safe_write)
        write_files([OutFile(p, text.encode("utf-8"), executable=p.suffix in (".py", ".sh"))
                     for p, text in bundle.files],
                    force=force, field="output")
        if as_json:
            print_json({"format": fmt, "files": [str(p) for p, _ in bundle.files],
                        "notes": warnings + bundle.notes, "setup": bundle.setup.to_dict()})
            return
        for p, _ in bundle.files:
            console.print(f"wrote {p}")
        for n in warnings + bundle.notes:
            console.print(f"[yellow]note:[/] {escape(n)}")


def _main_file(output: str | None, default_name: str) -> str:
    """The main file's path: ``-o out/`` (a trailing slash) or ``-o`` an existing folder means that folder
    with the format's own file name, ``-o name`` that file; no ``-o``: the default name (printed)."""
    import os

    if output is None:
        return default_name
    if output.endswith(("/", os.sep)) or os.path.isdir(output):
        return os.path.join(output, default_name)
    return output

