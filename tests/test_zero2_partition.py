"""ZeRO-2's gradient partition made in the layers' backward (estimator/wrappers/zero2_partition.py), by hand
from DeepSpeed 0.19.8's stage_1_and_2.py on a three-layer Qwen3-MoE of Qwen3-235B-A22B's widths, whose fused
expert stacks (transformers 5 ``Qwen3MoeExperts``) are larger than the default 5e8-element bucket."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.memory_statics import memory_statics
from tuneplan.estimator.run import resolve_run
from tuneplan.specs.model import ModelSpec, model_from_config

QWEN3_MOE_3L = {"model_type": "qwen3_moe", "hidden_size": 4096, "num_hidden_layers": 3,
                "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
                "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_experts": 128,
                "num_experts_per_tok": 8,
                "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
                "tie_word_embeddings": False}
BUCKET = 500_000_000
EMBED = 151_936 * 4_096
ATTN = 2 * 4_096 * 64 * 128 + 2 * 4_096 * 4 * 128  # q, o; k, v
ROUTER = 4_096 * 128
GATE_UP = 128 * 2 * 1_536 * 4_096  # one tensor: gate and up of every expert
DOWN = 128 * 4_096 * 1_536
NORMS = 2 * 4_096 + 2 * 128  # input / post-attention RMSNorms, q_norm, k_norm
TOTAL = 2 * EMBED + 3 * (ATTN + ROUTER + GATE_UP + DOWN + NORMS) + 4_096
# rank 0's slice of 8 is 1,088,491,104 elements from the flat group's start: the embedding, layer 0's
# attention and router, and the gate_up stack it ends inside, each held whole in grads_in_partition
PARTITION = EMBED + ATTN + ROUTER + GATE_UP


def statics(grad_accum: int, method: str = "full"):  # type: ignore[no-untyped-def]
    model: ModelSpec = model_from_config(QWEN3_MOE_3L, "Qwen3-MoE 3 layers (hand config)")
    setup = build_setup(model, method=method, precision="fp32", optimizer="adafactor", gpus=8, zero=2,
                        grad_accum=grad_accum, gradient_checkpointing=True, batch=1, seq=512)
    return memory_statics(resolve_run(model, setup))


def test_hand_counts_match_the_model() -> None:
    assert TOTAL == 8_707_928_832  # the simulated flat group (DeepSpeed's cat of every fp32 parameter)
    assert -(-TOTAL // 8) < PARTITION


def test_the_bottom_gate_up_stack_makes_the_partition_beside_the_one_an_accumulation_keeps() -> None:
    # backward: layer 0's down_proj (not rank 0's) is reduced when gate_up's hook fires; gate_up, larger
    # than the bucket, waits in its own tensor until the router's hook reduces it, and its copy into this
    # rank's partition allocates grads_in_partition whole; micro-batch 1's is still held by
    # all_grad_tensors (fp32 gradients accumulate in the model's dtype: no compact buffer)
    kept = 4 * PARTITION
    moment = 4 * (GATE_UP + ROUTER) + 4 * PARTITION
    assert statics(2).wrapped.layers_backward == kept + 4 * BUCKET + moment
    assert statics(1).wrapped.layers_backward == 4 * BUCKET + moment


def test_the_epilogue_keeps_the_accumulated_partition() -> None:
    one, two = statics(1).wrapped.epilogue, statics(2).wrapped.epilogue
    assert one is not None and two is not None
    assert two.gradients - one.gradients == 4 * PARTITION
    assert two.reduction_copy == one.reduction_copy


def test_a_lora_run_has_no_such_moment() -> None:
    assert statics(2, method="lora").wrapped.layers_backward == 0


MISTRAL_7B = {"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 4, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32768,
              "tie_word_embeddings": False}
# q, o; k, v; gate, up, down; the two norms
MISTRAL_LAYER = 2 * 4_096 * 4_096 + 2 * 4_096 * 1_024 + 3 * 4_096 * 14_336 + 2 * 4_096


def test_a_freeze_run_within_one_bucket_makes_its_partition_only_at_the_epilogue() -> None:
    # LLaMA-Factory's freeze trains the top two layers: 436,224,000 elements, within the 5e8 bucket, so the
    # only reduction is the epilogue's and grads_in_partition does not exist in the layers' backward; an
    # accumulation's kept partition does
    model = model_from_config(MISTRAL_7B, "Mistral-7B 4 layers (hand config)")
    assert 2 * MISTRAL_LAYER == 436_224_000 < BUCKET

    def wrapped(grad_accum: int):  # type: ignore[no-untyped-def]
        setup = build_setup(model, method="freeze", precision="bf16-mixed", gpus=4, zero=2,
                            grad_accum=grad_accum, batch=4, seq=1024)
        return memory_statics(resolve_run(model, setup)).wrapped

    one, two = wrapped(1), wrapped(2)
    assert one.resident.gradients > 0
    assert one.buckets.missing_at_bottom == one.resident.gradients
    assert two.buckets.missing_at_bottom == 0
    assert one.layers_backward == two.layers_backward - two.resident.gradients  # no moment beyond the kept


MIXTRAL_2L = {"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 14336, "num_local_experts": 8,
              "num_experts_per_tok": 2, "vocab_size": 32000, "tie_word_embeddings": False}


def test_the_first_hook_makes_the_bucket_after_the_top_expert_stack_gradient() -> None:
    # PEFT's LoRA on transformers 5's fused expert stacks: the top layer's stack gradient (a whole delta
    # weight, E x 4096 x 14336 in fp32) is made before any trained tensor's hook has fired, and only that
    # hook's process_gradients -> setup_buckets allocates the IPG bucket (freed at each ZeRO-2 epilogue):
    # at that moment the row holds no bucket, whatever reduce_bucket_size is, as long as that moment (a
    # 1.9 GB gradient) outweighs the layer's later ones beside the bucket (a few MB at 256 tokens)
    from tuneplan.estimator.instants import memory_at

    model = model_from_config(MIXTRAL_2L, "Mixtral 2 layers (hand config)")

    def top_row(bucket: int) -> int:
        setup = build_setup(model, method="lora", precision="fp32", gpus=4, zero=2, offload="optimizer",
                            targets="mlp", rank=4, batch=1, seq=256, gradient_checkpointing=False,
                            framework="llamafactory", ds_reduce_bucket=bucket)
        run = resolve_run(model, setup)
        assert memory_statics(run).wrapped.first_hook_bucket == 4 * bucket
        return sum(memory_at(run, 1, 256).rows["backward_layers_top"])

    assert top_row(10_000_000) == top_row(40_000_000)


def test_a_tied_embedding_holding_rank_0s_slice_has_no_partition_at_its_backward() -> None:
    # stage_1_and_2.py (DeepSpeed 0.19.8) calls copy_grads_in_partition, which allocates grads_in_partition,
    # only for a reduced parameter of this rank's partition. Tied Mistral-7B widths, 4 layers, 8 ranks: the
    # flat group is 1,006,669,824 elements (embedding 134,217,728, four layers of 218,112,000, the final
    # norm), rank 0's slice its first 125,833,728: inside the token embedding. The tied weight's hook fires
    # only once the embedding's backward has added its part to the head's (autograd's input buffer), so the
    # layers' reductions (872 M elements, one bucket flushed at layer 1) hold nothing of rank 0's: while the
    # embedding's gradient is made, only the 16-bit bucket (5e8 x 2 B) is there beside it
    tied = {**MISTRAL_7B, "tie_word_embeddings": True}
    model = model_from_config(tied, "Mistral-7B 4 layers, tied (hand config)")
    embed = 32_768 * 4_096
    assert embed + 4 * MISTRAL_LAYER + 4_096 == 1_006_669_824 and -(-1_006_669_824 // 8) < embed
    assert 4 * MISTRAL_LAYER > BUCKET
    setup = build_setup(model, method="full", precision="bf16-mixed", gpus=8, zero=2, batch=4, seq=64,
                        gradient_checkpointing=False)
    wrapped = memory_statics(resolve_run(model, setup)).wrapped
    assert wrapped.embedding is not None
    assert wrapped.embedding.gradients == 2 * BUCKET
    assert wrapped.buckets.missing_at_bottom == 2 * embed  # the partition (the embedding, whole) comes later
