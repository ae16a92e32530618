"""ZeRO-3 QLoRA under checkpointing: the running layer's in-flight tensors where the head is popped in the
forward (estimator/wrappers/zero3_head_pop_running.py), and the top layer's backward from the replay, the
untied head released after its own backward (wrappers/zero.py, zero3_module_trace.py)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.memory import memory_of
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_head_pop_running import checkpointed_mlp_in_flight
from tuneplan.specs.model import model_from_config


def mistral(layers: int, vocab: int) -> dict[str, object]:
    return dict(model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                num_attention_heads=32, num_key_value_heads=8, vocab_size=vocab, tie_word_embeddings=False,
                rope_theta=1e6)


def test_the_running_layer_holds_its_input_residual_norm_and_mlp_projections() -> None:
    # Mistral-7B-Instruct-v0.3, 4 layers, QLoRA nf4 in bf16 under checkpointing, 384 tokens. At layer 3's
    # up_proj: the layer input, the residual after the attention and the MLP norm's output, 3 x 384 x 4096
    # x 2 = 9,437,184, act_fn(gate_proj(x)) and up_proj's output, 2 x 384 x 14336 x 2 = 22,020,096:
    # 31,457,280 (simulate: the same blocks live at the step's peak, in layer 3's up_proj matmul).
    spec = model_from_config(mistral(4, 32768), "mistral-4L")
    setup = build_setup(spec, method="qlora", precision="bf16", gpus=4, zero=3, rank=64, quant_type="nf4",
                        gradient_checkpointing=True, offload="optimizer", seq=384, batch=1)
    run = resolve_run(spec, setup)
    assert checkpointed_mlp_in_flight(run, 384) == 31_457_280
    below = memory_of(run).instants["forward_head_popped"]
    assert below > 0


def test_the_untied_head_is_released_before_the_top_layers_backward() -> None:
    # Mistral-7B-v0.1, 2 layers, QLoRA fp4 rank 16 on the MLP under checkpointing, bf16, parameters and
    # optimizer offloaded, 2 GPUs. The replayed coordinator holds the untied head (32000 x 4096 bf16,
    # 262,144,000 B) at the loss; its only use in the step is its forward and backward, so
    # __params_to_release frees it with the head's backward: through the top layer's backward what was
    # gathered at the loss less the head (simulate: the head's 2.6214e8-byte buffer freed after the loss
    # backward, 4.838e8 B gathered at layer 1's down_proj backward, the replay 4.830e8).
    spec = model_from_config(mistral(2, 32000), "mistral-2L")
    setup = build_setup(spec, method="qlora", precision="bf16", gpus=2, zero=3, rank=16, targets="mlp",
                        quant_type="fp4", double_quant=True, gradient_checkpointing=True, offload="all",
                        attn="eager", batch=2, seq=1024)
    run = resolve_run(spec, setup)
    wm = run.wrapper.memory(run, run.stepped_optimizer)
    assert wm.top_layer is not None
    assert wm.gathered.at_loss == 745_144_320
    assert wm.top_layer.gathered == 745_144_320 - 32000 * 4096 * 2
