"""Widgets and wiring of the planner tabs (best config, GPUs, deploy, export); callbacks live in ``plans``.

A search over many estimates (fit, the GPU ranking) runs only while its tab is open: opening the tab
computes it, and field changes recompute it then; otherwise the tab is left as it was, so typing in a
field costs one estimate, not a search of the whole catalog.
"""

from __future__ import annotations

from typing import Any

from tuneplan.web import plans
from tuneplan.web.form import FIELDS


def build(gr: Any, w: dict[str, Any]) -> dict[str, Any]:
    """Add the tabs inside the page's ``gr.Tabs``; components go into ``w``; returns the tabs by name."""
    tabs = {}
    with gr.Tab("Best config", elem_id="tp-tab-fit") as tabs["fit"]:
        with gr.Row():
            w["global_batch"] = gr.Number(value=16,
                                          label="Target global batch (sequences per optimizer step)",
                                          elem_id="tp-global-batch")
            w["prefer"] = gr.Dropdown(list(plans.PREFERS), value="balanced",
                                      label="Objective (also ranks the GPUs tab)", elem_id="tp-prefer")
        w["fit"] = gr.HTML(elem_id="tp-fit")
    with gr.Tab("GPUs", elem_id="tp-tab-gpus") as tabs["gpus"]:
        w["gpus_rank"] = gr.HTML(elem_id="tp-gpus-rank")
    with gr.Tab("Deploy", elem_id="tp-tab-deploy") as tabs["deploy"]:
        with gr.Row():
            w["serve_precision"] = gr.Dropdown(list(plans.serve_precisions()), value="bf16", label="Serve at",
                                               elem_id="tp-serve-precision")
            w["context"] = gr.Number(value=4096, label="Context (tokens)", elem_id="tp-context")
            w["concurrency"] = gr.Number(value=1, label="Concurrent sequences", elem_id="tp-concurrency")
        w["deploy"] = gr.HTML(elem_id="tp-deploy")
    with gr.Tab("Export", elem_id="tp-tab-export") as tabs["export"]:
        gr.Markdown("Recipe files for the setup on the left (training script / configs), ready to run.")
        formats = plans.export_formats()
        w["export_formats"] = gr.CheckboxGroup(list(formats), value=list(formats[:1]), label="Formats",
                                               elem_id="tp-export-formats")
        w["export_btn"] = gr.Button("Build recipe files", elem_id="tp-export-btn")
        w["export_msg"] = gr.HTML(elem_id="tp-export-msg")
        w["export_files"] = gr.File(label="Recipe files", file_count="multiple", interactive=False,
                                    elem_id="tp-export-files")
    return tabs


def _setter(name: str) -> Any:
    return lambda: name


def wire(gr: Any, w: dict[str, Any], tabs: dict[str, Any], triggers: list[Any], inputs: list[Any]) -> None:
    """Opening a tab computes it; field changes recompute the open one, each as its own request."""
    active = w["active_tab"]
    for name, tab in tabs.items():
        tab.select(_setter(name), None, active, show_progress="hidden", api_name=False)

    def fit(*vals: Any) -> str:
        return plans.fit_view(dict(zip(FIELDS, vals[:-2], strict=True)), vals[-2], vals[-1])

    def gpus(*vals: Any) -> str:
        return plans.gpus_view(dict(zip(FIELDS, vals[:-1], strict=True)), vals[-1])

    def when_open(tab: str, fn: Any) -> Any:
        def run(current: str, *vals: Any) -> Any:
            return fn(*vals) if current == tab else gr.update()

        return run

    fit_inputs = inputs + [w["global_batch"], w["prefer"]]
    tabs["fit"].select(fit, fit_inputs, w["fit"], show_progress="hidden", api_name="fit")
    gr.on(triggers + [w["global_batch"].change, w["prefer"].change], when_open("fit", fit),
          inputs=[active] + fit_inputs, outputs=w["fit"], show_progress="hidden", trigger_mode="always_last",
          concurrency_limit=4, api_name=False)
    gpus_inputs = inputs + [w["prefer"]]
    tabs["gpus"].select(gpus, gpus_inputs, w["gpus_rank"], show_progress="hidden", api_name="gpus")
    gr.on(triggers, when_open("gpus", gpus), inputs=[active] + gpus_inputs, outputs=w["gpus_rank"],
          show_progress="hidden", trigger_mode="always_last", concurrency_limit=4, api_name=False)

    def deploy(*vals: Any) -> str:
        n = len(FIELDS)
        return plans.deploy_view(dict(zip(FIELDS, vals[:n], strict=True)), *vals[n:])

    deploy_inputs = inputs + [w["serve_precision"], w["context"], w["concurrency"]]
    deploy_triggers = triggers + [w[k].change for k in ("serve_precision", "context", "concurrency")]
    tabs["deploy"].select(deploy, deploy_inputs, w["deploy"], show_progress="hidden", api_name="deploy")
    gr.on(deploy_triggers, when_open("deploy", deploy), inputs=[active] + deploy_inputs, outputs=w["deploy"],
          show_progress="hidden", trigger_mode="always_last", concurrency_limit=4, api_name=False)

    def export(*vals: Any) -> tuple[Any, str]:
        paths, msg = plans.export_files(dict(zip(FIELDS, vals[:-1], strict=True)), vals[-1])
        return (paths or None), msg

    w["export_btn"].click(export, inputs + [w["export_formats"]], [w["export_files"], w["export_msg"]],
                          api_name="export")
