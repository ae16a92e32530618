"""ZeRO-1/2's IPG bucket made by the backward's first gradient hook (DeepSpeed 0.19.8 stage_1_and_2.py:
``grad_handling_hook -> process_gradients -> setup_buckets``), in a LoRA run without checkpointing: the top
layer's first trained gradient is its last adapter's (forward order), so with attention-only targets the
layer's MLP and attention core are back-propagated before the bucket exists (estimator/wrapper_rows.
first_hook_rows); and ZeRO-1's lowest trained layer (estimator/wrappers/zero1_bottom.py). By hand on
Llamas of Llama-3-8B's widths."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.instants import memory_at, named
from tuneplan.estimator.run import resolve_run
from tuneplan.specs.model import model_from_config

LLAMA_2L = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 32,
            "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
            "tie_word_embeddings": False}
TOKENS = 2 * 512


def rows(targets: str, bucket: int, zero: int = 2, layers: int = 2) -> dict[str, int]:
    model = model_from_config(dict(LLAMA_2L, num_hidden_layers=layers), f"Llama {layers} layers (hand)")
    setup = build_setup(model, method="lora", precision="fp32", gpus=2, zero=zero, targets=targets, rank=8,
                        batch=2, seq=512, gradient_checkpointing=False, attn="sdpa", framework="hf",
                        ds_reduce_bucket=bucket)
    at = memory_at(resolve_run(model, setup), 2, 512)
    return {name: sum(row) for name, row in at.rows.items()} | {
        "first_hook_temp": named(at.rows["backward_first_hook"]).backward_temp
        if "backward_first_hook" in at.rows else -1}


def test_the_bucket_is_made_after_the_top_layers_mlp_and_attention_core() -> None:
    # q_proj, v_proj: v_proj's lora_B is the first trained gradient; the bucket (fp32 here: 4 B x elements)
    # is absent from the top layer's largest moment and present from the first hook on
    small, large = rows("q_proj,v_proj", 10_000_000), rows("q_proj,v_proj", 40_000_000)
    assert large["backward_layers_top"] == small["backward_layers_top"]
    for moment in ("backward_first_hook", "backward_layer_below_top", "backward_layers_bottom"):
        assert large[moment] - small[moment] == 4 * 30_000_000
    # the moment's activation gradients, per token (fp32: out_b = residual_b = 4, h = 4096, r = 8): the
    # larger of q, k, v's output gradients (4096 + 1024 + 1024), their input's (h) and the residual's two,
    # 4 (10240 + 2 x 4096) = 73,728 B, and the input RMSNorm's backward (LlamaRMSNorm: fp32 input, rstd,
    # 5 fp32 h-wide gradients, the residual gradient) less what the layer keeps then (that fp32 input and
    # rstd, the norm's output the adapters read, 4h, and the two r-wide adapter middles): 20 h - 8 r
    assert small["first_hook_temp"] == TOKENS * max(4 * (4096 + 1024 + 1024 + 4096 + 2 * 4096),
                                                    20 * 4096 - 8 * 8)


def test_an_adapted_mlp_makes_the_bucket_at_the_top_layers_start() -> None:
    # down_proj's adapter is the layer's first trained gradient: the top row holds the bucket, no split
    small, large = rows("all-linear", 10_000_000), rows("all-linear", 40_000_000)
    assert large["backward_layers_top"] - small["backward_layers_top"] == 4 * 30_000_000
    assert small["first_hook_temp"] == -1


def test_zero1_alike() -> None:
    small, large = rows("q_proj,v_proj", 10_000_000, 1), rows("q_proj,v_proj", 40_000_000, 1)
    assert large["backward_layers_top"] == small["backward_layers_top"]
    assert large["backward_first_hook"] - small["backward_first_hook"] == 4 * 30_000_000


# ZeRO-1's lowest trained layer (estimator/wrappers/zero1_bottom.py): without overlap_comm a hook only makes
# the bucket, every gradient stays whole in param.grad until the boundary's reduce_gradients, and the lowest
# trained layer's own gradients are made as its activations and scratch are released. One Llama-3-8B layer:
# q, o 4096 x 4096, k, v 4096 x 1024, gate, up, down 4096 x 14336, two RMSNorm weights, in fp32
LLAMA_4L = LLAMA_2L | {"num_hidden_layers": 4}
LAYER_GRAD = 4 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096)


def bottom(batch: int, seq: int, zero: int = 1) -> tuple[int, int, int, int]:
    model = model_from_config(LLAMA_4L, "Llama 4 layers (hand config)")
    setup = build_setup(model, method="freeze", precision="fp32", gpus=2, zero=zero, batch=batch, seq=seq,
                        gradient_checkpointing=False, attn="sdpa", framework="hf", optimizer="adamw-8bit",
                        offload="optimizer")
    at = memory_at(resolve_run(model, setup), batch, seq)
    row = named(at.rows["backward_layers_bottom"])
    return row.gradients, row.activations, row.backward_temp, at.acts.top_layer_bytes


def test_zero1_lowest_trained_layer_ends_with_its_gradients_not_its_activations() -> None:
    # 1 x 1024 tokens: the layer's 872 MB of gradients outweigh its activations and scratch, all released
    _, acts, scratch, _ = bottom(1, 1024)
    assert (acts, scratch) == (0, 0)
    # 8 x 4096 tokens: its activations exceed the gradients made in their place
    _, acts, _, layer_acts = bottom(8, 4096)
    assert layer_acts > LAYER_GRAD
    assert acts == layer_acts - LAYER_GRAD
    # ZeRO-2 reduces in the hooks: its bottom row keeps the layer's activations
    assert bottom(1, 1024, 2)[1] > 0


def test_zero1_boundary_reduction_allocates_rank0_partition_beside_every_gradient() -> None:
    # Qwen2.5-7B at 2 layers, fp32, 2 GPUs (wrappers/zero12_reductions.zero1_epilogue). Module order: the
    # embedding (152064 x 3584 = 544,997,376, larger than the 5e8 bucket: reduced alone, never moved into
    # it), then layer 0's q, k, v, o, gate, up, down and norms, which rank 0's slice (half of 1,556,113,920)
    # ends past, then layer 1's q_proj weight it ends inside: copy_grads_in_partition allocates
    # 544,997,376 + 233,057,792 + 12,845,056 = 790,900,224 elements (the simulation's empty() of the same
    # size), beside every gradient and the 2 GB bucket; the analytic counts q_proj's bias with its weight
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from random_setups import reduced_model

    spec = reduced_model("Qwen/Qwen2.5-7B", 2)
    setup = build_setup(spec, method="full", precision="fp32", optimizer="adamw", batch=1, seq=16,
                        grad_accum=2, gradient_checkpointing=False, attn="eager", framework="hf", gpus=2,
                        zero=1)
    run = resolve_run(spec, setup)
    epilogue = memory_at(run, 1, 16).statics.wrapped.epilogue
    assert epilogue is not None
    expected = 4 * run.param_plan.trainable_params + 4 * 500_000_000 + 4 * 790_900_224
    assert 0 <= epilogue.gradients - expected <= 4 * 3584
    assert epilogue.reduction_copy == 0


def test_a_trained_classifier_head_makes_the_bucket_before_the_layers() -> None:
    # PEFT keeps a classifier's ``score`` trainable (modules_to_save): its gradient, the backward's first,
    # fires the hook before any layer, so the top layer's row keeps the bucket and there is no split
    model = model_from_config(LLAMA_2L, "Llama 2 layers (hand config)")
    setup = build_setup(model, method="lora", precision="fp32", gpus=2, zero=2, targets="q_proj,v_proj",
                        rank=8, batch=2, seq=512, gradient_checkpointing=False, attn="sdpa", framework="hf",
                        num_labels=2)
    assert "backward_first_hook" not in memory_at(resolve_run(model, setup), 2, 512).rows


def test_one_layer_the_bottom_row_is_the_top_layers_backward_before_its_first_hook() -> None:
    # with a single layer the bottom row is that layer's own backward, which starts before the bucket is
    # made: only the first hook's moment (and what follows it) holds the bucket (once estimated with a
    # KeyError: the bottom row was read before it was built)
    for zero in (1, 2):
        small = rows("q_proj,v_proj", 10_000_000, zero=zero, layers=1)
        large = rows("q_proj,v_proj", 40_000_000, zero=zero, layers=1)
        assert large["backward_layers_bottom"] == small["backward_layers_bottom"]
        assert large["backward_layers_top"] == small["backward_layers_top"]
        assert large["backward_first_hook"] - small["backward_first_hook"] == 4 * 30_000_000


def test_zero1_lowest_trained_layers_attention_core_beside_its_mlp_and_o_proj_gradients() -> None:
    # eager attention materialises the scores' gradients: when the lowest trained layer's attention core is
    # back-propagated, autograd has made its MLP's three and o_proj's weight gradients (fp32, whole in
    # param.grad under ZeRO-1), 3 x 4096 x 14336 + 4096 x 4096 = 192,937,984 elements, not yet q, k, v
    # nor the norms: the row holds every other gradient and the bucket, those, the layer's activations and
    # the attention core's own scratch (ActivationPlan.attention_backward_bytes)
    model = model_from_config(LLAMA_4L, "Llama 4 layers (hand config)")

    def rows_at(attn: str):  # type: ignore[no-untyped-def]
        setup = build_setup(model, method="freeze", precision="fp32", gpus=2, zero=1, batch=1, seq=1024,
                            gradient_checkpointing=False, attn=attn, framework="hf", optimizer="adamw-8bit",
                            offload="optimizer")
        at = memory_at(resolve_run(model, setup), 1, 1024)
        return at.rows, at.acts

    rows_eager, acts = rows_at("eager")
    every_gradient = named(rows_eager["backward_layers_bottom"]).gradients  # its end: G - E + E
    moment = named(rows_eager["backward_layer_attention"])
    assert moment.gradients == every_gradient - LAYER_GRAD + 4 * 192_937_984
    assert moment.backward_temp == acts.attention_backward_bytes  # type: ignore[attr-defined]
