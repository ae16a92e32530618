"""`max-model`: the standard family, and both answers checked against plain loops over the estimator."""

from __future__ import annotations

import pytest

from tuneplan.api import estimate
from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.errors import TuneplanError
from tuneplan.plan import max_model
from tuneplan.plan.max_model import catalog_models
from tuneplan.plan.standard_arch import MAX_INDEX, shape, standard_model


def test_standard_family_at_32_heads_is_llama_3_8b() -> None:
    # by hand, Llama-3-8B (config.json: hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate 14336,
    # vocab 128256, untied): embeddings + lm_head 2 x 128256 x 4096; per layer q,o 4096^2 each, k,v
    # 4096 x 1024 each, gate/up/down 3 x 4096 x 14336, two RMSNorms 2 x 4096; final norm 4096
    per_layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    total = 2 * 128256 * 4096 + 32 * per_layer + 4096
    assert total == 8_030_261_248  # the published count
    assert shape(62) == {"hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 8, "intermediate": 14336,
                         "vocab": 128256}
    assert standard_model(62).params_total == total


def test_standard_family_grows_in_every_dimension() -> None:
    prev = shape(0)
    for i in range(1, MAX_INDEX + 1, 7):
        cur = shape(i)
        # the key/value heads are the largest common divisor of the heads and 8: they may fall
        assert all(cur[k] >= prev[k] for k in cur if k != "kv_heads")
        assert cur["heads"] % cur["kv_heads"] == 0 and cur["kv_heads"] in (1, 2, 4, 8)
        prev = shape(i)
    for i in range(1, 600):  # the parameters still grow at every step, across every fall of the KV heads
        assert standard_model(i).params_total > standard_model(i - 1).params_total


def test_standard_family_memory_is_monotone_so_bisection_is_exact() -> None:
    for method in ("full", "lora", "qlora"):
        peaks = [estimate(standard_model(i), method=method).breakdown.device_peak_bytes
                 for i in range(0, 400, 3)]
        assert peaks == sorted(peaks), method


@pytest.mark.parametrize("gpu,setup", [
    ("rtx-3060-12gb", {"method": "full"}),
    ("rtx4090", {"method": "qlora"}),
    ("a100-80gb", {"method": "full", "gpus": 8, "zero": 3}),
])
def test_max_params_matches_a_plain_loop_and_is_a_boundary(gpu: str, setup: dict) -> None:
    acc = resolve_accelerator(gpu)
    r = max_model(gpu, **setup)
    best = None
    for i in range(MAX_INDEX + 1):  # plain loop up the family until it stops fitting
        if not estimate(standard_model(i), gpu=acc, **setup).fits:
            break
        best = i
    assert r.result.max_params == standard_model(best).params_total
    assert r.result.next_params == standard_model(best + 1).params_total
    assert not estimate(standard_model(best + 1), gpu=acc, **setup).fits


@pytest.mark.parametrize("gpu,setup", [("rtx4090", {"method": "lora"}),
                                       ("a100-80gb", {"method": "qlora", "bits": 8})])
def test_largest_catalog_model_matches_a_plain_loop(gpu: str, setup: dict) -> None:
    acc = resolve_accelerator(gpu)
    r = max_model(gpu, **setup)
    fitting = [m for m in catalog_models() if estimate(m, gpu=acc, **setup).fits]
    want = max(fitting, key=lambda m: m.params_total)
    assert r.result.largest_catalog_model["params"] == want.params_total
    assert r.result.largest_catalog_model["fits"]


def test_largest_model_without_and_with_quantization_and_deepspeed() -> None:
    """A practitioner's two questions (how large a model trains without quantization or DeepSpeed, and
    with them), as inequalities that hold by construction of the methods."""
    plain = max_model("a100-80gb", gpus=8, method="full").to_dict()
    zero3 = max_model("a100-80gb", gpus=8, method="full", zero=3).to_dict()
    assert zero3["max_params"] > 4 * plain["max_params"]  # ZeRO-3 shards 16 B/param over 8 cards
    by = {m["method"]: m["max_params"] for m in plain["by_method"]}
    assert by["qlora-4"] > by["qlora-8"] > by["lora"] > by["full"]


def test_v100_runs_fp16_unless_bf16_is_asked() -> None:
    r = max_model("v100-sxm2-32gb", method="lora")
    assert r.result.max_params and r.result.requires == []
    asked = max_model("v100-sxm2-32gb", method="lora", precision="bf16-mixed")
    assert asked.result.max_params is None and asked.result.largest_catalog_model is None
    assert asked.result.blocked_by  # says why: no bf16 on compute capability 7.0


def test_auto_reaches_at_least_as_far_as_the_setup_as_given() -> None:
    exact = max_model("rtx4090", method="lora")
    auto = max_model("rtx4090", method="lora", auto=True)
    assert auto.result.max_params >= exact.result.max_params
    assert "gradient-checkpointing" in auto.result.requires


def test_json_shape_and_bad_input() -> None:
    d = max_model("rtx4090", method="qlora").to_dict()
    assert {"largest_catalog_model", "max_params", "by_method"} <= set(d)
    assert d["method"] == "qlora-4"
    with pytest.raises(TuneplanError) as e:
        max_model("rtx4090", method="full", zero=2)  # ZeRO on one GPU without offload
    assert e.value.field == "zero"


