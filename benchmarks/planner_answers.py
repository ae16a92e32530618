"""The planner's answers over a fixed set of commands, to show a speed change leaves every answer alone.

    python benchmarks/planner_answers.py record DIR     # one JSON file per command
    python benchmarks/planner_answers.py compare DIR_A DIR_B

``record`` runs each command of :data:`COMMANDS` in this process through the CLI (``--json``) and writes
its output and exit status; ``compare`` reports every command whose output or status differs (the
recommendation, every figure and every count of evaluations alike; the count is reported apart, since a
search that does less work evaluates fewer setups by design). Keys the second record adds to an object
are not compared: a new field is not a changed answer.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

COMMANDS = [
    "fit meta-llama/Llama-2-7b-hf --gpu rtx4090",
    "fit meta-llama/Llama-2-7b-hf --gpu rtx-4060 --method qlora",
    "fit meta-llama/Llama-2-7b-hf --gpu rtx-4060",
    "fit Qwen/Qwen2.5-7B --gpu v100-sxm2-32gb",
    "fit Qwen/Qwen2.5-7B --gpu a100-80gb --gpus 8",
    "fit meta-llama/Llama-2-70b-hf --gpu a100-80gb",
    "fit meta-llama/Llama-2-70b-hf --gpu h100-sxm5-80gb --gpus 8 --samples 20000 --avg-tokens 512",
    "fit Qwen/Qwen2.5-7B-Instruct --gpu rtx4090 --prefer speed",
    "fit Qwen/Qwen2.5-7B-Instruct --gpu rtx4090 --prefer cost --samples 10000 --avg-tokens 400",
    "fit Qwen/Qwen2.5-7B-Instruct --gpu rtx4090 --prefer quality --margin 0",
    "fit Qwen/Qwen2.5-14B --gpu l40s --max-slowdown 1.5",
    "fit Qwen/Qwen2.5-14B --gpu a100-40gb-sxm4 --samples 50000 --avg-tokens 600 --max-hours 10",
    "fit Qwen/Qwen2.5-14B --gpu a100-40gb-sxm4 --samples 50000 --avg-tokens 600 --budget 20",
    "fit meta-llama/Llama-3.1-8B-Instruct --gpu t4 --seq 2048",
    "fit meta-llama/Llama-3.1-8B-Instruct --gpu rtx-3060-12gb --host-memory 32",
    "fit meta-llama/Llama-3.1-8B-Instruct --gpu rtx-4090 --framework unsloth",
    "fit meta-llama/Llama-3.1-70B-Instruct --gpu rtx-4090 --gpus 2 --method qlora",
    "fit Qwen/Qwen2.5-0.5B --gpu rtx-4060 --global-batch 64 --margin 2GiB",
    "fit mistralai/Mistral-7B-v0.1 --gpu rtx-4060-ti-16gb --method lora --rank 64",
    "fit Qwen/Qwen2.5-7B --gpu rtx-4060 --method full",
    "gpus Qwen/Qwen2.5-14B --method lora",
    "gpus meta-llama/Llama-3.1-405B-Instruct --method full",
    "gpus meta-llama/Llama-2-7b-hf --method qlora --samples 10000 --avg-tokens 512",
    "gpus Qwen/Qwen2.5-7B --as-given --method lora --max-gpus 8",
    "gpus meta-llama/Llama-2-70b-hf --sort cards --only rtx4090,a100-80gb,h100-sxm5-80gb",
    "max-model --gpu a100-80gb --gpus 8 --method full --zero 3",
    "max-model --gpu rtx4090 --method lora --auto",
    "max-model --gpu rtx-4060 --method qlora --auto",
    "max-model --gpu t4 --method lora",
    "max-model --gpu h100-sxm5-80gb --gpus 2 --method full --auto --host-memory 256",
]


def run_one(cmd: str) -> tuple[int, Any]:
    from typer.testing import CliRunner

    from tuneplan.cli.root import app

    r = CliRunner().invoke(app, [*shlex.split(cmd), "--json"])
    try:
        return r.exit_code, json.loads(r.stdout)
    except ValueError:
        return r.exit_code, r.stdout


def record(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for i, cmd in enumerate(COMMANDS):
        code, d = run_one(cmd)
        (out / f"{i:02d}.json").write_text(json.dumps({"command": cmd, "exit": code, "output": d}, indent=1,
                                                      sort_keys=True))
        print(f"{i:02d} exit {code}  {cmd}", flush=True)


def _without(d: Any, key: str) -> Any:
    if isinstance(d, dict):
        return {k: _without(v, key) for k, v in d.items() if k != key}
    if isinstance(d, list):
        return [_without(v, key) for v in d]
    return d


def _as_in(new: Any, old: Any) -> Any:
    """``new`` with only the keys ``old`` has (recursively): fields a change added are not a difference."""
    if isinstance(new, dict) and isinstance(old, dict):
        return {k: _as_in(v, old[k]) for k, v in new.items() if k in old}
    if isinstance(new, list) and isinstance(old, list) and len(new) == len(old):
        return [_as_in(v, o) for v, o in zip(new, old, strict=True)]
    return new


def compare(a: Path, b: Path) -> int:
    """Every answer of ``a`` against ``b``'s (the keys ``b`` added to an object are left out)."""
    differ = 0
    for fa in sorted(a.glob("*.json")):
        da, db = json.loads(fa.read_text()), json.loads((b / fa.name).read_text())
        db = _as_in(db, da)
        if _without(da, "evaluations") != _without(db, "evaluations"):
            differ += 1
            print(f"DIFFERS  {da['command']}")
        elif da != db:
            print(f"same answer, other evaluation counts  {da['command']}")
        else:
            print(f"same  {da['command']}")
    print(f"{differ} of {len(list(a.glob('*.json')))} commands differ")
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "record":
        record(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
