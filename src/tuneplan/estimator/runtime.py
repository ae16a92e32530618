"""How long and how much: the ``time`` and ``cost`` sections of an estimate.

Tokens: a DatasetSpec gives the rows of ``seq`` tokens computed per epoch (packing or padding to ``seq``);
each optimizer step computes ``batch x seq x grad_accum x GPUs`` of them; steps x step time = hours.
"""

from __future__ import annotations

import math
from operator import itemgetter
from typing import Any

from tuneplan.estimator.cost import CostRates, Prices, cost_rates, cost_section, hourless_section
from tuneplan.estimator.gemm_efficiency import unverified_figures
from tuneplan.estimator.run import Run
from tuneplan.estimator.step_calibration import LABEL, calibration_for, corrected_options, store_path
from tuneplan.estimator.throughput import RuntimeOptions, StepTime, UnknownThroughput, run_step_time
from tuneplan.estimator.time_band import band_section, calibrated_sigmas, part_sigmas
from tuneplan.estimator.types import MemoryBreakdown
from tuneplan.specs.dataset import DatasetSpec
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

# one object: the run's kept time terms match it without a new one per call
DEFAULT_OPTIONS = RuntimeOptions()
_value = itemgetter(1)  # a (name, seconds) pair's seconds: the sections list the parts that take time


def time_and_cost(model: ModelSpec, setup: TrainSetup, acc: Accelerator, dataset: DatasetSpec | None = None,
                  prices: Prices | None = None, options: RuntimeOptions | None = None) -> dict[str, Any]:
    """``{"time": {...}, "cost": {...}}`` for ``setup`` (resolved) on ``setup.world_size`` cards of
    ``acc``."""
    from tuneplan.estimator.run import resolve_run

    return run_time_and_cost(resolve_run(model, setup), acc, dataset, prices, options)


# The parts of an optimizer step (StepTime.breakdown) and the one word each names the step by.
STEP_BOUND_WORDS = {"compute": "compute", "memory_bound": "memory", "communication": "communication",
                    "offload": "offload", "overhead": "overhead"}


def step_bound(breakdown: dict[str, float]) -> str | None:
    """What limits the optimizer step, in one word: its largest part (compute, memory, communication,
    offload, overhead). The one bound the faces show: the micro-batch's own roofline word
    (``StepTime.bound``) can say compute while exposed communication takes most of the step."""
    # the first largest part, as max(breakdown, key=breakdown.__getitem__) picks it, without its key calls
    bound, most = None, 0.0
    for part, seconds in breakdown.items():
        if bound is None or seconds > most:
            bound, most = part, seconds
    return None if bound is None else STEP_BOUND_WORDS.get(bound)


def run_time_and_cost(run: Run, acc: Accelerator, dataset: DatasetSpec | None = None,
                      prices: Prices | None = None, options: RuntimeOptions | None = None,
                      memory: MemoryBreakdown | None = None) -> dict[str, Any]:
    """``time_and_cost`` of a resolved run (``memory``: its analytic breakdown, when the caller has it)."""
    setup = run.setup
    rates, why = card_terms(run, acc, prices)
    opts = options or DEFAULT_OPTIONS
    cal = calibration_for(acc.id, setup.framework)
    try:
        st = st0 = run_step_time(run, acc, opts, memory)
        if cal:
            st = run_step_time(run, acc, corrected_options(opts, cal["factors"]), memory)
    except UnknownThroughput as exc:
        reason = f"time cannot be computed: {exc}"
        t: dict[str, Any] = {k: None for k in ("tokens_per_second", "step_seconds", "total_hours",
                                               "gpu_hours")}
        t["unknown"] = [reason]
        t["assumptions"] = []
        c = cost_section(acc, setup.cards, None, prices, why_no_hours=reason, rates=rates)
        return {"time": t, "cost": c}

    fl = st.flops
    assert fl is not None
    # the step's own dicts, made for this call (run_step_time): the section takes them without a copy
    step_s, breakdown = st.step_seconds, st.breakdown
    sigmas = band_widths(run, st)
    if cal:
        sigmas = calibrated_sigmas(sigmas, set(cal["factors"]), cal["shapes"])
    time: dict[str, Any] = {
        "tokens_per_second": st.tokens_per_second,
        "tokens_per_second_per_gpu": st.tokens_per_second_per_gpu,
        "step_seconds": step_s,
        "micro_batch_seconds": st.micro_batch_seconds,
        "tokens_per_step": st.tokens_per_step,
        "bound": step_bound(breakdown),
        "mfu": st.mfu,
        "flops_per_token": fl.total,
        "flops_per_token_6n": fl.six_n,
        "total_hours": None,
        "gpu_hours": None,
        "components_seconds": dict(filter(_value, st.components.items())),
        "breakdown": breakdown,
        "breakdown_detail": dict(filter(_value, st.breakdown_detail.items())),
        "figures_verified": why is None,
        "card_throughput_known": st.card_known,
        "links": st.links,
        "assumptions": st.assumptions,  # made for this call (run_step_time): the section's own list
    }
    if cal or why or st.breakdown_detail.get("dequantization"):
        add_time_notes(time, setup, acc, st, st0, cal, why)
    gpu_hours = None
    if dataset is not None:
        plan = dataset.plan(setup.seq)
        rows_per_step = setup.batch * setup.grad_accum * setup.world_size
        steps = math.ceil(plan.rows_per_epoch / rows_per_step) * plan.epochs
        seconds = steps * step_s
        time["optimizer_steps"] = steps
        time["total_hours"] = seconds / 3600.0
        time["gpu_hours"] = time["total_hours"] * setup.cards
        time["computed_tokens"] = plan.computed_tokens
        time["trained_tokens"] = plan.real_tokens
        time["trained_tokens_per_second"] = plan.real_tokens / seconds if seconds else None
        time["assumptions"].extend(plan.notes)
        gpu_hours = time["gpu_hours"]
        time["band"] = band_section(step_s, breakdown, sigmas, steps, setup.cards)
    else:
        time["band"] = band_section(step_s, breakdown, sigmas, None, setup.cards)
        time["unknown"] = ["no dataset size: give {samples} (and {avg_tokens}) or {dataset_tokens} for hours"]
        return {"time": time, "cost": hourless_cost(run, acc, prices, rates)}
    return {"time": time, "cost": cost_section(acc, setup.cards, gpu_hours, prices, rates=rates)}


