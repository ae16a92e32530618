"""ZeRO-3's tied output head gathered again in the forward, in a coalesced round held twice (DeepSpeed 0.19.8,
``PartitionedParameterCoordinator`` and ``AllGatherCoalescedHandle``, runtime/zero/)."""

from __future__ import annotations

from tuneplan.estimator.wrappers.zero3_coordinator import (
    DS_MAX_LIVE_PARAMETERS,
    DS_MAX_REUSE_DISTANCE,
    DS_PARAM_PERSISTENCE_THRESHOLD,
)
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup


def zero3_tied_head_round(model: ModelSpec, setup: TrainSetup, targets: frozenset[str]) -> int:
    """Elements of the all-gather buffer ZeRO-3 holds beside the gathered parameters from the top layer's
    last LoRA factor to the tied head's forward, when the tied embedding is gathered again for the head
    (0 otherwise: an untied head is ``zero3_coordinator.zero3_head_round``'s).

    DeepSpeed 0.19.8, ``partitioned_param_coordinator.py``:

    - ``__params_to_release`` keeps a parameter gathered only if the trace uses it again within
      ``stage3_max_reuse_distance`` ``D`` elements: with the layers between the embedding's forward and
      the head's, ``P - E >= D``, the embedding is released after its forward. It is not popped ahead
      before that release: with ``E >= stage3_max_live_parameters`` ``M`` gathered, the
      embedding's fetch prefetches nothing (``min(M - n_available, bucket) <= 0``).
    - ``_fetch_sub_module_impl`` later pops the head's use of ``E`` as the last entry of a prefetch round.
      When the trace entry before it is a non-persistent parameter (``ds_numel`` above
      ``stage3_param_persistence_threshold``): a LoRA factor of the top layer's last linear (PEFT runs
      ``lora_A`` then ``lora_B`` after the base layer, each a module with its own fetch), the round is
      coalesced (``all_gather_coalesced`` with two parameters: ``_all_gather_dtype``'s flat buffer).
      A persistent factor is AVAILABLE and popped without counting, and a base linear ends its round by
      its overshoot: the embedding is then alone, gathered by ``_all_gather_sequential`` into a buffer
      its weight is a view of, with no copy.
    - The factor's fetch waits for the round: ``AllGatherCoalescedHandle.wait`` gives every parameter of it
      a copy (``torch.cat(partitions)``), the embedding's whole, while the handle, filed under the
      embedding in ``__inflight_param_registry``, keeps the flat buffer until the head's own fetch pops it.

    From that factor's forward to the head's the embedding is held twice:

    .. math:: G_{round} = E + f,\\quad f = r\\,d_{out}\\ (\\text{lora\\_B})\\ \\text{if}\\ r\\,d_{out} > T
              \\ \\text{else}\\ r\\,d_{in}\\ (\\text{lora\\_A})

    beside the copies (which the head's forward counts as at the loss). A max-live allowance under the
    factor's size at that fetch would end the round before the embedding: not modelled.
    (simulate: gemma-2-27b, 2 layers, LoRA rank 64 on the MLP over 4 GPUs: the 1.179943e9-element flat
    buffer, ``E`` + layer 1's ``down_proj.lora_B``, beside the embedding's copy at that factor's forward.)"""
    embed = model.embed_params
    if (model.lm_head_params or not model.tied_embeddings or not embed or setup.method != "lora"
            or setup.quant_bits is not None
            or embed < DS_MAX_LIVE_PARAMETERS or model.params_total - embed < DS_MAX_REUSE_DISTANCE):
        return 0
    last = model.layer_groups[-1][0].linears[-1]
    if last.name not in targets or last.count != 1:
        return 0
    lora_a, lora_b = setup.rank * last.d_in, last.d_out * setup.rank
    factor = lora_b if lora_b > DS_PARAM_PERSISTENCE_THRESHOLD else lora_a
    if factor <= DS_PARAM_PERSISTENCE_THRESHOLD:
        return 0
    return embed + factor
