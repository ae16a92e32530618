"""`sweep`: parsing the range, the stack adding up to the device peak, and the plots."""

from __future__ import annotations

from xml.etree import ElementTree

import pytest

from tuneplan.api import estimate
from tuneplan.errors import TuneplanError
from tuneplan.plan import sweep
from tuneplan.plan.sweep import parse_vary
from tuneplan.plan.sweep_plot import to_html, write_plot


def test_parse_vary() -> None:
    assert parse_vary("seq=512..8192") == ("seq", [512, 1024, 2048, 4096, 8192])
    assert parse_vary("seq=500..3000") == ("seq", [500, 1000, 2000, 3000])  # the end is always included
    assert parse_vary("rank=8..32:8") == ("rank", [8, 16, 24, 32])
    assert parse_vary("gpus=8,1,2,4,2") == ("gpus", [1, 2, 4, 8])
    assert parse_vary("cutoff_len=1024..2048") == ("seq", [1024, 2048])
    assert parse_vary("grad-accum=1..4:1") == ("grad_accum", [1, 2, 3, 4])


@pytest.mark.parametrize("bad", ["seq", "lr=1..2", "seq=0..8", "seq=9..3", "seq=a,b", "rank=1..10000:1",
                                 "seq=1..8:0"])
def test_parse_vary_rejects_with_the_field(bad: str) -> None:
    with pytest.raises(TuneplanError) as e:
        parse_vary(bad)
    assert e.value.field == "vary"


def test_points_are_estimates_and_the_stack_adds_up() -> None:
    r = sweep("Qwen/Qwen2.5-7B", "seq=512..8192", gpu="rtx4090", method="qlora")
    assert [p.value for p in r.points] == [512, 1024, 2048, 4096, 8192]
    assert r.capacity_bytes == estimate("Qwen/Qwen2.5-7B", gpu="rtx4090", method="qlora").gpu.memory_bytes
    for p in r.points:
        est = estimate("Qwen/Qwen2.5-7B", gpu="rtx4090", method="qlora", seq=p.value)
        assert p.device_peak_bytes == est.breakdown.device_peak_bytes
        assert sum(p.stack.values()) == p.device_peak_bytes
        assert p.fits == (p.device_peak_bytes <= r.capacity_bytes)
    peaks = [p.device_peak_bytes for p in r.points]
    assert peaks == sorted(peaks)  # longer sequences never need less
    # 8192 tokens of fp32 logits (152k vocab) do not fit 24 GB
    assert r.points[0].fits and not r.points[-1].fits


def test_a_value_the_setup_refuses_is_reported_not_raised() -> None:
    r = sweep("Qwen/Qwen2.5-7B", "gpus=1,2,4", method="full", zero=3, gpus=2, gpu="a100-80gb")
    one, two, four = r.points
    # ZeRO-3 on one GPU without offload is refused by the setup validation: reported on that point
    assert one.error and "zero" in one.error and one.fits is False
    assert two.error is None and four.error is None
    assert four.device_peak_bytes < two.device_peak_bytes  # ZeRO-3 shards more over more GPUs
    with pytest.raises(TuneplanError):  # the user's own setup (one GPU with ZeRO-3) is refused outright
        sweep("Qwen/Qwen2.5-7B", "gpus=1,2", method="full", zero=3)


def test_html_plot_without_matplotlib(tmp_path) -> None:
    r = sweep("Qwen/Qwen2.5-7B", "batch=1..8", gpu="rtx4090", method="lora")
    page = to_html(r)
    # stroke-dasharray: the capacity line
    assert page.startswith("<!doctype html>") and "<svg" in page and "stroke-dasharray" in page
    svg = ElementTree.fromstring(page[page.index("<svg"): page.index("</svg>") + 6])  # well-formed
    bars = [e for e in svg.iter("{http://www.w3.org/2000/svg}rect")
            if e.find("{http://www.w3.org/2000/svg}title") is not None]
    assert len(bars) >= len(r.points)  # at least one stacked segment per point
    out = write_plot(r, tmp_path / "sweep.html")
    assert out.read_text(encoding="utf-8") == page
    with pytest.raises(TuneplanError) as e:
        write_plot(r, tmp_path / "sweep.pdf")
    assert e.value.field == "plot"


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_matplotlib_plot(tmp_path, suffix: str) -> None:
    pytest.importorskip("matplotlib", reason="PNG/SVG need the optional 'plot' extra")
    r = sweep("Qwen/Qwen2.5-7B", "rank=8..64", gpu="rtx4090", method="qlora")
    out = write_plot(r, tmp_path / f"sweep.{suffix}")
    head = out.read_bytes()[:200]
    assert head.startswith(b"\x89PNG") if suffix == "png" else b"<svg" in head or b"<?xml" in head


@pytest.mark.parametrize("vary, kw", [
    ("seq=512..32768", {"gpu": "rtx4090", "method": "qlora"}),
    ("batch=1..12:1", {"gpu": "a100-80gb", "method": "lora", "samples": 10_000}),
    ("rank=8..64:8", {"gpu": "a100-80gb", "method": "lora"}),
    ("gpus=1,2,4", {"gpu": "a100-80gb", "method": "full", "zero": 3, "gpus": 2}),
    ("grad_accum=1..3:1", {"gpu": "v100-sxm2-32gb", "method": "lora"}),
    ("seq=512..2048", {"method": "lora"}),
])
def test_every_point_of_the_grid_sweep_is_the_scalar_estimate(vary: str, kw: dict) -> None:
    """The sweep reads one grid; each point must be what ``estimate`` says at that value, field by field."""
    from tuneplan.plan.timecost import make_dataset

    kw = dict(kw)
    ds = make_dataset(samples=kw.pop("samples")) if "samples" in kw else None
    gpu = kw.pop("gpu", None)
    r = sweep("Qwen/Qwen2.5-7B", vary, gpu=gpu, dataset=ds, **kw)
    name, values = parse_vary(vary)
    assert [p.value for p in r.points] == values
    for p in r.points:
        try:
            est = estimate("Qwen/Qwen2.5-7B", gpu=gpu, **({"dataset": ds} if ds else {}),
                           **{**kw, name: p.value})
        except TuneplanError as exc:
            assert p.error == str(exc) and p.fits is False
            continue
        b, d = est.breakdown, est.to_dict()
        assert p.error is None
        assert (p.device_peak_bytes, p.allocated_peak_bytes, p.reserved_peak_bytes, p.peak_instant) == (
            b.device_peak_bytes, b.allocated_peak_bytes, b.reserved_peak_bytes, b.peak_instant)
        assert p.stack == {**b.components,
                           "allocator_reserve": b.reserved_peak_bytes - b.allocated_peak_bytes,
                           "cuda_context": b.cuda_context_bytes, "nccl": b.nccl_bytes}
        assert (p.fits, p.headroom_bytes) == (est.fits, est.headroom_bytes)
        t, c = d.get("time") or {}, d.get("cost") or {}
        assert (p.tokens_per_second, p.total_hours, p.cloud_usd) == (
            t.get("tokens_per_second"), t.get("total_hours"), c.get("cloud_usd"))
    if ds is not None:
        assert all(p.total_hours for p in r.points)  # the dataset reaches the time model
