"""Speed of the analytic core: estimates per second in-process, and CLI start-up time.

    python benchmarks/estimator_speed.py [--seconds 3]

Reports (one run, same machine): memory_breakdown() calls/s on a resolved ModelSpec + TrainSetup,
the full tuneplan.estimate() API calls/s (validation, profile resolution, compatibility), the time of
`import tuneplan`, and the wall time of `tuneplan estimate ... --json` and `tuneplan --help`.
Target (issue 2): >= 10,000 core estimates per second on one core.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def rate(fn, seconds: float) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(200):
            fn()
        n += 200
    return n / (time.perf_counter() - t0)


def wall(cmd: list[str], repeat: int = 3) -> float:
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=False)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    t0 = time.perf_counter()
    import tuneplan  # noqa: F401

    t_import = time.perf_counter() - t0
    from tuneplan.api import build_setup, estimate
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.memory import memory_breakdown

    spec = resolve_model("Qwen/Qwen2.5-7B-Instruct")
    setup = build_setup(spec, method="qlora", rank=16, seq=2048, batch=2)
    core = rate(lambda: memory_breakdown(spec, setup), a.seconds)
    api = rate(lambda: estimate(spec, method="qlora", rank=16, seq=2048, batch=2, gpu="rtx4090"), a.seconds)
    cli = wall([sys.executable, "-m", "tuneplan.cli.app", "estimate", "qwen2.5-7b-instruct", "--method", "qlora",
                "--gpu", "rtx4090", "--json"])
    help_t = wall([sys.executable, "-m", "tuneplan.cli.app", "--help"])
    imp = wall([sys.executable, "-c", "import tuneplan.api"])
    print(f"import tuneplan (in-process, first import): {t_import * 1000:.1f} ms")
    print(f"python -c 'import tuneplan.api' wall:        {imp * 1000:.0f} ms")
    print(f"core memory_breakdown():                      {core:,.0f} estimates/s (one core)")
    print(f"tuneplan.estimate() full API:                 {api:,.0f} estimates/s")
    print(f"CLI `tuneplan estimate ... --json` wall:      {cli * 1000:.0f} ms")
    print(f"CLI `tuneplan --help` wall:                   {help_t * 1000:.0f} ms")
    print(f"target >= 10,000 core estimates/s: {'MET' if core >= 10_000 else 'NOT MET'}")


if __name__ == "__main__":
    main()
