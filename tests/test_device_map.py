"""device_map ("auto"): one process, the layers split over its cards. The placement worked by hand from
transformers' rules, the per-card figures against the single-GPU run they partition, the strategy's
refusals, the time, the faces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tuneplan
from tuneplan.api import build_setup, estimate
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.estimator.device_map import card_memories, card_run, placement
from tuneplan.estimator.instants import memory_at
from tuneplan.estimator.links import intra_node_link
from tuneplan.estimator.run import resolve_run
from tuneplan.specs.setup import TrainSetup

SRC = str(Path(tuneplan.__file__).resolve().parents[1])


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuneplan.cli.app", *args], capture_output=True, text=True,
                          timeout=120, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "COLUMNS": "160",
                                            "PYTHONPATH": SRC})


def run_of(model: str, **kw):
    spec = resolve_model(model)
    return resolve_run(spec, build_setup(spec, **kw))


# Llama-3.2-1B (config: hidden 2048, 16 layers, 32 heads / 8 KV of 64, MLP 8192, vocab 128256, tied), bf16:
# a layer is q 2048x2048 + k, v 2048x512 + o 2048x2048 + gate, up, down 2048x8192 + two RMSNorm 2048
#   = 60,821,504 parameters = 121,643,008 bytes; the embedding 128256 x 2048 = 525,336,576 bytes; the final
#   norm 4,096 bytes; rotary buffers 2 x 32 fp32 = 256 bytes; the tied head 0 (transformers skips tied keys).
LAYER, EMBED, NORM, ROPE = 121_643_008, 525_336_576, 4_096, 256
TOTAL = EMBED + 16 * LAYER + NORM + ROPE  # 2,471,629,056 (compute_module_sizes(model)[""])


def test_placement_by_hand_llama_1b_two_unbounded_cards() -> None:
    """get_balanced_memory caps card 0 at TOTAL // 2 + int(1.25 x the embedding) = 1,892,485,248 (the last
    card keeps its free memory, here unbounded). infer_auto_device_map: the body does not fit, so it is split;
    the embedding goes on card 0 (room: cap - the largest remaining layer) with the tied head; the layer
    stack is split; layer k fits while EMBED + (k + 1) x LAYER <= cap - LAYER, i.e. layers 0-9; the rest, the
    norm and the rotary buffers on card 1."""
    cap = TOTAL // 2 + int(1.25 * EMBED)
    assert cap == 1_892_485_248
    fit = max(k for k in range(17) if EMBED + k * LAYER <= cap - LAYER)
    assert fit == 10
    run = run_of("meta-llama/Llama-3.2-1B", method="lora", gpus=2, device_map="auto")
    where = placement(run, None)
    assert where.budgets[0] == cap and where.budgets[1] == float("inf")
    assert where.layers == (tuple(range(10)), tuple(range(10, 16)))
    assert (where.card("model.embed_tokens"), where.card("lm_head"), where.card("model.norm")) == (0, 0, 1)
    assert where.sizes == (EMBED + 10 * LAYER, 6 * LAYER + NORM + ROPE)  # the rotary buffers follow the norm


def test_per_card_weights_by_hand_llama_1b_lora() -> None:
    """Resident bytes per card (hf profile, bf16-mixed LoRA): frozen base in bf16; PEFT's adapters in fp32,
    q_proj r16 = 16 x (2048 + 2048), v_proj = 16 x (2048 + 512): 106,496 per layer; fused AdamW keeps two fp32
    states per adapter parameter and a device ``step`` scalar (one 512-byte block) per adapter tensor (4 per
    layer), on the adapter's card."""
    run = run_of("meta-llama/Llama-3.2-1B", method="lora", rank=16, targets="q_proj,v_proj", gpus=2,
                 device_map="auto", optimizer="adamw-fused")
    _, cards = card_memories(run, None)
    adapters = 16 * (2048 + 2048) + 16 * (2048 + 512)
    assert adapters == 106_496
    want = {0: (EMBED + 10 * LAYER, 10), 1: (6 * LAYER + NORM, 6)}
    for c in cards:
        weights, layers = want[c.card]
        comps = c.breakdown.components
        assert comps["weights"] == weights
        assert comps["lora_adapters"] == layers * adapters * 4
        assert comps["optimizer_states"] == layers * adapters * 8 + layers * 4 * 512


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-0.5B",
                                   "mistralai/Mixtral-8x7B-v0.1"])
@pytest.mark.parametrize("kw", [dict(method="qlora"), dict(method="lora", gradient_checkpointing=False),
                                dict(method="full"), dict(method="freeze", freeze_trainable_layers=5)])
