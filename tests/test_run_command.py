"""The `run:` line a plan prints is the plan: re-running it through `tuneplan estimate` resolves to the chosen
setup field by field and reproduces its device peak exactly."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest


def rerun(line: str) -> dict[str, Any]:
    """The `tuneplan estimate` line, parsed by the shell's rules and run in this process with --json."""
    from click.testing import CliRunner

    from tuneplan.cli.estimate_cmd import command

    words = shlex.split(line, comments=True)
    assert words[:2] == ["tuneplan", "estimate"], line
    res = CliRunner().invoke(command(), [*words[2:], "--json"], catch_exceptions=False)
    assert res.exit_code in (0, 1), res.output  # 1: does not fit, still a full report
    out: dict[str, Any] = json.loads(res.output)
    return out


def assert_reproduces(line: str, setup: dict[str, Any], peak: int) -> None:
    got = rerun(line)
    diff = {k: (v, got["setup"].get(k)) for k, v in setup.items() if got["setup"].get(k) != v}
    assert not diff, f"{line}: fields (plan, re-run) {diff}"
    assert got["per_gpu"]["device_peak_bytes"] == peak, line


def test_fit_command_keeps_checkpointing_off() -> None:
    """The reported case: QLoRA on a B200 at the lowest cost runs without checkpointing, where the hf
    profile's QLoRA default turns it on; the line must say --no-gradient-checkpointing."""
    from tuneplan.plan import fit

    rec = fit("Qwen/Qwen2.5-72B-Instruct", "b200", prefer="cost").to_dict()["recommended"]
    assert rec["setup"]["gradient_checkpointing"] is False
    assert "--no-gradient-checkpointing" in shlex.split(rec["command"])
    assert_reproduces(rec["command"], rec["setup"], rec["device_peak_bytes"])


def test_command_writes_fields_without_a_flag_as_a_comment() -> None:
    """A field only training files can set (a DeepSpeed bucket) cannot be a flag: the line says so."""
    from tuneplan.api import build_setup
    from tuneplan.catalog.accelerators import resolve_accelerator
    from tuneplan.catalog.models import resolve_model
    from tuneplan.plan.recommend import setup_command

    model, gpu = resolve_model("Qwen/Qwen2.5-0.5B"), resolve_accelerator("a100-80gb")
    s = build_setup(model, None, accelerator=gpu, method="full", gpus=2, zero=2, ds_reduce_bucket=10**7)
    line = setup_command(model, gpu, s)
    assert line.split("#")[1].strip() == "also, from the training files: ds_reduce_bucket=10000000"
    assert {"--zero", "2", "--gpus"} <= set(shlex.split(line, comments=True))


def test_command_carries_the_dataset_for_the_same_totals() -> None:
    from tuneplan.plan import fit
    from tuneplan.specs.dataset import DatasetSpec

    ds = DatasetSpec(samples=20000, avg_tokens=300.5, epochs=2.0).validate()
    rec = fit("Qwen/Qwen2.5-0.5B", "rtx4090", dataset=ds).to_dict()["recommended"]
    from tuneplan.api import estimate

    got = rerun(rec["command"])
    same = estimate("Qwen/Qwen2.5-0.5B", gpu="rtx4090", dataset=ds, **rec["setup"]).to_dict()
    assert got["time"]["total_hours"] == pytest.approx(same["time"]["total_hours"], rel=1e-12)
    assert got["time"]["tokens_per_second"] == pytest.approx(rec["tokens_per_second"], rel=1e-12)


def test_fit_labels_its_hours_as_the_band_upper_end_and_the_run_line_is_central() -> None:
    """With the default safety margin fit plans on the time band's upper end; the `run:` line's
    estimate prints the central hours. The text names both, so they are not read as a contradiction."""
    from typer.testing import CliRunner

    from tuneplan.cli.root import app

    args = ["fit", "Qwen/Qwen2.5-0.5B", "--gpu", "rtx4090", "--samples", "20000", "--avg-tokens", "300"]
    rec = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)["recommended"]
    got = rerun(rec["command"])
    central, band = got["time"]["total_hours"], got["time"]["band"]
    assert rec["hours_basis"] == "time band upper end"
    assert rec["central_hours"] == pytest.approx(central, rel=1e-12)
    assert rec["total_hours"] == pytest.approx(band["total_hours_high"], rel=1e-9)
    text = " ".join(CliRunner().invoke(app, args, env={"COLUMNS": "200"}).stdout.split())
    assert (f"plan for {rec['total_hours']:,.3g} h" in text and "upper end of the time band" in text
            and f"central {central:,.3g} h" in text)


# A sample of plans: sizes from 0.5 B to 72 B, dense and MoE, one to many cards, each objective, a pinned
# method, another framework profile.
FIT_SAMPLE = [
    ("Qwen/Qwen2.5-0.5B", "rtx4090", "quality", {}),
    ("Qwen/Qwen2.5-7B", "rtx4090", "speed", {}),
    ("Qwen/Qwen2.5-7B", "a100-80gb", "cost", {"seq": 2048}),
    ("Qwen/Qwen2.5-72B-Instruct", "b200", "cost", {}),
    ("Qwen/Qwen2.5-72B-Instruct", "h100-80gb", "quality", {"gpus": 8}),
    ("Qwen/Qwen2-57B-A14B", "a100-80gb", "speed", {"gpus": 4}),
    ("01-ai/Yi-1.5-6B", "v100-sxm2-32gb", "quality", {}),
    ("Qwen/Qwen2.5-14B", "l4", "cost", {"method": "qlora"}),
    ("Qwen/Qwen2.5-3B", "rtx3090", "speed", {"framework": "llamafactory"}),
    ("EleutherAI/pythia-6.9b", "a10g", "quality", {}),
    ("mistralai/Mixtral-8x7B-v0.1", "h100-80gb", "cost", {"gpus": 2}),
    ("google/gemma-2-9b", "rtx4090", "quality", {"framework": "unsloth"}),
    ("microsoft/Phi-3-mini-4k-instruct", "a100-80gb", "speed", {"framework": "torchtune"}),
]


@pytest.mark.parametrize(("model", "gpu", "prefer", "setup"), FIT_SAMPLE)
def test_fit_run_lines_reproduce_the_plan(model: str, gpu: str, prefer: str, setup: dict[str, Any]) -> None:
    from tuneplan.plan import fit

    d = fit(model, gpu, prefer=prefer, **setup).to_dict()
    rec = d["recommended"]
    assert rec is not None, (model, gpu)
    assert_reproduces(rec["command"], rec["setup"], rec["device_peak_bytes"])


@pytest.mark.parametrize("model", ["Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-72B-Instruct"])
def test_gpus_setups_reproduce_through_their_line(model: str) -> None:
    """`gpus` shows each card's chosen setup; its line (the same generator) re-runs to its peak."""
    from tuneplan.catalog.accelerators import resolve_accelerator
    from tuneplan.catalog.models import resolve_model
    from tuneplan.plan import rank_gpus
    from tuneplan.plan.recommend import setup_command
    from tuneplan.specs.setup import TrainSetup

    spec = resolve_model(model)
    rows = rank_gpus(model, only=["rtx4090", "a100-80gb", "h100-80gb", "mi300x"]).to_dict()["ranking"]
    fitting = [r for r in rows if r["fits"]]
    assert fitting
    for r in fitting:
        line = setup_command(spec, resolve_accelerator(r["gpu"]), TrainSetup(**r["setup"]))
        assert_reproduces(line, r["setup"], r["per_gpu_peak_bytes"])
