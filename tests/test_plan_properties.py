"""Property tests of the planner's invariants over random catalog models, cards and GPU counts.

The checker (tuneplan.plan.invariants.violations) states structure only: a recommendation if and only
if a row fits, every fitting row in the candidate set, the recommendation is a row and keeps the
margin whenever a candidate does. Separately, the recommendation's upper band is recomputed here from
a fresh estimate's bands. Kept to a few dozen fits (about a minute of CI).
"""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tuneplan.api import estimate  # noqa: E402
from tuneplan.catalog.accelerators import catalog_accelerators  # noqa: E402
from tuneplan.plan import fit  # noqa: E402
from tuneplan.plan.invariants import violations  # noqa: E402
from tuneplan.plan.max_model import catalog_models  # noqa: E402

MODELS = [m for m in catalog_models() if m.params_total < 20e9]  # larger ones cost minutes of CI each
CARDS = sorted(catalog_accelerators())
METHODS = [None, "full", "lora", "qlora", "freeze"]


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(MODELS), card=st.sampled_from(CARDS), gpus=st.sampled_from([1, 2, 8]),
       method=st.sampled_from(METHODS), global_batch=st.sampled_from([1, 7, 16, 64]))
def test_fit_invariants_hold_anywhere(model, card, gpus, method, global_batch) -> None:
    kw = {"gpus": gpus} | ({"method": method} if method else {})
    d = fit(model, card, global_batch=global_batch, detail=False, **kw).to_dict()
    assert violations(d) == []
    rec = d["recommended"]
    if rec is None:
        return
    s = {k: v for k, v in rec["setup"].items()
         if v is not None and not (k == "bits" and rec["setup"]["method"] != "qlora")}
    e = estimate(model, gpu=card, timing=False, **s)
    b = e.breakdown
    high = b.bands["reserved"].high + b.bands["cuda_context"].high + b.nccl_bytes
    assert e.fits and high == rec["device_peak_high_bytes"]
    assert rec["tight"] or high <= e.gpu.memory_bytes
    assert rec["micro_batch"] * rec["grad_accum"] * gpus == rec["global_batch"]
    if not rec["relaxed"]:
        assert rec["global_batch"] >= global_batch
