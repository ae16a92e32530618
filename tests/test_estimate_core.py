"""First-principles checks of the analytic estimator, each expected value derived by hand here."""

from __future__ import annotations

import math

import pytest

from tuneplan.api import build_setup, estimate
from tuneplan.estimator.activations import layer_activations
from tuneplan.estimator.dtypes import resolve_dtypes
from tuneplan.specs.model import model_from_config
from tuneplan.specs.profiles import get_profile

from .conftest import LLAMA2_7B

H, L, F, V, KV = 3584, 28, 18944, 152064, 512  # Qwen2.5-7B


def lin_weights() -> int:
    return L * (H * H + 2 * H * KV + H * H + 3 * H * F)


def test_qlora_weights_first_principles(qwen7b) -> None:
    est = estimate(qwen7b, method="qlora", rank=16, batch=1, seq=512)
    c = est.breakdown.components
    biases = L * (H + 2 * KV)
    norms = (2 * L + 1) * H
    embed_head = 2 * V * H
    # 4-bit storage: half a byte per weight; everything not quantized is fp32 after
    # prepare_model_for_kbit_training (embeddings, lm_head, norms, q/k/v biases).
    expected = lin_weights() // 2 + 4 * (biases + norms + embed_head)
    assert c["weights"] == expected
    # double quant: 1 B per 64-block absmax + 4 B per 256 blocks + 1 KiB code table + fp32 offset per tensor,
    # + the 16-entry fp32 NF4 code book every QuantState keeps (real Params4bit: 18944x3584 = 35,026,180 B)
    tensors = [H * H, H * KV, H * KV, H * H, H * F, H * F, F * H]
    meta = L * sum(n // 64 + 4 * math.ceil(n / 64 / 256) + 1024 + 4 + 64 for n in tensors)
    assert c["quant_meta"] == meta
    per_param = (lin_weights() // 2 + meta) / lin_weights()
    assert 0.515 < per_param < 0.52  # ~0.516 B/param (QLoRA paper section 3)


def test_qlora_no_double_quant_metadata(qwen7b) -> None:
    est = estimate(qwen7b, method="qlora", double_quant=False)
    # one fp32 absmax per 64, + the 64-byte fp32 NF4 code book of each of the 7 weights per layer
    assert est.breakdown.components["quant_meta"] == 4 * lin_weights() // 64 + L * 7 * 64


@pytest.mark.parametrize("shard", [dict(fsdp=True), dict(zero=3)])
def test_bitsandbytes_quant_state_is_whole_on_every_rank(qwen7b, shard) -> None:
    """bitsandbytes keeps QuantState on the module, outside the sharded parameter (fix_4bit_weight_quant_
    state_from_module); torchao's NF4 scalers shard with the weight."""
    one = estimate(qwen7b, method="qlora", double_quant=False).breakdown.components["quant_meta"]
    hf = estimate(qwen7b, method="qlora", double_quant=False, gpus=4,
                  **shard).breakdown.components["quant_meta"]
    assert hf == one == 4 * lin_weights() // 64 + L * 7 * 64
    if shard.get("fsdp"):
        tt = estimate(qwen7b, method="qlora", double_quant=False, gpus=4, framework="torchtune", **shard)
        assert tt.breakdown.components["quant_meta"] == -(-one // 4)


def test_lora_trainable_and_states(qwen7b) -> None:
    est = estimate(qwen7b, method="lora", rank=16, targets="q_proj,v_proj", optimizer="adamw")
    lora = L * 16 * ((H + H) + (H + KV))
    assert est.trainable_params == lora
    c = est.breakdown.components
    assert c["lora_adapters"] == 4 * lora  # PEFT keeps adapters in fp32 on a 16-bit base
    assert c["optimizer_states"] == 8 * lora  # AdamW: exp_avg + exp_avg_sq in fp32


def test_full_mixed_is_16_bytes_per_param_at_the_step() -> None:
    spec = model_from_config(LLAMA2_7B)
    est = estimate(spec, method="full", precision="bf16-mixed", optimizer="adamw-fused", batch=1, seq=128)
    p = spec.params_total
    c = est.breakdown.components
    # backward_embedding: every gradient exists and the embedding backward adds its small scratch
    assert est.breakdown.peak_instant in ("optimizer_step", "backward_layers_bottom", "backward_embedding")
    assert c["weights"] == 4 * p and c["gradients"] == 4 * p
    assert 8 * p <= c["optimizer_states"] <= 8 * p + 512 * 1000  # + one 'step' scalar per tensor


def test_pure_bf16_full_has_no_master() -> None:
    spec = model_from_config(LLAMA2_7B)
    est = estimate(spec, method="full", precision="bf16", optimizer="adamw-fused", seq=128,
                   framework="torchtune", gradient_checkpointing=False)
    p = spec.params_total
    assert est.breakdown.components["weights"] == 2 * p
    assert abs(est.breakdown.components["optimizer_states"] - 4 * p) < 512 * 1000


def test_hf_logits_chain_at_backward_start(qwen7b) -> None:
    tokens = 2 * 2048
    est = estimate(qwen7b, method="qlora", batch=2, seq=2048)
    instants = est.breakdown.instants
    assert est.breakdown.peak_instant == "backward_start"
    # fp32 log-softmax output + dense fp32 nll grad + fp32 log_softmax grad = 12 B/token/vocab
    assert est.breakdown.components["logits_loss"] == 12 * tokens * V
    # QLoRA checkpoints by default: the fp32 adapters' 16-bit autocast casts (2 B per LoRA param, q/v r16)
    # live in the forward only, dropped with autocast's cache when the checkpointed forward ends
    adapter_casts = 2 * L * 16 * ((H + H) + (H + KV))
    assert instants["backward_start"] - instants["forward"] == (12 - 10) * tokens * V - adapter_casts


def test_llama_layer_activations_match_prior_art_formula() -> None:
    """Full fine-tune, pure bf16, flash: (16h + 4ad + 4 kv d + 8f + 4a + 8) bytes/token/layer. Prior-art e.4
    has 22h + 4h_kv + 8f + 4a when a*d = h; the simulate engine shows the flash kernel's saved output *is*
    o_proj's saved input (one storage: -2h) and each RMSNorm keeps its fp32 rsqrt per token (+2 x 4 B)."""
    cfg = dict(LLAMA2_7B, num_key_value_heads=8)
    spec = model_from_config(cfg)
    est = estimate(spec, method="full", precision="bf16", framework="torchtune", attn="flash",
                   gradient_checkpointing=False)
    dt = resolve_dtypes(est.setup, get_profile("torchtune"))
    layer = spec.layer_groups[0][0]
    la = layer_activations(spec, layer, est.setup, dt, frozenset(), True, "flash", False)
    h, f, a, d, kv = 4096, 11008, 32, 128, 8
    assert la.per_token == 20 * h + 4 * kv * d + 8 * f + 4 * a + 8
    assert la.per_token_per_pos == 0


def test_eager_attention_adds_quadratic_term() -> None:
    spec = model_from_config(LLAMA2_7B)
    sdpa = estimate(spec, method="lora", seq=1024, attn="sdpa", gradient_checkpointing=False)
    eager = estimate(spec, method="lora", seq=1024, attn="eager", gradient_checkpointing=False)
    diff = eager.breakdown.components["activations"] - sdpa.breakdown.components["activations"]
    quad = 32 * 1024 * 1024 * 32 * 6  # layers x s^2 x heads x (fp32 softmax out + bf16 copy)
    kernel_state = 32 * 1024 * (2 * 4096 + 4 * 32)  # SDPA's saved output (2ad) and fp32 lse (4a), per layer
    # layer 0 of a LoRA model: eager's q @ k^T keeps q only for k's gradient, and k (frozen k_proj on the
    # frozen embeddings) needs none; the SDPA kernel keeps q regardless (simulate: Llama-2-7B layer 0)
    layer0_q = 1024 * 2 * 4096
    assert diff == quad - kernel_state - layer0_q


def test_moe_holds_all_experts_and_routes_top_k() -> None:
    mix = dict(model_type="mixtral", hidden_size=512, num_hidden_layers=2, num_attention_heads=8,
               num_key_value_heads=2, intermediate_size=1024, vocab_size=1000, num_local_experts=8,
               num_experts_per_tok=2)
    spec = model_from_config(mix)
    est = estimate(spec, method="lora", precision="bf16", targets="q_proj,v_proj")
    expert_params = 2 * 8 * 3 * 512 * 1024
    assert est.breakdown.components["weights"] >= 2 * expert_params  # every expert resident in bf16
    assert spec.params_active < spec.params_total


def test_offload_reports_host_memory(qwen7b) -> None:
    est = estimate(qwen7b, method="full", gpus=4, zero=2, offload="optimizer")
    assert est.breakdown.components["optimizer_states"] == 0
    assert est.breakdown.host_bytes >= 12 * qwen7b.params_total // 4  # fp32 master + Adam states


def test_fits_verdict_and_headroom(qwen7b) -> None:
    est = estimate(qwen7b, method="qlora", gpu="rtx4090")
    assert est.fits is True and est.headroom_bytes == est.gpu.memory_bytes - est.breakdown.device_peak_bytes
    big = estimate(qwen7b, method="full", gpu="rtx4090")
    assert big.fits is False and big.headroom_bytes < 0


def test_json_shape(qwen7b) -> None:
    d = estimate(qwen7b, method="qlora", gpu="rtx4090").to_dict()
    for key in ("model", "per_gpu", "peak_instant", "findings", "gpu", "fits", "headroom_bytes"):
        assert key in d
    assert d["model"]["params_total"] == 7_615_616_512
    pg = d["per_gpu"]
    assert sum(pg["components"].values()) == pg["allocated_peak_bytes"]
    assert pg["allocated_peak_bytes"] <= pg["reserved_peak_bytes"] <= pg["device_peak_bytes"]


@pytest.mark.parametrize("kw,field", [
    (dict(method="full", bits=4), "bits"), (dict(method="lora", rank=0), "rank"), (dict(batch=0), "batch"),
    (dict(zero=2), "zero"), (dict(precision="fp8"), "precision"), (dict(offload="optimizer"), "offload"),
    (dict(optimizer="lion"), "optimizer"), (dict(targets="w_nope"), "targets"), (dict(seq=-3), "seq"),
])
def test_invalid_setups_name_the_field(qwen7b, kw, field) -> None:
    from tuneplan.errors import TuneplanError

    with pytest.raises(TuneplanError) as exc:
        estimate(qwen7b, **kw)
    assert exc.value.field == field


def test_deepspeed_buckets_move_the_estimate(qwen7b) -> None:
    """ZeRO-2's reduce bucket holds reduce_bucket_size 16-bit elements (DeepSpeed stage_1_and_2)."""
    base = dict(method="full", gpus=4, zero=2, precision="bf16-mixed")
    # the bucket lives from the first gradient to the end of the backward (setup_buckets ..
    # _release_ipg_buffers): it moves the layers' backward, not the loss or the step
    default = estimate(qwen7b, **base).breakdown.instants
    auto = estimate(qwen7b, **base, ds_reduce_bucket=3584 * 3584).breakdown.instants
    assert default["backward_layers_top"] - auto["backward_layers_top"] == 2 * (500_000_000 - 3584 * 3584)
    assert default["optimizer_step"] == auto["optimizer_step"]


def test_overlap_comm_double_buffers_the_zero12_bucket(qwen7b) -> None:
    """stage_1_and_2 setup_buckets allocates buf_1 beside buf_0 with overlap_comm: 2 x 5e8 x 2 B."""
    base = dict(method="full", gpus=4, precision="bf16-mixed")
    for zero in (1, 2):
        off = estimate(qwen7b, **base, zero=zero).breakdown.instants["backward_layers_top"]
        on = estimate(qwen7b, **base, zero=zero,
                      ds_overlap_comm=True).breakdown.instants["backward_layers_top"]
        assert on - off == 500_000_000 * 2
    z3 = [estimate(qwen7b, **base, zero=3, ds_overlap_comm=v).breakdown.device_peak_bytes
          for v in (False, True)]
    assert z3[0] == z3[1]


@pytest.mark.parametrize("zero", [2, 3])
def test_deepspeed_bucket_is_allocated_whole_under_lora(qwen7b, zero) -> None:
    """contiguous_gradients allocates the IPG bucket at reduce_bucket_size whatever trains (stage_1_and_2
    setup_buckets, stage3 __init__): a LoRA run's bucket is 5e8 x 2 B, not its adapters' size."""
    from tuneplan.estimator.optimizer import OptimizerPlan
    from tuneplan.estimator.run import resolve_run

    setup = build_setup(qwen7b, method="lora", gpus=2, zero=zero, precision="bf16-mixed")
    run = resolve_run(qwen7b, setup)
    trainable = run.param_plan.trainable_params
    assert trainable < 100_000_000  # the adapters only: far fewer than the bucket's 5e8 elements
    buckets = run.wrapper.memory(run, OptimizerPlan(8 * trainable, 0, 0)).buckets
    if zero == 2:  # made in the backward, released at its end (stage_1_and_2 setup_buckets)
        assert buckets.in_layers == 500_000_000 * 2
    else:  # made at construction, beside the flat 16-bit gradient partition (stage3 __init__)
        assert buckets.persistent == 500_000_000 * 2 + -(-trainable * 2 // 2)


def test_model_dropout_masks_and_layernorm() -> None:
    """GPT-2 style: CUDA dropout keeps a 1-byte mask; attention dropout's output (compute dtype) is what
    probs @ V keeps; residual dropout keeps only masks; native LayerNorm keeps its input, not its output."""
    from tuneplan.estimator.activations import activation_plan

    base = dict(model_type="gpt2", n_embd=256, n_layer=2, n_head=4, vocab_size=1000, n_positions=1024,
                activation_function="gelu_new",
                attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    kw = dict(method="full", seq=512, batch=2, attn="eager", precision="fp32", gradient_checkpointing=False)

    def acts(**cfg) -> int:
        spec = model_from_config({**base, **cfg})
        est = estimate(spec, **kw)
        dt = resolve_dtypes(est.setup, get_profile("hf"))
        return activation_plan(spec, est.setup, dt, frozenset(), "eager", False, True).saved_bytes

    none = acts()
    scores = 2 * 4 * 512 * 512 * 2  # batch x heads x s x s x layers
    assert acts(attn_pdrop=0.1) - none == scores * (1 + 4)  # mask + fp32 dropout output
    tokens = 2 * 512
    assert acts(resid_pdrop=0.1) - none == tokens * 2 * 2 * 256  # 2 masks x h per layer x 2 layers
    assert acts(embd_pdrop=0.1) - none == tokens * 256  # one mask after the embeddings
    spec = model_from_config(base)
    est = estimate(spec, **kw)
    dt = resolve_dtypes(est.setup, get_profile("hf"))
    la = layer_activations(spec, spec.layer_groups[0][0], est.setup, dt, frozenset(), True, "eager", True)
    # 2 LayerNorms x (fp32 input 4h + mean/rstd 8); nothing else of the norms
    norms = 2 * (4 * 256 + 8)
    # c_attn input (4h, shared by nothing else), q, k, v (3 x 4h), c_proj input (4h), c_fc input (4h),
    # gelu_new pieces: c_fc output + 3 intermediates + its output kept by c_proj (5 x 4f)
    rest = 4 * 256 + 3 * 4 * 256 + 4 * 256 + 4 * 256 + 5 * 4 * 1024
    assert la.per_token == norms + rest
    assert la.per_token_per_pos == 4 * 4  # fp32 softmax output, 4 heads


def test_moe_all_linear_leaves_experts_and_router() -> None:
    """transformers 5: routed experts are fused 3-D parameters and the router a TopK module, not nn.Linear;
    PEFT's all-linear adapts attention only in a Mixtral layer (hand count, r=16)."""
    mix = dict(model_type="mixtral", hidden_size=512, num_hidden_layers=2, num_attention_heads=8,
               num_key_value_heads=2, intermediate_size=1024, vocab_size=1000, num_local_experts=4,
               num_experts_per_tok=2)
    est = estimate(model_from_config(mix), method="lora", rank=16, targets="all-linear")
    q, kv, o = 16 * (512 + 512), 16 * (512 + 128), 16 * (512 + 512)
    assert est.trainable_params == 2 * (q + 2 * kv + o)
