"""How long the planner takes: fit, gpus (whole catalog), max-model, sweep.

    python benchmarks/planner_speed.py [--repeat 5]

Each line is the median wall time of ``--repeat`` in-process calls (after one warm-up call that loads the
catalogs), with the number of estimates the call evaluated, the time per estimate, and the target.
The estimate count does not depend on the machine; the wall time is about count x the cost of one
``estimate()`` (printed first). Targets: ``fit`` on one card under 0.1 s, ``gpus`` over the whole
catalog under 0.5 s, ``max-model`` under 0.5 s. The search evaluates every family of the candidate
space (pruned only by compatibility, dominance and monotone bisection), so it meets them when one
estimate costs tens of microseconds (the grid evaluator replaces ``evaluate.largest_fitting_batch``);
the scalar estimator costs about a millisecond.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

CASES: list[tuple[str, str, Callable[[], Any]]] = []
TARGET_S = {"fit": 0.1, "gpus": 0.5, "max-model": 0.5, "sweep": None}


def case(label: str, kind: str):  # noqa: ANN201 - a registering decorator
    def wrap(fn: Callable[[], Any]) -> Callable[[], Any]:
        CASES.append((label, kind, fn))
        return fn

    return wrap


@case("fit Qwen2.5-7B on v100 (5 methods)", "fit")
def _fit_one() -> Any:
    from tuneplan.plan import fit

    return fit("Qwen/Qwen2.5-7B", "v100")


@case("fit Qwen2.5-7B on 8 x a100-80gb (5 methods x 10 strategies)", "fit")
def _fit_eight() -> Any:
    from tuneplan.plan import fit

    return fit("Qwen/Qwen2.5-7B", "a100-80gb", gpus=8)


@case("fit Llama-2-70b on a100-80gb", "fit")
def _fit_70b() -> Any:
    from tuneplan.plan import fit

    return fit("meta-llama/Llama-2-70b-hf", "a100-80gb")


@case("gpus Qwen2.5-14B lora, whole catalog, up to 64 cards", "gpus")
def _gpus_lora() -> Any:
    from tuneplan.plan import rank_gpus

    return rank_gpus("Qwen/Qwen2.5-14B", method="lora")


@case("gpus Llama-3.1-405B full, whole catalog, up to 64 cards", "gpus")
def _gpus_405b() -> Any:
    from tuneplan.plan import rank_gpus

    return rank_gpus("meta-llama/Llama-3.1-405B-Instruct", method="full")


@case("max-model 8 x a100-80gb full ZeRO-3 (catalog + bisection, 5 methods)", "max-model")
def _max_model() -> Any:
    from tuneplan.plan import max_model

    return max_model("a100-80gb", gpus=8, method="full", zero=3)


@case("max-model rtx4090 lora --auto (candidate space per probe)", "max-model")
def _max_model_auto() -> Any:
    from tuneplan.plan import max_model

    return max_model("rtx4090", method="lora", auto=True)


@case("sweep Qwen2.5-7B qlora seq=512..32768", "sweep")
def _sweep() -> Any:
    from tuneplan.plan import sweep

    return sweep("Qwen/Qwen2.5-7B", "seq=512..32768", gpu="rtx4090", method="qlora")


def evaluations(res: Any) -> int | None:
    n = getattr(res, "evaluations", None)
    return n if isinstance(n, int) and n > 0 else None


def per_estimate_us(n: int = 300) -> float:
    """One plain ``estimate()`` call on a resolved model and card: the planner's unit of work."""
    from tuneplan.api import estimate
    from tuneplan.catalog.accelerators import resolve_accelerator
    from tuneplan.catalog.models import resolve_model

    spec, gpu = resolve_model("Qwen/Qwen2.5-7B"), resolve_accelerator("a100-80gb")
    estimate(spec, gpu=gpu, method="lora")
    t0 = time.perf_counter()
    for b in range(n):
        estimate(spec, gpu=gpu, method="lora", batch=1 + b % 16)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    print(f"one estimate() (Qwen2.5-7B LoRA on a100-80gb): {per_estimate_us():,.0f} us")
    print(f"{'case':<74} {'median':>9} {'estimates':>10} {'per estimate':>13} {'target':>8}")
    for label, kind, fn in CASES:
        res = fn()  # warm-up: catalogs, lru caches
        ts = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            res = fn()
            ts.append(time.perf_counter() - t0)
        med = statistics.median(ts)
        n = evaluations(res)
        per = f"{med / n * 1e6:,.0f} us" if n else "-"
        tgt = TARGET_S.get(kind)
        mark = "-" if tgt is None else f"{'ok' if med <= tgt else 'over'} {tgt:g} s"
        print(f"{label:<74} {med * 1000:>7.0f} ms {n if n else '-':>10} {per:>13} {mark:>8}")


if __name__ == "__main__":
    main()
