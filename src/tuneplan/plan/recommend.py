"""The recommendation: the rule's first candidate, why, the knob for the margin, and the command line."""

from __future__ import annotations

import shlex
from typing import Any

import numpy as np

from tuneplan.api import build_setup
from tuneplan.estimator.types import GIB
from tuneplan.plan import rule
from tuneplan.plan.candidates import CandidateSet
from tuneplan.plan.evaluate import Candidate, Prober
from tuneplan.plan.margin import Margin
from tuneplan.plan.search import largest_true
from tuneplan.plan.space import LABELS, strategy_name, switches
from tuneplan.specs.dataset import DatasetSpec
from tuneplan.specs.fields import FIELDS, Field
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup


def command(probe: Prober, c: Candidate) -> str:
    """The `tuneplan estimate` line that reproduces a candidate (:func:`setup_command`)."""
    return setup_command(probe.model, probe.gpu, c.estimate.setup, probe.timing_kw.get("dataset"))


def setup_command(model: ModelSpec, gpu: Accelerator, s: TrainSetup,
                  dataset: DatasetSpec | None = None) -> str:
    """The `tuneplan estimate` line of a setup on a card: the setup's own fields, not a difference.

    The method, its sizes and the card count are always written (they are what a reader looks for);
    every other field is written where `estimate` given the flags so far would resolve it to another
    value (a profile default that differs from the chosen one, e.g. checkpointing off where the
    profile turns it on for QLoRA), until the line resolves to the chosen setup field by field.
    Fields with no flag (read from training files only) follow as a shell comment, so the line stays
    runnable and says what it cannot carry."""
    given = _core_fields(s)
    for _ in range(len(FIELDS)):  # each round pins at least one field, so this ends
        resolved = build_setup(model, None, accelerator=gpu, **given)
        missing = {f.name: getattr(s, f.name) for f in FIELDS
                   if f.flag and f.name not in given and getattr(resolved, f.name) != getattr(s, f.name)}
        if not missing:
            break
        given.update(missing)
    words = ["tuneplan", "estimate", model.name, "--gpu", gpu.id]
    if gpu.origin != "catalog":
        words += ["--hardware-file", gpu.origin]
    for f in FIELDS:
        if f.name in given:
            words += _flag_words(f, given[f.name])
    words += _dataset_words(dataset)
    line = " ".join(shlex.quote(str(w)) for w in words)
    unreached = [f"{f.name}={getattr(s, f.name)}" for f in FIELDS
                 if not f.flag and getattr(resolved, f.name) != getattr(s, f.name)]
    return line + (f"  # also, from the training files: {', '.join(unreached)}" if unreached else "")


def _core_fields(s: TrainSetup) -> dict[str, Any]:
    """What a command always shows: method (and QLoRA bits, LoRA rank), micro-batch, accumulation, tokens
    per sample, and more than one GPU or node."""
    core: dict[str, Any] = {"method": s.method}
    if s.method == "qlora":
        core["bits"] = s.quant_bits
    if s.is_lora:
        core["rank"] = s.rank
    core.update(batch=s.batch, grad_accum=s.grad_accum, seq=s.seq)
    core.update({k: getattr(s, k) for k in ("gpus", "nodes") if getattr(s, k) > 1})
    return core


def _flag_words(f: Field, value: Any) -> list[str]:
    """A field's value as the words of its flag: ``--x`` / ``--no-x`` for a switch (its declaration
    ``--x/--no-x``), else the first name and the value."""
    names = f.flag[0].split("/")
    if f.is_switch:
        return [names[0] if value else names[-1]]
    return [names[0], str(value)]


def _dataset_words(ds: DatasetSpec | None) -> list[str]:
    """The dataset flags of the time model (``cli/time_options.py``), for the same totals."""
    if ds is None:
        return []
    words: list[str] = []
    for name in ("samples", "avg_tokens", "dataset_tokens"):
        if getattr(ds, name) is not None:
            words += ["--" + name.replace("_", "-"), str(getattr(ds, name))]
    if ds.epochs != 1.0:
        words += ["--epochs", str(ds.epochs)]
    return words + (["--packing"] if ds.packing else [])


def restore_knob(probe: Prober, c: Candidate, margin: Margin) -> dict[str, Any] | None:
    """For a tight candidate: the longest sequence at micro-batch 1 that keeps the margin, if any."""
    fields = {**c.family.as_fields, "batch": 1, "grad_accum": 1}
    seq = c.estimate.setup.seq
    if seq <= 1:
        return None
    best = largest_true(lambda s: probe.ok(margin)(probe({**fields, "seq": s})), 1, seq - 1)
    return {"field": "seq", "from": seq, "to": best, "flag": f"--seq {best}"} if best else None


def on_paper(probe: Prober, c: Candidate, top: int) -> int:
    """The largest micro-batch (up to ``top``) that fits without the margin at the candidate's
    accumulation regime: read off the family's grid (the one its candidate came from)."""
    grid = probe.grid(c.family.as_fields, top)
    if grid is None or c.batch >= top:
        return c.batch
    fit = np.flatnonzero(probe.passes(grid, None, int(c.grad_accum > 1))[:top])
    return max(c.batch, int(fit[-1]) + 1) if fit.size else c.batch


