"""cli/deploy_cmd.py: `tuneplan deploy` prints plan_deploy's answer as it is, exits 1 when the model does
not fit the --gpu, and 2 on bad input naming the flag."""

from __future__ import annotations

import json

from tuneplan.cli.app import run
from tuneplan.deploy import plan_deploy


def cli_json(capsys, *args: str) -> tuple[int, dict]:
    code = run(["deploy", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_json_is_plan_deploys(capsys):
    code, out = cli_json(capsys, "Qwen/Qwen2.5-0.5B", "--serve-precision", "int4", "--context", "8192",
                         "--concurrency", "4", "--method", "lora")
    assert code == 0
    expected = plan_deploy("Qwen/Qwen2.5-0.5B", serve_precision="int4", context=8192, concurrency=4,
                           method="lora")
    assert out == json.loads(json.dumps(expected, default=str))


def test_a_model_too_large_for_the_card_exits_1(capsys):
    # Llama-2-70B in bf16: ~138 GB of weights alone, far over a 24 GB card
    code, out = cli_json(capsys, "meta-llama/Llama-2-70b-hf", "--gpu", "rtx4090")
    assert code == 1 and out["gpu"]["fits"] is False


def test_a_small_model_that_fits_exits_0(capsys):
    code, out = cli_json(capsys, "Qwen/Qwen2.5-0.5B", "--gpu", "h100")
    assert code == 0 and out["gpu"]["fits"] is True


def test_bad_serving_precision_exits_2_naming_the_field(capsys):
    code, out = cli_json(capsys, "Qwen/Qwen2.5-0.5B", "--serve-precision", "int3")
    err = out["error"]
    assert code == 2 and err["kind"] == "bad_input"
    assert "int4" in err["accepted"] and "serve" in err["field"]
