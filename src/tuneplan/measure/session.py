"""``measure``: run, compare with the estimate of the same setup, optionally append a calibration row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.measure.compare import compare
from tuneplan.measure.record import append_record, build_record, check_record_target
from tuneplan.measure.runner import run_measure
from tuneplan.safe_read import path_exists, user_path
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup


def measure(model: str | ModelSpec, setup: TrainSetup | None = None, *, steps: int = 3,
            device: str = "auto", weights: str | None = None, record: str | Path | None = None,
            **setup_fields: Any) -> dict[str, Any]:
    """Measure ``steps`` real training steps of ``model`` on this machine; returns a JSON-ready dict.

    Keys: ``measured`` (MeasureResult as a dict), ``estimate`` (the analytic estimate's to_dict),
    ``comparison`` (rows quantity / measured / estimated / ratio), ``record`` (the calibration row) and
    ``record_path`` when ``record`` names a file to append to.
    """
    from tuneplan.api import estimate  # the same setup resolution as every other command

    if record is not None:
        check_record_target(record)  # before spending the run
    if weights is not None and not path_exists(user_path(str(weights), "weights")):
        raise TuneplanError(f"no checkpoint at {weights}", field="weights",
                            accepted="a local folder with config.json and weights, "
                                     "or leave out for random weights")
    est = estimate(model, setup, **setup_fields)
    result = run_measure(est.model, est.setup, steps=steps, device=device, weights=weights)
    b = est.breakdown
    rows = compare(result, b)
    row = build_record(result, rows, est.model.params_total,
                       {"allocated": b.allocated_peak_bytes, "reserved": b.reserved_peak_bytes,
                        "device": b.device_peak_bytes})
    out: dict[str, Any] = {"measured": result.to_dict(), "estimate": est.to_dict(), "comparison": rows,
                           "record": row}
    if record is not None:
        out["record_path"] = str(append_record(record, row))
    return out
