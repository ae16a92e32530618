"""The Gradio page: widgets and wiring only. Every answer comes from ``callbacks`` (plain functions).

Each input's ``change`` event re-runs the estimate (``trigger_mode="always_last"``: while a user types,
only the latest value is computed), so there is no submit button; the planner tabs listen to the same
events on their own, so a slower search never delays the verdict.
"""

from __future__ import annotations

from typing import Any

from tuneplan.web import callbacks, exports, limits, planner_tabs
from tuneplan.web.form import AUTO, CHOICES, DEFAULTS, FIELDS, GENERATED, widget_kind
from tuneplan.web.wording import LABELS

TITLE = "tuneplan: will this fine-tune fit?"
# Fonts the browser already has: the page makes no request beyond the server it came from.
FONTS = ["system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica", "Arial", "sans-serif"]
MONO = ["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"]


def gradio_major() -> int:
    import gradio as gr

    return int(gr.__version__.split(".")[0])


def theme() -> Any:
    import gradio as gr

    return gr.themes.Default(font=FONTS, font_mono=MONO)


def model_choices() -> list[str]:
    from tuneplan.catalog.models import catalog_entries

    return sorted(e.hf_id for e in catalog_entries())


def gpu_choices() -> list[tuple[str, str]]:
    """The card picker: every card, after one entry per card model sold in several memory sizes, so that
    typing "v100" and Enter picks the model's name (which the core refuses, listing the sizes, as the CLI
    does), never the first variant in the list."""
    from tuneplan.catalog.accelerators import accelerators, memory_families
    from tuneplan.web.views import gib

    cards = sorted(accelerators().values(), key=lambda a: (a.memory_bytes, a.name))
    families = [(f"{fam.upper()}: {len(ids)} cards, pick one by its memory below", fam)
                for fam, ids in memory_families().items()]
    return ([("none: memory only", "")] + families
            + [(f"{a.name} ({gib(a.memory_bytes)} GiB)", a.id) for a in cards])


def build_app() -> Any:
    """The page as a ``gradio.Blocks`` (not launched)."""
    import gradio as gr

    # Gradio's copies of uploads and of exported files go after an hour, checked every 10 minutes.
    blocks_kw: dict[str, Any] = {"title": TITLE, "analytics_enabled": False,
                                 "delete_cache": (600, int(limits.SESSION_TTL_S))}
    if gradio_major() < 6:  # Gradio 6 moved theme to launch(); see tuneplan.web.launch
        blocks_kw["theme"] = theme()
    w: dict[str, Any] = {}
    with gr.Blocks(**blocks_kw) as demo:
        gr.Markdown(f"## {TITLE}\nPer-GPU peak memory, compatibility, time and cost of an LLM fine-tune, "
                    "computed by the same core as the `tuneplan` command. Change any field; the answer "
                    "follows.")
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=320):
                w.update(_model_inputs(gr))
                w.update(_setup_inputs(gr))
                w.update(_hardware_inputs(gr))
                w.update(_dataset_inputs(gr))
            with gr.Column(scale=3, min_width=420):
                w["verdict"] = gr.HTML(elem_id="tp-verdict")
                w["chart"] = gr.HTML(elem_id="tp-chart")
                w["active_tab"] = gr.State("memory", time_to_live=limits.SESSION_TTL_S)
                with gr.Tabs():
                    tabs = {}
                    with gr.Tab("Memory", elem_id="tp-tab-memory") as tabs["memory"]:
                        w["memory"] = gr.HTML(elem_id="tp-memory")
                    with gr.Tab("Findings", elem_id="tp-tab-findings") as tabs["findings"]:
                        w["findings"] = gr.HTML(elem_id="tp-findings")
                    with gr.Tab("Time & cost", elem_id="tp-tab-time") as tabs["time"]:
                        w["time"] = gr.HTML(elem_id="tp-time")
                    tabs.update(planner_tabs.build(gr, w))
        inputs = [w[f] for f in FIELDS]
        triggers = [demo.load] + [w[f].change for f in FIELDS]

        def update(*vals: Any) -> tuple[str, ...]:
            out = callbacks.estimate_view(dict(zip(FIELDS, vals, strict=True)))
            return tuple(out[k] for k in callbacks.ESTIMATE_OUTPUTS)

        gr.on(triggers, update, inputs=inputs, outputs=[w[k] for k in callbacks.ESTIMATE_OUTPUTS],
              api_name="estimate", show_progress="hidden", trigger_mode="always_last", concurrency_limit=8)
        planner_tabs.wire(gr, w, tabs, triggers, inputs)
        w["method"].change(_method_applies, w["method"], [w["bits"], w["rank"], w["targets"]],
                           show_progress="hidden", api_name=False)
        demo.unload(_session_ended)
        w["upload"].upload(callbacks.read_upload, w["upload"], [w["config_text"], w["model_msg"]],
                           show_progress="hidden", api_name=False)
    return demo


