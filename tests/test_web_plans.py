"""The planner tabs' callbacks (fit, GPU ranking, deploy, export, time and cost), without a browser.

Each tab must show what the planner function returned (the same function as its CLI command).
"""

from __future__ import annotations

import importlib
import re

import pytest

from tuneplan.plan.timecost import make_dataset
from tuneplan.web import callbacks, plans
from tuneplan.web.form import DEFAULTS, parse, setup_kwargs

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
# What `tuneplan fit MODEL --gpu G --rank 16 --seq 512 --samples 10000` passes for the form's defaults,
# written out by hand: no strategy, offload or framework pinned (the form's 0 / off / none / hf are the
# CLI's defaults), the sizes left to the planner.
CLI_EQUIVALENT = {"rank": DEFAULTS["rank"], "seq": DEFAULTS["seq"], "gpus": 1, "nodes": 1,
                  "dataset": make_dataset(samples=DEFAULTS["samples"], epochs=DEFAULTS["epochs"])}


def test_tabs_wait_for_valid_input() -> None:
    bad = {**DEFAULTS, "rank": 0}
    for html in (plans.fit_view(bad), plans.gpus_view(bad), plans.deploy_view(bad)):
        assert "Fix the input first" in html and "setup" in html
    assert "Choose a GPU" in plans.fit_view({**DEFAULTS, "gpu": ""})


def test_fit_tab_shows_the_planners_recommendation() -> None:
    # part of the package: a failed import fails the test
    fit_mod = importlib.import_module("tuneplan.plan.fit")
    values = dict(DEFAULTS)
    rep = fit_mod.fit(values["model"], values["gpu"], global_batch=16, **CLI_EQUIVALENT).to_dict()
    html = plans.fit_view(values, 16)
    rec = rep["recommended"]
    assert rec is not None
    assert (f"<b>Recommended{' (tight' if rec['tight'] else ''}" in html
            and f"{rec['method']} ({rec['strategy']}), micro-batch {rec['micro_batch']} " in html)
    # header + one row per method, then the limits: header + one row per method that fits
    assert html.count("<tr>") == 2 + len(rep["methods"]) + sum(m["fits"] for m in rep["methods"])
    assert rep["rule"] in html.replace("&#x27;", "'")
    assert "global_batch" in plans.fit_view(values, 0)  # its own field is validated like the others


def test_gpus_tab_lists_the_planners_ranking_in_order() -> None:
    gpus_mod = importlib.import_module("tuneplan.plan.gpus")
    values = {**DEFAULTS, "model": "Qwen/Qwen2.5-0.5B"}
    kw = {k: v for k, v in setup_kwargs(values).items() if k not in ("gpus", "nodes")}
    kw.update(callbacks.dataset_kwargs(parse(values)))  # the form's dataset: time and cost break ties
    ranking = gpus_mod.rank_gpus(values["model"], **kw).to_dict()["ranking"]
    html = plans.gpus_view(values)
    names = re.findall(r'<tr><td style="[^"]*">([^<]*)</td>', html)
    assert names[:5] == [r["name"] for r in ranking[:5]]


def test_deploy_tab_shows_the_deploy_plan() -> None:
    dep = pytest.importorskip("tuneplan.deploy.plan", reason="the deploy plan is not in this build")
    kw = {k: v for k, v in setup_kwargs(dict(DEFAULTS)).items()
          if k not in ("gpus", "nodes", "zero", "fsdp", "offload")}
    d = dep.plan_deploy(DEFAULTS["model"], gpu=DEFAULTS["gpu"], context=4096, concurrency=1, cards=False,
                        **kw)
    html = plans.deploy_view(dict(DEFAULTS), "bf16", 4096, 1)
    verdict = "SERVES" if d["gpu"]["fits"] else "DOES NOT SERVE"
    assert f'data-verdict="{verdict}"' in html
    assert f"{d['per_gpu']['total'] / 2**30:,.2f} of {d['gpu']['budget_bytes'] / 2**30:,.2f} GiB" in html
    assert "context" in plans.deploy_view(dict(DEFAULTS), "bf16", -5, 1)


def test_export_writes_the_exporters_files() -> None:
    exp = pytest.importorskip("tuneplan.export", reason="the recipe export is not in this build")
    from tuneplan.api import build_setup, estimate
    from tuneplan.web.form import read_model

    values = {**DEFAULTS, "method": "lora", "gpus": 2, "zero": "2", "gpu": "a100-80gb-sxm4"}
    paths, msg = plans.export_files(values, ["hf-script"])
    assert "file(s)" in msg and len(paths) >= 2  # the script and the ZeRO-2 DeepSpeed JSON it points at
    spec, _ = read_model(values["model"], "")
    setup = build_setup(spec, None, **setup_kwargs(values))
    from pathlib import Path

    from tuneplan.catalog.accelerators import resolve_accelerator

    plan = estimate(spec, setup, gpu=resolve_accelerator("a100-80gb-sxm4"))
    bundle = exp.build_export("hf-script", plan, Path(paths[0]))
    for (p, text), written in zip(bundle.files, paths, strict=True):
        assert Path(written).name == Path(p).name
        assert Path(written).read_text(encoding="utf-8") == text
    assert plans.export_files(values, [])[0] == []
    assert "format" in plans.export_files(values, ["nope"])[1]


