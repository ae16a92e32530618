"""Every command reads on an 80-column terminal: each one is rendered in-process at COLUMNS=80 and no line of
what it prints (output and help) is longer than 80 characters."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from tuneplan.cli import render
from tuneplan.cli.app import COMMAND_MODULES, app

WIDTH = 80
MODEL = "Qwen/Qwen2.5-7B-Instruct"
# 8B full fine-tune, ZeRO-3 over 2 nodes of 8: NVLink inside a node, the network between them
MULTI_NODE = ["meta-llama/Llama-3.1-8B", "--gpu", "a100-80gb", "--method", "full",
              "--gpus", "8", "--nodes", "2", "--zero", "3"]

# (arguments, exit statuses that are the command's answer, not a failure)
RUNS: list[tuple[list[str], set[int]]] = [
    (["estimate", MODEL], {0}),
    (["estimate", MODEL, "--gpu", "rtx4090", "--method", "qlora"], {0}),
    (["estimate", MODEL, "--gpu", "v100-sxm2-32gb", "--method", "qlora", "--details"], {1}),
    (["estimate", *MULTI_NODE, "--samples", "10000", "--details"], {0}),
    (["estimate", "meta-llama/Llama-2-70b-hf", "--gpu", "rtx4090", "--method", "full"], {1}),
    (["fit", MODEL, "--gpu", "rtx4090"], {0, 1}),
    (["gpus", MODEL, "--method", "qlora"], {0, 1}),
    (["max-model", "--gpu", "v100-sxm2-32gb", "--method", "lora"], {0, 1}),
    (["sweep", MODEL, "--gpu", "rtx4090", "--vary", "seq=512..4096"], {0}),
    (["fit", MODEL, "--gpu", "rtx4090", "--details"], {0, 1}),
    (["fit", *MULTI_NODE, "--details"], {0, 1}),  # the per-strategy table: 10 strategies x 5 methods
    (["gpus", MODEL, "--only", "rtx-pro-6000-blackwell-workstation-edition,rtx4090,a100-80gb", "--samples",
      "10000", "--details"], {0, 1}),
    (["max-model", "--gpu", "a100-80gb", "--method", "full", "--auto", "--details"], {0, 1}),
    (["sweep", MODEL, "--gpu", "rtx4090", "--vary", "seq=512..65536", "--samples", "1000", "--details"], {0}),
    (["compare", MODEL, "--gpu", "rtx4090", "--a", "--seq 512", "--b", "--seq 2048 --grad-accum 4"], {0}),
    (["compare", MODEL, "--gpu", "rtx4090", "--method", "lora",
      "--a", "--seq 512 --gradient-checkpointing --optimizer adamw-8bit",
      "--b", "--seq 4096 --batch 4 --method qlora --gpu a100-80gb"], {0}),
    (["table"], {0}),
    (["models"], {0}),
    (["accelerators"], {0}),
    (["accelerators", "--details"], {0}),
    (["accelerators", "a100"], {0}),
    (["deploy", MODEL, "--gpu", "rtx4090"], {0, 1}),
    (["doctor", "--no-import-check"], {0, 1}),
    (["calibration", "list"], {0}),
    (["--help"], {0}),
]
COMMANDS = [
    "estimate",
    "models",
    "table",
    "fit",
    "gpus",
    "max-model",
    "sweep",
    "compare",
    "measure",
    "simulate",
    "deploy",
    "export",
    "serve",
    "doctor",
    "accelerators",
    "calibration",
]


@pytest.fixture()
def narrow(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    monkeypatch.setattr(render.console, "width", WIDTH)
    monkeypatch.setattr(render.err_console, "width", WIDTH)
    return CliRunner()


def _long_lines(text: str) -> list[str]:
    """Lines over 80 columns, and lines where a table had to cut a cell ("…") to stay within them."""
    return [line for line in text.splitlines() if len(line) > WIDTH or "…" in line]


@pytest.mark.parametrize("args,ok", RUNS)
def test_output_fits_80_columns(narrow: CliRunner, args: list[str], ok: set[int]) -> None:
    r = narrow.invoke(app, args, terminal_width=WIDTH)
    assert r.exit_code in ok, (r.exit_code, r.output[-2000:], r.exception)
    assert r.output.strip(), "printed nothing"
    assert _long_lines(r.output) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_80_columns_and_every_flag_is_described(narrow: CliRunner, command: str) -> None:
    r = narrow.invoke(app, [command, "--help"], terminal_width=WIDTH)
    assert r.exit_code == 0, r.output
    assert _long_lines(r.output) == []
    assert "<bool>" not in r.output and "…" not in r.output
    cmd = typer.main.get_command(app).get_command(None, command)  # type: ignore[attr-defined]  (lazy group)
    for p in cmd.params:
        if p.param_type_name == "option":
            assert (p.help or "").strip(), f"{command} {p.opts[0]} has no help text"
            for name in [] if p.hidden else p.opts + p.secondary_opts:  # hidden: measure --torch-era
                assert name in r.output, f"{command}: {name} missing or cut in --help"


def test_every_registered_command_is_checked() -> None:
    assert set(typer.main.get_command(app).list_commands(None)) == set(COMMANDS), COMMAND_MODULES  # type: ignore[attr-defined]


def test_the_version_flag(narrow: CliRunner) -> None:
    from importlib.metadata import version

    r = narrow.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"tuneplan {version('tuneplan')}"


def test_doctor_shows_the_extra_in_brackets(narrow: CliRunner) -> None:
    # rich would read "[detect]" as markup and print pip install 'tuneplan'
    r = narrow.invoke(app, ["doctor", "--no-import-check", "--json"])
    notes = json.loads(r.stdout)["machine"].get("notes", [])
    plain = narrow.invoke(app, ["doctor", "--no-import-check"]).output
    for n in notes:
        if "[" in n:
            assert n.split("(")[0].strip() in plain and "[detect]" in plain


def test_no_deploy_hint_when_the_plan_does_not_fit(narrow: CliRunner) -> None:
    r = narrow.invoke(
        app, ["estimate", "meta-llama/Llama-2-70b-hf", "--gpu", "rtx4090", "--method", "full", "--details"]
    )
    assert r.exit_code == 1 and "DOES NOT FIT" in r.output and "tuneplan deploy" not in r.output
    r = narrow.invoke(app, ["estimate", MODEL, "--gpu", "rtx4090", "--method", "qlora", "--details"])
    assert r.exit_code == 0 and "tuneplan deploy" in r.output


def test_default_estimate_fits_one_screen(narrow: CliRunner) -> None:
    r = narrow.invoke(app, ["estimate", MODEL, "--gpu", "v100-sxm2-32gb", "--method", "qlora"])
    lines = r.output.splitlines()
    assert len(lines) <= 40, len(lines)
    assert lines[0].startswith("RUNS ONLY WITH bitsandbytes") and "GiB headroom" in lines[1]
    assert any(line.startswith("Time ") for line in lines)
    # the details are one flag away
    full = narrow.invoke(app, ["estimate", MODEL, "--gpu", "v100-sxm2-32gb", "--method", "qlora",
                               "--details"]).output
    assert len(full.splitlines()) > len(lines) and "allocated by instant" in full


def test_link_speeds_shown_and_the_flag_they_name_exists(narrow: CliRunner) -> None:
    args = ["estimate", *MULTI_NODE, "--details"]
    r = narrow.invoke(app, args)
    assert "link intra-node: NVLink" in r.output and "--inter-node-gbs" in r.output
    assert "inter_node_gbs" not in r.output
    # 50 GB/s per GPU x 0.9 network efficiency (estimator/links.py) = 45 GB/s
    faster = narrow.invoke(app, [*args, "--inter-node-gbs", "50"])
    assert "45 GB/s per GPU" in faster.output.replace("\n", " ")
    bad = narrow.invoke(app, [*args, "--inter-node-gbs", "0"])
    assert bad.exit_code != 0


def test_lora_flags_with_full_fine_tuning_warn(narrow: CliRunner) -> None:
    r = narrow.invoke(app, ["estimate", MODEL, "--method", "full", "--rank", "64", "--json"])
    assert r.exit_code == 0
    assert "--rank only applies to --method lora or qlora" in r.output.replace("\n", " ")


def test_accelerators_keeps_every_column_at_80(narrow: CliRunner) -> None:
    # a no_wrap column would be cropped at the edge without an ellipsis: the last header must be whole
    header = narrow.invoke(app, ["accelerators"]).output.splitlines()[1]
    assert header.split() == ["id", "GiB", "GB/s", "bf16", "TF", "arch", "bf16", "fp8", "link", "$/h"]