def band_widths(run: Run, st: StepTime) -> dict[str, float]:
    """The parts' widths (``time_band.part_sigmas``) for the card and link of ``st``: shape-independent, kept
    on the run for the last (card's throughput class, link) asked about; never edited (the band copies
    them, a calibration makes new ones)."""
    key = (st.card_known, st.link_name, st.link_stated)
    last = run.memo.get("band_widths")
    if last is None or last[0] != key:
        last = run.memo["band_widths"] = (key, part_sigmas(*key))
    sigmas: dict[str, float] = last[1]
    return sigmas


def add_time_notes(time: dict[str, Any], setup: TrainSetup, acc: Accelerator, st: StepTime, st0: StepTime,
                   cal: dict[str, Any] | None, why: str | None) -> None:
    """The calibration the step carries (with the uncalibrated step beside it), and the notes that lead
    the assumptions: a calibrated machine, unverified card figures, the share of dequantization."""
    if cal:
        time["calibration"] = {"label": LABEL, "factors": dict(cal["factors"]),
                               "measurements": cal["measurements"], "shapes": cal["shapes"],
                               "store": store_path()}
        time["uncalibrated_step_seconds"] = st0.step_seconds
        time["uncalibrated_breakdown"] = dict(st0.breakdown)
        time["assumptions"].insert(0, f"{LABEL}: the rates of each mechanism corrected from "
                                   f"{cal['measurements']} measured step(s) ({store_path()}; "
                                   "`tuneplan calibration list|remove`)")
    if why:
        time["assumptions"].insert(0, f"{acc.name}: the card's throughput figures are not verified ({why})")
    deq = st.breakdown_detail.get("dequantization", 0.0)
    if deq:
        time["assumptions"].append(
            f"{setup.quant_bits}-bit weights: {st.dequant_library} rebuilds a 16-bit copy of every quantized "
            "weight before each matmul that uses it (forward, the input-gradient matmul of backward"
            + (", and the recomputation of gradient checkpointing" if setup.gradient_checkpointing else "")
            + f"): {deq / st.step_seconds:.0%} of the step; this is why it is slower than LoRA on 16-bit "
            "weights")


def hourless_cost(run: Run, acc: Accelerator, prices: Prices | None, rates: CostRates) -> dict[str, Any]:
    """The cost section without a dataset (no hours): it depends on the card, the card count and the prices
    alone, so it is made once per (card, cards, prices) (``cost.hourless_section``), kept on the run next to
    the card's rates (``card_terms``), and copied for each caller (its lists too)."""
    last = run.memo.get("cost")
    if last is None or last[2] is not rates:  # another card asked about meanwhile: nothing to share
        return cost_section(acc, run.setup.cards, None, prices, rates=rates)
    if len(last) == 4:
        last = run.memo["cost"] = (*last, hourless_section(acc, run.setup.cards, prices))
    sec = dict(last[4])
    sec["assumptions"] = list(sec["assumptions"])
    if "unknown" in sec:
        sec["unknown"] = list(sec["unknown"])
    return sec


def card_terms(run: Run, acc: Accelerator, prices: Prices | None) -> tuple[CostRates, str | None]:
    """The card's prices per GPU-hour and why its figures are unverified: shape-independent, kept on the run
    for the last (card, prices) asked about."""
    last = run.memo.get("cost")
    if last is not None and (last[0] is acc or last[0] == acc) and (last[1] is prices or last[1] == prices):
        return last[2], last[3]
    rates, why = cost_rates(acc, prices), unverified_figures(acc)
    run.memo["cost"] = (acc, prices, rates, why)
    return rates, why
