"""Draw a sweep: stacked memory per value with the card's capacity as a line, and time when known.

PNG and SVG go through matplotlib (the optional ``plot`` extra, imported only here, only when asked);
HTML is a self-contained page with an inline SVG drawn here, so it works without matplotlib. Draws the
numbers of a :class:`~tuneplan.plan.sweep.SweepResult`; computes none.
"""

from __future__ import annotations

import html
from pathlib import Path

from tuneplan.errors import TuneplanError
from tuneplan.estimator.types import COMPONENTS, GIB
from tuneplan.plan.sweep import SweepResult

STACK_ORDER = (*COMPONENTS, "allocator_reserve", "cuda_context", "nccl")
FORMATS = ("png", "svg", "html")
# Tableau 10 + grey shades: distinguishable, and the same in both renderers.
PALETTE = ("#4e79a7", "#a0cbe8", "#f28e2b", "#ffbe7d", "#59a14f", "#8cd17d", "#b6992d", "#f1ce63",
           "#499894", "#86bcb6", "#e15759", "#ff9d9a", "#79706e", "#bab0ac", "#d4a6c8")


def _series(res: SweepResult) -> dict[str, list[float]]:
    """GiB per stack part per point, keeping only parts that are ever non-zero."""
    out = {k: [p.stack.get(k, 0) / GIB for p in res.points] for k in STACK_ORDER}
    return {k: v for k, v in out.items() if any(v)}


def _title(res: SweepResult) -> str:
    s = res.setup
    what = s["method"] + (f" {s.get('bits') or 4}-bit" if s["method"] == "qlora" else "")
    gpu = f" on {res.gpu['name']}" if res.gpu else ""
    return f"{res.model} {what}{gpu}: per-GPU device memory vs {res.variable}"


def write_plot(res: SweepResult, path: str | Path, *, force: bool = False) -> Path:
    """Draw to ``path`` atomically; an existing file or a symbolic link only with ``force`` (safe_write)."""
    from tuneplan.safe_write import check_targets, write_bytes, write_text

    p = Path(path)
    fmt = p.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise TuneplanError(f"cannot draw {p.name!r}", field="plot", accepted="a .png, .svg or .html file")
    check_targets([p], force=force, field="plot")
    if fmt == "html":
        return write_text(p, to_html(res), force=force, field="plot")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TuneplanError("PNG/SVG plots need matplotlib", field="plot",
                            accepted="pip install 'tuneplan[plot]', or write a .html plot (no extra "
                                     "needed)") from None
    series = _series(res)
    x = list(range(len(res.points)))
    labels = [str(pt.value) for pt in res.points]
    hours = [pt.total_hours for pt in res.points]
    has_time = any(h is not None for h in hours)
    fig, axes = plt.subplots(2 if has_time else 1, 1, figsize=(9, 7 if has_time else 5), squeeze=False,
                             sharex=True)
    ax = axes[0][0]
    bottom = [0.0] * len(x)
    for i, (k, v) in enumerate(series.items()):
        ax.bar(x, v, bottom=bottom, label=k, color=PALETTE[i % len(PALETTE)])
        bottom = [a + b for a, b in zip(bottom, v, strict=True)]
    if res.capacity_bytes:
        ax.axhline(res.capacity_bytes / GIB, color="black", linestyle="--",
                   label=f"{res.gpu['name']} ({res.capacity_bytes / GIB:.1f} GiB)")
    ax.set_ylabel("GiB per GPU")
    ax.set_title(_title(res), fontsize=10)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    if has_time:
        ax2 = axes[1][0]
        ax2.plot(x, [h if h is not None else float("nan") for h in hours], marker="o")
        ax2.set_ylabel("hours")
    axes[-1][0].set_xticks(x, labels)
    axes[-1][0].set_xlabel(res.variable)
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format=fmt)
    plt.close(fig)
    return write_bytes(p, buf.getvalue(), force=force, field="plot")


def to_html(res: SweepResult) -> str:
    """A page with an inline SVG stacked-bar chart and the numbers as a table."""
    series = _series(res)
    n = len(res.points)
    w, h, left, top, bottom_m = 760, 360, 60, 30, 40
    cap = res.capacity_bytes / GIB if res.capacity_bytes else 0.0
    ymax = max([cap] + [pt.device_peak_bytes / GIB for pt in res.points] + [1e-9]) * 1.08
    bw = (w - left - 20) / max(n, 1)

    def y(v: float) -> float:
        return top + (h - top - bottom_m) * (1 - v / ymax)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w + 180}" height="{h}" '
             f'font-family="sans-serif" font-size="11">']
    for i, pt in enumerate(res.points):
        acc = 0.0
        x0 = left + i * bw + bw * 0.1
        for j, (k, vals) in enumerate(series.items()):
            v = vals[i]
            if v <= 0:
                continue
            parts.append(f'<rect x="{x0:.1f}" y="{y(acc + v):.1f}" width="{bw * 0.8:.1f}" '
                         f'height="{y(acc) - y(acc + v):.1f}" fill="{PALETTE[j % len(PALETTE)]}">'
                         f'<title>{html.escape(k)}: {v:.2f} GiB</title></rect>')
            acc += v
        parts.append(f'<text x="{x0 + bw * 0.4:.1f}" y="{h - bottom_m + 15}" text-anchor="middle">'
                     f'{pt.value}</text>')
    for t in range(6):
        v = ymax * t / 5
        parts.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.0f}</text>')
    parts.append(f'<line x1="{left}" y1="{y(0):.1f}" x2="{w - 20}" y2="{y(0):.1f}" stroke="black"/>')
    if cap:
        parts.append(f'<line x1="{left}" y1="{y(cap):.1f}" x2="{w - 20}" y2="{y(cap):.1f}" stroke="black" '
                     f'stroke-dasharray="6,4"/><text x="{w - 20}" y="{y(cap) - 4:.1f}" text-anchor="end">'
                     f'{html.escape(res.gpu["name"])} {cap:.1f} GiB</text>')
    parts.append(f'<text x="{left + (w - left) / 2}" y="{h - 6}" text-anchor="middle">{res.variable}</text>')
    parts.append(f'<text x="14" y="{top + (h - top) / 2}" transform="rotate(-90 14 {top + (h - top) / 2})" '
                 f'text-anchor="middle">GiB per GPU</text>')
    for j, k in enumerate(series):
        parts.append(f'<rect x="{w}" y="{top + j * 16}" width="10" height="10" '
                     f'fill="{PALETTE[j % len(PALETTE)]}"/>'
                     f'<text x="{w + 14}" y="{top + j * 16 + 9}">{html.escape(k)}</text>')
    parts.append("</svg>")
    rows = "".join(
        f"<tr><td>{pt.value}</td><td>{pt.device_peak_bytes / GIB:.2f}</td>"
        f"<td>{'yes' if pt.fits else 'no'}</td>"
        f"<td>{'-' if pt.total_hours is None else f'{pt.total_hours:.3g}'}</td></tr>" for pt in res.points)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(_title(res))}</title>"
            "</head>"
            f"<body><h3>{html.escape(_title(res))}</h3>{''.join(parts)}"
            f"<table border='1' cellpadding='3'><tr><th>{res.variable}</th><th>device peak GiB</th>"
            "<th>fits</th>"
            f"<th>hours</th></tr>{rows}</table></body></html>")
