"""`tuneplan estimate`: per-GPU peak memory by component, and the verdict on a GPU.

Built with click directly from flag rows (``cli/flags.py``), not from a typer signature: the command a
script runs in a loop starts without typer's per-option validators (``cli/app.CLICK_COMMANDS``).
"""

from __future__ import annotations

from typing import Any

from tuneplan.cli.flags import Flag, click_command
from tuneplan.cli.from_option import FROM_FLAG, resolve_from
from tuneplan.cli.options import setup_flags, take_setup
from tuneplan.cli.time_options import TIME_FLAGS, time_kw_from
from tuneplan.cli.wording import cli_texts

DOC = """Per-GPU peak memory of a fine-tune, by component, and whether it fits the GPU.

Exit status: 0 fits (or no --gpu), 1 does not fit, cannot run there, or runs there only with library
versions that --versions did not confirm, 2 bad input."""
MODEL = ("model", "catalog name, HF id, or path to config.json (optional with --from)")
OWN_FLAGS = [
    Flag("gpu", str, ("-g", "--gpu"), "accelerator, e.g. rtx4090, a100-80gb"),
    Flag("engine", str, ("--engine",), "analytic | simulate", default="analytic", show_default=True),
    Flag("as_json", bool, ("--json",), "print one JSON object", default=False),
    Flag("details", bool, ("--details",), "everything: component descriptions, memory by instant, "
         "uncertainty, all findings, time and cost tables", default=False),
    Flag("hardware_file", str, ("--hardware-file",), "TOML/YAML file adding or overriding accelerators"),
    Flag("versions", str, ("--versions",), "the library versions the run will use, e.g. "
         "bitsandbytes=0.48.1,torch=2.13.0+cu126 (`tuneplan doctor` prints them): known breakages are then "
         "answered for them", metavar="NAME=VER,..."),
]


def command() -> Any:
    """The click command; the options in the order of the help: --from, its own, time and cost, setup."""
    import click

    setup = setup_flags()
    setup_names = [f.name for f in setup]
    time_names = [f.name for f in TIME_FLAGS]

    def callback(**kw: Any) -> None:
        setup_kw = take_setup(kw, setup_names)
        time_kw = time_kw_from({n: kw.pop(n) for n in time_names})
        if estimate(setup_kw=setup_kw, time_kw=time_kw, **kw) is False:
            raise click.exceptions.Exit(1)

    flags = [FROM_FLAG, *OWN_FLAGS, *TIME_FLAGS, *setup]
    return click_command("estimate", callback, doc=DOC, argument=MODEL, flags=flags)


def estimate(model: str | None, from_files: tuple[str, ...], gpu: str | None, engine: str, as_json: bool,
             details: bool, hardware_file: str | None, versions: str | None, setup_kw: dict[str, Any],
             time_kw: dict[str, Any]) -> bool | None:
    """Prints the estimate (one JSON object with ``as_json``); returns whether it fits with nothing left
    to check (None: no GPU)."""
    from tuneplan.api import estimate
    from tuneplan.cli.json_out import print_json

    frm = resolve_from(list(from_files) or None, model, setup_kw)
    if versions is not None:
        from tuneplan.compat import parse_versions

        stated: dict[str, Any] | None = parse_versions(versions)
    else:
        stated = None
    est = estimate(
        frm.model,
        frm.base,
        gpu=gpu,
        engine=engine,
        hardware_file=hardware_file,
        versions=stated,
        **frm.time_kw(time_kw),
        **frm.setup_kw,
    )
    d = cli_texts(frm.annotate(est.to_dict()))  # the core's field references as flags
    if est.verdict == "does_not_fit":  # the planner only for a setup that does not fit: its next step
        from tuneplan.plan.next_step import next_step

        d["next_step"] = next_step(est)
    if as_json:
        print_json(d)
    else:
        from tuneplan.cli.render import render_estimate  # rich: only for the tables

        frm.render(d)
        render_estimate(d, details=details)
    return None if est.verdict is None else est.verdict == "fits"
