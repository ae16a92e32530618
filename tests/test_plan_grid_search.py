"""The planner's grid search against a brute-force scalar search over the same candidates.

For every family of the space the expected candidate comes from plain ``tuneplan.estimate`` calls, one per
(micro-batch, accumulation) the global batch rule can pick, each at its exact accumulation, with the verdicts
written out here from the estimate's own fields (``fits``, ``breakdown.host_bytes``, the bands): no grid, no
shared cache, no assumption that memory grows with the micro-batch or depends on accumulation only through
"more than one". The rule's three steps are restated here from its docstring.
"""

from __future__ import annotations

import pytest

from tuneplan.api import estimate
from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.plan import fit, rule
from tuneplan.plan.evaluate import Candidate, Prober, default_host_bytes, plan_family
from tuneplan.plan.margin import parse_margin
from tuneplan.plan.space import METHOD_VARIANTS, families

GIB = 2**30


def passes(est, margin_text: str, host_limit: int) -> bool:
    """The planner's verdict, from the estimate's fields: fits, host memory, and the margin (added to what
    the card must hold: the device peak less the free segments the allocator releases before it fails)."""
    if est is None or not est.fits or est.breakdown.host_bytes * est.setup.gpus > host_limit:
        return False
    b, mem = est.breakdown, est.gpu.memory_bytes
    if margin_text == "band":
        need = b.bands["reserved"].high + b.bands["cuda_context"].high + b.nccl_bytes
    elif margin_text.endswith("%"):
        need = b.device_needed_bytes + int(float(margin_text[:-1]) / 100 * mem)
    elif margin_text.endswith("GiB"):
        need = b.device_needed_bytes + int(float(margin_text[:-3]) * GIB)
    else:
        need = b.device_needed_bytes
    return need <= mem


