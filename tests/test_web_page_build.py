"""web/page.py: the model and card pickers, and the page's widgets (built, not launched)."""

from __future__ import annotations

from collections import Counter

import pytest

from tuneplan import resolve_accelerator
from tuneplan.catalog.models import catalog_entries
from tuneplan.errors import TuneplanError

pytest.importorskip("gradio", reason="the web page needs the [web] extra")

from tuneplan.web.page import build_app, gpu_choices, model_choices  # noqa: E402


@pytest.fixture(scope="module")
def demo():
    return build_app()


def elem_ids(demo) -> list[str]:
    return [b.elem_id for b in demo.blocks.values() if getattr(b, "elem_id", None)]


def test_model_choices_are_the_catalog_sorted():
    ids = [e.hf_id for e in catalog_entries()]
    assert model_choices() == sorted(ids)


def test_gpu_choices_families_first_then_every_card_by_memory():
    choices = gpu_choices()
    assert choices[0][1] == ""  # memory only, no card
    families = [(label, v) for label, v in choices[1:] if "pick one by its memory" in label]
    cards = choices[1 + len(families):]
    assert families and cards
    for _, family in families:  # a name sold in several memory sizes is refused, as on the command line
        with pytest.raises(TuneplanError):
            resolve_accelerator(family)
    memories = [resolve_accelerator(card_id).memory_bytes for _, card_id in cards]
    assert memories == sorted(memories)


def test_the_inputs_and_tabs_are_on_the_page(demo):
    ids = set(elem_ids(demo))
    for widget in ("tp-model", "tp-config", "tp-method", "tp-gpu", "tp-verdict", "tp-tab-fit", "tp-tab-gpus",
                   "tp-tab-deploy", "tp-tab-export"):
        assert widget in ids, widget


def test_element_ids_are_unique(demo):
    # an HTML id names one element: the browser tests and the page's CSS select by it
    repeated = [i for i, n in Counter(elem_ids(demo)).items() if n > 1]
    assert repeated == []
