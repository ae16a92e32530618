"""The decision rule on candidates whose figures are written out here, and the answers it gives end to end.

Each rule test builds a handful of candidates with tokens/s, hours and USD chosen by hand, and the expected
choice is worked out in the comment above it from the rule's statement (docs/planner.md), not from the code.
"""

from __future__ import annotations

import pytest

from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.errors import TuneplanError
from tuneplan.plan import fit, rule
from tuneplan.plan.evaluate import Candidate
from tuneplan.plan.host import Machine, assumed
from tuneplan.plan.invariants import violations
from tuneplan.plan.space import Family
from tuneplan.plan.timecost import make_dataset

GIB = 2**30
OFFLOAD = {"single": "none", "ddp": "none", "zero-2": "none", "fsdp": "none",
           "zero-2+offload-optimizer": "optimizer", "zero-3+offload-all": "all"}


def cand(method: str, strategy: str, tps: float, *, hours: float | None = None, usd: float | None = None,
         optimizer: str | None = None, tight: bool = False) -> Candidate:
    fam = Family(method, strategy, optimizer, False, (("offload", OFFLOAD[strategy]),))
    c = Candidate(fam, 1, 16, 1, 16, None, tight)  # type: ignore[arg-type]  # the rule reads no estimate
    c.metrics = {"tokens_per_second": tps, "total_hours": hours, "cloud_usd": usd,
                 "cloud_usd_per_million_tokens": None}
    return c


def names(c: Candidate | None) -> tuple[str, str] | None:
    return None if c is None else (c.family.method, c.family.strategy)


# full at 500 tokens/s, LoRA 3,000, QLoRA-4 2,600, freeze 7,000.
FOUR = [cand("full", "zero-2+offload-optimizer", 500), cand("lora", "single", 3000),
        cand("qlora-4", "single", 2600), cand("freeze", "single", 7000)]


def test_balanced_takes_the_most_faithful_method_within_twice_the_fastest() -> None:
    # fastest plan adapting every layer: LoRA 3,000 (freeze trains the last layers only); full needs
    # 3000 / 500 = 6x the time, over 2x; LoRA is the most faithful within 2x
    got = rule.decide(FOUR, "balanced")
    assert names(got.chosen) == ("lora", "single")
    assert got.decided_by == "max_slowdown" and got.passed_over[0]["slowdown"] == pytest.approx(6.0)
    # quality takes full whatever its time; speed the fastest overall (freeze)
    assert names(rule.best(FOUR, "quality")) == ("full", "zero-2+offload-optimizer")
    assert names(rule.best(FOUR, "speed")) == ("freeze", "single")


def test_max_slowdown_moves_the_boundary() -> None:
    # 6x: full is within a limit of 6 (500 x 6 = 3,000 >= 3,000) and not within 5.9
    assert names(rule.best(FOUR, "balanced", limits=rule.Limits(max_slowdown=6))) == ("full",
                                                                                    "zero-2+offload-optimizer")
    assert names(rule.best(FOUR, "balanced", limits=rule.Limits(max_slowdown=5.9))) == ("lora", "single")
    # a limit of 1: only the fastest plan's method (LoRA at 3,000; QLoRA-4 at 2,600 is 1.15x slower)
    assert names(rule.best(FOUR, "balanced", limits=rule.Limits(max_slowdown=1))) == ("lora", "single")


def test_max_hours_is_a_hard_limit() -> None:
    # full 10 h, LoRA 1.7 h, QLoRA-4 2 h; with a limit of 8 h and a slowdown limit of 10x, full is out
    # by the hours alone; a limit of 1.8 h leaves LoRA; 1 h leaves nothing
    cs = [cand("full", "single", 500, hours=10.0), cand("lora", "single", 3000, hours=1.7),
          cand("qlora-4", "single", 2600, hours=2.0)]
    got = rule.decide(cs, "quality", limits=rule.Limits(max_slowdown=10, max_hours=8))
    assert names(got.chosen) == ("lora", "single") and got.decided_by == "max_hours"
    assert names(rule.best(cs, "quality", limits=rule.Limits(max_hours=1.8))) == ("lora", "single")
    none = rule.decide(cs, "quality", limits=rule.Limits(max_hours=1))
    assert none.chosen is None and none.decided_by == "max_hours"


