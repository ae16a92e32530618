"""`gpus`: the fewest cards per card type agree with a plain loop over every count, and the ranking."""

from __future__ import annotations

import pytest

from tuneplan.api import estimate
from tuneplan.catalog.accelerators import accelerators, resolve_accelerator
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.plan import fit, rank_gpus
from tuneplan.plan.gpus import card_counts
from tuneplan.plan.space import families
from tuneplan.plan.timecost import make_dataset

CARDS = ["rtx-3060-12gb", "rtx-4090", "v100-sxm2-32gb", "a100-40gb-sxm4", "a100-80gb-sxm4", "h200-sxm-141gb"]
GIB = 2**30


@pytest.fixture(scope="module")
def qwen14b():
    return resolve_model("Qwen/Qwen2.5-14B")


@pytest.fixture(scope="module")
def full14b(qwen14b):
    return rank_gpus(qwen14b, only=CARDS, method="full", max_gpus=32)


def some_family_fits(model, gpu, layout: dict) -> bool:
    """Plain: every family of the space at micro-batch 1, with estimate() directly; host memory by hand:
    a typical cloud instance's RAM per GPU (AWS p3dn.24xlarge 768 GiB / 8 V100 32GB, p4d.24xlarge and
    p4de.24xlarge 1,152 GiB / 8 A100, p5e.48xlarge 2,048 GiB / 8 H200), else twice the node's GPU memory,
    at least 64 GiB."""
    per_gpu = {"v100-sxm2-32gb": 96, "a100-40gb-sxm4": 144, "a100-80gb-sxm4": 144, "h200-sxm-141gb": 256}
    host = (per_gpu[gpu.id] * GIB * layout["gpus"] if gpu.id in per_gpu
            else max(64 * GIB, 2 * gpu.memory_bytes * layout["gpus"]))
    for f in families([("full", {"method": "full"})], layout, layout["gpus"] * layout["nodes"], gpu):
        try:
            e = estimate(model, gpu=gpu, timing=False, **{**f.as_fields, **layout})
        except TuneplanError:
            continue
        if e.fits and e.breakdown.host_bytes * layout["gpus"] <= host:
            return True
    return False


def test_fewest_cards_match_a_loop_over_every_count(full14b, qwen14b) -> None:
    counts = card_counts(32)
    for c in full14b.ranking:
        gpu = resolve_accelerator(c.gpu)
        want = next((n for n, lay in counts if some_family_fits(qwen14b, gpu, lay)), None)
        assert c.min_gpus == want, c.gpu
        if want is not None:
            assert c.fits
            prev = [n for n, _ in counts if n < want]
            if prev:  # the boundary: one count fewer does not fit
                lay = next(lay for n, lay in counts if n == prev[-1])
                assert not some_family_fits(qwen14b, gpu, lay)
            s = dict(c.setup)
            s.pop("bits")
            assert estimate(qwen14b, gpu=gpu, **s).fits  # the reported setup runs
            assert c.per_gpu_peak_bytes <= gpu.memory_bytes


def test_gpus_and_fit_give_the_same_answer_for_a_card(full14b, qwen14b) -> None:
    c = next(c for c in full14b.ranking if c.gpu == "a100-80gb-sxm4")
    rec = fit(qwen14b, "a100-80gb", method="full", gpus=c.min_gpus).recommended
    assert ((rec["strategy"], rec["micro_batch"], rec["grad_accum"])
            == (c.strategy, c.micro_batch, c.grad_accum))


def test_rent_or_buy_figures() -> None:
    ds = make_dataset(samples=10_000, avg_tokens=400.0)
    r = rank_gpus("Qwen/Qwen2.5-7B", only=["rtx4090"], method="lora", dataset=ds).ranking[0]
    assert r.fits and r.cloud_usd > 0 and r.own_usd > 0 and r.break_even_hours > 0
    # by hand: cloud USD = hours x cards x the cloud price per GPU-hour
    assert r.cloud_usd == pytest.approx(r.total_hours * r.min_gpus * r.cloud_usd_per_gpu_hr, rel=1e-6)


