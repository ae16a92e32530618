"""ZeRO-3's first reduction holding the untied head's gradient alone, where the prefetcher never runs ahead,
counted by hand from DeepSpeed 0.19.8 (estimator/wrappers/zero3_head_flush_rounds.py)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_coordinator import zero3_gathered_ahead
from tuneplan.estimator.wrappers.zero3_head_flush_rounds import zero3_head_flush_params
from tuneplan.specs.model import model_from_config


def test_the_heads_flush_holds_the_two_rounds_before_the_final_norms_gradient() -> None:
    # Llama-3.1-405B widths (h 16384, 128 heads of 128, 8 KV heads, f 53248, vocab 128256, untied) at 4
    # layers, full fine-tune over 4 GPUs with the CPU optimizer, no checkpointing. Head V h = 2,101,346,304
    # elements, over reduce_bucket_size 5e8: the head's hook leaves it in the bucket (bucket.elements counts
    # it), the final norm's hook (h elements) reduces it. A layer: q and o 16384^2 = 268,435,456, k and v
    # 16384 x 1024 = 16,777,216, gate/up/down 16384 x 53248 = 872,415,232: 13 fetches x 5e7 < 3.19e9, the
    # prefetcher does not run ahead; 2 x (V h) > stage3_max_reuse_distance: no layer kept. The backward
    # queue after the head: down, up, gate, o, v, k, q of the top layer. The base model's fetch pops down
    # (8.72e8 >= 5e7 ends the round), the final norm's fetch pops up: 2 x 872,415,232 = 1,744,830,464
    # (simulate: seed 107 r3, two 872,415,232-element gathers live while the head's partition is cast to
    # fp32 for the CPU optimizer, the step's peak), not the whole top layer and a bucket.
    base = resolve_model("meta-llama/Llama-3.1-405B-Instruct", allow_network=False)
    spec = model_from_config(dict(base.config, num_hidden_layers=4), "llama-405b-4L")
    setup = build_setup(spec, method="full", precision="bf16-mixed", gpus=4, zero=3, offload="optimizer",
                        gradient_checkpointing=False, batch=2, seq=256)
    run = resolve_run(spec, setup)
    assert spec.lm_head_params == 128256 * 16384
    assert zero3_gathered_ahead(spec, setup, 50_000_000) == 0
    assert zero3_head_flush_params(run, 50_000_000, 500_000_000) == 2 * 16384 * 53248
    # a reduce bucket the head fits in: its gradient is not reduced alone at the norm's hook
    assert zero3_head_flush_params(run, 50_000_000, 3_000_000_000) == -1
    # LoRA: no head gradient
    lora = build_setup(spec, method="lora", precision="bf16-mixed", gpus=4, zero=3,
                       gradient_checkpointing=False)
    assert zero3_head_flush_params(resolve_run(spec, lora), 50_000_000, 500_000_000) == -1
    # rounds of 1e9 elements: the base model's pops down and up (8.72e8 < 1e9 before up); the norm's finds
    # 1.74e9 available, past stage3_max_live_parameters (min(M - n_available, B) < 0): it pops nothing
    assert zero3_head_flush_params(run, 1_000_000_000, 500_000_000) == 2 * 872_415_232