def test_budget_is_a_hard_limit_and_an_unknown_price_cannot_meet_it() -> None:
    # full 40 USD, LoRA 6 USD, QLoRA-8 with no price: a 20 USD budget leaves LoRA (QLoRA-8's cost is
    # unknown, so it cannot be shown to stay within the budget)
    cs = [cand("full", "single", 500, usd=40.0), cand("lora", "single", 3000, usd=6.0),
          cand("qlora-8", "single", 2000, usd=None)]
    got = rule.decide(cs, "quality", limits=rule.Limits(budget_usd=20))
    assert names(got.chosen) == ("lora", "single") and got.decided_by == "budget"
    assert rule.Limits(budget_usd=20).over(cs[2]) == "budget"


def test_simplest_stack_within_ten_percent_and_no_offload_when_it_fits_without() -> None:
    # one method, four stacks: ZeRO-2 3,300, DDP 3,100, plain 3,000 (all within 10 % of 3,300: plain is
    # the simplest); ZeRO-Offload 3,500 is faster still but the plan fits without offload
    cs = [cand("lora", "zero-2+offload-optimizer", 3500), cand("lora", "zero-2", 3300),
          cand("lora", "ddp", 3100), cand("lora", "single", 3000)]
    assert names(rule.pick(cs, "balanced")) == ("lora", "single")
    # plain at 2,900 is more than 10 % below 3,300 (2,970): DDP at 3,100 is the simplest within it
    cs[3] = cand("lora", "single", 2900)
    assert names(rule.pick(cs, "balanced")) == ("lora", "ddp")
    # offload is taken only when nothing runs without it
    assert names(rule.pick([cand("full", "zero-3+offload-all", 400), cand("full", "zero-2+offload-optimizer",
                                                                          380)], "balanced")) == (
        "full", "zero-2+offload-optimizer")


def test_quality_keeps_32_bit_states_before_speed_balanced_does_not() -> None:
    # 32-bit AdamW 2,000 tokens/s; 8-bit AdamW 3,000 (a larger micro-batch fits): quality ranks the
    # exact states first, balanced takes the faster one (2,000 is outside 10 % of 3,000)
    cs = [cand("lora", "single", 2000), cand("lora", "single", 3000, optimizer="adamw-8bit")]
    assert rule.pick(cs, "quality").family.optimizer is None
    assert rule.pick(cs, "balanced").family.optimizer == "adamw-8bit"


def test_limits_are_checked_and_need_the_data_size() -> None:
    for kw, field in (({"max_slowdown": 0.5}, "max_slowdown"), ({"max_hours": -1}, "max_hours"),
                      ({"budget_usd": float("nan")}, "budget")):
        with pytest.raises(TuneplanError) as e:
            rule.make_limits(**kw, has_dataset=True)
        assert e.value.field == field
    with pytest.raises(TuneplanError) as e:
        fit("Qwen/Qwen2.5-0.5B", "rtx4090", max_hours=3)
    assert e.value.field == "max_hours"


def test_host_memory_from_this_machine_a_cloud_instance_or_the_default() -> None:
    a100, r4090 = resolve_accelerator("a100-80gb"), resolve_accelerator("rtx4090")
    here = Machine(cards=("rtx-4090",), ram_bytes=48 * GIB)
    # this machine's card: its RAM
    assert (assumed(r4090, 1, machine=here).bytes, assumed(r4090, 1, machine=here).source) == (48 * GIB,
                                                                                              "this machine")
    # not here: AWS p4de.24xlarge, 8 x A100 80GB and 1,152 GiB: 144 GiB per GPU
    cloud = assumed(a100, 2, machine=here)
    assert (cloud.bytes, cloud.source) == (2 * 144 * GIB, "cloud instance")
    assert "p4de" in (cloud.instance or "")
    # a 4090 elsewhere: no typical instance in the catalog, so twice its memory, at least 64 GiB
    assert assumed(r4090, 1, machine=Machine()).bytes == 64 * GIB
    assert assumed(r4090, 4, machine=Machine()).bytes == 2 * 4 * r4090.memory_bytes
    assert assumed(r4090, 1, given=10 * GIB, machine=here).source == "given"


