"""A LoRA run whose FSDP units mix frozen and trainable weights (LitGPT's Block units under
``use_orig_params=True``): the unit's flat parameter requires grad, so the backward makes a weight gradient
for every block weight, frozen ones included. Counted here on the dense config of tests/test_compute.py.
"""

from __future__ import annotations

import pytest

from tuneplan.api import build_setup
from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.estimator.compute import flops_at
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.time_statics import RuntimeOptions, time_statics
from tuneplan.estimator.wrappers.fsdp import frozen_weights_get_gradients
from tuneplan.specs.model import model_from_config

# h 64, 2 layers, 4 heads of 16, 2 KV heads, SwiGLU 128, vocab 100, untied (tests/test_compute.py DENSE).
DENSE = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=128, vocab_size=100, tie_word_embeddings=False)
# per token per layer, forward, 2 * d_in * d_out: q 8192, k 4096, v 4096, o 8192, gate/up/down 3 x 16384
DENSE_LINEAR_LAYER = 8192 + 4096 + 4096 + 8192 + 3 * 16384
# the block weights, by hand: 4 attention projections (64x64, 64x32, 64x32, 64x64), 3 MLP (64x128), 2 norms
BLOCK_PARAMS = 2 * (4096 + 2048 + 2048 + 4096 + 3 * 8192 + 2 * 64)


def _run(framework: str, gpus: int, method: str = "lora"):
    model = model_from_config(DENSE, "dense-hand")
    kw = dict(rank=4, targets="q_proj,v_proj") if method != "full" else {}
    setup = build_setup(model, method=method, framework=framework, gpus=gpus, fsdp=gpus > 1, seq=8,
                        batch=1, attn="sdpa", precision="bf16", gradient_checkpointing=False, **kw)
    return resolve_run(model, setup)


def test_litgpt_fsdp_lora_backward_makes_every_block_weight_gradient() -> None:
    run = _run("litgpt", 2)
    assert frozen_weights_get_gradients(run)
    acc = resolve_accelerator("a100-80gb-sxm4")
    ts = time_statics(run, acc, RuntimeOptions())
    fl = flops_at(ts.flops, 8)
    # 2 layers x the forward linear FLOPs: the weight-gradient matmul of each linear costs its forward
    assert fl.parts["linear_bwd_weight"] == pytest.approx(2 * DENSE_LINEAR_LAYER)
    assert fl.parts["linear_bwd_input"] == pytest.approx(2 * DENSE_LINEAR_LAYER)
    # the gradients read and written by the backward: the block weights in bf16 beside the adapters
    pp = run.param_plan
    assert ts.grad_bytes == pp.trainable_params * pp.trainable_bytes + BLOCK_PARAMS * 2
    # one more matmul launched per block linear (7 a layer, 2 layers) than on one GPU, where they stay frozen
    one = time_statics(_run("litgpt", 1), acc, RuntimeOptions())
    assert ts.flops.kernels[0] - one.flops.kernels[0] == 2 * 7


@pytest.mark.parametrize(("framework", "gpus", "method"), [
    ("litgpt", 1, "lora"),  # one GPU: no FSDP units, frozen weights stay without gradients
    ("hf", 2, "lora"),  # PEFT's wrap: each adapter a unit of its own, no unit mixes frozen and trained
    ("litgpt", 2, "qlora"),  # 4-bit codes are not part of a gradient-carrying flat parameter
])
def test_no_frozen_weight_gradients_elsewhere(framework: str, gpus: int, method: str) -> None:
    run = _run(framework, gpus, method)
    assert not frozen_weights_get_gradients(run)
    ts = time_statics(run, resolve_accelerator("a100-80gb-sxm4"), RuntimeOptions())
    assert flops_at(ts.flops, 8).parts["linear_bwd_weight"] == 0


def test_litgpt_fsdp_reduce_scatters_every_block_weight_once_per_step() -> None:
    # fabric.no_backward_sync while accumulating: only the step's last micro-batch reduce-scatters, and the
    # mixed units' flat gradients cover the block weights beside the adapters (bf16 on the wire, half each)
    run = _run("litgpt", 2)
    ts = time_statics(run, resolve_accelerator("a100-80gb-sxm4"), RuntimeOptions())
    pp = run.param_plan
    reduced = (BLOCK_PARAMS + pp.trainable_params) * 2 * 0.5
    assert ts.per_step == pytest.approx(reduced / (ts.link_gbs * 1e9))
    # per micro-batch the two gathers and NCCL's latency of 3 calls for each of 3 units (2 layers and the
    # root), a 2-rank NVLink ring: 8.4 us base + 1 hop x 3.4 us (nccl.py, NCCL's tuning.cc)
    gathered = (pp.weight_bytes + pp.adapter_bytes) * 0.5
    assert ts.per_micro == pytest.approx(2 * gathered / (ts.link_gbs * 1e9) + 9 * 11.8e-6)


def test_flat_gradient_cat_and_accumulation_traffic() -> None:
    # use_orig_params: the block's weights are views split off the flat parameter, so the backward's cat
    # reads every view's gradient and writes the flat one (2x its bytes); AccumulateGrad then adds each
    # micro-batch's into the kept unsharded gradient (3x) on all but the step's first micro-batch
    from tuneplan.estimator.throughput import micro_batch

    acc = resolve_accelerator("a100-80gb-sxm4")
    run = _run("litgpt", 2)
    pp = run.param_plan
    flat = BLOCK_PARAMS * 2 + pp.trainable_params * pp.trainable_bytes
    ts = time_statics(run, acc, RuntimeOptions())
    assert ts.flat_grad_bytes == flat
    fl = flops_at(ts.flops, 8)
    plain = fl.traffic_bytes * 8 * ts.traffic_factor / ts.bw
    one = micro_batch(ts, fl, run.setup)
    four = run.reshaped(grad_accum=4)
    assert one.elem_s == pytest.approx(plain + 2 * flat / ts.bw)
    assert micro_batch(ts, fl, four.setup).elem_s == pytest.approx(plain + (2 + 3 * 3 / 4) * flat / ts.bw)
    assert time_statics(_run("litgpt", 1), acc, RuntimeOptions()).flat_grad_bytes == 0
    assert time_statics(_run("hf", 2), acc, RuntimeOptions()).flat_grad_bytes == 0
