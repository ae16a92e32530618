"""The calibration store, written: measured step times per card and framework in the user's config
directory (``estimator/step_calibration.py`` reads them and says what the correction is).

Every write replaces ``calibration.json`` atomically (``safe_write``: a temporary file in the same folder,
fsync, rename); a symbolic link at the store's path is refused, so nothing is written through one.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Callable
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.estimator.step_calibration import STORE_VERSION, entry_key, forget, load_store, store_path
from tuneplan.estimator.time_band import part_sigmas
from tuneplan.specs.hardware import Accelerator

MAX_MEASUREMENTS = 50  # per card and framework: the oldest go first
FIT_MEASUREMENTS = 10  # the newest ones the factors are fitted to


def _write(store: dict[str, Any], path: str) -> str:
    from tuneplan.safe_write import write_text

    if os.path.islink(path):
        raise TuneplanError(f"{path} is a symbolic link; the calibration store is never written through one",
                            field="calibration", accepted="remove the link, or point $TUNEPLAN_CONFIG_DIR "
                            "at another folder")
    write_text(path, json.dumps(store, indent=1, sort_keys=True) + "\n", force=True, field="calibration")
    forget()
    return path


# the time options a measurement's machine was described with (a stated link, the network between nodes,
# compiled kernels, a given tensor peak or GEMM fraction): the fit predicts each stored step with its own
TIME_OPTION_FIELDS = ("compiled", "inter_node_gbs", "peak_tflops", "gemm_efficiency", "peer_link")


def record_step(run: Any, acc: Accelerator, measured_step_seconds: float, source: str,
                path: str | None = None, options: Any = None) -> dict[str, Any]:
    """Store one measured optimizer step of ``run`` on ``acc`` beside its uncalibrated prediction, and fit the
    card's and framework's factors again over its stored measurements; returns the stored measurement.
    ``options`` (``RuntimeOptions``): how the machine was described (``--link`` and the like); the
    prediction the factors correct is the one made with them, as the calibrated estimates will be."""
    import dataclasses

    from tuneplan.estimator.throughput import run_step_time

    if not isinstance(measured_step_seconds, (int, float)) or not 0 < measured_step_seconds < 1e7:
        raise TuneplanError(f"{measured_step_seconds!r} is not a step time", field="step_seconds",
                            accepted="seconds per optimizer step > 0, e.g. 1.8")
    opts = _options_of({f: getattr(options, f) for f in TIME_OPTION_FIELDS} if options is not None else {})
    st = run_step_time(run, acc, opts)
    s = run.setup
    m = {"model": run.model.name, "method": s.method, "batch": s.batch, "seq": s.seq,
         "grad_accum": s.grad_accum,
         "gpus": s.world_size, "setup": {k: list(v) if isinstance(v, tuple) else v
                                         for k, v in dataclasses.asdict(s).items()
                                         if isinstance(v, (str, int, float, bool, type(None), tuple))},
         "measured_step_seconds": float(measured_step_seconds), "predicted_step_seconds": st.step_seconds,
         "predicted": dict(st.breakdown), "widths": part_sigmas(st.card_known, st.link_name, st.link_stated),
         "source": source, "time_options": {f: getattr(opts, f) for f in TIME_OPTION_FIELDS
                                            if getattr(opts, f) not in (None, False)},
         "recorded_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    p = path or store_path()
    store = load_store(p)
    store = {"version": STORE_VERSION, "entries": dict(store["entries"])}
    key = entry_key(acc.id, s.framework)
    entry = dict(store["entries"].get(key) or {"card": acc.id, "framework": s.framework, "measurements": []})
    entry["measurements"] = (list(entry.get("measurements") or []) + [m])[-MAX_MEASUREMENTS:]
    entry["factors"] = fit_entry(entry["measurements"], acc, {id(m): run})
    store["entries"][key] = entry
    _write(store, p)
    return m


def fit_entry(measurements: list[dict[str, Any]], acc: Accelerator, runs: dict[int, Any]) -> dict[str, float]:
    """Factors over the stored measurements (the last ``FIT_MEASUREMENTS``): each measurement's run is the
    one given in ``runs`` (by the measurement's id) or resolved again from its stored model and setup; one
    that cannot be resolved any more is left out."""
    from tuneplan.estimator.step_calibration import fit_corrections
    from tuneplan.estimator.throughput import UnknownThroughput

    cases: list[tuple[Callable[[dict[str, float]], float], float]] = []
    widths: dict[str, float] = {}
    for m in measurements[-FIT_MEASUREMENTS:]:
        run = runs.get(id(m)) or _resolve(m)
        if run is None:
            continue

        step = _step_of(run, acc, _options_of(m.get("time_options") or {}))

        try:
            step({})
        except UnknownThroughput:
            continue
        cases.append((step, float(m["measured_step_seconds"])))
        for part, w in (m.get("widths") or {}).items():
            widths[part] = max(widths.get(part, 0.0), float(w))
    used = {"compute", "memory_bound", "overhead"}
    if any(r.get("gpus", 1) > 1 for r in measurements):
        used.add("communication")
    if any((r.get("setup") or {}).get("offload", "none") != "none" for r in measurements):
        used.add("offload")
    return fit_corrections(cases, {k: v for k, v in widths.items() if k in used})


def _options_of(given: dict[str, Any]) -> Any:
    """The ``RuntimeOptions`` of a measurement's stored time options (the shared default when none)."""
    from tuneplan.estimator.runtime import DEFAULT_OPTIONS
    from tuneplan.estimator.throughput import RuntimeOptions

    kept = {k: v for k, v in given.items() if k in TIME_OPTION_FIELDS}
    return RuntimeOptions(**kept) if kept else DEFAULT_OPTIONS


def _step_of(run: Any, acc: Accelerator, options: Any) -> Callable[[dict[str, float]], float]:
    """The run's step seconds, with its own time options, as a function of the per-mechanism factors."""
    from tuneplan.estimator.step_calibration import corrected_options
    from tuneplan.estimator.throughput import run_step_time

    def step(k: dict[str, float]) -> float:
        return run_step_time(run, acc, corrected_options(options, k)).step_seconds

    return step


def _resolve(m: dict[str, Any]) -> Any:
    """The run of a stored measurement, or None when its model or setup no longer resolves."""
    from tuneplan.catalog.models import resolve_model
    from tuneplan.errors import TuneplanError as _Err
    from tuneplan.estimator.run import resolve_run
    from tuneplan.specs.setup import TrainSetup

    try:
        fields = set(TrainSetup.__dataclass_fields__)
        given: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                 for k, v in (m.get("setup") or {}).items() if k in fields}
        setup = TrainSetup(**given)
        return resolve_run(resolve_model(m["model"], allow_network=False), setup)
    except (_Err, KeyError, TypeError, ValueError, OSError):
        return None


def list_entries(path: str | None = None) -> list[dict[str, Any]]:
    """One row per card and framework: the measurements and the factors they give."""
    from tuneplan.estimator.step_calibration import calibration_for

    p = path or store_path()
    out = []
    for key, entry in sorted(load_store(p)["entries"].items()):
        card, _, framework = key.partition("|")
        cal = calibration_for(card, framework, p) or {}
        out.append({"card": card, "framework": framework, "measurements": entry.get("measurements") or [],
                    "factors": cal.get("factors") or {}})
    return out


def remove_entries(card: str | None = None, framework: str | None = None, path: str | None = None
                   ) -> list[str]:
    """Remove the entries of ``card`` (and ``framework``), or every entry when both are None; returns the
    removed keys."""
    p = path or store_path()
    store = load_store(p)
    gone = [k for k in store["entries"] if (card is None or k.partition("|")[0] == card)
            and (framework is None or k.partition("|")[2] == framework)]
    if gone:
        kept = {k: v for k, v in store["entries"].items() if k not in gone}
        _write({"version": STORE_VERSION, "entries": kept}, p)
    return gone
