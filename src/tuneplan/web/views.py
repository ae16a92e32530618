"""HTML and SVG for the page, drawn from the core's ``Estimate.to_dict()``. Formats; computes nothing.

Every number shown comes from the dict the core returns (the same one ``tuneplan estimate --json``
prints). The chart draws the per-GPU components (which sum to the allocated peak), then the allocator's
cache (reserved - allocated), the CUDA context and NCCL (which together make the device peak the core
judges OOM against), against the card's memory. Every user-supplied string is escaped.
"""

from __future__ import annotations

from html import escape
from typing import Any

from tuneplan.estimator.types import COMPONENTS, GIB

# Colour per bar segment (Okabe-Ito palette, readable by colour-blind viewers), in COMPONENTS order.
PALETTE = ("#0072B2", "#56B4E9", "#009E73", "#E69F00", "#D55E00", "#F0E442", "#CC79A7", "#999933",
           "#882255", "#44AA99", "#332288", "#AA4499")
OVERHEAD_COLOURS = {"allocator cache": "#BBBBBB", "runtime": "#777777", "collectives": "#444444"}


def _outside_torch(d: dict[str, Any]) -> tuple[str, str]:
    """The card's names for the memory outside PyTorch (``Accelerator.outside_torch_words``)."""
    words = (d.get("gpu") or {}).get("outside_torch_words") or ("CUDA context", "NCCL")
    return words[0], words[1]
OK, BAD, INFO = "#1a7f37", "#cf222e", "#57606a"


def gib(n: float | int | None) -> str:
    return "-" if n is None else f"{n / GIB:,.2f}"


def message_html(text: str | None) -> str:
    """An input error shown under its fields (empty string: no message); worded by the caller
    (``wording.page_error``)."""
    if not text:
        return ""
    lines = "<br>".join(escape(t) for t in text.splitlines())
    return (f'<div class="tp-error" role="alert" style="color:{BAD};border-left:3px solid {BAD};'
            f'padding:4px 8px;margin:4px 0;font-size:0.9em">{lines}</div>')


def note_html(text: str) -> str:
    return f'<div class="tp-note" style="color:{INFO};font-size:0.85em;margin:2px 0">{escape(text)}</div>'


def verdict_label(d: dict[str, Any]) -> str:
    """FITS / DOES NOT FIT / CANNOT RUN / MEMORY ONLY, from the core's verdict, as the CLI words it."""
    if "gpu" not in d:
        return "MEMORY ONLY"
    return {"fits": "FITS", "cannot_run": "CANNOT RUN"}.get(d.get("verdict") or "", "DOES NOT FIT")


def verdict_html(d: dict[str, Any]) -> str:
    label = verdict_label(d)
    pg, s = d["per_gpu"], d["setup"]
    world = s["gpus"] * s["nodes"]
    where = f" per GPU, {world} GPUs" if world > 1 else ""
    if label == "MEMORY ONLY":
        colour = INFO
        detail = f"device peak {gib(pg['device_peak_bytes'])} GiB{where}; choose a GPU for a verdict"
    else:
        g = d["gpu"]
        colour = OK if label == "FITS" else BAD
        if label == "FITS":
            detail = f"{gib(d['headroom_bytes'])} GiB headroom on {escape(g['name'])}"
            if d.get("allocator_retries"):
                detail += " (the allocator frees cached segments and retries: slower steps)"
        elif label == "CANNOT RUN":
            err = next(f for f in d["findings"] if f["level"] == "error")
            detail = f"on {escape(g['name'])}: {escape(err['message'])}"
        else:
            detail = f"short by {gib(-d['headroom_bytes'])} GiB on {escape(g['name'])}"
        detail += (f" &middot; device peak {gib(pg['device_peak_bytes'])} of {gib(g['memory_bytes'])} GiB"
                   f"{where}")
    m = d["model"]
    what = (f"{escape(m['name'])} &middot; {escape(s['method'])}"
            + (f" {s['bits']}-bit" if s["method"] == "qlora" else "")
            + (f" r={s['rank']}" if s["method"] in ("lora", "qlora") else "")
            + f" &middot; batch {s['batch']} &times; seq {s['seq']}")
    return (f'<div id="tp-verdict-box" data-verdict="{label}" style="border:2px solid {colour};'
            'border-radius:8px;padding:10px 14px">'
            f'<div style="font-size:1.6em;font-weight:700;color:{colour}" class="tp-verdict">{label}</div>'
            f'<div style="margin-top:2px">{detail}</div>'
            f'<div style="color:{INFO};font-size:0.85em;margin-top:4px">{what}</div>{time_headline(d)}</div>')