def _session_ended() -> None:
    """The tab closed: its recipe folder goes (the downloads it was offered are Gradio's own copies)."""
    exports.end_session()


def _method_applies(method: str) -> tuple[Any, Any, Any]:
    """Fields that do not apply to the method are greyed out (and not passed, see form.setup_kwargs).

    Greyed, not hidden: Gradio 6 re-mounts a hidden Radio without drawing its selected button.
    """
    import gradio as gr

    lora = method in ("lora", "qlora")
    return gr.update(interactive=method == "qlora"), gr.update(interactive=lora), gr.update(interactive=lora)


def _dropdown(gr: Any, name: str, label: str, info: str | None = None, **kw: Any) -> Any:
    return gr.Dropdown(list(CHOICES[name]), value=DEFAULTS[name], label=label, info=info,
                       elem_id=f"tp-{name}", **kw)


def _number(gr: Any, name: str, label: str, **kw: Any) -> Any:
    return gr.Number(value=DEFAULTS[name], label=label, elem_id=f"tp-{name}", **kw)


def _generated(gr: Any, f: Any) -> Any:
    """The widget a field-table row names (``Field.widget``), labelled and explained from the row."""
    kw = {"label": LABELS[f.name], "elem_id": f"tp-{f.name}"}
    kind = widget_kind(f)
    if kind == "checkbox":
        return gr.Checkbox(value=DEFAULTS[f.name], info=f.help, **kw)
    if kind == "number":
        return gr.Number(value=DEFAULTS[f.name], info=f.cli_help(), **kw)
    if kind == "radio":
        return gr.Radio(list(CHOICES[f.name]), value=DEFAULTS[f.name], info=f.help, **kw)
    if kind == "dropdown":
        return gr.Dropdown(list(CHOICES[f.name]), value=DEFAULTS[f.name], info=f.help, **kw)
    return gr.Textbox(value=DEFAULTS[f.name], info=f.cli_help(), **kw)


def _model_inputs(gr: Any) -> dict[str, Any]:
    w: dict[str, Any] = {}
    gr.Markdown("#### Model")
    with gr.Group():
        w["model"] = gr.Dropdown(model_choices(), value=DEFAULTS["model"], label=LABELS["model"],
                                 allow_custom_value=True, elem_id="tp-model",
                                 info="type to search the catalog, or enter a Hugging Face id")
        with gr.Accordion("...or paste / upload a config.json", open=False):
            w["config_text"] = gr.Code(value="", language="json",
                                       label="config.json (overrides the model above)",
                                       lines=6, interactive=True, elem_id="tp-config")
            w["upload"] = gr.UploadButton("Upload config.json", file_types=[".json"], type="binary",
                                          size="sm", elem_id="tp-upload")
    w["model_msg"] = gr.HTML(elem_id="tp-model-msg")
    return w


