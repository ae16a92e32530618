"""The placement formula against transformers' own code: each model built from its config on the meta
device, sized by ``compute_module_sizes`` and placed by ``_get_device_map`` (what ``from_pretrained(...,
device_map=...)`` runs), for several architectures, card counts and rules."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.integrations.accelerate import _get_device_map, compute_module_sizes  # noqa: E402

from tuneplan.api import build_setup  # noqa: E402
from tuneplan.catalog.models import resolve_model  # noqa: E402
from tuneplan.estimator.placement import CPU, balanced_budgets, module_tree, place  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402
from tuneplan.simulate.build import hf_config  # noqa: E402

# (model, what it exercises, free bytes per card: small enough that the layers spread over every card)
MODELS = [
    ("meta-llama/Llama-3.2-1B", "Llama, tied head", 1.2 * 2**30),
    ("Qwen/Qwen2.5-0.5B", "Qwen2, tied head, embedding larger than a layer", 0.5 * 2**30),
    ("mistralai/Mistral-7B-v0.1", "Mistral, untied head", 5.5 * 2**30),
    ("google/gemma-2b", "Gemma, tied 256k embedding", 2.2 * 2**30),
    ("mistralai/Mixtral-8x7B-v0.1", "MoE: fused experts in one no-split block", 36 * 2**30),
]


@pytest.fixture(autouse=True)
def _quiet_accelerate():
    # accelerate warns for each card index this CPU machine lacks; the cards here are hypothetical
    log = logging.getLogger("accelerate.utils.modeling")
    level = log.level
    log.setLevel(logging.ERROR)
    yield
    log.setLevel(level)


_BUILT: dict[str, object] = {}


def meta_model(name: str):
    if name not in _BUILT:
        with torch.device("meta"):
            _BUILT[name] = AutoModelForCausalLM.from_config(hf_config(resolve_model(name), "sdpa"),
                                                            dtype=torch.bfloat16)
    return _BUILT[name]


def transformers_cards(model, rule: str, free: float, n: int, quantizer=None) -> dict[str, int]:
    found = _get_device_map(model, rule, {k: free for k in range(n)}, quantizer)
    return {k: (v if isinstance(v, int) else CPU) for k, v in found.items()}


def card_of(found: dict[str, int], name: str) -> int:
    key = name
    while key not in found and key:
        key = key.rsplit(".", 1)[0] if "." in key else ""
    return found.get(key, CPU)


def units(tree) -> list[str]:
    out, todo = [], [tree]
    while todo:
        m = todo.pop(0)
        if m.kind:
            out.append(m.name)
        todo = list(m.children) + todo
    return out


def formula(name: str, rule: str, free: float, n: int, **kw) -> tuple[object, dict[str, int]]:
    spec = resolve_model(name)
    run = resolve_run(spec, build_setup(spec, method=kw.pop("method", "lora"), gpus=n, device_map=rule, **kw))
    tree = module_tree(run.model, run.setup, run.dtypes)
    budgets = balanced_budgets(tree, [free] * n, rule, run.setup.quant_bits is not None)
    where = place(tree, budgets)
    return tree, {u: card_of(where, u) for u in units(tree)}


@pytest.mark.parametrize("name,what,free", MODELS, ids=[m[0].split("/")[1] for m in MODELS])
def test_module_sizes_match_compute_module_sizes(name: str, what: str, free: float) -> None:
    model = meta_model(name)
    sizes, _ = compute_module_sizes(model)
    tree, _ = formula(name, "auto", free, 2)
    for m in [tree, *tree.children, *tree.children[0].children, tree.children[0].children[1].children[0]]:
        # Gemma's embedding carries a 0-d embed_scale buffer (2 bytes) the formula leaves out
        assert abs(m.size - sizes[m.name]) <= 2, (m.name, m.size, sizes[m.name])


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("name,what,free", MODELS, ids=[m[0].split("/")[1] for m in MODELS])
def test_layer_to_card_matches_transformers(name: str, what: str, free: float, n: int) -> None:
    model = meta_model(name)
    theirs = transformers_cards(model, "auto", free, n)
    _, mine = formula(name, "auto", free, n)
    assert {u: card_of(theirs, u) for u in mine} == mine
    assert len({c for u, c in mine.items() if u.startswith("model.layers.")}) > 1  # really split


@pytest.mark.parametrize("rule", ["balanced_low_0", "sequential"])
def test_other_rules_match_transformers(rule: str) -> None:
    name, free = "mistralai/Mistral-7B-v0.1", 5.5 * 2**30
    theirs = transformers_cards(meta_model(name), rule, free, 3)
    _, mine = formula(name, rule, free, 3)
    assert {u: card_of(theirs, u) for u in mine} == mine


def test_unbounded_cards_match_transformers() -> None:
    """No card given: the balancing cap alone splits the model (2**62 bytes stands for unbounded there)."""
    name = "mistralai/Mistral-7B-v0.1"
    theirs = transformers_cards(meta_model(name), "auto", float(2**62), 2)
    _, mine = formula(name, "auto", float("inf"), 2)
    assert {u: card_of(theirs, u) for u in mine} == mine


def test_a_model_too_large_spills_as_transformers_does() -> None:
    name, free = "mistralai/Mistral-7B-v0.1", 3 * 2**30
    theirs = transformers_cards(meta_model(name), "auto", free, 2)
    _, mine = formula(name, "auto", free, 2)
    assert CPU in mine.values()
    assert {u: card_of(theirs, u) for u in mine} == mine


@pytest.mark.parametrize("n", [2, 3])
def test_4bit_placement_matches_transformers_quantizer(n: int) -> None:
    """QLoRA: transformers' Bnb4BitHfQuantizer sizes the linear weights at 0.5 byte per element and keeps 90 %
    of each budget; the simulate engine's stand-in answers only whether a weight is quantized (an nn.Linear
    outside the head), which needs bitsandbytes in transformers."""
    from transformers.quantizers.base import get_keys_to_not_convert

    from tuneplan.simulate.device_map import _quantizer

    name, free = "Qwen/Qwen2.5-7B", 3 * 2**30
    spec = resolve_model(name)
    setup = build_setup(spec, method="qlora", gpus=n, device_map="auto")
    model = meta_model(name)
    q = _quantizer(setup, torch)
    q.kept = get_keys_to_not_convert(model)
    theirs = transformers_cards(model, "auto", free, n, q)
    _, mine = formula(name, "auto", free, n, method="qlora")
    assert {u: card_of(theirs, u) for u in mine} == mine


@pytest.mark.slow  # runs a simulated training step
def test_simulate_engine_reports_the_check() -> None:
    from tuneplan.api import estimate

    est = estimate("Qwen/Qwen2.5-7B", method="qlora", gpu="rtx4090", gpus=2, device_map="auto",
                   engine="simulate")
    assert est.breakdown.notes[0].startswith("simulate: transformers placed the model itself")
    assert "agrees with the formula's on every module" in est.breakdown.notes[0]
    assert len(est.breakdown.per_card) == 2


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("name,what,free", MODELS[:4], ids=[m[0].split("/")[1] for m in MODELS[:4]])
def test_the_walk_matches_accelerates_own_walk(name: str, what: str, free: float, n: int) -> None:
    """accelerate.utils.infer_auto_device_map (accelerate 1.x, what transformers 4.x called) walks the modules
    as transformers 5's copy does: given the same budgets it places every module where the formula does.
    (accelerate's own get_balanced_memory sizes its margin from the mean module instead of the largest leaf,
    so the budgets themselves are transformers 5's.)"""
    from accelerate.utils import infer_auto_device_map

    model = meta_model(name)
    tree, mine = formula(name, "auto", free, n)
    budgets = balanced_budgets(tree, [free] * n, "auto", False)
    theirs = infer_auto_device_map(model, max_memory=dict(enumerate(budgets)),
                                   no_split_module_classes=list(model._no_split_modules))
    cards = {k: (v if isinstance(v, int) else CPU) for k, v in theirs.items()}
    assert {u: card_of(cards, u) for u in mine} == mine


def test_one_card_keeps_ten_percent_as_transformers_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """device_map="auto" on one card with no max_memory: get_balanced_memory keeps 90 % of the free memory
    for the model; Mistral-7B in bf16 (13.49 GiB) on 14.5 GiB free spills its last layers to the CPU.
    transformers reads the free memory from the card, so the test hands it the same figure."""
    import transformers.integrations.accelerate as tia

    free = 14.5 * 2**30
    monkeypatch.setattr(tia, "get_max_memory",
                        lambda max_memory=None: dict(max_memory) if max_memory is not None
                        else {0: free, "cpu": float(2**50)})
    name = "mistralai/Mistral-7B-v0.1"
    found = _get_device_map(meta_model(name), "auto", None, None)
    theirs = {k: (v if isinstance(v, int) else CPU) for k, v in found.items()}
    tree, mine = formula(name, "auto", free, 1)
    assert balanced_budgets(tree, [free], "auto", False) == [0.9 * free]
    assert CPU in mine.values() and 0 in mine.values()
    assert {u: card_of(theirs, u) for u in mine} == mine
