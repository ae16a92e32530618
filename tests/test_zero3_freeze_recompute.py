"""A freeze run's frozen, back-propagated MoE layers under checkpointing and ZeRO-3: their recomputed
stacks are filed under the shared experts' backward module in every pass, as LoRA's
(estimator/wrappers/zero3_expert_round.py, zero3_shared_moe_trace.py)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_expert_round import zero3_recompute_every_pass
from tuneplan.estimator.wrappers.zero3_shared_moe_trace import zero3_shared_moe_backward
from tuneplan.specs.model import model_from_config


def _freeze(trained: int, checkpointing: bool = True) -> object:
    base = resolve_model("deepseek-ai/DeepSeek-V2-Lite", allow_network=False)
    spec = model_from_config(dict(base.config, num_hidden_layers=4), "deepseek-v2-lite-4L")
    setup = build_setup(spec, method="freeze", freeze_trainable_layers=trained, precision="fp16-mixed",
                        gpus=4, zero=3, batch=1, seq=64, offload="optimizer",
                        gradient_checkpointing=checkpointing)
    return resolve_run(spec, setup)


def test_frozen_moe_layers_below_the_trained_ones_recompute_every_pass() -> None:
    # transformers 5 _activation_checkpointing_enable calls enable_input_require_grads (main_input_name
    # "input_ids"): every layer's input requires grad, the frozen layers below the trained ones run a
    # backward. DeepSpeed 0.19.8 _fetch_sub_module_impl files a recompute's parameter under the active
    # backward module only when ``not param.requires_grad``: DeepSeek-V2-Lite over 4 layers (0 dense,
    # 1-3 MoE), top 1 or 2 trained -> layer 2 or 1 is a frozen MoE layer; top 3 trained -> the layer
    # below them is the dense layer 0, no frozen stacks; without checkpointing no recompute at all.
    assert zero3_recompute_every_pass(_freeze(1))
    assert zero3_recompute_every_pass(_freeze(2))
    assert not zero3_recompute_every_pass(_freeze(3))
    assert not zero3_recompute_every_pass(_freeze(2, checkpointing=False))


def test_the_lowest_moe_layers_experts_fetch_holds_its_round_beside_the_recomputed_copy() -> None:
    # Top 2 layers trained (2, 3), layer 1 the only frozen MoE layer, fp16 throughout (DeepSpeed's fp16
    # module), a 5e7 bucket. Layer 1's stacks: gate_up_proj 64 x 2816 x 2048 = 369,098,752, down_proj
    # 64 x 2048 x 1408 = 184,549,376 elements, S = 553,648,128 -> 1,107,296,256 bytes. At its experts'
    # backward fetch (the recompute filed them under the shared experts, released before it):
    #   the recomputed copy the saved view keeps                                    1,107,296,256
    #   the fetch's flat buffer and the per-parameter copies                     2 x 1,107,296,256
    #   gathered ahead by the prefetcher, under min(M - A, 5e7), into one round: layer 1's shared
    #   experts' up / gate (2 x 2048 x 2816 = 11,534,336, released since), the dense layer 0's
    #   attention q 2048 x 3072 = 6,291,456, kv_a 2048 x 576 = 1,179,648, kv_b 512 x 4096 = 2,097,152,
    #   o 2048 x 2048 = 4,194,304 (13,762,560) and two of its MLP linears 2 x 2048 x 10944 = 44,826,624:
    #   70,123,520 elements; waited, its copies made (58,589,184 elements still gathered)  117,178,368
    #   and its flat buffer, filed until its last entry                               140,247,040
    #   the next round: the embedding 102,400 x 2048 = 209,715,200 and layer 0's third MLP linear
    #   22,413,312 elements, not yet waited (no copies), its flat buffer               464,257,024
    # Without the freeze gate the replay is not run (0). (simulate, seed-107 r212 layout with the top 2
    # of 5 layers trained: the peak at layer 2's experts' backward copy, layer 1's rounds filed beside.)
    stacks = 553_648_128 * 2
    assert stacks == 1_107_296_256
    assert 11_534_336 + 13_762_560 + 44_826_624 == 70_123_520
    ahead = (13_762_560 + 44_826_624) * 2 + 70_123_520 * 2 + (209_715_200 + 22_413_312) * 2
    assert ahead == 117_178_368 + 140_247_040 + 464_257_024
    assert zero3_shared_moe_backward(_freeze(2), 50_000_000) == 3 * stacks + ahead
