"""`compare`: two setups side by side, and the difference attributed to each changed flag."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tuneplan.api import estimate
from tuneplan.errors import TuneplanError
from tuneplan.plan.compare import compare

M = "Qwen/Qwen2.5-7B"


def peak(**kw) -> int:
    return estimate(M, timing=False, **kw).breakdown.device_peak_bytes


def test_the_seq_and_accumulation_question_names_the_sequence() -> None:
    # the user changed cutoff_len and gradient accumulation together and memory jumped: which one did it?
    c = compare(M, {"method": "lora", "gpu": "rtx4090"}, {"seq": 1024, "grad_accum": 1},
                {"seq": 2048, "grad_accum": 4})
    d = c.to_dict()
    a, b = peak(method="lora", seq=1024, grad_accum=1), peak(method="lora", seq=2048, grad_accum=4)
    assert d["delta_bytes"] == b - a
    by = {x["flag"]: x for x in d["causes"]}
    assert set(by) == {"--seq", "--grad-accum"}
    assert by["--seq"]["delta_bytes"] == peak(method="lora", seq=2048, grad_accum=1) - a
    assert by["--grad-accum"]["delta_bytes"] == peak(method="lora", seq=1024, grad_accum=4) - a
    assert by["--seq"]["delta_bytes"] > 10 * abs(by["--grad-accum"]["delta_bytes"])  # the sequence did it
    assert d["interaction_bytes"] == d["delta_bytes"] - sum(x["delta_bytes"] for x in d["causes"])
    assert {"a", "b", "delta_bytes", "causes"} <= set(d)
    rows = {r["component"]: r for r in d["components"]}
    assert rows["device peak"]["delta_bytes"] == d["delta_bytes"]
    assert rows["activations"]["delta_bytes"] > 0


def test_a_change_refused_alone_says_why() -> None:
    d = compare(M, {"method": "full"}, {}, {"zero": 3, "gpus": 2}).to_dict()
    by = {x["flag"]: x for x in d["causes"]}
    assert by["--zero"]["delta_bytes"] is None and "zero" in by["--zero"]["error"]
    assert by["--gpus"]["delta_bytes"] == peak(method="full", gpus=2) - peak(method="full")
    assert d["interaction_bytes"] is None


def test_bad_input_names_the_field_and_cli_json() -> None:
    with pytest.raises(TuneplanError):
        compare(M, {}, {"method": "sft"}, {})
    p = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "compare", M, "--method", "lora",
                        "--a", "--seq 512", "--b", "--seq 1024 --grad-accum 2", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert [c["flag"] for c in d["causes"]] == ["--seq", "--grad-accum"]
    p = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "compare", M, "--a", "--seq x", "--b", ""],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "a: " in p.stderr and "Traceback" not in p.stderr
