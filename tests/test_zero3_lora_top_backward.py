"""ZeRO-3's gathered bytes through the top decoder layer's backward of a dense 16-bit LoRA run under
checkpointing, from the coordinator replayed (estimator/wrappers/zero3_lora_top_backward.py), counted by
hand from DeepSpeed 0.19.8's ``PartitionedParameterCoordinator``."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.instants import memory_at
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_coordinator import zero3_gathered_in_backward
from tuneplan.estimator.wrappers.zero3_lora_top_backward import (
    zero3_lora_forward_bytes,
    zero3_lora_lower_backward_bytes,
    zero3_lora_top_backward_bytes,
)
from tuneplan.estimator.wrappers.zero3_module_trace import step_events
from tuneplan.estimator.wrappers.zero3_replay import replay
from tuneplan.specs.model import model_from_config

LLAMA2_70B_2L = dict(model_type="llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=2,
                     num_attention_heads=64, num_key_value_heads=8, vocab_size=32000,
                     tie_word_embeddings=False)


def test_the_top_layers_backward_holds_the_lower_layer_and_the_embedding() -> None:
    # Llama-2-70b over 2 layers, LoRA rank 4 on q/v in fp32 with checkpointing over 2 GPUs (the
    # simulation's second step, hf). A layer: q / o 8192^2 = 67,108,864, k / v 1024 x 8192 = 8,388,608,
    # gate / up / down 28672 x 8192 = 234,881,024: 855,638,016 elements; the LoRA matrices (4 x 8192 =
    # 32,768, 4 x 1024 = 4,096) and the norms (8,192) are under the 1e5 persistence threshold, the head
    # 32000 x 8192 = 262,144,000, the embedding 262,144,000.
    # The forward's prefetcher keeps layer 0 for its backward use; the top layer's MLP backward releases
    # the weights its recompute fetched (update_recompute_parameters), the count drops under M = 1e9 and
    # the prefetcher pops what the queue holds ahead: layer 0's entries (AVAILABLE, uncounted), then the
    # embedding, alone. Between module fetches of layer 1's backward, at the most: layer 0 and the
    # embedding, 855,638,016 + 262,144,000 = 1,117,782,016 elements, 4 bytes each: 4,471,128,064 (the
    # simulation: 4.4711e9 bytes of gathered buffers at layer 1's attention releases). The closed form
    # bounds it by M plus the largest layer parameter: 1e9 + 234,881,024 elements.
    spec = model_from_config(LLAMA2_70B_2L, "llama-2-70b-2L")
    setup = build_setup(spec, method="lora", precision="fp32", gpus=2, zero=3, rank=4,
                        targets="q_proj,v_proj", gradient_checkpointing=True)
    run = resolve_run(spec, setup)
    assert zero3_lora_top_backward_bytes(run, 50_000_000) == 4 * (855_638_016 + 262_144_000)
    assert zero3_gathered_in_backward(spec, setup, targets=run.targets) == 1_000_000_000 + 234_881_024
    # the top layer's backward row counts the replay's bytes gathered, not the closed form's bound
    assert memory_at(run, setup.batch, setup.seq).rows["backward_layers_top"][-1] == 4_471_128_064


def test_no_replay_without_checkpointing_nor_for_a_parallel_block() -> None:
    # without checkpointing the trace has no recompute (other closed forms); Falcon's parallel block runs
    # its MLP beside the attention, an order the module trace does not lay out
    spec = model_from_config(LLAMA2_70B_2L, "llama-2-70b-2L")
    plain = build_setup(spec, method="lora", precision="fp32", gpus=2, zero=3, rank=4,
                        targets="q_proj,v_proj", gradient_checkpointing=False)
    assert zero3_lora_top_backward_bytes(resolve_run(spec, plain), 50_000_000) == 0
    falcon = model_from_config(dict(model_type="falcon", hidden_size=1024, num_hidden_layers=2,
                                    num_attention_heads=16, vocab_size=1000, parallel_attn=True,
                                    new_decoder_architecture=True, num_kv_heads=2), "falcon-tiny")
    setup = build_setup(falcon, method="lora", precision="fp32", gpus=2, zero=3, rank=4,
                        gradient_checkpointing=True)
    assert zero3_lora_top_backward_bytes(resolve_run(falcon, setup), 50_000_000) == 0


def test_the_forward_pops_the_untied_head_alone_beside_the_kept_layers() -> None:
    # Yi-1.5-34B over 4 layers, LoRA rank 64 on q/v in bf16 with checkpointing over 4 GPUs, optimizer
    # offload (hf). q / o 7168^2 = 51,380,224, k / v 1024 x 7168 = 7,340,032, gate / up / down 20480 x 7168
    # = 146,800,640 elements; a lora_A 64 x 7168 = 458,752 (over the 1e5 persistence threshold), a v
    # lora_B 1024 x 64 = 65,536 (under it), the norms 7,168; head 64000 x 7168 = 458,752,000.
    # Second step, at layer 2's post_attention_layernorm: the prefetcher keeps layers 0 and 1's MLP weights
    # for their backward use (6 x 146,800,640), has layer 3's q_proj and its lora_A, and a coalesced round
    # of its k / v, their lora_A and o_proj, and with A under M the next one not available, the head, is
    # popped alone: 458,752,000 + 6 x 146,800,640 + 2 x 51,380,224 + 2 x 7,340,032 + 3 x 458,752 =
    # 1,458,372,608 elements (the simulation: the head's buffer, six MLP buffers, layer 3's round and
    # q_proj's, 2.9158e9 bytes at that norm, the step's peak, the layers below it checkpointed).
    cfg = dict(model_type="llama", hidden_size=7168, intermediate_size=20480, num_hidden_layers=4,
               num_attention_heads=56, num_key_value_heads=8, vocab_size=64000, tie_word_embeddings=False)
    spec = model_from_config(cfg, "yi-1.5-34b-4L")
    setup = build_setup(spec, method="lora", precision="bf16-mixed", gpus=4, zero=3, rank=64,
                        targets="q_proj,v_proj", gradient_checkpointing=True, offload="optimizer")
    run = resolve_run(spec, setup)
    events, top = step_events(run)
    counts = [n for n, _ in replay(events, 50_000_000)]
    elements = 458_752_000 + 6 * 146_800_640 + 2 * 51_380_224 + 2 * 7_340_032 + 3 * 458_752
    assert max(counts[:top.start]) == elements == 1_458_372_608
    most, below, _ = zero3_lora_forward_bytes(run, 50_000_000)
    # in bytes, 2 an element: the round's flat buffer holds its parameters (not waited on yet, no copies)
    assert most == 2 * elements and below == 2
    assert memory_at(run, setup.batch, setup.seq).rows["forward_head_popped"][-1] == most


def test_a_lower_layers_recompute_beside_the_embedding_and_the_rounds() -> None:
    # Qwen2.5-72B-Instruct over 4 layers, LoRA rank 16 on every linear in bf16 with checkpointing over 8
    # GPUs, optimizer offload (LLaMA-Factory). q / o 8192^2 = 67,108,864, k / v 1024 x 8192 = 8,388,608,
    # gate / up / down 29568 x 8192 = 242,221,056; a lora_A over 8192 (or lora_B onto it) 16 x 8192 =
    # 131,072, onto / over 29568 16 x 29568 = 473,088; embedding 152064 x 8192 = 1,245,708,288.
    # At the most of a lower layer's recompute fetches: the embedding (popped alone past the top layer),
    # the layer's attention, its MLP weights and nine 131,072 / three 473,088 LoRA matrices gathered,
    # 2,125,965,312 elements; two coalesced rounds still filed: one waited on (its flat buffer of
    # 131,072 + 473,088 + 242,221,056 elements beside its copies), one not (its flat buffer of 473,088 +
    # 242,221,056, no copies). Bytes, 2 an element: 2 x (2,125,965,312 - 242,694,144) + 2 x 242,825,216
    # + 2 x 242,694,144 = 4,737,581,056 (the simulation: 4.7373e9 at layer 0's recomputed up_proj, the
    # step's peak; the closed form's layer and embedding 4.2468e9).
    cfg = dict(model_type="qwen2", hidden_size=8192, intermediate_size=29568, num_hidden_layers=4,
               num_attention_heads=64, num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False)
    spec = model_from_config(cfg, "qwen2.5-72b-4L")
    setup = build_setup(spec, method="lora", precision="bf16", framework="llamafactory", gpus=8, zero=3,
                        rank=16, gradient_checkpointing=True, offload="optimizer", num_labels=1)
    run = resolve_run(spec, setup)
    elements = 1_245_708_288 + 2 * 67_108_864 + 2 * 8_388_608 + 3 * 242_221_056 + 9 * 131_072 + 3 * 473_088
    assert elements == 2_125_965_312
    expected = 2 * (elements - 242_694_144) + 2 * 242_825_216 + 2 * 242_694_144
    assert zero3_lora_lower_backward_bytes(run, 50_000_000) == expected == 4_737_581_056
    assert memory_at(run, setup.batch, setup.seq).rows["backward_layers_bottom"][-1] == expected
