"""cli/compare_cmd.py: the two quoted flag strings parsed with the shared setup flags (and --gpu), a bad one
named by which side it came from; the command's JSON is plan/compare's."""

from __future__ import annotations

import json

import pytest

from tuneplan.cli.app import run
from tuneplan.cli.compare_cmd import parse_flags
from tuneplan.errors import TuneplanError


def test_parse_flags_reads_setup_fields_and_the_gpu():
    assert parse_flags("--seq 1024 --grad-accum 4 --gpu h100 --method qlora", "a") == {
        "method": "qlora", "seq": 1024, "grad_accum": 4, "gpu": "h100"}
    assert parse_flags("", "b") == {}
    assert parse_flags("--seq '2048'", "b") == {"seq": 2048}  # shell quoting, as a terminal would


@pytest.mark.parametrize("text", ["--seq abc", "--bogus 1", '--seq "unclosed'])
def test_a_bad_flag_string_names_its_side(text):
    with pytest.raises(TuneplanError) as err:
        parse_flags(text, "b")
    assert err.value.field == "b"
    assert "--a" in err.value.accepted and "--b" in err.value.accepted


def test_the_command_compares_the_two_setups(capsys):
    code = run(["compare", "Qwen/Qwen2.5-0.5B", "--gpu", "rtx4090", "--method", "lora",
                "--a", "--seq 512", "--b", "--seq 2048", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["a_fields"] == {"method": "lora", "gpu": "rtx4090", "seq": 512}
    assert out["b_fields"] == {"method": "lora", "gpu": "rtx4090", "seq": 2048}
    # the weights do not depend on the sequence; the difference is what grows with it
    weights = next(c for c in out["components"] if c["component"] == "weights")
    assert weights["delta_bytes"] == 0 and out["delta_bytes"] > 0
    assert [c["flag"] for c in out["causes"]] == ["--seq"]


def test_a_bad_side_exits_2_naming_it(capsys):
    code = run(["compare", "Qwen/Qwen2.5-0.5B", "--a", "--seq abc", "--b", "--seq 1", "--json"])
    err = json.loads(capsys.readouterr().out)["error"]
    assert code == 2 and err["kind"] == "bad_input" and err["field"] == "a"
