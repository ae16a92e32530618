"""The recomputed layer's end under FSDP1 LoRA (estimator/layer_saved.py, first_target_terms and
input_norm_backward). By hand for Llama-2-7B (hidden 4096), LoRA r8 on q_proj only, bf16-mixed, FSDP1 on
2 GPUs through the HF Trainer, checkpointing on (residual stream and linear outputs bf16, 2 B):

* saved up to q_proj's adapter: RMSNorm's fp32 input 4 x 4096 = 16,384, its rstd 4, the adapter's private
  16-bit input copy (FSDP1's fp32 adapter view cast back by autocast) 2 x 4096 = 8,192, lora_A's output
  2 x 8 = 16: 24,596 per token;
* when q_proj's adapter starts its backward: q's output gradient and the input gradient, 2 x (4096 + 4096),
  beside the residual's two, 2 x 2 x 4096: 32,768;
* when the input norm back-propagates (pow's backward, torch pow_backward; the adapter's tensors freed):
  the fp32 input and rstd (16,388), five fp32 h-wide gradients (20 x 4096 = 81,920) and the residual
  gradient (2 x 4096 = 8,192): 106,500, i.e. 106,500 - 24,596 = 81,904 above the first moment's saved part.
The larger temporaries: 81,904."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.activations import layer_activations
from tuneplan.estimator.dtypes import resolve_dtypes
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.profiles import get_profile, resolve_setup


def test_input_norm_backward_outweighs_the_first_adapter_moment() -> None:
    spec = resolve_model("meta-llama/Llama-2-7b-hf", allow_network=False)
    s = resolve_setup(build_setup(spec, method="lora", seq=512, batch=1, targets="q_proj",
                                  precision="bf16-mixed", dropout=0.0, rank=8, gpus=2, fsdp=True,
                                  fsdp_version=1, gradient_checkpointing=True), spec)
    dt = resolve_dtypes(s, get_profile("hf"))
    assert (dt.residual, dt.linear_out) == (2, 2)
    acts = layer_activations(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False,
                             "sdpa", True)
    assert acts.first_target_saved == 16_384 + 4 + 8_192 + 16
    assert acts.first_target_temp == max(32_768, 16_384 + 4 + 81_920 + 8_192 - 24_596) == 81_904


def test_top_layer_end_without_checkpointing_counts_the_moment_not_the_whole_layer() -> None:
    # without checkpointing the top layer's end (FSDP1, next layer prefetched) holds, of the top layer, the
    # same moment: 24,596 saved + 81,904 live per token (no checkpoint to alias: bf16 residual, fp32 copy)
    from tuneplan.estimator.activations import activations_at, layer_kinds

    spec = resolve_model("meta-llama/Llama-2-7b-hf", allow_network=False)
    s = resolve_setup(build_setup(spec, method="lora", seq=512, batch=1, targets="q_proj",
                                  precision="bf16-mixed", dropout=0.0, rank=8, gpus=2, fsdp=True,
                                  fsdp_version=1, gradient_checkpointing=False), spec)
    dt = resolve_dtypes(s, get_profile("hf"))
    kinds = layer_kinds(spec, s, dt, resolve_targets(spec, s.targets), "sdpa", python_model_code=True)
    plan = activations_at(spec, s, dt, kinds, 1, 512, gc_offload=False)
    assert plan.layer_end_bytes == 512 * 24_596
    assert plan.layer_end_temp_bytes == 512 * 81_904


def test_eager_attention_scores_stay_at_an_mlp_adapters_layer_end() -> None:
    # Mistral-7B-v0.2 (hidden 4096, 32 query heads, 8 KV heads of 128), QLoRA r8 on the MLP, bf16, eager
    # attention, FSDP1 on 4 GPUs, checkpointing, 2 x 256 tokens. gate_proj's adapter (the layer's first in
    # forward order) starts its backward before the attention's: the recomputed layer still keeps what
    # transformers' eager_attention_forward saved, softmax's fp32 probabilities and their bf16 copy (.to(
    # query.dtype)) read by the matmul with V (no dropout mask), 32 heads x (4 + 2) = 192 B per token per
    # key position. Per token besides: the input norm's fp32 input and rstd 16,388, q and the expanded k, v
    # (repeat_kv) 3 x 32 x 128 x 2 = 24,576, the post-attention norm's fp32 input and rstd 16,388, its bf16
    # output (the adapters' input) 8,192, lora_A's output 2 x 8 = 16: 65,560 (nothing aliases the
    # checkpoint: the input norm reads an fp32 copy). At 512 tokens: 512 x 65,560 + 512 x 256 x 192 =
    # 33,566,720 + 25,165,824 = 58,732,544 (simulate: the attention's 25,165,824 B live at gate_proj's
    # dequantized backward). Without the O(s) part the moment was not derived (0).
    from tuneplan.estimator.activations import activations_at, layer_kinds

    spec = resolve_model("mistral-community/Mistral-7B-v0.2", allow_network=False)
    s = resolve_setup(build_setup(spec, method="qlora", seq=256, batch=2, targets="mlp", precision="bf16",
                                  bits=4, quant_type="fp4", double_quant=False, rank=8, gpus=4, fsdp=True,
                                  fsdp_version=1, gradient_checkpointing=True, attn="eager",
                                  offload="all"), spec)
    dt = resolve_dtypes(s, get_profile("hf"))
    acts = layer_activations(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False,
                             "eager", True)
    assert (acts.first_target_saved, acts.first_target_per_pos) == (65_560, 32 * (4 + 2))
    kinds = layer_kinds(spec, s, dt, resolve_targets(spec, s.targets), "eager", python_model_code=True)
    plan = activations_at(spec, s, dt, kinds, 2, 256, gc_offload=False)
    assert plan.layer_end_bytes == 512 * 65_560 + 512 * 256 * 192 == 58_732_544