def test_a_14b_full_fine_tune_needs_several_24gb_cards(full14b) -> None:
    # by hand: ZeRO-3 shards 16 B/param (fp32 master + Adam, 16-bit weights and grads) over N cards:
    # 14.8e9 x 16 B = 220 GiB, so at least 10 cards of 23.8 GiB before activations
    by = {c.gpu: c for c in full14b.ranking}
    assert by["rtx-4090"].min_gpus is None or by["rtx-4090"].min_gpus >= 2
    assert by["h200-sxm-141gb"].fits


def test_ranking_order_fits_first_then_by_the_objective(full14b, qwen14b) -> None:
    r = full14b.ranking
    fitting = [c for c in r if c.fits]
    assert r[: len(fitting)] == fitting  # every card that fits comes before every card that does not
    keep = [c for c in fitting if not c.tight]  # quality, one method: then tokens/s
    tps = [c.tokens_per_second or 0 for c in keep]
    assert tps == sorted(tps, reverse=True)
    by_cards = rank_gpus(qwen14b, only=CARDS, method="full", max_gpus=32, sort="cards").ranking
    fit_cards = [c.min_gpus for c in by_cards if c.fits]
    assert fit_cards == sorted(fit_cards)


def test_memory_sort_puts_the_smallest_card_that_fits_first(qwen14b) -> None:
    r = rank_gpus(qwen14b, only=CARDS, method="qlora", sort="memory")
    fitting = [c for c in r.ranking if c.fits]
    assert [c.memory_bytes for c in fitting] == sorted(c.memory_bytes for c in fitting)


def test_fixed_card_count(qwen14b) -> None:
    r = rank_gpus(qwen14b, only=["a100-80gb", "rtx4090"], method="full", gpus=4, zero=3)
    for c in r.ranking:
        assert c.min_gpus in (None, 4)
        if c.fits:
            assert c.setup["gpus"] == 4 and c.setup["zero"] == 3


def test_as_given_switches_nothing_on_and_never_needs_fewer_cards(qwen14b) -> None:
    auto = {c.gpu: c for c in rank_gpus(qwen14b, only=CARDS, method="full", zero=3, max_gpus=32).ranking}
    given = rank_gpus(qwen14b, only=CARDS, method="full", zero=3, max_gpus=32, auto=False)
    for c in given.ranking:
        assert c.requires == []  # nothing switched on
        assert c.strategy is None or c.strategy.startswith("zero-3")
        if c.fits:
            assert c.min_gpus >= 2  # ZeRO-3 as asked: one card of it is refused
            assert auto[c.gpu].fits and auto[c.gpu].min_gpus <= c.min_gpus
            s = dict(c.setup)
            s.pop("bits")
            assert estimate(qwen14b, gpu=c.gpu, **s).fits and c.setup["zero"] == 3


def test_json_shape_and_time_columns(qwen14b) -> None:
    ds = make_dataset(samples=10_000, avg_tokens=400.0)
    r = rank_gpus(qwen14b, only=["a100-80gb", "rtx4090"], method="qlora", dataset=ds).to_dict()
    assert "ranking" in r
    for c in r["ranking"]:
        assert {"gpu", "fits", "min_gpus", "per_gpu_peak_bytes", "total_hours", "cloud_usd"} <= set(c)
        if c["fits"] and ds is not None:
            assert c["total_hours"] > 0  # filled by the time model; the value is its business
        elif ds is None:
            assert c["total_hours"] is None and c["cloud_usd"] is None


def test_whole_catalog_is_ranked() -> None:
    r = rank_gpus("Qwen/Qwen2.5-7B", method="lora")
    assert {c.gpu for c in r.ranking} == set(accelerators())


def test_bad_input() -> None:
    with pytest.raises(TuneplanError) as e:
        rank_gpus("Qwen/Qwen2.5-7B", sort="price")
    assert e.value.field == "sort"
    with pytest.raises(TuneplanError) as e:
        rank_gpus("Qwen/Qwen2.5-7B", prefer="cheap")
    assert e.value.field == "prefer"
    with pytest.raises(TuneplanError) as e:
        rank_gpus("Qwen/Qwen2.5-7B", only=["no-such-card"])
    assert e.value.field == "gpu"
    with pytest.raises(TuneplanError) as e:
        rank_gpus("Qwen/Qwen2.5-7B", method="sft")
    assert e.value.field == "method"
