"""The core names setup fields, never a CLI flag: its findings, notes and assumptions refer to a field as
``{field}`` / ``{field=value}`` (tuneplan.errors), and each face words them: the CLI as flags, the web page
as its labels, the page's JSON API as field names."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import click
import tomllib
import typer

import tuneplan
from tuneplan.api import estimate
from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.catalog.models import resolve_model
from tuneplan.cli.wording import flag_words
from tuneplan.errors import plain_words, word_texts
from tuneplan.specs.setup import TrainSetup

SRC = Path(tuneplan.__file__).parent

# Modules whose strings are other programs' command lines or a face's own words, each with its reason.
OTHER_PROGRAMS = {
    "export/common.py": "torchrun's command line",
    "export/hf_script.py": "the exported train.py's own flags (--dataset, --max-steps)",
    "export/fsdp_qlora.py": "Answer.AI's train.py flags",
    "export/train_script.py": "the template of the exported script (its argparse flags)",
    "doctor/system.py": "nvidia-smi's command line",
    "doctor/machine.py": "doctor runs on the CLI only: it names its own `doctor --json` output",
    "doctor/report.py": "doctor runs on the CLI only: how to plan for another machine from there",
}
FACES = ("cli/", "web/")
PLANNER = "plan/"  # the planner's strings are its own change (its setup changes worded by each face)


def tuneplan_flags() -> set[str]:
    """Every long option of every tuneplan command, from click itself."""
    from tuneplan.cli.root import app

    group = typer.main.get_command(app)
    ctx = click.Context(group)
    flags = set()
    for name in group.list_commands(ctx):
        for param in getattr(group.get_command(ctx, name), "params", []):
            flags.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("--"))
    return flags


def _strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module that are not docstrings nor a field row's flag column."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
        if isinstance(node, ast.keyword) and node.arg == "flag":  # specs/fields: the CLI names themselves
            skip.update(id(n) for n in ast.walk(node.value))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip]


def test_no_core_string_names_a_cli_flag() -> None:
    flags = tuneplan_flags()
    assert {"--price", "--samples", "--precision", "--gpus", "--hardware-file"} <= flags
    pattern = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(FACES) or rel.startswith(PLANNER) or rel in OTHER_PROGRAMS:
            continue
        for line, text in _strings(path):
            named = set(pattern.findall(text)) & flags
            if named:
                found.append(f"{rel}:{line}: {sorted(named)} in {text[:70]!r}")
    assert not found, "\n".join(found)


def test_no_compatibility_rule_names_a_cli_flag() -> None:
    flags = tuneplan_flags()
    pattern = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
    rules = tomllib.loads((SRC / "catalog" / "compat_rules.toml").read_text(encoding="utf-8"))["rule"]
    found = [f"{r['code']}.{k}: {sorted(set(pattern.findall(v)) & flags)}"
             for r in rules for k, v in r.items() if isinstance(v, str) and set(pattern.findall(v)) & flags]
    found += [f"{r['code']}.params.{k}" for r in rules for k, v in r.get("params", {}).items()
              if isinstance(v, str) and set(pattern.findall(v)) & flags]
    assert not found, "\n".join(found)


def test_a_finding_is_worded_by_each_face() -> None:
    """bf16 on a V100 (CC 7.0, no bf16): the rule's fix names the precision to use."""
    setup = TrainSetup(precision="bf16", sources={"precision": "flag"})
    card = resolve_accelerator("v100-32gb")
    est = estimate(resolve_model("Qwen/Qwen2.5-0.5B"), setup, gpu=card, timing=False)
    fixes = [f.fix for f in est.findings if "{precision=fp16-mixed}" in f.fix]
    assert fixes, [f.fix for f in est.findings]
    from tuneplan.web.wording import page_words

    d = est.to_dict()
    cli, page, api = (word_texts(d, w) for w in (flag_words, page_words, plain_words))
    for worded, text in ((cli, "use --precision fp16-mixed"), (page, "use “Precision” set to fp16-mixed"),
                         (api, "use precision=fp16-mixed")):
        assert any(f["fix"].startswith(text) for f in worded["findings"]), worded["findings"]
        assert "{precision" not in json.dumps(worded)
    assert cli["setup"] == d["setup"] and cli["model"] == d["model"]  # what the user gave, as given


def test_word_texts_keeps_what_the_user_gave() -> None:
    result = {"model": {"name": "/data/{seq}/model"}, "notes": ["no {avg_tokens}: fills {seq=512}"],
              "time": {"unknown": ("pass {price}",)}, "steps": 3}
    out = word_texts(result, flag_words)
    assert out == {"model": {"name": "/data/{seq}/model"}, "notes": ["no --avg-tokens: fills --seq 512"],
                   "time": {"unknown": ("pass --price",)}, "steps": 3}


def test_the_cli_prints_flags_for_the_cores_references() -> None:
    line = ["estimate", "Qwen/Qwen2.5-0.5B", "--gpu", "v100-32gb", "--precision", "bf16", "--json"]
    out = subprocess.run([sys.executable, "-m", "tuneplan", *line], capture_output=True, text=True)
    d = json.loads(out.stdout)
    hours = "no dataset size: give --samples (and --avg-tokens) or --dataset-tokens for hours"
    assert hours in d["time"]["unknown"]
    assert any(f["fix"].startswith("use --precision fp16-mixed") for f in d["findings"])
    assert not re.search(r"\{[a-z_]+(=[^{}]*)?\}", json.dumps({k: v for k, v in d.items() if k != "setup"}))