def test_cards_partition_the_single_gpu_run(model: str, kw: dict) -> None:
    """Every persistent term of the single-card run is on exactly one card: weights, quantization metadata,
    adapters, gradients; the saved activations of the layers and the tail split without loss or double count;
    the logits only on the head's card."""
    one = run_of(model, seq=1024, **kw)
    split = run_of(model, seq=1024, gpus=3, device_map="auto", **kw)
    where = placement(split, None)
    parts = [card_run(split, where, k) for k in range(3) if where.sizes[k]]
    whole = memory_at(one, 1, 1024)
    for key in ("weights", "quant_meta", "lora_adapters"):
        assert sum(p.memo["memory"].common[key] for p in parts) == whole.statics.common[key], key
    assert sum(p.memo["memory"].grads for p in parts) == whole.statics.grads
    assert sum(memory_at(p, 1, 1024).acts.saved_bytes for p in parts) == whole.acts.saved_bytes
    head = where.card("lm_head")
    for k, p in zip((k for k in range(3) if where.sizes[k]), parts, strict=True):
        logits = memory_at(p, 1, 1024).logits
        assert (logits.backward_peak > 0) == (k == head)


def test_hand_over_and_logits_copies_at_the_end_of_the_forward() -> None:
    """Llama-3.1-8B LoRA on 2 cards: card 0 sends the hidden states once (1024 tokens x 4096 x 2 bytes, bf16
    residual) and receives the logits the root hook copies back (1024 x 128256 x 2, bf16 under autocast); card
    1 (layers, norm, head) sends nothing forward."""
    run = run_of("meta-llama/Llama-3.1-8B", method="lora", seq=1024, gpus=2, device_map="auto")
    where = placement(run, None)
    assert where.card("lm_head") == 1 and where.card("model.embed_tokens") == 0
    c0, c1 = (card_run(run, where, k).memo["memory"] for k in (0, 1))
    assert c0.gathered_at_forward_end == 1024 * 4096 * 2 + 1024 * 128256 * 2
    assert c1.gathered_at_forward_end == 0


def test_estimate_reports_the_fullest_card_and_every_card() -> None:
    est = estimate("meta-llama/Llama-3.1-8B", method="qlora", seq=1024, gpu="rtx4090", gpus=2,
                   device_map="auto")
    cards = est.breakdown.per_card
    assert [c["card"] for c in cards] == [0, 1]
    assert est.breakdown.device_peak_bytes == max(c["device_peak_bytes"] for c in cards)
    assert all(sum(c["components"].values()) == c["allocated_peak_bytes"] for c in cards)
    d = est.to_dict()
    assert d["per_gpu"]["per_card"] == cards and d["setup"]["device_map"] == "auto"
    single = estimate("meta-llama/Llama-3.1-8B", method="qlora", seq=1024, gpu="rtx4090")
    assert est.breakdown.device_peak_bytes < single.breakdown.device_peak_bytes


def test_time_is_one_card_plus_the_copies_and_cost_counts_every_card() -> None:
    """One card works at a time: the step is the single card's plus the copies over the link (forward and
    backward per hand-over, the logits once); throughput per card is the job's over the cards."""
    kw = dict(method="lora", seq=1024)
    from tuneplan.specs.dataset import DatasetSpec

    ds = DatasetSpec(samples=1000, avg_tokens=1024)
    one = estimate("meta-llama/Llama-3.1-8B", gpu="rtx4090", dataset=ds, **kw)
    two = estimate("meta-llama/Llama-3.1-8B", gpu="rtx4090", gpus=2, device_map="auto", dataset=ds, **kw)
    link = intra_node_link(two.gpu, 2)
    copies = (2 * 1024 * 4096 * 2 + 1024 * 128256 * 2) / (link.gbs * 1e9)
    t1, t2 = one.to_dict()["time"], two.to_dict()["time"]
    assert t2["step_seconds"] == pytest.approx(t1["step_seconds"] + copies, rel=1e-9)
    assert t2["tokens_per_second"] == pytest.approx(1024 / t2["step_seconds"], rel=1e-9)
    assert t2["tokens_per_second_per_gpu"] == pytest.approx(t2["tokens_per_second"] / 2, rel=1e-9)
    assert t2["gpu_hours"] == pytest.approx(2 * t2["total_hours"], rel=1e-9)
    assert two.to_dict()["cost"]["gpus"] == 2


def test_world_size_counts_processes_and_cards_counts_gpus() -> None:
    s = TrainSetup(gpus=3, device_map="auto").validate()
    assert (s.world_size, s.cards) == (1, 3)
    assert (TrainSetup(gpus=3).world_size, TrainSetup(gpus=3).cards) == (3, 3)


@pytest.mark.parametrize("kw", [dict(zero=2), dict(zero=3), dict(fsdp=True), dict(nodes=2),
                                dict(framework="llamafactory"), dict(framework="unsloth"),
                                dict(device_map="anywhere")])