def _passed_over(choice: rule.Choice, limits: rule.Limits) -> list[str]:
    """Why each more faithful method was not taken, in words (its figures are the estimator's)."""
    out, no_fit = [], []
    for p in choice.passed_over or []:
        label, why = LABELS[p["method"]], p["why"]
        if why == "no_fit":
            no_fit.append(label)
        elif why == "max_slowdown" and p["slowdown"]:
            out.append(f"more faithful {label} runs {p['slowdown']:.1f}x slower than the fastest plan, "
                       f"beyond the {limits.max_slowdown:g}x slowdown limit")
        elif why == "max_hours":
            hours = f" ({p['total_hours']:,.3g} h)" if p["total_hours"] is not None else ""
            out.append(f"more faithful {label} takes longer{hours} than the {limits.max_hours:g} h limit")
        elif why == "budget":
            usd = f" ({p['cloud_usd']:,.2f} USD)" if p["cloud_usd"] is not None else " (no price known)"
            out.append(f"more faithful {label} costs more{usd} than the {limits.budget_usd:g} USD budget")
        elif why == "tight":
            out.append(f"more faithful {label} fits only without the margin")
        elif why == "relaxed":
            out.append(f"more faithful {label} reaches only a smaller global batch")
    if no_fit:
        out.insert(0, f"more faithful {', '.join(no_fit)} does not fit")
    return out


def recommendation(probe: Prober, cs: CandidateSet, baseline: Any, margin: Margin, target: int,
                   world: int, rule_line: str, choice: rule.Choice | None = None) -> dict[str, Any] | None:
    choice = choice if choice is not None else cs.decide()
    c = choice.chosen
    if c is None:
        return None
    est = c.estimate
    why = [f"{LABELS[c.family.method]} ({strategy_name(est.setup)})"
           + ("; " + "; ".join(passed) if (passed := _passed_over(choice, cs.limits)) else "")]
    slow, fast = choice.slowdown(), choice.fastest
    if slow is not None and fast is not None and slow > 1 + rule.NEAR:
        why.append(f"{slow:.1f}x slower than the fastest plan ({LABELS[fast.family.method]}, "
                   f"{strategy_name(fast.estimate.setup)}, {rule.tps_of(fast):,.0f} tokens/s)")
    names, _ = switches(est.setup, baseline)
    if names:
        why.append("switches " + ", ".join(names))
    if c.relaxed:
        why.append(f"no candidate reaches the global batch {target}: relaxed to {c.global_batch}, the "
                   "largest that fits (accumulation itself does not fit)")
    elif c.global_batch != target:
        why.append(f"{world} GPU(s) cannot split {target} evenly: global batch {c.global_batch}")
    why.append(f"micro-batch {c.batch} x accumulation {c.grad_accum} x {world} GPU(s) = {c.global_batch}")
    knob = None
    if c.tight:
        knob = restore_knob(probe, c, margin)
        why.append("tight: fits on paper but not with the margin ("
                   + (f"a sequence of {knob['to']} restores it" if knob
                      else "no setting on this card restores it: more GPUs or a larger card") + ")")
    else:
        paper = on_paper(probe, c, max(1, -(-target // world)))
        if paper > c.batch:
            knob = {"field": "batch", "from": paper, "to": c.batch, "flag": f"--batch {c.batch}"}
            why.append(f"micro-batch {paper} fits on paper, {c.batch} keeps the margin")
    m = c.metrics
    tps = m.get("tokens_per_second")
    if c.family.offload != "none" and tps:
        why.append(f"CPU offload: {tps:,.0f} tokens/s (no plan of this method runs without it)")
    assert est.gpu is not None  # the prober passes its card to every estimate
    why.append(f"{(est.gpu.memory_bytes - c.device_peak_high_bytes) / GIB:.2f} GiB left at the upper band")
    return {
        "method": c.family.method, "strategy": strategy_name(est.setup),
        "command": command(probe, c), "setup": est.setup.to_dict(), "requires": names,
        "micro_batch": c.batch, "grad_accum": c.grad_accum, "world_size": world,
        "global_batch": c.global_batch, "target_global_batch": target, "relaxed": c.relaxed,
        "device_peak_bytes": est.breakdown.device_peak_bytes,
        "device_peak_high_bytes": c.device_peak_high_bytes,
        "headroom_bytes": est.headroom_bytes, "host_bytes": est.breakdown.host_bytes,
        "tight": c.tight, "restore": knob, **m, "rule": rule_line, "reason": "; ".join(why),
        "decided_by": choice.decided_by, "slowdown": slow, "passed_over": choice.passed_over,
        "fastest": None if fast is None else {"method": fast.family.method,
                                              "strategy": strategy_name(fast.estimate.setup),
                                              "tokens_per_second": rule.tps_of(fast)},
    }
