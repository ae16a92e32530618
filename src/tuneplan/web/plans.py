"""The planner tabs' callbacks (best config, GPU ranking, recipe export), as plain functions.

Each calls the same function as its CLI command (``tuneplan.plan.fit``, ``tuneplan.plan.gpus``,
``tuneplan.export``, ``tuneplan.deploy.plan``), imported when the tab is first used. Results are
rendered from their ``to_dict()``, so the page shows what the planner decided and decides nothing
itself.
"""

from __future__ import annotations

import logging
from html import escape
from pathlib import Path
from typing import Any

from tuneplan.errors import TuneplanError, word_texts
from tuneplan.web import views
from tuneplan.web.callbacks import guarded
from tuneplan.web.form import Parsed, parse
from tuneplan.web.wording import LABELS, page_error, page_words

log = logging.getLogger("tuneplan.web")

TIGHT = "#9a6700"  # amber border: a recommendation that fits only on paper
# plan.rule.PREFERS (not imported: the planner loads lazily)
PREFERS = ("balanced", "quality", "speed", "cost")


def _ready(values: dict[str, Any], *, need_gpu: bool) -> tuple[Parsed | None, str]:
    """The parsed form, or the reason this tab cannot answer yet (already shown next to the fields)."""
    p = parse(values)
    bad = [g for g in p.errors if g != "dataset"]
    if bad:
        return None, ('<p class="tp-wait">Fix the input first (see the message under: '
                      f'{escape(", ".join(bad))}).</p>')
    if need_gpu and p.gpu is None:
        return None, '<p class="tp-wait">Choose a GPU: this tab plans for a card.</p>'
    return p, ""


