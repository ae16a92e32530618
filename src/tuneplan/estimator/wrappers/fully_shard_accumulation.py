"""FSDP2's layers' backward after a micro-batch accumulated its gradients unsharded (torch 2.13
``_fully_shard``, as accelerate's ``no_sync`` drives it: ``set_requires_gradient_sync(False)``):
what ``wrappers/fsdp.Fsdp2`` reads in place of a layer's whole new gradient."""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.estimator.wrappers.base import NoSyncGradients
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup


@dataclass(frozen=True)
class AccumulatedBackward:
    transient: int  # the new gradient of one weight, added in place into its accumulated ``.grad``
    missing_at_top: int  # accumulated unsharded gradients already reduce-scattered at the top layer
    missing_at_bottom: int  # those at the second layer's backward
    missing_at_bottom_layer: int  # those at the bottom layer's backward
    pending_head: int = 0  # a tied head's new gradient, waiting for the embedding's (module docstring)


def accumulated_backward(model: ModelSpec, setup: TrainSetup, no_sync: NoSyncGradients | None,
                         layer_grads: int, compute_bytes: int,
                         trainable_params: int) -> AccumulatedBackward | None:
    """The layers' backward of a micro-batch that follows one accumulating unsharded (None where no
    micro-batch does: no ``no_sync`` accumulation, or the longest micro-batch first).

    Torch 2.13 ``FSDPParamGroup.post_backward`` with ``reduce_grads`` False reshards and keeps each
    unsharded gradient in ``unsharded_param.grad`` (``FSDPParam.to_accumulated_grad_if_needed`` converts
    it only when ``reduce_dtype`` differs from the gradient's dtype; accelerate's policy sets both to the
    param dtype). The next micro-batch unshards the same ``Parameter``: autograd's ``AccumulateGrad``
    adds each new weight gradient into that ``.grad`` in place, so a layer's backward holds one new
    weight gradient at a time beside the accumulated ones, not the layer's:

        transient = w x compute_bytes, w the layer's largest trained tensor (a fused expert stack whole)

    In the micro-batch that syncs, ``post_backward`` hands each group's accumulated gradient to
    ``foreach_reduce`` and drops it (``unsharded_param.grad = None``) as the backward reaches the group,
    leaving its shard (on the host under ``CPUOffloadPolicy``). With two micro-batches that is the only
    one after an accumulating one; the first made its gradients fresh, growing from the top. A layer's
    backward with k layers below it (n - 1 at the top layer, 1 at the second, 0 at the bottom one) holds
    the larger of the two (A the accumulated bytes, L a layer's, t trained layers, an untied trained
    head H and embedding E, in the accumulated dtype):

        synced:  A + w - (H + min(t, n - 1 - k) L) (1 - s)     (s: a shard's share on the device)
        first:   A - E - max(0, k - n + t) L                 (those below not made yet)
        missing  = A + w - max(synced, first)

    With more micro-batches a middle one holds every accumulated gradient (nothing missing).

    A tied head that trains adds its new gradient beside them through the layers' backward, in every
    micro-batch: the embedding weight is one leaf read twice, so autograd's engine sums the head's
    contribution in the ``AccumulateGrad`` node's input buffer (torch/csrc/autograd/input_buffer.cpp) and
    runs the node, which adds into the accumulated ``.grad``, only once the embedding's backward has made
    the other one: ``pending_head`` = V x h x compute_bytes (simulate: Falcon-7B full fp32 over 4 GPUs with
    CPU offload, two micro-batches: the 65024 x 4544 fp32 head gradient beside the accumulated one at the
    layers' backward).
    Simulate: Mistral-7B full, CPU offload, two micro-batches (the synced top layer: the accumulated
    gradients less the head's and one new 14336 x 4096 gradient)."""
    if (no_sync is None or setup.grad_accum < 2 or no_sync.accumulating == no_sync.synced
            or not trainable_params or setup.longest_batch_first):
        return None
    n = max(model.n_layers, 1)
    trained = min(setup.freeze_trainable_layers, n) if setup.method == "freeze" else n
    unsharded = no_sync.accumulating / trainable_params  # bytes per trainable element, accumulated
    shard = no_sync.synced / trainable_params  # on the device once reduce-scattered (0: host)
    layer_elems = layer_grads / max(compute_bytes, 1)
    transient = largest_layer_tensor(model, setup, int(layer_elems)) * compute_bytes
    tied = not model.lm_head_params
    head_trains = setup.method == "full"
    head = model.lm_head_params + model.final_norm_params if head_trains and not tied else 0
    embed = model.embed_params if head_trains and not tied else 0

    def missing(below: int) -> int:
        """Accumulated bytes not live with ``below`` layers under the one back-propagated."""
        if setup.grad_accum > 2:
            return 0
        reduced = head + min(trained, max(0, n - 1 - below)) * layer_elems
        synced = int(reduced * (unsharded - shard))
        trained_below = max(0, below - n + trained)
        # the first micro-batch: the layer's own gradients are its new ones (``transient`` counts one more)
        first = int((embed + trained_below * layer_elems) * unsharded) + transient
        return max(0, min(synced, first))

    return AccumulatedBackward(transient=transient, missing_at_top=missing(n - 1),
                               missing_at_bottom=missing(1), missing_at_bottom_layer=missing(0),
                               pending_head=model.embed_params * compute_bytes if tied and head_trains else 0)


def largest_layer_tensor(model: ModelSpec, setup: TrainSetup, layer_elems: int) -> int:
    """Elements of a decoder layer's largest trained tensor: its largest linear weight, or a fused routed
    expert stack (transformers 5 ``*Experts``: ``gate_up_proj`` E x 2f x h, ``down_proj`` E x h x f,
    one parameter each); a LoRA run's trained tensors are its adapters, bounded by the layer's."""
    if setup.method not in ("full", "freeze"):
        return layer_elems
    sizes = [0]
    for spec, _ in model.layer_groups:
        experts = [m.count * m.d_in * m.d_out for m in spec.linears if m.role == "expert"]
        if experts:  # gate and up fused, down on its own
            sizes += [sum(experts[:-1]), experts[-1]]
        sizes += [m.d_in * m.d_out for m in spec.linears if m.role != "expert"]
    return min(max(sizes), layer_elems) if layer_elems else max(sizes)
