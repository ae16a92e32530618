"""A freeze fine-tune on one GPU: the backward ends at the lowest trained layer (the layer below it gets no
gradient), whose every weight trains, so as for a full fine-tune each weight's gradient is made by the
backward of the op that saved the activation it reads (``MmBackward0`` returns the weight's gradient and
frees its saved input): that layer's row is the larger of its start and its end, not both at once
(estimator/memory_statics.bottom_own_gradients)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.instants import memory_at  # noqa: E402
from tuneplan.estimator.memory_statics import memory_statics  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402

# phi-4: h 5120, fused qkv_proj 7680 x h, o_proj h x h, fused gate_up_proj 35840 x h, down_proj h x 17920,
# two RMSNorms of h: 5120 x 66560 + 2 x 5120 = 340,797,440 parameters a layer, bf16 gradients
H = 5120
LAYER = H * (7680 + 5120 + 35840 + 17920) + 2 * H
OWN = 2 * LAYER  # 681,594,880 bytes


def _setup(spec, **kw):
    return build_setup(spec, method="freeze", precision="bf16", framework="hf", batch=4, seq=256,
                       gradient_checkpointing=False, optimizer="adamw-8bit", attn="eager", **kw)


def test_lowest_trained_layer_own_gradients() -> None:
    # both layers trained (freeze_trainable_layers 2 >= 2 layers): the bottom one's 681,594,880 bytes
    # (simulate: its gate_up 367,001,600 + down 183,500,800 + qkv 78,643,200 + o 52,428,800 + norms 20,480)
    spec = reduced_model("microsoft/phi-4", 2)
    assert OWN == 681_594_880
    assert memory_statics(resolve_run(spec, _setup(spec))).bottom_own_grads == OWN
    # three layers, the top one trained: the backward ends at layer 2, a phi-4 layer all the same
    spec3 = reduced_model("microsoft/phi-4", 3)
    top_only = _setup(spec3, freeze_trainable_layers=1)
    assert memory_statics(resolve_run(spec3, top_only)).bottom_own_grads == OWN


def test_bottom_row_releases_the_layer_activations() -> None:
    # at 4 x 256 tokens one eager layer saves fewer bytes than its own gradients, so at its end none of them
    # remain: the row holds both layers' gradients (2 x 681,594,880) and the scratch, no activation
    # (simulate, microsoft/phi-4 at 2 layers, 4 x 256: the peak, 5,303,255,552 B, is inside the bottom
    # layer's backward with its MLP's gradients made and its attention's 147 MB of activations still saved)
    spec = reduced_model("microsoft/phi-4", 2)
    row = memory_at(resolve_run(spec, _setup(spec)), 4, 256).components("backward_layers_bottom")
    assert row["activations"] == 0
    assert row["gradients"] == 2 * OWN


def test_accumulated_gradients_keep_the_whole_row() -> None:
    # with accumulation the gradients are buffers already there (AccumulateGrad adds into them): nothing new
    spec = reduced_model("microsoft/phi-4", 2)
    assert memory_statics(resolve_run(spec, _setup(spec, grad_accum=2))).bottom_own_grads == 0


def test_ddp_keeps_each_gradient_a_tensor_of_its_own() -> None:
    # DDP (gradient_as_bucket_view=False, its default) copies each .grad into a bucket allocated at wrap time
    # and leaves the .grad a tensor of its own, made by the same MmBackward0 as on one GPU: the bottom layer's
    # own 681,594,880 bytes again, and its row holds both layers' gradients and their buckets (4 x
    # 681,594,880) with no activation left (simulate: Llama-2-7b freeze DDP x 4 at 2 layers, 1 x 1024,
    # checkpointed: the peak inside the bottom layer's attention backward, its MLP's gradients made, 25 MB of
    # activations live)
    spec = reduced_model("microsoft/phi-4", 2)
    ddp = _setup(spec, gpus=4)
    assert memory_statics(resolve_run(spec, ddp)).bottom_own_grads == OWN
    row = memory_at(resolve_run(spec, ddp), 4, 256).components("backward_layers_bottom")
    assert row["activations"] == 0
    assert row["gradients"] == 4 * OWN  # 2,726,379,520
    # ZeRO-2 reduces each gradient into its bucket and frees it: no new tensor of the layer's own stays
    zero2 = _setup(spec, gpus=4, zero=2)
    assert memory_statics(resolve_run(spec, zero2)).bottom_own_grads == 0


def test_checkpointing_runs_the_backward_to_a_frozen_layer_0() -> None:
    # transformers' gradient_checkpointing_enable calls enable_input_require_grads (modeling_utils.py): the
    # embedding's output requires grad, so autograd back-propagates the two frozen layers below the trained
    # top one, recomputing them, down to layer 0, which makes no gradient: its row holds no own gradient
    # to trade against its recomputed activations, which stay whole (simulate: Llama-2-13b freeze at 4
    # layers, 4 x 384, checkpointed: the peak at layer 1's MLP backward, its 285 MB recomputed, both trained
    # layers' 2,537,635,840 gradient bytes live)
    spec3 = reduced_model("microsoft/phi-4", 3)
    frozen_below = _setup(spec3, freeze_trainable_layers=1).replace(gradient_checkpointing=True)
    run = resolve_run(spec3, frozen_below)
    assert memory_statics(run).bottom_own_grads == 0
    at = memory_at(run, 4, 256)
    assert at.components("backward_layers_bottom")["activations"] == at.acts.recompute_bytes > 0
    # every layer trained: layer 0 is the lowest trained one, its own gradients as before
    spec = reduced_model("microsoft/phi-4", 2)
    trained = _setup(spec).replace(gradient_checkpointing=True)
    assert memory_statics(resolve_run(spec, trained)).bottom_own_grads > 0