def brute_force(model, gpu, base: dict, fields: dict, target: int, world: int, margin_text: str,
                host_limit: int) -> tuple[int, int, bool] | None:
    """(micro-batch, accumulation, tight) by the global batch rule over every scalar estimate."""
    top = max(1, -(-target // world))
    cache: dict = {}

    def est(b: int, ga: int):
        if (b, ga) not in cache:
            try:
                cache[b, ga] = estimate(model, gpu=gpu, timing=False,
                                        **{**base, **fields, "batch": b, "grad_accum": ga})
            except TuneplanError:  # a setup validation refuses: not fitting
                cache[b, ga] = None
        return cache[b, ga]

    for m, tight in ((margin_text, False), ("0", True)):
        if passes(est(top, 1), m, host_limit):
            return top, 1, tight
        per_gpu = target // world if target % world == 0 else None
        for b in range(top - 1, 0, -1):
            ga = -(-target // (b * world))
            if (per_gpu is None or per_gpu % b == 0) and passes(est(b, ga), m, host_limit):
                return b, ga, tight
        for b in range(top - 1, 0, -1):
            if passes(est(b, 1), m, host_limit):
                return b, 1, tight
    return None


ONE_FAMILY = {"optimizer": "adamw", "gradient_checkpointing": True, "zero": 0, "fsdp": False,
              "offload": "none"}
CASES = [
    # model, card, base setup, variants (method label, fields), global batch, margin
    ("meta-llama/Llama-2-70b-hf", "a100-80gb", {}, [("qlora-4", {"method": "qlora", "bits": 4})], 8, "band"),
    ("meta-llama/Llama-2-7b-hf", "l40s", {}, [("full", {"method": "full"})], 4, "band"),
    ("meta-llama/Llama-2-7b-hf", "rtx-4060", {"seq": 2048}, [("lora", {"method": "lora"})], 8, "band"),
    ("Qwen/Qwen2.5-7B", "rtx4090", {"framework": "unsloth", "seq": 4096},
     [("qlora-4", {"method": "qlora", "bits": 4})], 6, "10%"),
    ("Qwen/Qwen2.5-7B", "t4", {"gpus": 2}, [("qlora-4", {"method": "qlora", "bits": 4})], 7, "2GiB"),
    ("Qwen/Qwen2.5-0.5B", "rtx-3060-12gb", {"seq": 4096}, [("full", {"method": "full"})], 6, "0"),
    # more than 256 micro-batches: the grid grows past its first block while the widest still fits
    ("Qwen/Qwen2.5-0.5B", "h200", {"seq": 64}, [("lora", {"method": "lora"})], 300, "band"),
    ("Qwen/Qwen2.5-0.5B", "rtx4090", {"seq": 1024, **ONE_FAMILY}, [("lora", {"method": "lora"})], 300,
     "band"),
]


@pytest.mark.parametrize("model_id, card, base, variants, target, margin_text", CASES)
def test_every_family_matches_the_brute_force(model_id, card, base, variants, target, margin_text) -> None:
    model, gpu = resolve_model(model_id), resolve_accelerator(card)
    world = base.get("gpus", 1)
    host_limit = default_host_bytes(gpu, world)
    probe = Prober(model, gpu, base)
    kinds: set[str] = set()
    for fam in families(variants, base, world, gpu):
        if probe.compat_errors(fam):  # cannot run: the brute force finds nothing either
            assert brute_force(model, gpu, base, fam.as_fields, target, world, margin_text,
                               host_limit) is None
            continue
        got = plan_family(probe, fam, target=target, world=world, margin=parse_margin(margin_text))
        want = brute_force(model, gpu, base, fam.as_fields, target, world, margin_text, host_limit)
        assert (None if got is None else (got.batch, got.grad_accum, got.tight)) == want, fam
        kinds.add("none" if want is None else ("tight" if want[2] else "margin")
                  + (", accumulation" if want[1] > 1 else "")
                  + (", relaxed" if want[0] * want[1] * world < target else ""))
    assert kinds - {"none"}, kinds  # the case holds at least one candidate
    print(model_id, card, sorted(kinds))


@pytest.mark.parametrize("prefer", ["balanced", "quality", "speed", "cost"])
def test_the_recommendation_is_the_rule_over_the_brute_force_candidates(prefer: str) -> None:
    """fit's recommendation = the rule's pick over every family's brute-force candidate, each timed."""
    model, gpu, target = resolve_model("Qwen/Qwen2.5-0.5B"), resolve_accelerator("rtx-4060"), 4
    host_limit = default_host_bytes(gpu, 1)
    gc_first = estimate(model, gpu=gpu, method="full", timing=False).setup.gradient_checkpointing
    cands = []
    for fam in families(list(METHOD_VARIANTS), {}, 1, gpu, gc_first=gc_first):
        got = brute_force(model, gpu, {}, fam.as_fields, target, 1, "band", host_limit)
        if got is None:
            continue
        b, ga, tight = got
        est = estimate(model, gpu=gpu, **fam.as_fields, batch=b, grad_accum=ga)
        c = Candidate(fam, b, ga, 1, target, est, tight)
        d = est.to_dict()
        tps, price = d["time"]["tokens_per_second"], d["cost"]["cloud_usd_per_gpu_hour"]
        c.metrics = {"tokens_per_second": tps,  # USD per million tokens on one GPU
                     "cloud_usd_per_million_tokens": price / tps / 3600 * 1e6 if price and tps else None}
        cands.append(c)
    want = rule.best(cands, prefer)  # the rule itself is checked by hand in tests/test_plan_rule.py
    assert want is not None
    rec = fit(model, gpu, global_batch=target, prefer=prefer, detail=False).recommended
    assert rec is not None
    assert (rec["method"], rec["strategy"], rec["micro_batch"], rec["grad_accum"], rec["tight"]) == (
        want.family.method, want.family.strategy, want.batch, want.grad_accum, want.tight)
    assert rec["setup"]["optimizer"] == want.estimate.setup.optimizer
    assert rec["setup"]["gradient_checkpointing"] == want.family.gradient_checkpointing
    assert rec["tokens_per_second"] == want.metrics["tokens_per_second"]


def test_a_ranking_shares_nothing_that_depends_on_the_card() -> None:
    """Runs, memory and grids are shared across the cards of one ranking; each card's answer must be the
    one it gets alone (same model and setup, that card only)."""
    from tuneplan.plan import rank_gpus

    cards = ["rtx-3060-12gb", "rtx-4090", "v100-sxm2-32gb", "a100-40gb-sxm4", "ascend-910b", "t4"]
    together = {c.gpu: c.to_dict() for c in rank_gpus("Qwen/Qwen2.5-7B", only=cards, method="lora",
                                                      max_gpus=8).ranking}
    for card in cards:
        alone = rank_gpus("Qwen/Qwen2.5-7B", only=[card], method="lora", max_gpus=8).ranking[0].to_dict()
        assert together[alone["gpu"]] == alone


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tuneplan.catalog.accelerators import catalog_accelerators  # noqa: E402
from tuneplan.plan.max_model import catalog_models  # noqa: E402

SMALL = [m.name for m in catalog_models() if m.params_total < 15e9]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(SMALL), card=st.sampled_from(sorted(catalog_accelerators())),
       gpus=st.sampled_from([1, 2, 8]), target=st.integers(1, 24),
       margin_text=st.sampled_from(["band", "1GiB", "0"]), seq=st.sampled_from([256, 1024, 4096]),
       method=st.sampled_from([label for label, _ in METHOD_VARIANTS]), pick=st.integers(0, 10_000))
def test_any_family_matches_the_brute_force(model, card, gpus, target, margin_text, seq, method,
                                            pick) -> None:
    model, gpu = resolve_model(model), resolve_accelerator(card)
    variant = next(v for v in METHOD_VARIANTS if v[0] == method)
    base = {"gpus": gpus, "seq": seq}
    fams = families([variant], base, gpus, gpu)
    fam = fams[pick % len(fams)]
    probe = Prober(model, gpu, base)
    host = default_host_bytes(gpu, gpus)
    want = brute_force(model, gpu, base, fam.as_fields, target, gpus, margin_text, host)
    if probe.compat_errors(fam):
        assert want is None
        return
    got = plan_family(probe, fam, target=target, world=gpus, margin=parse_margin(margin_text))
    assert (None if got is None else (got.batch, got.grad_accum, got.tight)) == want
