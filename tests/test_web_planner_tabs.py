"""web/planner_tabs.py: the planner tabs' widgets offer what the core accepts, and each tab's search is one
named API endpoint (built inside a bare page, not launched)."""

from __future__ import annotations

import pytest

gr = pytest.importorskip("gradio", reason="the web page needs the [web] extra")

from tuneplan.deploy.formats import SERVE_PRECISIONS  # noqa: E402
from tuneplan.export import FORMATS as EXPORT_FORMATS  # noqa: E402
from tuneplan.plan.rule import PREFERS  # noqa: E402
from tuneplan.web import planner_tabs  # noqa: E402
from tuneplan.web.form import FIELDS  # noqa: E402


@pytest.fixture(scope="module")
def page():
    w: dict = {}
    with gr.Blocks() as demo:
        w["active_tab"] = gr.State("memory")
        inputs = [gr.Textbox(label=name) for name in FIELDS]
        with gr.Tabs():
            tabs = planner_tabs.build(gr, w)
        planner_tabs.wire(gr, w, tabs, [inputs[0].change], inputs)
    return demo, w, tabs


def choices(component) -> list[str]:
    return [value for _, value in component.choices]


def test_the_four_tabs(page):
    _, _, tabs = page
    assert set(tabs) == {"fit", "gpus", "deploy", "export"}


def test_widgets_offer_what_the_core_accepts(page):
    _, w, _ = page
    assert choices(w["prefer"]) == list(PREFERS)
    assert choices(w["serve_precision"]) == list(SERVE_PRECISIONS)
    assert set(choices(w["export_formats"])) == set(EXPORT_FORMATS)
    assert w["global_batch"].value == 16 and w["context"].value == 4096


def test_each_search_is_one_named_endpoint_and_the_rest_private(page):
    demo, _, _ = page
    assert set(demo.get_api_info()["named_endpoints"]) == {"/fit", "/gpus", "/deploy", "/export"}
