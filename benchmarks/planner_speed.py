"""How long the planner takes: fit, gpus (whole catalog), max-model, sweep.

    python benchmarks/planner_speed.py [--repeat 5]

Each line is the median of ``--repeat`` in-process calls (after one warm-up call that loads the catalogs),
as wall time and as this process's CPU time (the CPU figure holds on a shared machine, where the wall time
also counts waiting for a core; the target is checked on it), with the setups the call evaluated
(scalar estimates + grid configurations) and the target of the line. Targets: ``fit`` on one card 0.1 s,
``fit`` with every strategy (8 GPUs) or every framework and ``gpus`` over the whole catalog 0.2 s,
``max-model`` 0.2 s; a sweep has none (it is one grid call). How the planner spends them: every family's
micro-batch x accumulation is read off one grid (``plan/sizes.py``), runs and memory figures are shared
across the cards of a ``gpus`` ranking, only the candidates the decision rule reads get a time estimate,
and ``max-model`` computes full verdicts only where its answer shows them and rules out, before
resolving a run, the models and families whose weights exceed the memory that would hold them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

CASES: list[tuple[str, float | None, Callable[[], Any]]] = []


def case(label: str, target_s: float | None):  # noqa: ANN201 - a registering decorator
    def wrap(fn: Callable[[], Any]) -> Callable[[], Any]:
        CASES.append((label, target_s, fn))
        return fn

    return wrap


@case("fit Qwen2.5-7B on v100 (5 methods)", 0.1)
def _fit_one() -> Any:
    from tuneplan.plan import fit

    return fit("Qwen/Qwen2.5-7B", "v100-sxm2-32gb")


@case("fit Qwen2.5-7B on 8 x a100-80gb (5 methods x 10 strategies)", 0.2)
def _fit_eight() -> Any:
    from tuneplan.plan import fit

    return fit("Qwen/Qwen2.5-7B", "a100-80gb", gpus=8)


@case("fit Llama-2-70b on a100-80gb", 0.1)
def _fit_70b() -> Any:
    from tuneplan.plan import fit

    return fit("meta-llama/Llama-2-70b-hf", "a100-80gb")


@case("fit Qwen2.5-7B full on rtx-4060 (nothing fits with hf: every framework)", 0.2)
def _fit_frameworks() -> Any:
    from tuneplan.plan import fit

    return fit("Qwen/Qwen2.5-7B", "rtx-4060", method="full", host_memory_gib=64)


@case("fit Qwen2.5-7B full on rtx-4060 --framework hf (nothing fits: the next step)", 0.1)
def _fit_next_step() -> Any:
    from tuneplan.plan import fit

    return fit("Qwen/Qwen2.5-7B", "rtx-4060", method="full", framework="hf", host_memory_gib=64)


@case("gpus Qwen2.5-14B lora, whole catalog, up to 64 cards", 0.2)
def _gpus_lora() -> Any:
    from tuneplan.plan import rank_gpus

    return rank_gpus("Qwen/Qwen2.5-14B", method="lora")


@case("gpus Llama-3.1-405B full, whole catalog, up to 64 cards", 0.2)
def _gpus_405b() -> Any:
    from tuneplan.plan import rank_gpus

    return rank_gpus("meta-llama/Llama-3.1-405B-Instruct", method="full")


@case("max-model 8 x a100-80gb full ZeRO-3 (catalog + bisection, 5 methods)", 0.2)
def _max_model() -> Any:
    from tuneplan.plan import max_model

    return max_model("a100-80gb", gpus=8, method="full", zero=3)


@case("max-model rtx4090 lora --auto (candidate space per probe)", 0.2)
def _max_model_auto() -> Any:
    from tuneplan.plan import max_model

    return max_model("rtx4090", method="lora", auto=True)


@case("max-model rtx4090 lora --auto, the table alone (what the text face asks)", 0.2)
def _max_model_auto_table() -> Any:
    from tuneplan.plan import max_model

    return max_model("rtx4090", method="lora", auto=True, catalog=False)


@case("sweep Qwen2.5-7B qlora seq=512..32768", None)
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
    print(f"{'case':<72} {'wall':>8} {'cpu':>8} {'setups':>7} {'target':>11}")
    for label, tgt, fn in CASES:
        res = fn()  # warm-up: catalogs, lru caches
        wall, cpu = [], []
        for _ in range(a.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            res = fn()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        w, c = statistics.median(wall), statistics.median(cpu)
        n = evaluations(res)
        mark = "-" if tgt is None else f"{'ok' if c <= tgt else 'over'} {tgt:g} s"  # CPU: load-independent
        print(f"{label:<72} {w * 1000:>5.0f} ms {c * 1000:>5.0f} ms {n if n else '-':>7} {mark:>11}")


if __name__ == "__main__":
    main()
