"""`tuneplan estimate --json` loads only what it prints: no typer (whose parser builds a pydantic validator
per option), no rich, no numpy, no config readers, planner, web page or simulator. And the command built
with click directly behaves as the typer-built commands do: the same help whichever way it is reached, exit
2 naming the flag for a value of the wrong type, one JSON object with --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parent.parent / "src")
ESTIMATE = ["estimate", "Qwen/Qwen2.5-7B-Instruct", "--method", "qlora", "--rank", "16", "--batch", "1",
            "--seq", "512", "--gpu", "rtx4090", "--json"]
NOT_PRINTED = ("typer", "pydantic", "rich", "numpy", "yaml", "huggingface_hub", "torch", "gradio",
               "tuneplan.plan", "tuneplan.web", "tuneplan.simulate", "tuneplan.ingest", "tuneplan.grid",
               "tuneplan.cli.render", "tuneplan.cli.root")

# A fresh interpreter (this one has loaded everything): the command line as `tuneplan` runs it, then the
# names of the modules it loaded, on stderr.
PROBE = """
import contextlib, io, json, sys
from tuneplan.cli.app import run
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = run(sys.argv[1:])
print(json.dumps({"code": code, "out": out.getvalue(), "modules": sorted(sys.modules)}))
"""


def probe(args: list[str]) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=SRC))
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def loaded(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return [n for n in names if any(m == n or m.startswith(n + ".") for m in modules)]


def test_estimate_json_imports_nothing_it_does_not_print() -> None:
    p = probe(ESTIMATE)
    assert p["code"] == 0
    assert json.loads(p["out"])["fits"] is True  # 7B QLoRA r16 at 512 tokens on a 24 GB card
    assert loaded(p["modules"], NOT_PRINTED) == []


def test_a_typer_command_still_runs_through_typer() -> None:
    # the other commands are typer's: the split must not route them past it
    p = probe(["models", "--json"])
    assert p["code"] == 0 and json.loads(p["out"])
    assert loaded(p["modules"], ("typer", "tuneplan.cli.root")) == ["typer", "tuneplan.cli.root"]


@pytest.mark.parametrize("flag,value,field,accepted", [
    ("--batch", "many", "batch", "an integer"),
    ("--rank", "1e3", "rank", "an integer"),
    ("--price", "cheap", "price", "a number"),
])
def test_a_value_of_the_wrong_type_names_the_flag(flag: str, value: str, field: str, accepted: str) -> None:
    p = probe(["estimate", "qwen2.5-7b", flag, value, "--json"])
    err = json.loads(p["out"])["error"]
    assert p["code"] == 2 and err["kind"] == "bad_input"
    assert err["field"] == field and err["accepted"] == accepted and flag in err["message"]


def test_usage_errors_exit_2_with_the_usage_line(capsys: pytest.CaptureFixture[str]) -> None:
    from tuneplan.cli.app import run

    for args in (["--batch", "many"], ["--bogus"], ["--packing=3"], ["--gpu"]):
        assert run(["estimate", "qwen2.5-7b", *args]) == 2
        err = capsys.readouterr().err
        assert "Error:" in err and "Traceback" not in err
    assert run(["estimate", "qwen2.5-7b", "--batch", "many"]) == 2
    assert "Usage: tuneplan estimate [OPTIONS] [model]" in capsys.readouterr().err


def test_help_is_the_same_from_the_entry_point_and_from_the_typer_app(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from tuneplan.cli.app import app, run

    monkeypatch.setenv("COLUMNS", "80")
    assert run(["estimate", "--help"]) == 0
    direct = capsys.readouterr().out
    via_typer = CliRunner().invoke(app, ["estimate", "--help"], terminal_width=80)
    assert via_typer.exit_code == 0 and via_typer.output == direct
    # every flag of the field table and of the time model is offered, with its help
    from tuneplan.cli.options import setup_flags
    from tuneplan.cli.time_options import TIME_FLAGS

    for f in [*setup_flags(), *TIME_FLAGS]:
        assert all(d.split("/")[0] in direct for d in f.decls), f.name
    assert direct.startswith("Usage: tuneplan estimate [OPTIONS] [model]") and "\nArguments:\n" in direct


def test_switches_given_or_not(capsys: pytest.CaptureFixture[str]) -> None:
    # a switch not given stays unset (the profile decides); --no-x sets it off
    from tuneplan.cli.app import run

    assert run(["estimate", "qwen2.5-0.5b", "--json"]) == 0
    unset = json.loads(capsys.readouterr().out)["setup_sources"]
    assert run(["estimate", "qwen2.5-0.5b", "--no-gradient-checkpointing", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["setup"]["gradient_checkpointing"] is False
    assert d["setup_sources"]["gradient_checkpointing"] == "flag"
    assert unset["gradient_checkpointing"] != "flag"