def error_verdict_html(groups: list[str]) -> str:
    where = ", ".join(groups)
    return (f'<div id="tp-verdict-box" data-verdict="INPUT ERROR" style="border:2px solid {BAD};'
            'border-radius:8px;padding:10px 14px">'
            f'<div style="font-size:1.6em;font-weight:700;color:{BAD}" class="tp-verdict">'
            f'CHECK THE INPUT</div><div>see the message under: {escape(where)}</div></div>')


def bar_segments(d: dict[str, Any]) -> list[tuple[str, int, str]]:
    """(label, bytes, colour) of each stacked segment, in drawing order; zero-byte parts left out."""
    pg = d["per_gpu"]
    comps = pg["components"]
    segs = []
    order = list(COMPONENTS) + [k for k in comps if k not in COMPONENTS]
    for i, k in enumerate(order):
        if comps.get(k):
            segs.append((k, int(comps[k]), PALETTE[i % len(PALETTE)]))
    runtime, collectives = _outside_torch(d)
    cache = pg["reserved_peak_bytes"] - pg["allocated_peak_bytes"]
    for kind, label, n in (("allocator cache", "allocator cache", cache),
                           ("runtime", runtime, pg["cuda_context_bytes"]),
                           ("collectives", collectives, pg.get("nccl_bytes", 0))):
        if n > 0:
            segs.append((label, int(n), OVERHEAD_COLOURS[kind]))
    return segs


STEPS = (1, 2, 5)


