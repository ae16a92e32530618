"""FLOPs per token against hand derivations (small dense and MoE configs, counted on paper).

Conventions (compute.py doc): a multiply-add is 2 FLOPs; backward = input gradients (1x forward of every
linear the gradient crosses) + weight gradients (1x, trainable weights only); attention core backward 2x
forward (eager) or 2.5x (SDPA/flash); causal SDPA/flash attention meets (s + 1) / 2 keys per query.
"""

from __future__ import annotations

import pytest

from tuneplan.api import build_setup
from tuneplan.estimator.compute import flops_per_token
from tuneplan.specs.model import model_from_config

# Dense: h 64, 2 layers, 4 heads of 16, 2 KV heads, SwiGLU 128, vocab 100, untied.
DENSE = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=128, vocab_size=100, tie_word_embeddings=False)
# Per token per layer, forward, 2 * d_in * d_out each:
#   q 2*64*64 = 8192, k 2*64*32 = 4096, v 4096, o 8192, gate/up/down 3 * 2*64*128 = 49152  -> 73728
DENSE_LINEAR_LAYER = 8192 + 4096 + 4096 + 8192 + 3 * 16384
LOGITS = 2 * 64 * 100  # 12800

# MoE (Mixtral layout): h 64, 2 layers, 4 heads of 16 (MHA), 4 experts of width 96, top-2, vocab 100.
MOE = dict(model_type="mixtral", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=4, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2,
           vocab_size=100, tie_word_embeddings=False)
# Per token per layer: q,k,v,o 4 * 2*64*64 = 32768; router 2*64*4 = 512;
# experts: 2 routed of 3 matrices 2*64*96 = 12288 each -> 2 * 36864 = 73728. Total 107008.
MOE_LINEAR_LAYER = 4 * 8192 + 512 + 2 * 3 * 12288


@pytest.fixture
def dense():
    return model_from_config(DENSE, "dense-hand")


@pytest.fixture
def moe():
    return model_from_config(MOE, "moe-hand")


def _setup(model, **kw):
    base = dict(seq=8, gradient_checkpointing=False, attn="sdpa", precision="bf16", framework="hf")
    base.update(kw)
    return build_setup(model, **base)


def test_dense_full_finetune_by_hand(dense) -> None:
    fl = flops_per_token(dense, _setup(dense, method="full"))
    attn_layer = 2 * 4 * (16 + 16) * 4.5  # QK^T + PV, ctx (8 + 1) / 2 = 4.5 -> 1152
    fwd = 2 * DENSE_LINEAR_LAYER + 2 * attn_layer + LOGITS
    bwd = 2 * (2 * DENSE_LINEAR_LAYER) + 2 * 2.5 * attn_layer + 2 * LOGITS
    assert fl.forward == pytest.approx(fwd)
    assert fl.backward == pytest.approx(bwd)
    assert fl.recompute == 0
    assert fl.total == pytest.approx(fwd + bwd)  # = 488,832


def test_dense_eager_attention_meets_every_key(dense) -> None:
    fl = flops_per_token(dense, _setup(dense, method="full", attn="eager"))
    attn_layer = 2 * 4 * 32 * 8  # ctx = s = 8 -> 2048
    assert fl.parts["attn_fwd"] == pytest.approx(2 * attn_layer)
    assert fl.parts["attn_bwd"] == pytest.approx(2 * 2.0 * attn_layer)


def test_dense_lora_has_no_weight_gradients_plus_adapters(dense) -> None:
    fl = flops_per_token(dense, _setup(dense, method="lora", rank=4, targets="q_proj,v_proj"))
    adapters_layer = 2 * 4 * (64 + 64) + 2 * 4 * (64 + 32)  # q 1024 + v 768
    attn_layer = 2 * 4 * 32 * 4.5
    assert fl.parts["linear_bwd_weight"] == 0
    assert fl.parts["adapter_fwd"] == pytest.approx(2 * adapters_layer)
    fwd = 2 * DENSE_LINEAR_LAYER + 2 * attn_layer + LOGITS + 2 * adapters_layer
    bwd = 2 * DENSE_LINEAR_LAYER + 2 * 2.5 * attn_layer + LOGITS + 2 * (2 * adapters_layer)
    assert fl.forward == pytest.approx(fwd)
    assert fl.backward == pytest.approx(bwd)


def test_gradient_checkpointing_recomputes_the_layers_not_the_head(dense) -> None:
    off = flops_per_token(dense, _setup(dense, method="lora", rank=4, targets="q_proj,v_proj"))
    on = flops_per_token(dense, _setup(dense, method="lora", rank=4, targets="q_proj,v_proj",
                                       gradient_checkpointing=True))
    layers_fwd = off.forward - LOGITS
    assert on.recompute == pytest.approx(layers_fwd)
    assert on.total == pytest.approx(off.total + layers_fwd)


