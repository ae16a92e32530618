"""ZeRO-3's coordinator replayed through non-leaf MoE blocks with shared experts after the routed ones,
counted by hand from DeepSpeed 0.19.8 (estimator/wrappers/zero3_shared_moe_trace.py)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_shared_moe_trace import zero3_shared_moe_backward
from tuneplan.specs.model import model_from_config


def _deepseek_v2_lite(**kw: object) -> object:
    base = resolve_model("deepseek-ai/DeepSeek-V2-Lite", allow_network=False)
    spec = model_from_config(dict(base.config, num_hidden_layers=4), "deepseek-v2-lite-4L")
    setup = build_setup(spec, method="qlora", precision="fp16", gpus=4, zero=3, rank=8, batch=4, seq=64,
                        quant_type="fp4", double_quant=False, offload="optimizer", **kw)
    return resolve_run(spec, setup)


def test_the_layer_belows_round_is_filed_beside_an_experts_backward_round() -> None:
    # DeepSeek-V2-Lite over 4 layers (layer 0 dense, 1-3 MoE), QLoRA fp4 rank 8 on the attention in fp16
    # under checkpointing over 4 GPUs, a 5e7 bucket, M = 1e9. A MoE layer's stacks (2 bytes, never
    # quantized): gate_up_proj 64 x 2816 x 2048 = 369,098,752, down_proj 64 x 2048 x 1408 = 184,549,376
    # elements, S = 553,648,128 -> 1,107,296,256 bytes; its router 64 x 2048 = 131,072 (2 bytes).
    # At layer 2's router backward fetch the prefetcher pops, under min(M - A, 5e7), layer 1's entries
    # up to its gate_up_proj: packed codes (one byte an element) 3 x 2,883,584 (shared experts), q
    # 3,145,728, kv_a 589,824, kv_b 1,048,576, o 2,097,152, the router, gate_up_proj (overshooting):
    # flat buffer 8,650,752 + 6,881,280 + 262,144 + 738,197,504 = 753,991,680. The next fetch (A < M)
    # pops layer 1's down_proj alone (369,098,752). Layer 2's recompute fetches its shared gate_proj,
    # which waits on that round: every member copied out (AllGatherCoalescedHandle.wait) while layer
    # 1's gate_up_proj entry keeps the flat buffer. Gathered at layer 2's experts' backward fetch:
    # layer 2's new round's copies 1,107,296,256; layer 1's gate_up_proj copy 738,197,504, its down_proj
    # 369,098,752, the round's packed codes still gathered (q, one shared code, o, kv_b, kv_a)
    # 3,145,728 + 2,883,584 + 2,097,152 + 1,048,576 + 589,824 = 9,764,864, its router 262,144; the
    # filed flat buffer 753,991,680: 2,978,611,200. Beside it the recomputed stacks the saved view keeps
    # (1,107,296,256) and layer 2's own flat buffer until its last copy (1,107,296,256): 5,193,203,712.
    # (simulate: 7.3408e9 at layer 2's down_proj copy; the analytic peak 7.339e9 with this term.)
    run = _deepseek_v2_lite()
    gathered = 1_107_296_256 + 738_197_504 + 369_098_752 + 9_764_864 + 262_144 + 753_991_680
    assert gathered == 2_978_611_200
    assert zero3_shared_moe_backward(run, 50_000_000) == gathered + 2 * 1_107_296_256


def test_adapted_stacks_are_not_laid_out() -> None:
    # LoRA on the fused stacks (PEFT's ParamWrapper modules around them): the replay does not lay them out
    run = _deepseek_v2_lite(targets="mlp")
    assert zero3_shared_moe_backward(run, 50_000_000) == 0