def test_invalid_combinations_name_the_field(kw: dict) -> None:
    with pytest.raises(TuneplanError) as e:
        TrainSetup(**{"gpus": 2, "device_map": "auto", **kw}).validate()
    assert e.value.field == "device_map" and e.value.accepted


def test_the_planner_refuses_a_device_map_plan() -> None:
    from tuneplan.plan.fit import fit

    with pytest.raises(TuneplanError) as e:
        fit("meta-llama/Llama-3.1-8B", "rtx4090", gpus=2, device_map="auto")
    assert e.value.field == "device_map"


def test_a_model_larger_than_the_cards_is_an_error_finding() -> None:
    """Llama-3.1-70B in bf16 (141 GB) on 2 x 24 GB: the walk reaches the CPU, which bitsandbytes refuses and a
    16-bit model cannot train from."""
    est = estimate("meta-llama/Llama-3.1-70B-Instruct", method="lora", gpu="rtx4090", gpus=2,
                   device_map="auto")
    assert "device-map-spills-to-cpu" in [f.code for f in est.findings if f.level == "error"]
    assert est.fits is False


def test_cli_json_and_text() -> None:
    r = cli("estimate", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--gpu", "rtx4090", "--gpus", "2",
            "--device-map", "auto", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["per_gpu"]["per_card"]) == 2 and d["setup"]["device_map"] == "auto"
    r = cli("estimate", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--gpu", "rtx4090", "--gpus", "2",
            "--device-map", "auto")
    assert r.returncode == 0, r.stderr
    assert "card 0:" in r.stdout and "card 1:" in r.stdout and "device_map auto over 2 GPUs" in r.stdout


@pytest.mark.parametrize("extra", [("--zero", "2"), ("--fsdp",), ("--nodes", "2")])
def test_cli_refusals_exit_2_with_one_json_object(extra: tuple[str, ...]) -> None:
    r = cli("estimate", "meta-llama/Llama-3.1-8B", "--gpus", "2", "--device-map", "auto", *extra, "--json")
    assert r.returncode == 2
    err = json.loads(r.stdout)["error"]
    assert err["field"] == "device_map" and "Traceback" not in r.stderr


def test_hf_script_loads_with_the_device_map_and_the_assumed_max_memory() -> None:
    from tuneplan.catalog.accelerators import resolve_accelerator
    from tuneplan.estimator.overhead import cuda_context_bytes
    from tuneplan.export import build_export

    acc = resolve_accelerator("rtx4090")
    spec = resolve_model("meta-llama/Llama-3.1-8B")
    plan = TrainSetup(method="qlora", gpus=2, device_map="auto")
    b = build_export("hf-script", estimate(spec, plan, gpu=acc), "train.py")
    text = b.files[0][1]
    free = acc.memory_bytes - cuda_context_bytes()
    assert "'device_map': 'auto'," in text and f"'max_memory': {{0: {free}, 1: {free}}}," in text
    assert "Run:   python train.py" in text  # one process: no torchrun
    assert 'kw["device_map"] = plan["device_map"]' in text
    with pytest.raises(TuneplanError) as e:
        split = estimate(spec, TrainSetup(method="qlora", gpus=2, device_map="auto"), gpu=acc)
        build_export("deepspeed", split, "ds.json")
    assert e.value.field == "device_map"


def test_one_card_auto_map_can_leave_layers_on_the_cpu() -> None:
    """Llama-3.1-70B 4-bit on one L40S (47.58 GB, 47.04 GB free): accelerate keeps 0.9 (one card, no
    max_memory) x 0.9 (bitsandbytes) of it, 38.1 GB, less the largest layer it reserves on card 0, for a
    model it sizes at about 38.5 GB: the last layers land on the CPU and bitsandbytes refuses to load. Without
    a device_map the same plan has no such error (it does not fit for memory)."""
    kw = dict(method="qlora", seq=256, gradient_checkpointing=True, gpu="l40s")
    auto = estimate("meta-llama/Llama-3.1-70B-Instruct", device_map="auto", **kw)
    assert "device-map-spills-to-cpu" in [f.code for f in auto.findings if f.level == "error"]
    plain = estimate("meta-llama/Llama-3.1-70B-Instruct", **kw)
    assert not [f for f in plain.findings if f.level == "error"]
    where = placement(auto.run, auto.gpu)
    assert where.budgets[0] == pytest.approx(0.9 * 0.9 * (auto.gpu.memory_bytes - 512 * 2**20))


def test_measure_refuses_a_plan_over_several_cards() -> None:
    """One process, yet several cards: measure runs on one device, so it must not take the plan for one."""
    from tuneplan.measure.build import check_measurable

    with pytest.raises(TuneplanError) as e:
        check_measurable(TrainSetup(gpus=2, device_map="auto"), "cpu")
    assert e.value.field == "gpus"
