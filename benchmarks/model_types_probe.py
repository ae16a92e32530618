"""Every transformers model type's default config: tuneplan's parameter count against transformers' own.

For each ``model_type`` of ``transformers.CONFIG_MAPPING``, the default config (``CONFIG_MAPPING[t]()``)
is built on the meta device (no memory, no weights) with the head tuneplan models (causal LM, else
masked LM, else the bare model) and its parameters counted (``sum(p.numel())``, tied ones once); the same
config, as ``to_dict()`` writes it, goes through ``tuneplan.specs.model.model_from_config``. Each type
lands in one class:

- ok: accepted without a warning, within 5 % of transformers;
- warned: accepted with a warning (an unknown family read as a Llama-style decoder), any deviation;
- refused: a ConfigError, with its message (whether transformers builds the model is recorded too);
- wrong: accepted without a warning and more than 5 % off: the class that must stay empty;
- not built: transformers itself cannot build its default config here (a missing optional package, a
  remote-code or composite config): listed with the reason, never dropped.

    python3 benchmarks/model_types_probe.py [--only t1,t2] [--json out.json] [--timeout 60]

CPU only and cheap: the meta device allocates nothing; one type taking longer than ``--timeout``
seconds is listed as not built (timed out).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import warnings
from typing import Any

TOLERANCE = 0.05  # the largest parameter-count error accepted before a model type is flagged


def _first_line(exc: Exception, n: int = 110) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0][:n] if text else ''}"


class _Timeout(Exception):
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise _Timeout


def transformers_count(model_type: str) -> tuple[dict[str, Any] | None, int | None, str]:
    """(config dict, parameter count, head or why not built)."""
    import torch
    import transformers

    try:
        cfg = transformers.CONFIG_MAPPING[model_type]()
    except Exception as exc:  # noqa: BLE001 - any failure is a row of the report
        return None, None, f"config: {_first_line(exc)}"
    written = json.loads(json.dumps(cfg.to_dict(), default=str))
    errors = []
    heads = (("causal", transformers.AutoModelForCausalLM), ("masked", transformers.AutoModelForMaskedLM),
             ("bare", transformers.AutoModel))
    for head, auto in heads:
        try:
            with torch.device("meta"):
                model = auto.from_config(cfg)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{head}: {_first_line(exc)}")
            continue
        return written, sum(p.numel() for p in model.parameters()), head
    return written, None, "; ".join(errors)


def tuneplan_count(written: dict[str, Any]) -> tuple[int | None, str, list[str]]:
    """(parameter count or None, refusal message, warnings)."""
    from tuneplan.errors import TuneplanError
    from tuneplan.specs.model import model_from_config

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            spec = model_from_config(written, "config")
        except TuneplanError as exc:
            return None, str(exc), []
        except Exception as exc:  # noqa: BLE001 - an internal error is a finding, reported as such
            return None, f"INTERNAL {type(exc).__name__}: {exc}", []
    return spec.params_total, "", [str(w.message) for w in caught]


def probe(model_type: str, timeout: int) -> dict[str, Any]:
    row: dict[str, Any] = {"model_type": model_type}
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        written, theirs, head = transformers_count(model_type)
    except _Timeout:
        written, theirs, head = None, None, f"timed out after {timeout} s"
    finally:
        signal.alarm(0)
    row.update(transformers_params=theirs, head=head)
    if written is None:
        row["class"] = "not built"
        return row
    ours, refusal, warned = tuneplan_count(written)
    row.update(tuneplan_params=ours, refusal=refusal, warnings=warned)
    if theirs is None:
        row["class"] = "refused" if refusal else "not built"
        return row
    if ours is None:
        row["class"] = "refused"
        return row
    row["deviation"] = ours / theirs - 1 if theirs else float("inf")
    if warned:
        row["class"] = "warned"
    else:
        row["class"] = "ok" if abs(row["deviation"]) <= TOLERANCE else "wrong"
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma list of model types")
    ap.add_argument("--json", help="write the rows to this file")
    ap.add_argument("--timeout", type=int, default=60, help="seconds per model type")
    args = ap.parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", module="transformers")
    types = args.only.split(",") if args.only else sorted(transformers.CONFIG_MAPPING.keys())
    rows, start = [], time.perf_counter()
    for t in types:
        rows.append(probe(t, args.timeout))
    classes: dict[str, int] = {}
    for r in rows:
        classes[r["class"]] = classes.get(r["class"], 0) + 1
    for r in rows:
        if r["class"] == "wrong" or (r["class"] == "refused" and r.get("transformers_params")):
            dev = f"{r['deviation']:+.1%}" if "deviation" in r else r.get("refusal", "")[:150]
            print(f"{r['class']:8} {r['model_type']:32} {dev}")
    took = time.perf_counter() - start
    print(f"transformers {transformers.__version__}: {len(rows)} model types in {took:.0f} s: "
          + ", ".join(f"{k} {v}" for k, v in sorted(classes.items())))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1, default=str)
    return 1 if classes.get("wrong") else 0


if __name__ == "__main__":
    sys.exit(main())