def _setup_inputs(gr: Any) -> dict[str, Any]:
    w: dict[str, Any] = {}
    gr.Markdown("#### Training")
    with gr.Group():
        with gr.Row():
            w["method"] = gr.Radio(list(CHOICES["method"]), value=DEFAULTS["method"], label=LABELS["method"],
                                   elem_id="tp-method", scale=3)
            w["bits"] = gr.Radio(list(CHOICES["bits"]), value=DEFAULTS["bits"], label=LABELS["bits"],
                                 elem_id="tp-bits",
                                 scale=1, interactive=DEFAULTS["method"] == "qlora")
        with gr.Row():
            w["rank"] = _number(gr, "rank", LABELS["rank"])
            w["targets"] = _dropdown(gr, "targets", LABELS["targets"], allow_custom_value=True)
        with gr.Row():
            w["batch"] = _number(gr, "batch", LABELS["batch"])
            w["seq"] = _number(gr, "seq", LABELS["seq"])
            w["grad_accum"] = _number(gr, "grad_accum", LABELS["grad_accum"])
        with gr.Accordion("Precision, optimizer, attention, framework", open=False):
            with gr.Row():
                w["precision"] = _dropdown(gr, "precision", LABELS["precision"])
                w["optimizer"] = _dropdown(gr, "optimizer", LABELS["optimizer"])
            with gr.Row():
                w["gradient_checkpointing"] = _dropdown(gr, "gradient_checkpointing",
                                                        LABELS["gradient_checkpointing"])
                w["attn"] = _dropdown(gr, "attn", LABELS["attn"])
            with gr.Row():
                w["loss"] = _dropdown(gr, "loss", LABELS["loss"],
                                      info="upcast | chunked | fused | fused-linear (Liger)")
                w["compile"] = gr.Checkbox(value=DEFAULTS["compile"], label=LABELS["compile"],
                                           elem_id="tp-compile")
                w["activation_offload"] = gr.Checkbox(value=DEFAULTS["activation_offload"],
                                                      label=LABELS["activation_offload"],
                                                      elem_id="tp-act-offload")
            w["num_labels"] = gr.Textbox(value=DEFAULTS["num_labels"], label=LABELS["num_labels"],
                                         placeholder="empty: language-model head; "
                                         "N: a classifier / reward head",
                                         elem_id="tp-num-labels")
            w["framework"] = _dropdown(gr, "framework", LABELS["framework"],
                                       info=f"'{AUTO}' fields take this framework's defaults")
        if GENERATED:  # setup fields the field table gives a widget and this page no place of its own
            with gr.Accordion("More settings", open=False):
                w.update({f.name: _generated(gr, f) for f in GENERATED})
    w["setup_msg"] = gr.HTML(elem_id="tp-setup-msg")
    return w


def _hardware_inputs(gr: Any) -> dict[str, Any]:
    w: dict[str, Any] = {}
    gr.Markdown("#### Hardware")
    with gr.Group():
        w["gpu"] = gr.Dropdown(gpu_choices(), value=DEFAULTS["gpu"], label=LABELS["gpu"],
                               allow_custom_value=True, elem_id="tp-gpu",
                               info="type to search; loose names like 4090 or a100-40g work")
        with gr.Row():
            w["gpus"] = _number(gr, "gpus", LABELS["gpus"])
            w["nodes"] = _number(gr, "nodes", LABELS["nodes"])
        with gr.Row():
            w["zero"] = _dropdown(gr, "zero", LABELS["zero"])
            w["fsdp"] = gr.Checkbox(value=DEFAULTS["fsdp"], label=LABELS["fsdp"], elem_id="tp-fsdp")
            w["offload"] = _dropdown(gr, "offload", LABELS["offload"])
    w["hardware_msg"] = gr.HTML(elem_id="tp-hardware-msg")
    return w


def _dataset_inputs(gr: Any) -> dict[str, Any]:
    w: dict[str, Any] = {}
    gr.Markdown("#### Dataset (for time and cost)")
    with gr.Group():
        with gr.Row():
            w["samples"] = _number(gr, "samples", LABELS["samples"])
            w["avg_tokens"] = gr.Textbox(value="", label=LABELS["avg_tokens"],
                                         placeholder="empty: each fills seq", elem_id="tp-avg_tokens")
        with gr.Row():
            w["epochs"] = _number(gr, "epochs", LABELS["epochs"], step=0.5)
            w["packing"] = gr.Checkbox(value=DEFAULTS["packing"], label=LABELS["packing"],
                                       elem_id="tp-packing")
    w["dataset_msg"] = gr.HTML(elem_id="tp-dataset-msg")
    return w
