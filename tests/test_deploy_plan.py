"""plan_deploy: merge step, serving memory per GPU, card verdicts, decode bound, and the CLI face."""

from __future__ import annotations

import json

import pytest

from tuneplan.deploy import plan_deploy
from tuneplan.deploy.decode import crossover_batch, decode_inputs, step_times
from tuneplan.deploy.formats import resolve_format
from tuneplan.deploy.kv_cache import kv_layout
from tuneplan.deploy.merge import merge_plan
from tuneplan.deploy.weights import serving_weights
from tuneplan.errors import TuneplanError
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import model_from_config
from tuneplan.specs.setup import TrainSetup

LLAMA8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
           "max_position_embeddings": 131072, "tie_word_embeddings": False}
PARAMS_8B = 8_030_261_248  # Llama-3.1-8B, published and counted by the spec tests
# A made-up card with round figures: 1000 GB/s, 100 dense TFLOPS, 24 GiB seen by software.
CARD = Accelerator(id="round", name="Round card", vendor="NVIDIA", memory_gb_marketed=24.0,
                   memory_gib_usable_observed=24.0, compute_capability=(8, 9), bf16_tflops_dense=100.0,
                   memory_bandwidth_gbs=1000.0)


@pytest.fixture(scope="module")
def llama():
    return model_from_config(LLAMA8B, name="llama-8b")


def test_lora_merge_memory_by_hand(llama) -> None:
    s = TrainSetup(method="lora", rank=16, targets="q_proj,v_proj").validate()
    mp = merge_plan(llama, s)
    adapter = 32 * 16 * ((4096 + 4096) + (4096 + 1024))  # r (d_in + d_out) per targeted module
    assert mp.adapter_params == adapter == 6_815_744
    assert mp.adapter_bytes == 4 * adapter  # PEFT keeps (and saves) adapters in fp32 on a 16-bit base
    assert mp.temp_bytes == 2 * 4096 * 4096 * 4  # B @ A of the largest target and its scaled copy, fp32
    assert mp.peak_bytes == 2 * PARAMS_8B + 4 * adapter + 2 * 4096 * 4096 * 4
    assert mp.checkpoint_bytes == 4 * adapter


def test_qlora_dequantize_merge_holds_the_16_bit_base_and_one_4_bit_layer(llama) -> None:
    s = TrainSetup(method="qlora", rank=16, targets="q_proj,v_proj").validate()
    deq = merge_plan(llama, s, qlora_path="dequantize")
    reload = merge_plan(llama, s, qlora_path="reload")
    def nf4(n: int) -> int:  # 4-bit storage, double-quantized absmax, code tables (see test_deploy.py)
        blocks = n // 64
        return n // 2 + blocks + 4 * -(-blocks // 256) + 1024 + 4 + 16 * 4
    h, f, kv = 4096, 14336, 1024
    layer = 2 * nf4(h * h) + 2 * nf4(h * kv) + 3 * nf4(h * f)
    assert deq.quantized_base_bytes == layer
    assert deq.peak_bytes - reload.peak_bytes == layer
    assert reload.base_16bit_bytes == 2 * PARAMS_8B  # the merge runs on a 16-bit base either way
    assert deq.peak_bytes > 2 * PARAMS_8B


def test_full_fine_tune_has_nothing_to_merge(llama) -> None:
    mp = merge_plan(llama, TrainSetup(method="full", precision="bf16-mixed").validate())
    assert not mp.needed and mp.peak_bytes == 0
    assert mp.checkpoint_bytes == 4 * PARAMS_8B  # fp32 master weights are what Trainer saves


def test_decode_bound_of_a_16_bit_dense_model_by_hand(llama) -> None:
    s = TrainSetup(method="lora").validate()
    fmt = resolve_format("bf16", None)
    w = serving_weights(llama, fmt)
    kv = kv_layout(llama)
    d = decode_inputs(llama, s, w, kv, context=1, tp=1, adapter_bytes=0, unmerged=False)
    # One token reads every weight but the (untied) embedding table, and one token of KV cache.
    read = 2 * PARAMS_8B - 2 * 128256 * 4096 + 131072
    mem, _ = step_times(d, CARD, 1)
    assert mem == pytest.approx(read / 1e12)
    out = plan_deploy(llama, s, serve_precision="bf16", context=1, gpu=CARD, cards=False)
    assert out["decode"]["single"]["tokens_per_s_per_sequence"] == pytest.approx(1e12 / read, rel=1e-9)
    assert out["decode"]["single"]["bound_by"] == "memory bandwidth"
    b = crossover_batch(d, CARD)
    assert b is not None
    m1, c1 = step_times(d, CARD, b - 1)
    m2, c2 = step_times(d, CARD, b)
    assert c1 < m1 and c2 >= m2  # compute takes over exactly at b


def test_long_context_keeps_decode_memory_bound(llama) -> None:
    # At 32k tokens each extra sequence reads 4 GiB of KV cache: more time than its compute on this card.
    s = TrainSetup(method="lora").validate()
    w = serving_weights(llama, resolve_format("bf16", None))
    d = decode_inputs(llama, s, w, kv_layout(llama), context=32768, tp=1, adapter_bytes=0, unmerged=False)
    assert crossover_batch(d, CARD) is None