def test_time_and_cost_show_the_time_models_figures() -> None:
    import inspect

    from tuneplan.api import estimate

    if "dataset" not in inspect.signature(estimate).parameters:
        assert "not in this build" in callbacks.estimate_view(dict(DEFAULTS))["time"]
        return
    d = callbacks.estimate_dict(dict(DEFAULTS))
    out = callbacks.estimate_view(dict(DEFAULTS))
    assert f"<b>{d['time']['total_hours']:,.2f} h</b>" in out["time"]
    assert f"${d['cost']['cloud_usd']:,.2f}" in out["verdict"]
    # Twice the samples, twice the tokens to compute: the time model's hours follow the form's field.
    d2 = callbacks.estimate_dict({**DEFAULTS, "samples": 2 * DEFAULTS["samples"]})
    assert d2["time"]["total_hours"] == pytest.approx(2 * d["time"]["total_hours"], rel=1e-6)
    assert "Choose a GPU" in callbacks.estimate_view({**DEFAULTS, "gpu": ""})["time"]


def test_fit_tab_objective_is_the_clis() -> None:
    fit_mod = importlib.import_module("tuneplan.plan.fit")
    rule = importlib.import_module("tuneplan.plan.rule")
    assert plans.PREFERS == rule.PREFERS
    values = dict(DEFAULTS)
    rec = fit_mod.fit(values["model"], values["gpu"], global_batch=16, prefer="speed",
                      **CLI_EQUIVALENT).recommended
    html = plans.fit_view(values, 16, "speed")
    assert f"{rec['method']} ({rec['strategy']}), micro-batch {rec['micro_batch']} " in html
    assert "the most tokens/s" in html


def test_the_page_never_takes_the_servers_machine_for_the_users(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server with the asked card and 3 TiB of RAM: `fit` on that server counts its RAM ("this
    machine"), the page does not (the user's machine is elsewhere): it states the default, max(64 GiB,
    2 x the card's memory), as for any machine without the card."""
    host = importlib.import_module("tuneplan.plan.host")
    fit_mod = importlib.import_module("tuneplan.plan.fit")
    values = {**DEFAULTS, "gpu": "GeForce RTX 3060 12 GB"}
    card = importlib.import_module("tuneplan.catalog.accelerators").resolve_accelerator(values["gpu"])
    assert host.cloud_host(card.id) is None  # no cloud instance row: the default applies
    monkeypatch.setattr(host, "this_machine", lambda: host.Machine((card.id,), 3 * 2**40))
    here = fit_mod.fit(values["model"], values["gpu"], global_batch=16, **CLI_EQUIVALENT).to_dict()
    assert here["host_memory"]["source"] == "this machine" and here["host_memory_bytes"] == 3 * 2**40
    html = plans.fit_view(values, 16)
    assert "host memory 64.00 GiB per node (assumed)" in html  # 2 x 12 GiB < 64 GiB
    assert "this machine" not in html


def test_fit_tab_names_another_framework_when_the_forms_has_no_plan() -> None:
    """As `fit`: when nothing fits with the form's framework profile, the answer says whose it is."""
    fit_mod = importlib.import_module("tuneplan.plan.fit")
    values = {**DEFAULTS, "model": "Qwen/Qwen2.5-7B", "gpu": "GeForce RTX 4060", "seq": 4096}
    rep = fit_mod.fit(values["model"], values["gpu"], global_batch=16,
                      **{**CLI_EQUIVALENT, "seq": 4096}).to_dict()
    fw = rep["framework"]
    assert fw["default"] == "hf" and fw["chosen"] not in (None, "hf") and rep["recommended"] is not None
    html = plans.fit_view(values, 16)
    assert f"<b>Framework profile {fw['chosen']}</b>: nothing fits with hf, the form's" in html


def test_fit_tab_shows_the_next_step_when_nothing_fits() -> None:
    """As `fit`: nothing fits, so the page names the closest setup, what it is short of, and the change
    that makes it fit (here host memory, which the page has no field for: it says the CLI's flag)."""
    fit_mod = importlib.import_module("tuneplan.plan.fit")
    values = {**DEFAULTS, "model": "meta-llama/Llama-3.1-405B-Instruct", "gpu": "GeForce RTX 4090"}
    rep = fit_mod.fit(values["model"], values["gpu"], global_batch=16, **CLI_EQUIVALENT).to_dict()
    step = rep["next_step"]
    assert rep["recommended"] is None and step["short_of"] == "host"
    assert step["change"]["field"] == "host_memory"
    html = plans.fit_view(values, 16)
    short = step["short_by_bytes"] / 2**30
    assert (f"closest: host memory short by {short:.2f} GiB for {step['method']} ({step['strategy']})"
            in html)
    assert (f"next step: {step['change']['to']} GiB of host memory per node (the page assumes "
            f"{rep['host_memory_bytes'] / 2**30:.2f} GiB; the CLI's --host-memory sets it)") in html
