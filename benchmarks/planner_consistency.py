"""The planner's invariants over the catalog: every model x 14 cards x 1, 2 and 8 GPUs.

    python benchmarks/planner_consistency.py [--jobs N] [--models N] [--out FILE]

For each (model, card, GPUs) it runs ``fit`` (every method, the whole candidate space, the default
balanced rule, detail off: the rows' limits and the equal-memory ranks are left out, the candidate set,
verdicts and recommendation are the same) and checks:
- the invariants of :func:`tuneplan.plan.invariants.violations` (a recommendation if and only if a
  row fits; every fitting row is in the candidate set; the recommendation is a row, keeps the margin
  and reaches the global batch whenever some candidate does);
- ``gpus`` and ``fit`` agree: some family fits at micro-batch 1 by the fewest-cards search
  (:func:`tuneplan.plan.evaluate.first_fitting`, which relies on checkpointing and lighter optimizers
  never adding memory) exactly when ``fit`` has a row that fits; where ``fit`` answered with another
  framework (nothing fits with the default one), that search finds nothing with the default framework
  and something with the one ``fit`` took.
It prints one line per model and a summary that the README quotes.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

CARDS = ("rtx-3060-12gb", "rtx-4060", "rtx-4060-ti-16gb", "rtx-4090", "rtx-5090", "t4", "v100-sxm2-32gb",
         "l40s", "a100-40gb-sxm4", "a100-80gb-sxm4", "h100-sxm5-80gb", "h200-sxm-141gb", "ascend-910b",
         "mi300x")
GPUS = (1, 2, 8)


def check_model(name: str) -> dict[str, Any]:
    from tuneplan.catalog.accelerators import resolve_accelerator
    from tuneplan.catalog.models import resolve_model
    from tuneplan.plan import fit
    from tuneplan.plan.evaluate import Prober, first_fitting
    from tuneplan.plan.invariants import violations
    from tuneplan.plan.space import METHOD_VARIANTS, compat_errors, families

    model = resolve_model(name, allow_network=False)
    out: dict[str, Any] = {"model": name, "runs": 0, "recommended": 0, "tight": 0, "relaxed": 0,
                           "violations": [], "seconds": 0.0, "evaluations": 0}
    t0 = time.perf_counter()
    for card in CARDS:
        acc = resolve_accelerator(card)
        for n in GPUS:
            where = f"{name} on {n} x {card}"
            d = fit(model, acc, gpus=n, detail=False).to_dict()
            out["runs"] += 1
            out["evaluations"] += d["evaluations"]
            out["violations"] += [f"{where}: {v}" for v in violations(d)]
            rec = d["recommended"]
            if rec is not None:
                out["recommended"] += 1
                out["tight"] += rec["tight"]
                out["relaxed"] += rec["relaxed"]
            fw = d["framework"]

            def hit(framework: str | None, n: int = n, acc: Any = acc) -> bool:
                base = {"gpus": n, **({"framework": framework} if framework else {})}
                probe = Prober(model, acc, base)
                fams = families(list(METHOD_VARIANTS), probe.base, n, acc)
                got = first_fitting(probe, fams, lambda f: not compat_errors(model, acc, probe.base, f))
                return got is not None

            fits = any(m["fits"] for m in d["methods"])
            if fw["chosen"] == fw["default"] and hit(None) != fits:
                out["violations"].append(f"{where}: fewest-cards search says {not fits}, fit says otherwise")
            if fw["chosen"] != fw["default"] and (hit(None) or not hit(fw["chosen"]) or not fits):
                out["violations"].append(f"{where}: fit took {fw['chosen']}, but the fewest-cards search "
                                         "disagrees on it or on the setup's own framework")
    out["seconds"] = time.perf_counter() - t0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--models", type=int, default=None,
                    help="only the first N catalog models (largest first)")
    args = ap.parse_args()
    from tuneplan.plan.max_model import catalog_models

    names = [m.name for m in catalog_models()][: args.models]
    t0 = time.perf_counter()
    results = []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        for r in ex.map(check_model, names):
            results.append(r)
            print(f"{r['model']:<48} {r['runs']:>3} runs, {r['recommended']:>3} recommended, "
                  f"{len(r['violations'])} violations, {r['seconds']:.1f} s", flush=True)
            for v in r["violations"]:
                print("  VIOLATION", v, flush=True)
    runs = sum(r["runs"] for r in results)
    rec = sum(r["recommended"] for r in results)
    viol = sum(len(r["violations"]) for r in results)
    print(f"\n{len(names)} models x {len(CARDS)} cards x GPUs {'/'.join(map(str, GPUS))}: {runs} fit runs, "
          f"{rec} with a recommendation ({sum(r['tight'] for r in results)} tight, "
          f"{sum(r['relaxed'] for r in results)} with a relaxed global batch), "
          f"{runs - rec} where nothing fits; "
          f"{viol} violations of the invariants; {sum(r['evaluations'] for r in results):,} setups "
          f"evaluated, {time.perf_counter() - t0:.0f} s wall")
    return 1 if viol else 0


if __name__ == "__main__":
    sys.exit(main())