def test_serving_memory_adds_up_and_grows_with_context_and_concurrency(llama) -> None:
    base = plan_deploy(llama, method="qlora", serve_precision="int4", quant_method="gptq", context=4096,
                       concurrency=1, gpu=CARD, cards=False)
    pg = base["per_gpu"]
    assert pg["total"] == pg["weights"] + pg["adapter"] + pg["kv_cache"] + pg["activations"] + pg["workspace"]
    assert pg["kv_cache"] == 131072 * 4096
    assert pg["adapter"] == 0 and base["serving"]["adapter"] == "merged into the base"
    more = plan_deploy(llama, method="qlora", serve_precision="int4", quant_method="gptq", context=8192,
                       concurrency=4, gpu=CARD, cards=False)
    assert more["per_gpu"]["kv_cache"] == 4 * 2 * pg["kv_cache"]
    assert more["per_gpu"]["total"] > pg["total"]
    # int4 weights are far smaller than bf16 ones
    bf16 = plan_deploy(llama, method="qlora", serve_precision="bf16", context=4096, gpu=CARD, cards=False)
    assert pg["weights"] < 0.4 * bf16["per_gpu"]["weights"]


def test_unmerged_adapter_costs_memory_and_flops(llama) -> None:
    kept = plan_deploy(llama, method="lora", rank=64, targets="all-linear", serve_precision="bf16",
                       keep_adapter=True, gpu=CARD, cards=False)
    merged = plan_deploy(llama, method="lora", rank=64, targets="all-linear", serve_precision="bf16",
                         gpu=CARD, cards=False)
    params = 32 * 64 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 2 * (4096 + 14336) + (14336 + 4096))
    assert kept["per_gpu"]["adapter"] == 2 * params  # served in 16 bits
    assert merged["per_gpu"]["adapter"] == 0
    assert kept["decode"]["adapter_flops_share"] > 0 == merged["decode"]["adapter_flops_share"]
    assert (kept["decode"]["single"]["tokens_per_s_per_sequence"]
            < merged["decode"]["single"]["tokens_per_s_per_sequence"])


def test_capacity_on_the_card(llama) -> None:
    out = plan_deploy(llama, method="lora", serve_precision="int4", context=4096, gpu=CARD, cards=False)
    g = out["gpu"]
    budget = int(24 * 1024**3 * 0.9)
    assert g["budget_bytes"] == budget
    fixed = out["per_gpu"]["total"] - out["per_gpu"]["kv_cache"]
    assert g["max_concurrency_at_context"] == (budget - fixed) // (131072 * 4096)
    assert g["max_context_one_sequence"] == min((budget - fixed) // 131072, 131072)


def test_tensor_parallel_halves_the_sharded_parts(llama) -> None:
    one = plan_deploy(llama, method="lora", serve_precision="bf16", context=4096, cards=False)
    two = plan_deploy(llama, method="lora", serve_precision="bf16", context=4096, tp=2, cards=False)
    assert two["per_gpu"]["kv_cache"] == one["per_gpu"]["kv_cache"] // 2
    norms = 2 * (32 * 2 * 4096 + 4096)
    assert two["per_gpu"]["weights"] == (one["per_gpu"]["weights"] - norms) // 2 + norms


def test_cards_need_the_formats_compute_capability() -> None:
    out = plan_deploy("Qwen/Qwen2.5-0.5B", method="lora", serve_precision="int4", quant_method="awq")
    by_id = {c["id"]: c for c in out["cards"]}
    assert by_id["t4"]["fits"]  # 7.5: AWQ's floor
    assert by_id["v100-sxm2-32gb"]["memory_fits"] and not by_id["v100-sxm2-32gb"]["fits"]  # 7.0 < 7.5
    bf16 = plan_deploy("Qwen/Qwen2.5-0.5B", serve_precision="bf16", gpu="t4", cards=False)
    assert bf16["gpu"]["memory_fits"] and not bf16["gpu"]["runs"]  # bf16 needs 8.0


def test_bad_inputs_name_the_field(llama) -> None:
    for kw, field in (({"context": 0}, "context"), ({"concurrency": -1}, "concurrency"), ({"tp": 0}, "tp"),
                      ({"gpu_util": 1.5}, "gpu_util"), ({"kv_dtype": "int2"}, "kv_dtype"),
                      ({"qlora_merge": "magic"}, "qlora_merge"),
                      ({"serve_precision": "int3"}, "serve_precision")):
        with pytest.raises(TuneplanError) as e:
            plan_deploy(llama, cards=False, **kw)
        assert e.value.field == field


def test_cli_deploy_json_and_text() -> None:
    from typer.testing import CliRunner

    from tuneplan.cli.app import app

    r = CliRunner().invoke(app, ["deploy", "Qwen/Qwen2.5-0.5B", "--method", "qlora",
                                 "--serve-precision", "int4", "--quant-method", "gguf-q4_k_m",
                                 "--gpu", "rtx4090", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["serving"]["format"] == "GGUF Q4_K_M" and d["gpu"]["fits"]
    r = CliRunner().invoke(app, ["deploy", "Qwen/Qwen2.5-0.5B", "--serve-precision", "int4",
                                 "--gpu", "rtx4090"])
    assert r.exit_code == 0 and "SERVES" in r.output and "decode (upper bound)" in r.output
    r = CliRunner().invoke(app, ["deploy", "meta-llama/Llama-3.1-70B-Instruct", "--serve-precision", "bf16",
                                 "--gpu", "rtx4090", "--cards", "0"])
    assert r.exit_code == 1 and "DOES NOT FIT" in r.output