def _gib_cells(d: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    out = []
    for k in keys:
        v = d.get(k)
        if v is None or v == "":  # a method that cannot run has no strategy: "" in the planner's dict
            out.append("-")
        elif isinstance(v, bool):
            out.append("yes" if v else "no")
        elif k.endswith("_bytes"):
            out.append(views.gib(v))
        elif isinstance(v, float):
            out.append(f"{v:,.2f}")
        elif isinstance(v, list):
            out.append(escape(", ".join(map(str, v))) or "-")
        else:
            out.append(escape(str(v)))
    return out


# The form's values that mean "not set" for the planner: the CLI passes no such flag, so the planner
# searches the axis (strategy, offload, framework) instead of pinning it.
UNSET_FOR_PLANNER = {"zero": 0, "fsdp": False, "offload": "none", "framework": "hf"}


def planner_setup(p: Parsed) -> dict[str, Any]:
    """The setup fields ``fit`` gets from the form, as the CLI's flags would pass them: every method is
    tried, the planner chooses the sizes, and a strategy field left at the form's default is not pinned."""
    return {k: v for k, v in p.setup_kw.items()
            if k not in ("method", "bits", "batch", "grad_accum")
            and not (k in UNSET_FOR_PLANNER and v == UNSET_FOR_PLANNER[k])}


def _dataset(p: Parsed) -> dict[str, Any]:
    """The form's data size for the planner (time and cost), or nothing when its fields are not valid."""
    from tuneplan.web.callbacks import dataset_kwargs

    if "dataset" in p.errors:
        return {}
    try:
        return dataset_kwargs(p)
    except TuneplanError:
        return {}  # the message is already under the dataset fields


def _hours(v: Any) -> str:
    return "-" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


def _tokens_per_second(v: Any) -> str:
    return "-" if v is None else f"{v:,.0f}"


@guarded("fit")
def fit_view(values: dict[str, Any], global_batch: Any = 16, prefer: str | None = "balanced") -> str:
    """The best configuration on the chosen card(s): the planner's ``fit`` with the CLI's defaults, its
    recommendation, and the trade-off per method (quality rank, time, cost, peak and its band)."""
    from tuneplan.plan.fit import fit

    p, why = _ready(values, need_gpu=True)
    if p is None:
        return why
    from tuneplan.web.form import whole

    extra = _dataset(p)
    d = fit(p.model, p.gpu, global_batch=whole("global_batch", global_batch), prefer=prefer or "balanced",
            **extra, **planner_setup(p)).to_dict()
    out = [_recommended_html(d)]
    # Two tables, not one of twelve columns: one that wide is cut off on the right of the page's results
    # column at 1280 px (tests/test_web_e2e.py measures it).
    keys = ("method", "fits", "strategy", "requires", "micro_batch", "grad_accum", "device_peak_bytes",
            "device_peak_high_bytes")
    rows = []
    for m in d.get("methods", []):
        cells = _gib_cells(m, keys)
        cells[1] = "tight" if m.get("tight") else cells[1]
        rows.append(cells + [str(m.get("quality_rank", "-"))])
    out.append(views.table_html(["method", "fits", "strategy", "switch on", "micro-batch", "accum",
                                 "peak GiB", "upper band GiB", "quality"], rows, klass="tp-fit"))
    blocked = sorted({msg for m in d.get("methods", []) for msg in m.get("blocked_by") or []})
    out += [views.note_html(f"cannot run: {msg}") for msg in blocked]  # note_html escapes
    lim = [[escape(m["method"]), _tokens_per_second(m.get("tokens_per_second")), _hours(m.get("total_hours")),
            *_gib_cells(m, ("cloud_usd", "max_batch", "max_seq", "max_rank", "host_bytes"))]
           for m in d.get("methods", []) if m.get("fits")]
    if lim:
        out.append(views.table_html(["method", "tokens/s", "hours", "cloud USD", "max batch", "max seq",
                                     "max rank", "host GiB"], lim, klass="tp-fit-limits"))
    eq = d.get("equal_memory")
    if eq and eq.get("qlora"):
        ranks = ", ".join(f"{k} up to r={v}" for k, v in eq["qlora"].items() if v)
        out.append(views.note_html(f"In the memory LoRA r={eq.get('lora_rank')} uses, {ranks}"
                                   if ranks else ""))
    h = d.get("host_memory") or {}
    src = {"given": "given", "this machine": "this machine's RAM",
           "cloud instance": f"as a cloud {h.get('instance')}"}.get(h.get("source", ""), "assumed")
    out.append(views.note_html(f"host memory {views.gib(d.get('host_memory_bytes'))} GiB per node "
                               f"({src}); {len(d.get('candidates', []))} candidates, "
                               f"{d.get('evaluations', '?')} estimates evaluated"))
    return "".join(out)


def _framework_html(fw: dict[str, Any]) -> str:
    """The framework profile of the answer, when the planner took another than the form's (as `fit`)."""
    if not fw.get("chosen") or fw["chosen"] == fw.get("default"):
        return ""
    why = {"max_hours": "every plan breaks the hours limit", "budget": "every plan breaks the budget"}.get(
        fw.get("default_decided_by") or "", "nothing fits")
    searched = escape(", ".join(fw.get("searched", [])))
    return (f"<br><b>{escape(LABELS['framework'])} {escape(str(fw['chosen']))}</b>: {why} with "
            f"{escape(str(fw.get('default')))}, the form's (searched: {searched})")


def _next_step_html(step: dict[str, Any] | None, host_bytes: Any) -> str:
    """What is closest to fitting, and the one change that makes something fit (`fit`'s next step), with
    the change named by the page's label (the page has no host-memory field: the CLI's flag sets it)."""
    if not step:
        return ""
    how = f"{escape(str(step['method']))} ({escape(str(step['strategy']))})"
    short = (f"host memory short by {views.gib(step['short_by_bytes'])} GiB for {how}"
             if step["short_of"] == "host"
             else f"{views.gib(step['short_by_bytes'])} GiB over the card with {how}, micro-batch 1")
    if step.get("largest_component") and step["short_of"] == "device":
        short += (f"; largest component {escape(str(step['largest_component']))} "
                  f"{views.gib(step['largest_component_bytes'])} GiB")
    ch = step.get("change")
    if ch is None:
        change = ("no single change of sequence length, host memory, method or GPUs per node makes it fit: "
                  "the GPUs tab searches more cards")
    else:
        to = ch["to"]
        if ch["field"] == "host_memory":
            what = (f"{escape(str(to))} GiB of host memory per node (the page assumes "
                    f"{views.gib(host_bytes)} GiB; the CLI's --host-memory sets it)")
        elif ch["field"] == "method" and str(to).startswith("qlora-"):
            what = escape(f"{page_words('method', 'qlora')} with {page_words('bits', str(to).split('-')[1])}")
        else:
            what = escape(page_words(ch["field"], str(to)) or f"{ch['field']} {to}")
        change = (f"next step: {what} fits ({escape(str(ch['method']))}, {escape(str(ch['strategy']))}, "
                  f"peak {views.gib(ch['device_peak_bytes'])} GiB)")
    return f"<br>closest: {short}<br>{change}"


def _recommended_html(d: dict[str, Any]) -> str:
    rec = d.get("recommended")
    if not rec:
        return (f'<div id="tp-fit-recommended" style="color:{views.BAD}"><b>No method fits</b> on this card '
                "with these settings, anywhere in the candidate space."
                + _next_step_html(d.get("next_step"), d.get("host_memory_bytes")) + "</div>")
    tight = " (tight: fits on paper, not with the margin)" if rec.get("tight") else ""
    tps = rec.get("tokens_per_second")
    return (f'<div id="tp-fit-recommended" style="border:1px solid {TIGHT if rec.get("tight") else views.OK};'
            f'border-radius:6px;padding:8px"><b>Recommended{tight}:</b> {escape(str(rec.get("method")))} '
            f'({escape(str(rec.get("strategy")))}), micro-batch {rec.get("micro_batch")} '
            f'&times; accumulation {rec.get("grad_accum")} &times; {rec.get("world_size")} GPU(s) = '
            f'{rec.get("global_batch")} sequences per step; '
            f'device peak {views.gib(rec.get("device_peak_bytes"))} GiB '
            f'(upper band {views.gib(rec.get("device_peak_high_bytes"))} GiB)'
            + (f"; {_tokens_per_second(tps)} tokens/s" if tps else "")
            + (f"; {_hours(rec.get('total_hours'))} h" if rec.get("total_hours") is not None else "")
            + '<br><code style="white-space:normal;word-break:break-word">'
            f'{escape(str(rec.get("command", "")))}</code><br><span style="font-size:0.9em">'
            f'{escape(str(rec.get("reason", "")))}<br>rule: {escape(str(d.get("rule", "")))}'
            + _framework_html(d.get("framework") or {}) + "</span></div>")


@guarded("gpus")
def gpus_view(values: dict[str, Any], prefer: str | None = "quality") -> str:
    """Every card in the catalog ranked for this fine-tune (fewest cards, memory, time, cost)."""
    from tuneplan.plan.gpus import rank_gpus as rank

    p, why = _ready(values, need_gpu=False)
    if p is None:
        return why
    setup = dict(p.setup_kw)
    fixed = setup["gpus"] * setup["nodes"] > 1
    if not fixed:  # one GPU on the form: let the planner find the fewest cards of each kind
        setup.pop("gpus")
        setup.pop("nodes")
    extra = _dataset(p)
    d = rank(p.model, prefer=prefer or "quality", **setup, **extra).to_dict()
    keys = ("name", "fits", "min_gpus", "method", "per_gpu_peak_bytes", "memory_bytes", "strategy",
            "requires", "tokens_per_second", "total_hours", "cloud_usd", "own_usd", "break_even_hours")
    rows = [_gib_cells(r, keys) for r in d.get("ranking", [])]
    head = (f"{setup['gpus'] * setup['nodes']} GPUs per setup, as on the form" if fixed
            else "fewest cards of each kind that run this setup (up to "
            + escape(str(d.get("max_gpus"))) + ")")
    out = [f'<p style="font-size:0.9em">{head}; sorted by {escape(str(d.get("sort")))}'
           + ("" if d.get("time_model") else "; time and cost need the time/cost layer") + "</p>",
           views.table_html(["card", "fits", "cards", "method", "peak GiB", "card GiB", "strategy",
                             "switch on", "tokens/s", "hours", "cloud USD", "own USD", "break-even h"], rows,
                            klass="tp-gpus"),
           views.note_html(f"rule: {d.get('rule', '')}"),
           views.note_html(f"{d.get('evaluations', '?')} estimates evaluated")]
    return "".join(out)


def serve_precisions() -> tuple[str, ...]:
    from tuneplan.deploy.formats import SERVE_PRECISIONS

    return tuple(SERVE_PRECISIONS)


def export_formats() -> tuple[str, ...]:
    from tuneplan.export import FORMATS

    return tuple(FORMATS)


def _fresh_export_dir() -> Path:
    """A new folder for one click's files, made by this process (``tuneplan.web.exports``)."""
    from tuneplan.web.exports import fresh_folder

    return fresh_folder()


def export_files(values: dict[str, Any], formats: list[str] | tuple[str, ...] | None = None
                 ) -> tuple[list[str], str]:
    """Recipe files for the form's setup (``tuneplan.export.build_export``): (paths, message)."""
    from tuneplan.export import build_export

    try:
        return _export(build_export, values, list(formats or ()))
    except TuneplanError as exc:  # e.g. the setup cannot run on the card: no recipe for it
        return [], views.message_html(page_error(exc))
    except Exception as exc:  # noqa: BLE001 - same contract as guarded(): logged, one line
        log.exception("export failed")
        return [], views.message_html(f"internal error ({type(exc).__name__}: {exc}); logged on the server")


def _export(build_export: Any, values: dict[str, Any], formats: list[str]) -> tuple[list[str], str]:
    from tuneplan.api import build_setup, estimate
    from tuneplan.export import DEFAULT_NAMES

    if not formats or not all(isinstance(f, str) for f in formats):
        return [], views.message_html("format: choose at least one recipe format")
    p, why = _ready(values, need_gpu=False)
    if p is None:
        return [], why
    # estimated once for all the formats
    plan = estimate(p.model, build_setup(p.model, None, **p.setup_kw), gpu=p.gpu, timing=False)
    out_dir = _fresh_export_dir()
    written: dict[str, None] = {}
    notes: list[str] = []
    for fmt in formats:
        bundle = build_export(fmt, plan, out_dir / DEFAULT_NAMES.get(fmt, fmt))
        for path, text in bundle.files:
            Path(path).write_text(text, encoding="utf-8")
            written[str(path)] = None
        notes += word_texts(bundle.notes, page_words)
    msg = "".join(views.note_html(n) for n in dict.fromkeys(notes))
    names = ", ".join(Path(f).name for f in written)
    return list(written), views.note_html(f"{len(written)} file(s): {names}") + msg


@guarded("deploy")
def deploy_view(values: dict[str, Any], serve_precision: str = "bf16", context: Any = 4096,
                concurrency: Any = 1) -> str:
    """Serving the fine-tuned model: merge, memory per GPU, KV cache, decode speed bound, disk."""
    from tuneplan.deploy.plan import plan_deploy

    p, why = _ready(values, need_gpu=False)
    if p is None:
        return why
    from tuneplan.web.form import whole

    kw = {k: v for k, v in p.setup_kw.items() if k not in ("gpus", "nodes", "zero", "fsdp", "offload")}
    d = plan_deploy(p.model, serve_precision=serve_precision or "bf16", context=whole("context", context),
                    concurrency=whole("concurrency", concurrency), gpu=p.gpu, cards=False, **kw)
    return views.deploy_html(d)
