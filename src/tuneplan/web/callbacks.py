"""The page's callbacks as plain functions: form values in, HTML strings (or file paths) out.

No gradio here: ``page.py`` wires these to widgets, tests call them directly. Each one asks the core
(``tuneplan.api.estimate``, the planner, the exporters) and formats the answer with ``views``; a bad
input becomes a message in the slot next to its fields, and an unexpected failure is logged on the
server and shown as one line, never a traceback, so the server keeps serving.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from tuneplan.errors import TuneplanError, plain_words, word_texts
from tuneplan.web import views
from tuneplan.web.form import GROUPS, Parsed, group_of, parse
from tuneplan.web.wording import page_error, page_words

log = logging.getLogger("tuneplan.web")

# Outputs of the main update, in the order the page lists its components.
ESTIMATE_OUTPUTS = ("model_msg", "setup_msg", "hardware_msg", "dataset_msg", "verdict", "chart", "memory",
                    "findings", "time")


def _messages(errors: dict[str, str]) -> dict[str, str]:
    return {f"{g}_msg": views.message_html(errors.get(g)) for g in GROUPS}


def guarded(slot: str, outputs: tuple[str, ...] | None = None
            ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Turn any exception a callback raises into a message in ``slot`` (and log the traceback); the
    callback runs as for a machine elsewhere (``plan.host.elsewhere``)."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from tuneplan.plan.host import elsewhere

            try:
                with elsewhere():  # the host memory is the user's, never this server's
                    return fn(*args, **kwargs)
            except TuneplanError as exc:
                msg = views.message_html(page_error(exc))
            except Exception as exc:  # a bug must not take the page down: log it, say so in one line
                log.exception("web callback %s failed", fn.__name__)
                msg = views.message_html(f"internal error ({type(exc).__name__}: {exc}); "
                                         "logged on the server")
            if outputs is None:
                return msg
            return {name: (msg if name == slot else "") for name in outputs}

        return wrapper

    return deco


def dataset_kwargs(p: Parsed) -> dict[str, Any]:
    """``dataset=DatasetSpec(...)`` for ``estimate`` when the form gives a dataset size, else nothing.

    The DatasetSpec is made by the planner's contract module (``tuneplan.plan.timecost``), the one place
    that knows how the time model is asked.
    """
    if p.samples is None:
        return {}
    from tuneplan.plan.timecost import dataset_kw, make_dataset

    ds = make_dataset(samples=p.samples, avg_tokens=p.avg_tokens, epochs=p.epochs, packing=p.packing)
    if ds is not None and hasattr(ds, "validate"):
        ds.validate()
    return dataset_kw(ds)


def _estimate(p: Parsed, extra: dict[str, Any]) -> Any:
    from tuneplan.api import estimate

    return estimate(p.model, gpu=p.gpu, **p.setup_kw, **extra)


@guarded("setup_msg", ESTIMATE_OUTPUTS)
def estimate_view(values: dict[str, Any]) -> dict[str, str]:
    """The main update: messages, verdict, chart, memory table, findings, time and cost."""
    p = parse(values)
    out = _messages(p.errors)
    blocking = [g for g in GROUPS if g in p.errors and g != "dataset"]
    if blocking:
        out.update(verdict=views.error_verdict_html(blocking), chart="", memory="", findings="", time="")
        return out
    extra: dict[str, Any] = {}
    if "dataset" not in p.errors:
        try:
            extra = dataset_kwargs(p)
        except TuneplanError as exc:  # time and cost are then left out; the verdict still shows
            out["dataset_msg"] = views.message_html(page_error(exc))
    try:
        est = _estimate(p, extra)
    except TuneplanError as exc:
        g = group_of(exc.field)
        out[f"{g}_msg"] = views.message_html(page_error(exc))
        out.update(verdict=views.error_verdict_html([g]), chart="", memory="", findings="", time="")
        return out
    d = word_texts(est.to_dict(), page_words)  # the core's field references as the page's labels
    out.update(verdict=views.verdict_html(d), chart=views.chart_svg(d), memory=views.memory_html(d, p.notes),
               findings=views.findings_html(d), time=time_html(d))
    return out


def time_html(d: dict[str, Any]) -> str:
    secs = [views.section_html(k.capitalize(), d[k]) for k in ("time", "cost") if d.get(k)]
    if secs:
        return views.time_headline(d) + "".join(secs)
    return '<p class="tp-wait">Choose a GPU: time and cost depend on the card.</p>'


def estimate_dict(values: dict[str, Any]) -> dict[str, Any]:
    """``Estimate.to_dict()`` for the form (the page's JSON API); raises TuneplanError on bad input."""
    p = parse(values)
    blocking = {g: m for g, m in p.errors.items() if g != "dataset"}
    if blocking:
        raise TuneplanError("; ".join(blocking.values()), field=next(iter(blocking)))
    return word_texts(_estimate(p, {} if "dataset" in p.errors else dataset_kwargs(p)).to_dict(), plain_words)


def read_upload(data: bytes | None) -> tuple[str, str]:
    """An uploaded config.json's bytes -> (its text for the config box, a message for the model slot).

    The page asks Gradio for the upload's bytes (``type="binary"``), never for a path: a path named by
    the client is not something this function could be tricked into opening.
    """
    from tuneplan.web.limits import PASTE_MAX_BYTES

    if not data:
        return "", ""
    if not isinstance(data, (bytes, bytearray)):
        return "", views.message_html("config: the upload did not arrive as a file; "
                                      "upload the model's config.json")
    if len(data) > PASTE_MAX_BYTES:
        return "", views.message_html(f"config: the file is {len(data):,} bytes; a config.json is a few KiB "
                                      f"(at most {PASTE_MAX_BYTES // 1024} KiB here)")
    try:
        return bytes(data).decode("utf-8"), ""
    except UnicodeDecodeError:
        return "", views.message_html("config: the file is not UTF-8 text; upload the model's config.json")