def test_auto_answers_only_what_trains_at_a_usable_speed_within_the_host_memory() -> None:
    """One V100 32GB with QLoRA 4-bit: Qwen3-235B fits on paper with every weight streamed from host
    memory, at a speed no one trains at (and needs more RAM than a p3dn.24xlarge has per GPU, 96 GiB):
    the answer is a model that one epoch of 10,000 x 512 tokens trains within a day, hours shown."""
    from tuneplan.plan.max_model import USABLE_TOKENS_PER_S

    assert USABLE_TOKENS_PER_S == pytest.approx(10_000 * 512 / 86_400)  # 59.3 tokens/s, by hand
    d = max_model("v100-sxm2-32gb", auto=True, method="qlora", bits=4).to_dict()
    big = next(r for r in d["catalog"] if r["model"] == "Qwen/Qwen3-235B-A22B")
    assert not big["fits"]
    top = d["largest_catalog_model"]
    assert top is not None and top["params"] < big["params"]
    assert top["hours"] is not None and top["hours"] <= 24 and top["tokens_per_second"] >= USABLE_TOKENS_PER_S


def _without_work(d: dict) -> dict:
    """A report's answers: without the count of setups evaluated (less work is the point)."""
    out = {k: v for k, v in d.items() if k not in ("evaluations", "catalog", "by_method")}
    out["by_method"] = [{k: v for k, v in m.items() if k != "evaluations"} for m in d["by_method"]]
    return out


@pytest.mark.parametrize("gpu,setup", [("t4", {"method": "lora"}),
                                       ("rtx4090", {"method": "qlora", "auto": True})])
def test_the_table_alone_has_the_same_answers_as_the_whole_catalog(gpu: str, setup: dict) -> None:
    whole = max_model(gpu, **setup).to_dict()
    table = max_model(gpu, catalog=False, **setup).to_dict()
    assert len(whole["catalog"]) == len(catalog_models()) and len(table["catalog"]) <= 1
    assert _without_work(table) == _without_work(whole)


@pytest.mark.parametrize("gpu,gpus,method", [("rtx4090", 1, "lora"), ("t4", 1, "full"),
                                             ("rtx-4060", 1, "qlora"), ("a100-80gb", 4, "full")])
def test_weights_floor_is_below_what_every_family_keeps_on_the_cards_and_the_host(
        gpu: str, gpus: int, method: str) -> None:
    """The bound that rules a model out unprobed: the weights (parameters but the lm_head at 2 bytes,
    or at bits / 8 under QLoRA) are at most what the estimator puts on all GPUs plus their host share,
    in every family the search tries, for every catalog model."""
    from tuneplan.plan.evaluate import Prober, sparing
    from tuneplan.plan.max_model import weights_floor
    from tuneplan.plan.space import METHOD_VARIANTS, families

    acc = resolve_accelerator(gpu)
    base = {"gpus": gpus}
    variants = [(lb, f) for lb, f in METHOD_VARIANTS if f["method"] == method]
    checked = 0
    for m in catalog_models()[::3]:
        probe = Prober(m, acc, base)
        for lb, fixed in variants:
            for fam in sparing(families([(lb, dict(fixed))], base, gpus, acc)):
                est = probe({**fam.as_fields, "batch": 1})
                if est is None:
                    continue
                b = est.breakdown
                assert weights_floor(m, fixed) <= gpus * (b.device_needed_bytes + b.host_bytes), (m.name, fam)
                if fam.as_fields.get("offload") in ("none", "optimizer"):  # every weight on the cards
                    assert weights_floor(m, fixed) <= gpus * b.device_needed_bytes, (m.name, fam)
                checked += 1
    assert checked > 20


def test_the_weights_bound_leaves_every_answer_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ruling out the models whose weights exceed the cards and the host memory, and the families that
    keep them on cards too small for them, changes no answer and no catalog row: the same report with
    both bounds switched off, less the count of setups evaluated."""
    import importlib

    mm = importlib.import_module("tuneplan.plan.max_model")
    cases = [("rtx4090", {"method": "lora", "auto": True}), ("t4", {"method": "qlora"}),
             ("a100-80gb", {"method": "full", "gpus": 2, "zero": 3, "offload": "all", "auto": True})]
    ruled_out: dict[str, list[bool]] = {"beyond_memory": [], "on_cards_beyond_memory": []}

    def counted(name: str):  # noqa: ANN202 - a wrapper of either bound
        bound = getattr(mm, name)

        def wrapped(*a: object) -> bool:
            ruled_out[name].append(bound(*a))
            return ruled_out[name][-1]

        return wrapped

    for name in ruled_out:
        monkeypatch.setattr(mm, name, counted(name))
    fast = [max_model(g, **s).to_dict() for g, s in cases]
    # neither bound is idle in these cases (405B, 235B, ... on one card; 70B without offload on 2 cards)
    assert all(sum(v) >= 10 for v in ruled_out.values()), {k: sum(v) for k, v in ruled_out.items()}
    for name in ruled_out:
        monkeypatch.setattr(mm, name, lambda *a: False)
    slow = [max_model(g, **s).to_dict() for g, s in cases]
    for f, s in zip(fast, slow, strict=True):
        assert f.pop("catalog") == s.pop("catalog")
        assert _without_work(f) == _without_work(s)
