"""FSDP1 with PEFT's per-adapter units gathers the layer below once a layer's first adapter in forward
order starts its backward. With the adapters on the MLP only, that adapter comes after the attention core,
so an eager core's backward (the scores' gradients, the layer's largest scratch) runs with two layers
unsharded (estimator/wrappers/fsdp1_adapter_units.next_layer_at_attention_core)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.instants import memory_at  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402

# Mistral-7B-v0.3 (h 4096, 8 KV heads of 128, MLP 14336, vocab 32768), QLoRA at 2 layers, 4 GPUs, CPU
# offload of the parameters. A layer's unit: its linears' 4096 x (4096 + 1024 + 1024 + 4096) + 3 x 4096 x
# 14336 = 218,103,808 4-bit codes in bf16 storage (2 per byte) and two RMSNorms of 4096 in bf16:
LAYER = 218_103_808 // 2 + 2 * 4096 * 2  # 109,068,288 B gathered, 27,267,072 B its host shard's copy
# the root unit: embedding and head 2 x 32768 x 4096 and the final norm, bf16, and its shard's copy
ROOT = (2 * 32768 * 4096 + 4096) * 2  # 536,879,104 B
TWO_LAYERS = 2 * (LAYER + LAYER // 4) + ROOT + ROOT // 4
SLACK = 16 * 1024**2  # what else the row counts unsharded: the adapter units, a cached shard copy


def _top_gathered(targets: str) -> int:
    spec = reduced_model("mistralai/Mistral-7B-Instruct-v0.3", 2)
    s = build_setup(spec, method="qlora", precision="bf16-mixed", framework="llamafactory", batch=1, seq=2048,
                    gradient_checkpointing=True, bits=4, rank=32, targets=targets, attn="eager", gpus=4,
                    fsdp=True, fsdp_version=1, offload="all")
    return memory_at(resolve_run(spec, s), 1, 2048).components("backward_layers_top")["parallel_buffers"]


def test_adapters_on_the_mlp_gather_the_layer_below_before_the_core() -> None:
    # simulate (the same setup): 943,769,600 B of all-gather outputs and host-shard copies at the top layer's
    # _softmax_backward_data: the root and both layers, each with its copy
    assert TWO_LAYERS == 943_769_600
    assert TWO_LAYERS <= _top_gathered("mlp") <= TWO_LAYERS + SLACK


def test_adapters_on_q_and_v_gather_it_after_the_core() -> None:
    one_layer = TWO_LAYERS - LAYER - LAYER // 4
    assert one_layer <= _top_gathered("q_proj,v_proj") <= one_layer + SLACK
