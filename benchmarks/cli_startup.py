"""Start-up of `tuneplan estimate ... --json` against a bare `python3 -c pass`, measured in the same run.

    python benchmarks/cli_startup.py [--rounds 20] [--no-bytecode-cache] [--compare OTHER_CHECKOUT/src]

The two commands run alternately (one of each per round) so that a change of load on the machine hits
both; the figure is the difference of the best wall times, and of the best CPU times (user + system of
the child, less sensitive to other processes). Bytecode is cached in a temporary folder, filled by one
warm-up run, as it is for an installed package (``pip`` compiles on install); ``--no-bytecode-cache``
measures with whatever the environment says instead. The checkout's own ``src`` comes first on the path;
``--compare`` times another checkout's ``src`` in the same rounds (before / after a change).

It also runs the command once under ``-X importtime`` and lists which of the heavy modules that
`estimate --json` does not need were imported (the answer should be none).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
ESTIMATE = ["estimate", "Qwen/Qwen2.5-7B-Instruct", "--method", "qlora", "--rank", "16", "--batch", "1",
            "--seq", "512", "--gpu", "rtx4090", "--json"]
TARGET_S = 0.15  # the start-up budget for `estimate --json`: at most this much above the bare interpreter
# Imported by `estimate --json` only if something is loaded that it does not print.
NOT_NEEDED = ("typer", "pydantic", "rich", "numpy", "yaml", "huggingface_hub", "torch", "gradio",
              "transformers", "tuneplan.plan", "tuneplan.web", "tuneplan.simulate", "tuneplan.ingest",
              "tuneplan.grid", "tuneplan.cli.render")


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one run; the command must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def imported(cmd: list[str], env: dict[str, str]) -> list[str]:
    """The modules of NOT_NEEDED (or their submodules) that ``cmd`` imports."""
    err = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True).stderr
    names = {line.rsplit("|", 1)[-1].strip() for line in err.splitlines() if line.startswith("import time:")}
    return sorted(m for m in NOT_NEEDED if any(n == m or n.startswith(m + ".") for n in names))


def _env(src: Path, cache: str | None) -> dict[str, str]:
    path = [str(src), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    if cache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = cache
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--no-bytecode-cache", action="store_true")
    ap.add_argument("--compare", type=Path, help="another checkout's src folder, timed in the same rounds")
    a = ap.parse_args()
    cli = [sys.executable, "-m", "tuneplan", *ESTIMATE]
    with tempfile.TemporaryDirectory() as tmp:
        caches = None if a.no_bytecode_cache else (tmp + "/this", tmp + "/other")
        runs: dict[str, tuple[list[str], dict[str, str]]] = {
            "python3 -c pass": ([sys.executable, "-c", "pass"], _env(SRC, caches and caches[0])),
            "estimate --json": (cli, _env(SRC, caches and caches[0])),
        }
        if a.compare:
            runs["estimate --json, --compare"] = (cli, _env(a.compare.resolve(), caches and caches[1]))
        for cmd, env in runs.values():
            timed(cmd, env)  # warm-up: fills the bytecode cache and the file cache
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
        for _ in range(a.rounds):
            for key, (cmd, env) in runs.items():
                times[key].append(timed(cmd, env))
        extra = {k: imported(*runs[k]) for k in runs if k != "python3 -c pass"}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"`tuneplan {' '.join(ESTIMATE)}`")
    print(f"{a.rounds} rounds, alternating; load average {load:.1f}; bytecode "
          f"{'as the environment says' if a.no_bytecode_cache else 'cached'}")
    print(f"{'':28s} {'best wall':>10s} {'median wall':>12s} {'best CPU':>9s}  above python3 -c pass")
    bare_wall, bare_cpu = (min(t[i] for t in times["python3 -c pass"]) for i in (0, 1))
    for key, ts in times.items():
        walls, cpus = [w for w, _ in ts], [c for _, c in ts]
        meets = "meets" if min(walls) - bare_wall <= TARGET_S else "misses"
        above = "" if key == "python3 -c pass" else (
            f"  {min(walls) - bare_wall:+.3f} s wall, {min(cpus) - bare_cpu:+.3f} s CPU "
            f"({meets} the target of +{TARGET_S} s wall)")
        print(f"{key:28s} {min(walls):9.3f}s {statistics.median(walls):11.3f}s {min(cpus):8.3f}s{above}")
    for key, mods in extra.items():
        print(f"heavy modules imported by {key}: {', '.join(mods) or 'none'}")


if __name__ == "__main__":
    main()
