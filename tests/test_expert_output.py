"""A MoE layer's routed-expert output back-propagated (estimator/expert_output.py), by hand from
transformers 5's integrations/moe.py ``grouped_mm_experts_forward``."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.activations import layer_activations
from tuneplan.estimator.dtypes import resolve_dtypes
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.model import model_from_config
from tuneplan.specs.profiles import get_profile, resolve_setup

# a Qwen3-30B-A3B-shaped layer (hand config): h 2048, 128 experts of width 768, 8 per token
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
             "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
             "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
             "vocab_size": 151936, "tie_word_embeddings": False}


def test_the_restored_token_order_is_a_fine_grained_moe_layers_widest_backward_moment() -> None:
    # LoRA on the attention only, bf16 autocast (bf16 linear outputs, bf16 residual stream). The experts'
    # output, S = 8 rows per token of h = 2048: back-propagating ``.view(T, 8, h).sum(1)`` and
    # ``weighted_out[inv_perm]`` holds the sum's gradient copied whole (clone), the zeros IndexBackward
    # scatters into and the scattered gradient: 3 x 8 x 2048 x 2 B = 98,304 B per token, beside the
    # incoming gradient of the layer's output, 2048 x 2 B. The gated product's gradients (three
    # 8 x 768-wide bf16 tensors: 36,864 B) are smaller, so the layer's scratch is 98,304 + 4,096
    model = model_from_config(QWEN3_MOE, "Qwen3-30B-A3B 2 layers (hand config)")
    setup = resolve_setup(build_setup(model, method="lora", precision="bf16-mixed", targets="attn",
                                      batch=1, seq=512), model)
    dtypes = resolve_dtypes(setup, get_profile("hf"))
    assert dtypes.linear_out == 2 and dtypes.residual == 2
    acts = layer_activations(model, model.layer_groups[0][0], setup, dtypes,
                             resolve_targets(model, setup.targets), False, "sdpa", True)
    assert acts.backward_temp == 3 * 8 * 2048 * 2 + 2048 * 2 == 102_400