def tick_step(max_gib: float, most: int = 6) -> float:
    """A 1-2-5 step in GiB that puts at most ``most`` ticks on the axis."""
    k = 0
    while max_gib / (STEPS[k % 3] * 10 ** (k // 3 - 1)) > most:
        k += 1
    return STEPS[k % 3] * 10 ** (k // 3 - 1)


def chart_svg(d: dict[str, Any], width: int = 640) -> str:
    """One stacked horizontal bar (device peak per GPU) and a line at the card's memory."""
    pg = d["per_gpu"]
    segs = bar_segments(d)
    capacity = d["gpu"]["memory_bytes"] if "gpu" in d else None
    total = pg["device_peak_bytes"]
    scale_max = max(total, capacity or 0) * 1.08 or 1
    left, bar_w, bar_y, bar_h = 10, width - 20, 40, 40
    legend_y = bar_y + bar_h + 40
    height = legend_y + 18 * ((len(segs) + 2) // 3)

    def x(n: float) -> float:
        return left + bar_w * n / scale_max

    parts = [f'<svg id="tp-chart-svg" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
             f'width="100%" role="img" data-device-peak-bytes="{total}" '
             f'data-capacity-bytes="{capacity or ""}" '
             f'style="font-family:sans-serif;font-size:12px;max-width:{width}px">',
             f"<title>Per-GPU device peak {gib(total)} GiB"
             + (f" against {gib(capacity)} GiB" if capacity else "") + "</title>",
             f'<text x="{left}" y="14" font-weight="600">Per-GPU memory at the peak '
             f'({escape(d["peak_instant"])}): {gib(total)} GiB</text>']
    step = tick_step(scale_max / GIB)
    t = 0.0
    while t * GIB <= scale_max:
        tx = x(t * GIB)
        parts.append(f'<line x1="{tx:.2f}" x2="{tx:.2f}" y1="{bar_y + bar_h}" y2="{bar_y + bar_h + 4}" '
                     'stroke="#888"/>'
                     f'<text x="{tx:.2f}" y="{bar_y + bar_h + 16}" text-anchor="middle" fill="#666">{t:g}'
                     '</text>')
        t += step
    parts.append(f'<text x="{left + bar_w}" y="{bar_y + bar_h + 30}" text-anchor="end" fill="#666">GiB'
                 '</text>')
    pos = 0
    for label, n, colour in segs:
        parts.append(f'<rect class="tp-seg" data-component="{escape(label)}" data-bytes="{n}" '
                     f'x="{x(pos):.2f}" '
                     f'y="{bar_y}" width="{x(pos + n) - x(pos):.2f}" height="{bar_h}" fill="{colour}">'
                     f"<title>{escape(label)}: {gib(n)} GiB</title></rect>")
        pos += n
    if capacity:
        cx = x(capacity)
        colour = OK if total <= capacity else BAD
        parts.append(f'<line id="tp-capacity" x1="{cx:.2f}" x2="{cx:.2f}" y1="{bar_y - 6}" '
                     f'y2="{bar_y + bar_h + 6}" '
                     f'stroke="{colour}" stroke-width="2.5" stroke-dasharray="5,3"/>')
        anchor = "end" if cx > width * 0.6 else "start"
        parts.append(f'<text x="{cx + (-4 if anchor == "end" else 4):.2f}" y="{bar_y - 8}" '
                     f'text-anchor="{anchor}" fill="{colour}">{escape(d["gpu"]["name"])}: '
                     f"{gib(capacity)} GiB</text>")
    for i, (label, n, colour) in enumerate(segs):
        lx, row = left + (i % 3) * (bar_w / 3), legend_y + 18 * (i // 3)
        parts.append(f'<rect x="{lx:.1f}" y="{row - 10}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{lx + 14:.1f}" y="{row}">{escape(label)} {gib(n)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def table_html(headers: list[str], rows: list[list[Any]], *, klass: str = "tp-table") -> str:
    th = "".join(f'<th style="text-align:left;padding:3px 8px">{escape(str(h))}</th>' for h in headers)
    td = '<td style="padding:3px 8px;vertical-align:top">'
    body = "".join("<tr>" + "".join(f"{td}{c}</td>" for c in r) + "</tr>" for r in rows)
    return (f'<div style="overflow-x:auto"><table class="{klass}" style="border-collapse:collapse;width:100%;'
            f'font-size:0.9em"><tr>{th}</tr>{body}</table></div>')


def memory_html(d: dict[str, Any], notes: list[str] | None = None) -> str:
    pg = d["per_gpu"]
    rows = [[escape(k), gib(v), escape(COMPONENTS.get(k, ""))] for k, v in pg["components"].items() if v]
    rows += [["<b>allocated peak</b>", f"<b>{gib(pg['allocated_peak_bytes'])}</b>",
              "torch.cuda.max_memory_allocated"],
             ["reserved peak", gib(pg["reserved_peak_bytes"]), "caching allocator (emulated)"],
             [_outside_torch(d)[0], gib(pg["cuda_context_bytes"]), "driver and kernels, outside PyTorch"]]
    if pg.get("nccl_bytes"):
        rows.append([_outside_torch(d)[1], gib(pg["nccl_bytes"]), "communicator buffers"])
    rows.append(["<b>device peak</b>", f"<b>{gib(pg['device_peak_bytes'])}</b>",
                 "what nvidia-smi shows; OOM is judged here"])
    if pg.get("paged_bytes"):
        rows.append(["paged optimizer", gib(pg["paged_bytes"]), "unified memory, pages out instead of OOM"])
    if pg.get("host_bytes"):
        rows.append(["host (CPU) memory", gib(pg["host_bytes"]), "offloaded states / params"])
    out = [table_html(["component", "GiB", "what it is"], rows)]
    instants = " &middot; ".join(f"{escape(k)} {gib(v)}" for k, v in pg["instants"].items())
    if instants:
        out.append(f'<p style="font-size:0.9em">allocated by instant (GiB): {instants}</p>')
    band = pg.get("bands", {}).get("allocated")
    if band:
        out.append(f'<p style="font-size:0.9em">uncertainty: allocated {gib(band["low"])}&ndash;'
                   f'{gib(band["high"])} GiB ({escape(band["why"])})</p>')
    s, src = d["setup"], d.get("setup_sources", {})
    defaults = sorted(k for k, v in src.items() if "default" in v)
    settings = ", ".join(f"{escape(k)}={escape(str(s[k]))}" for k in
                         ("precision", "optimizer", "attn", "gradient_checkpointing", "targets", "framework")
                         if k in s and s[k] is not None)
    used = f"<br>profile defaults used for: {escape(', '.join(defaults))}" if defaults else ""
    out.append(f'<p style="font-size:0.9em">settings: {settings}{used}</p>')
    m = d["model"]
    out.append(f'<p style="font-size:0.9em">{escape(m["name"])}: {m["params_total"] / 1e9:.2f}B parameters, '
               f'{m["params_trainable"] / 1e6:,.1f}M trainable</p>')
    for n in list(d.get("notes", [])) + list(notes or []):
        out.append(note_html(f"note: {n}"))
    return "".join(out)


def findings_html(d: dict[str, Any]) -> str:
    fs = d.get("findings", [])
    if not fs:
        return '<p class="tp-findings-none">No compatibility findings for this model, setup and card.</p>'
    colours = {"error": BAD, "warning": "#9a6700", "info": INFO}
    rows = [[f'<b style="color:{colours.get(f["level"], INFO)}">{escape(f["level"])}</b>', escape(f["code"]),
             escape(f["message"]), escape(f.get("fix", "")), escape(f.get("source", ""))] for f in fs]
    return table_html(["level", "code", "message", "fix", "source"], rows, klass="tp-findings")


def _value(key: str, v: Any, in_bytes: bool = False) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)) and (in_bytes or key.endswith("_bytes") or key == "bytes"):
        return f"{gib(v)} GiB"
    if isinstance(v, float):
        return f"{v:,.4g}"
    return escape(str(v))


def section_html(title: str, sec: Any, *, in_bytes: bool = False) -> str:
    """A section whose keys the core chose: scalars as rows (``*_bytes`` in GiB), lists as notes."""
    if not isinstance(sec, dict):
        return f"<p>{escape(title)}: {escape(str(sec))}</p>"
    rows, extra = [], []
    for k, v in sec.items():
        if isinstance(v, dict):
            extra.append(section_html(f"{title} / {k}", v))
        elif isinstance(v, list):
            extra.extend(note_html(f"{k}: {x}") for x in v)
        elif v is not None:
            rows.append([escape(str(k).replace("_", " ")), _value(str(k), v, in_bytes)])
    head = f"<h4 style='margin:8px 0 4px'>{escape(title)}</h4>"
    return head + (table_html(["quantity", "value"], rows) if rows else "") + "".join(extra)


def time_headline(d: dict[str, Any]) -> str:
    """One line of the time/cost contract's figures (total_hours, tokens_per_second, cloud_usd)."""
    t, c = d.get("time") or {}, d.get("cost") or {}
    parts = []
    if t.get("total_hours") is not None:
        world = d["setup"]["gpus"] * d["setup"]["nodes"]
        parts.append(f"<b>{t['total_hours']:,.2f} h</b> on {world} GPU(s)")
    if t.get("tokens_per_second") is not None:
        parts.append(f"{t['tokens_per_second']:,.0f} tokens/s")
    if c.get("cloud_usd") is not None:
        parts.append(f"cloud <b>${c['cloud_usd']:,.2f}</b>"
                     + (f" (priced as {escape(c['cloud_priced_as'])})" if c.get("cloud_priced_as") else ""))
    elif t.get("total_hours") is not None:
        parts.append("cloud: no price known for this card")
    if c.get("own_usd") is not None:
        parts.append(f"owned card ${c['own_usd']:,.2f}")
    return (f'<div class="tp-time-headline" style="margin-top:4px">{" &middot; ".join(parts)}</div>'
            if parts else "")


def deploy_html(d: dict[str, Any]) -> str:
    """The deployment plan (``tuneplan.deploy.plan_deploy``) as it comes: verdict, memory, speed, disk."""
    out = []
    g, sv = d.get("gpu"), d.get("serving", {})
    if g:
        ok = g.get("fits")
        colour = OK if ok else BAD
        out.append(f'<div id="tp-deploy-verdict" data-verdict="{"SERVES" if ok else "DOES NOT SERVE"}" '
                   f'style="border:1px solid {colour};border-radius:6px;padding:8px">'
                   f'<b style="color:{colour}">{"SERVES" if ok else "DOES NOT SERVE"}</b> '
                   f'on {escape(g["name"])}: '
                   f'{gib(d["per_gpu"]["total"])} of {gib(g["budget_bytes"])} GiB budget per GPU '
                   f'({escape(str(sv.get("format", "")))}, context {sv.get("context")}, '
                   f'{sv.get("concurrency")} sequence(s))'
                   + (f"<br>{escape(g['runs_note'])}" if g.get("runs_note") else "")
                   + f'<br>up to {g.get("max_concurrency_at_context")} sequences at this context; '
                     f'one sequence up to {g.get("max_context_one_sequence")} tokens</div>')
    out.append(section_html("Memory per GPU", d.get("per_gpu", {}), in_bytes=True))
    dec = d.get("decode", {}).get("at_concurrency")
    if dec:
        out.append(section_html("Decode speed (upper bound)", {k: v for k, v in dec.items()}))
    for key, title in (("merge", "Merging the adapter"), ("disk", "Disk")):
        if d.get(key):
            out.append(section_html(title, d[key]))
    out.extend(note_html(f"assumes: {a}") for a in d.get("assumptions", []))
    return "".join(out)