def test_host_memory_of_this_machine_decides_whether_offload_runs() -> None:
    # 7B full with ZeRO-Offload keeps fp32 weights and Adam states on the host: 16 B x 6.74e9 = 100 GiB.
    # On a machine with 256 GiB it runs; on a desktop whose 4090 has 64 GiB beside it, it does not with
    # HF's mixed precision; torchtune's pure bf16 keeps 8 B x 6.74e9 = 50 GiB there, so an unpinned fit
    # answers with it
    big = fit("meta-llama/Llama-2-7b-hf", "rtx4090", method="full", detail=False,
              machine=Machine(("rtx-4090",), 256 * GIB)).to_dict()
    small = fit("meta-llama/Llama-2-7b-hf", "rtx4090", method="full", detail=False, framework="hf",
                machine=Machine(("rtx-4090",), 64 * GIB)).to_dict()
    assert big["host_memory"]["source"] == "this machine" and big["recommended"] is not None
    assert big["recommended"]["setup"]["offload"] != "none" and big["framework"]["chosen"] == "hf"
    assert small["recommended"] is None
    other = fit("meta-llama/Llama-2-7b-hf", "rtx4090", method="full", detail=False,
                machine=Machine(("rtx-4090",), 64 * GIB)).to_dict()
    assert other["framework"]["chosen"].startswith("torchtune") and other["recommended"] is not None
    assert other["recommended"]["host_bytes"] <= 64 * GIB < 16 * 6.74e9


@pytest.fixture(scope="module")
def llama7b_4090():
    return fit("meta-llama/Llama-2-7b-hf", "rtx4090", machine=Machine(), host_memory_gib=128,
               dataset=make_dataset(samples=10_000, avg_tokens=512))


def test_7b_on_a_4090_recommends_plain_lora_or_qlora(llama7b_4090) -> None:
    d = llama7b_4090.to_dict()
    assert violations(d) == []
    rec = d["recommended"]
    assert rec["method"] in ("lora", "qlora-8", "qlora-4")
    assert rec["setup"]["zero"] == 0 and rec["setup"]["offload"] == "none" and not rec["setup"]["fsdp"]
    # full fine-tuning runs here only with ZeRO-Offload, several times slower: said in the why line
    full = next(m for m in d["methods"] if m["method"] == "full")
    assert full["fits"] and "offload" in full["strategy"] and full["slowdown"] > 2
    assert rec["decided_by"] == "max_slowdown" and "slowdown limit" in rec["reason"]
    # every LoRA / QLoRA row is that method's plain plan
    for m in d["methods"]:
        if m["method"] != "full" and m["fits"]:
            assert m["strategy"] == "single", m
    # the frontier: every method that fits, most faithful first, with hours and USD at the data size
    assert [f["quality_rank"] for f in d["frontier"]] == sorted(f["quality_rank"] for f in d["frontier"])
    assert all(f["total_hours"] and f["cloud_usd"] is not None for f in d["frontier"])
    # equal-memory hint: common ranks only
    ranks = (d["equal_memory"] or {}).get("qlora", {}).values()
    assert all(r in (None, 8, 16, 32, 64, 128, 256) for r in ranks)


def test_prefer_quality_still_gives_full_with_its_slowdown(llama7b_4090) -> None:
    d = fit("meta-llama/Llama-2-7b-hf", "rtx4090", prefer="quality", machine=Machine(), host_memory_gib=128,
            detail=False).to_dict()
    rec = d["recommended"]
    assert rec["method"] == "full" and rec["slowdown"] > 2
    assert f"{rec['slowdown']:.1f}x slower than the fastest plan" in rec["reason"]