def test_freeze_backpropagates_only_through_the_trained_top(dense) -> None:
    fl = flops_per_token(dense, _setup(dense, method="freeze", freeze_trainable_layers=1))
    attn_layer = 2 * 4 * 32 * 4.5
    # top layer: input + weight grads; bottom layer: nothing; head: input grad only (frozen lm_head)
    bwd = 2 * DENSE_LINEAR_LAYER + 2.5 * attn_layer + LOGITS
    assert fl.backward == pytest.approx(bwd)


def test_qlora_dequantizes_every_block_weight_per_pass(dense) -> None:
    weights = 2 * (64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 3 * 64 * 128)  # 73,728 block weights
    off = flops_per_token(dense, _setup(dense, method="qlora", precision="bf16-mixed"))
    on = flops_per_token(dense, _setup(dense, method="qlora", precision="bf16-mixed",
                                       gradient_checkpointing=True))
    assert off.dequant_elements == 2 * weights  # forward + input-gradient matmul
    assert on.dequant_elements == 3 * weights  # + the recompute
    lora = flops_per_token(dense, _setup(dense, method="lora", precision="bf16-mixed"))
    assert lora.dequant_elements == 0
    assert off.total == pytest.approx(lora.total)  # same tensor-core work; dequant is memory traffic


def test_moe_counts_the_routed_experts_only(moe) -> None:
    fl = flops_per_token(moe, _setup(moe, method="full"))
    attn_layer = 2 * 4 * 32 * 4.5
    assert fl.parts["linear_fwd"] == pytest.approx(2 * MOE_LINEAR_LAYER)  # 214,016, not all 4 experts
    fwd = 2 * MOE_LINEAR_LAYER + 2 * attn_layer + LOGITS
    assert fl.forward == pytest.approx(fwd)
    # 6N uses the active parameters: top-2 experts, not 4
    assert fl.six_n == pytest.approx(6 * moe.params_active)
    assert moe.params_active < moe.params_total


def test_moe_lora_on_experts_counts_two_of_four(moe) -> None:
    # an nn.Linear per expert: LitGPT's MoE (under transformers 5 PEFT adapts the fused stacks instead,
    # and refuses w1 without w3: estimator/fused_expert_lora.py)
    fl = flops_per_token(moe, _setup(moe, method="lora", rank=2, targets="w1", framework="litgpt"))
    per_expert = 2 * 2 * (64 + 96)  # r=2 adapter on w1 (64 -> 96): 640
    assert fl.parts["adapter_fwd"] == pytest.approx(2 * 2 * per_expert)  # 2 layers x top-2


def test_attention_term_grows_with_sequence(dense) -> None:
    short = flops_per_token(dense, _setup(dense, method="full", seq=128))
    long = flops_per_token(dense, _setup(dense, method="full", seq=4096))
    assert long.total > short.total
    # per token the linears are the same; the difference is the s-dependent attention term
    assert long.parts["linear_fwd"] == short.parts["linear_fwd"]
    assert long.parts["attn_fwd"] / short.parts["attn_fwd"] == pytest.approx(4097 / 129)


def test_qwen_7b_is_6n_without_the_embedding_gather(qwen7b) -> None:
    # 6N counts the input embedding, a gather, not a matmul: the count is 6 x the other parameters plus the
    # attention term (28 layers x 3.5 x 2 x 28 heads x 256 x 256.5 keys ~ 0.36 GFLOP at s = 512)
    fl = flops_per_token(qwen7b, _setup(qwen7b, method="full", seq=512))
    matmul_params = qwen7b.params_active - qwen7b.embed_params
    assert 1.0 < fl.total / (6 * matmul_params) < 1.03
    assert fl.total < fl.six_n
    lora = flops_per_token(qwen7b, _setup(qwen7b, method="lora", seq=512))
    assert 0.62 < lora.total / fl.total < 0.72  # ~4N of 6N (the head's input gradient still runs)


def test_lora_matmul_reads_by_hand() -> None:
    """Llama-2 7B, LoRA r=16 on q_proj and v_proj (4096 x 4096), no dropout, fp32 adapters over bf16
    compute (elements of 4 B), per layer and token:

    - forward tensors the adapters write (write + read, 2x): r x 4 + 3 x 4096 x 4 = 49,216 B per module;
    - backward, op by op (2x): (4096 + 2 x 4096) x 4 = 49,152 B per module;
    - the memory-bound matmuls' reads no tensor count has: lora_A reads its input (4096 x 4 B) in forward
      (no dropout output in between) and the weight gradient reads it again in backward.
    Without checkpointing: 2 x (2 x 49,216) + 2 x (2 x 49,152) + 2 x (16,384 + 16,384) = 459,008 B a layer;
    with it the forward runs twice: + 2 x 49,216 x 2 (its tensors) + 2 x 16,384 (its read) = 688,640 B."""
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.compute import flop_plan
    from tuneplan.estimator.run import resolve_run

    spec = resolve_model("meta-llama/Llama-2-7b-hf")
    for ckpt, per_layer in ((False, 459_008), (True, 688_640)):
        setup = build_setup(spec, method="lora", rank=16, targets="q_proj,v_proj", dropout=0.0,
                            gradient_checkpointing=ckpt, batch=1, seq=512)
        run = resolve_run(spec, setup)
        assert (run.dtypes.adapter, run.dtypes.compute) == (4, 2)
        plan = flop_plan(run.model, run.setup, run.dtypes, run.targets, run.attn, run.loss)
        assert plan.traffic["adapters"] == pytest.approx(32 * per_layer)


