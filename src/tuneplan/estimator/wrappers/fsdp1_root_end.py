"""FSDP1's root unit (embeddings, lm_head, final norm) at the end of the backward: its post-backward runs
last, beside every other unit's gradient as the step's micro-batch left it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.base import EndOfBackward, NoSyncGradients
from tuneplan.estimator.xp import ceil_div

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run
    from tuneplan.estimator.wrappers.fsdp import ShardedTerms


def root_unit_end(run: Run, terms: ShardedTerms, grad_bytes: int, gathered: int,
                  no_sync: NoSyncGradients | None) -> EndOfBackward:
    """FSDP1's root unit (embeddings, lm_head, final norm) at the end of a full fine-tune's backward: its
    pre-backward runs first and its post-backward last, so once the token embedding's gradient is made the
    gradient of every original parameter of the root (the lm_head's, made at the loss, waiting) is live,
    and autograd concatenates them into the flat parameter's unsharded gradient (the views' backward: a
    cat whose inputs and output are live together) before ``_post_backward_hook`` reduce-scatters it,
    beside the root's unsharded parameters (torch 2.13 torch/distributed/fsdp/_runtime_utils.py
    _post_backward_hook; simulate: FSDP1, Meta-Llama-3-8B). The root's sharded gradient is not made yet.
    A tied embedding gets two contributions, the head's (waiting) and the embedding's, which autograd sums
    out of place before the cat: 3 embedding-sized gradients at once (simulate: FSDP1,
    Llama-3.2-3B-Instruct fp32)."""
    setup, params, model = run.setup, run.param_plan, run.model
    root_params = model.params_non_block
    # an accumulating step's earlier micro-batch left the root's gradient (its shard in _saved_grad_shard,
    # or the unsharded one under no_sync) as fsdp1_bottom.pending_shards leaves the layers'
    made = setup.offload != "none" or setup.grad_accum > 1
    per_elem = 0 if made else terms.grads / max(params.trainable_params, 1)
    pending = -(-int(root_params * per_elem) // setup.world_size)
    scratch = 2 * root_params if model.lm_head_params else max(2 * root_params, 3 * model.embed_params)
    # CPU offload with use_orig_params=False: each layer unit's reduce-scattered shard stays on the device as
    # _saved_grad_shard (the host copy's source, _offload_grad) until _finalize_params'
    # prepare_gradient_for_optim at the very end (use_orig_params=True frees it at once:
    # _post_backward_use_sharded_grad_views; simulate: fsdp_qlora, Meta-Llama-3-8B full fp32 offloaded)
    kept = setup.offload != "none" and run.profile.fsdp_flat_params_only
    offloaded = sum(count * ceil_div(spec.params * grad_bytes, setup.world_size)
                    for spec, count in model.layer_groups) if kept else 0
    gradients = offloaded - pending + synced_layers(run, root_params, no_sync)
    return EndOfBackward(gradients=gradients, gathered=gathered, scratch=scratch * grad_bytes)


def synced_layers(run: Run, root_params: int, no_sync: NoSyncGradients | None) -> int:
    """What the gradients of the last micro-batch of a ``no_sync`` accumulation lack at the root unit's end,
    beside the accumulated unsharded ones of every unit (``NoSyncGradients.accumulating``, the step's
    gradient rows): each layer unit's ``_post_backward_hook`` has reduce-scattered its accumulated unsharded
    gradient into its shard and dropped it (torch 2.13 _runtime_utils.py ``_reduce_grad``: ``flat_param.grad
    = None`` before the reduce-scatter), the root's alone is left unsharded (simulate: FSDP1, Qwen2.5-1.5B
    bf16 with two micro-batches)::

        (synced - accumulating) x (1 - root / trainable)

    ``no_sync``: the run's (``fsdp.no_sync_gradients``) where its loop accumulates under ``no_sync``
    (``fsdp.accumulates_unsharded``), else None."""
    if run.setup.grad_accum < 2 or no_sync is None:
        return 0
    layers = 1 - root_params / max(run.param_plan.trainable_params, 1)
    return int((no_sync.synced - no_sync.accumulating) * layers)