# Element-wise bytes per token of one Llama-2 7B decoder layer (h 4096, f 11008, 32 heads of 128, MHA),
# LoRA on k, q, v, gate, up, down with dropout, everything bf16 (2 B; fp32 4 B), SDPA: an op-by-op count
# from the code the fsdp_qlora runs execute (transformers LlamaDecoderLayer / LlamaRMSNorm /
# apply_rotary_pos_emb / LlamaMLP, PEFT lora.Linear.forward ``result + lora_B(lora_A(dropout(x))) *
# scaling``, autograd's backward formulas), as (read + write) bytes per element of the tensor named. The
# GEMMs' own operand reads and output writes are theirs (compute-bound), the r-wide adapter tensors left out.
H, F = 4096, 11008
FORWARD_OPS = {
    # RMSNorm: to(fp32) 2+4, pow(2) 4+4, mean 4, x * rsqrt 4+4, to(bf16) 4+2, weight * 2+2; two per layer
    "norms": 2 * 36 * H,
    # per adapter: dropout reads x, writes x and its bool mask (2+2+1 per d_in); lora_A reads the dropout
    # output (2 per d_in); lora_B writes d_out (2), * scaling 2+2, result + 2+2+2: 7 d_in + 12 d_out
    "adapters qkv": 3 * (7 * H + 12 * H),
    "adapters gate up": 2 * (7 * H + 12 * F),
    "adapter down": 7 * F + 12 * H,
    # q * cos 2+2, -x2 on half 1+1, cat 2+2, rotate * sin 2+2, add 2+2+2 = 20 per element, q and k
    "rotary": 2 * 20 * H,
    "attention output contiguous": 4 * H,
    "residual adds": 2 * 6 * H,
    "silu, gate * up": 4 * F + 6 * F,
}
BACKWARD_OPS = {
    # the two branches' gradients summed into the residual stream, one add per block
    "residual sums": 2 * 6 * H,
    # per adapter: scaling 2+2 per d_out, lora_B's two matmuls read the gradient (2+2 per d_out), lora_A's
    # input gradient written (2 per d_in) and its saved input read by the weight gradient (2), dropout
    # backward 2+1+2, the sum with the base layer's input gradient 2+2+2: 8 d_out + 15 d_in
    "adapter down": 8 * H + 15 * F,
    "silu, gate * up": 2 * 6 * F + 6 * F,  # mul backward twice (2+2+2), silu_backward (2+2+2)
    "adapters gate up": 2 * (8 * F + 15 * H) + 6 * H,  # + the sum of the two input gradients
    # RMSNorm: weight * (g*w 2+2, g*n 2+2+2, sum over tokens 2), to(bf16) backward 2+4, x * rsqrt (g*r 4+4,
    # g*x 4+4+4, row sum 4), mean backward 4, pow backward (x.pow(1) 4+4, * 2 4+4, * g 4+4+4), the two
    # gradients summed 4+4+4, to(fp32) backward 4+2 = 92 per element; two per layer
    "norms": 2 * 92 * H,
    "flash backward's dO . O": 4 * H,
    # per element of q and k: * cos 2+2, * sin 2+2, neg 1+1, two slice backwards (zeros 2, copy 1+1), three
    # gradients summed (two adds of 2+2+2) = 30
    "rotary": 2 * 30 * H,
    "q, k, v gradients made contiguous for the view": 3 * 4 * H,
    "adapters qkv": 3 * (8 * H + 15 * H) + 2 * 6 * H,  # + the sum of the three input gradients
}


def test_layer_traffic_against_an_op_by_op_count() -> None:
    """The per-token element-wise traffic of a decoder layer (``layers`` + ``adapters``) within 10 % of
    the op-by-op count above: without checkpointing forward + backward, with it one forward more."""
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.compute import flop_plan
    from tuneplan.estimator.run import resolve_run

    fwd, bwd = sum(FORWARD_OPS.values()), sum(BACKWARD_OPS.values())
    assert (fwd, bwd) == (211 * H + 41 * F, 397 * H + 49 * F)
    spec = resolve_model("meta-llama/Llama-2-7b-hf")
    for ckpt, counted in ((False, fwd + bwd), (True, 2 * fwd + bwd)):
        setup = build_setup(spec, framework="fsdp-qlora", method="lora", gradient_checkpointing=ckpt,
                            batch=1, seq=2048)
        run = resolve_run(spec, setup)
        assert (run.dtypes.compute, run.dtypes.adapter, setup.rank, setup.dropout) == (2, 2, 64, 0.1)
        plan = flop_plan(run.model, run.setup, run.dtypes, run.targets, run.attn, run.loss)
        per_layer = (plan.traffic["layers"] + plan.traffic["adapters"]) / spec.n_layers
        assert per_layer / counted == pytest.approx(1.0, abs=0.10)
