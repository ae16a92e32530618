"""FSDP1 with ``CPUOffload(offload_params=True)``: the device copies of host shards ``pre_unshard`` makes.

With parameters offloaded, a unit's sharded ``FlatParameter`` lives on the host. Before the all-gather,
``FlatParamHandle.pre_unshard`` (torch 2.13 ``torch/distributed/fsdp/_flat_param.py``) either casts the host
shard into the device-side low-precision shard ``_mp_shard`` (a unit with ``_uses_param_mixed_precision``:
its flat parameter's dtype differs from the ``MixedPrecision`` param dtype) or, for a unit already in the
param dtype, copies the host shard to the device (``flat_param_to(self.device)``). Only that copy outlives
the all-gather: with ``use_orig_params=True`` the original parameters are views of it
(``_use_sharded_views``) until the unit reshards, so a gathered unit of ``U`` bytes holds

    U + ceil(U / N)    (N: the world size)

on the device. With ``use_orig_params=False`` (``Profile.fsdp_flat_params_only``) nothing but
``flat_param`` refers to the copy, and ``_use_unsharded_flat_param`` points ``flat_param.data`` at the
all-gather output: the copy is freed once gathered (its block stays cached: :func:`freed_shard_copies`).

Which units are in the param dtype, as accelerate prepares them for the HF Trainer (``set_mixed_precision``
for the ``-mixed`` precisions, the trainable parameters upcast to fp32, the frozen ones left in 16 bits):

- full fine-tune: every unit trains, so with ``MixedPrecision`` every unit has an ``_mp_shard`` (no copy),
  without it every unit is copied;
- freeze: the root unit (embeddings, lm_head, final norm) and the layers below the trained top are frozen,
  16-bit, copied; the trained layers are copied only without ``MixedPrecision``. The layers a freeze run
  gathers in its backward are the trained ones, and under checkpointing the frozen one below the lowest
  (``enable_input_require_grads``), whose copy is held (:func:`frozen_layer_copy`);
- LoRA / QLoRA: the block units hold frozen 16-bit weights or bf16-stored 4-bit codes: copied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.base import layer_gathered_bytes
from tuneplan.estimator.xp import ceil_div
from tuneplan.specs.load_precision import fsdp_mixed_precision
from tuneplan.specs.profiles import Profile
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run

ROUND_LARGE = 2 * 1024**2  # CUDACachingAllocator kRoundLarge: a segment for a block from 10 MiB on


@dataclass(frozen=True)
class HeldCopies:
    """Whether the device copy of a unit's host shard stays alive while the unit is unsharded."""

    layers: bool  # the decoder-layer units gathered in the backward
    root: bool  # the root unit (embeddings, lm_head, final norm)

    def of(self, layers16: int, root16: int, world_size: int) -> int:
        """Bytes of the copies beside ``layers16`` bytes of unsharded layers and ``root16`` of the root."""
        return (ceil_div(layers16, world_size) if self.layers else 0) + (
            ceil_div(root16, world_size) if self.root else 0)


def fsdp1_param_mixed_precision(setup: TrainSetup, prof: Profile) -> bool:
    """Whether FSDP1 runs with a ``MixedPrecision`` param dtype as accelerate sets it for the HF Trainer
    (``set_mixed_precision`` when its mixed_precision is not "no": :func:`fsdp_mixed_precision`;
    ``update_fsdp_plugin_peft`` for QLoRA's floating ``bnb_4bit_quant_storage``); otherwise none."""
    return fsdp_mixed_precision(setup, prof) or setup.method == "qlora"


def held_shard_copies(run: Run) -> HeldCopies:
    """Which gathered units keep the device copy of their host shard (the module docstring)."""
    setup = run.setup
    if setup.offload == "none" or run.profile.fsdp_flat_params_only:
        return HeldCopies(layers=False, root=False)
    trained_in_param_dtype = not fsdp1_param_mixed_precision(setup, run.profile)
    if setup.method == "full":
        return HeldCopies(layers=trained_in_param_dtype, root=trained_in_param_dtype)
    if setup.method == "freeze":
        return HeldCopies(layers=trained_in_param_dtype, root=True)
    return HeldCopies(layers=True, root=True)


def frozen_layer_copy(run: Run, layer16: int) -> int:
    """The held device copy of a frozen 16-bit layer's host shard, gathered in a freeze run's backward
    below the lowest trained layer (``fsdp1_bottom.layers_below_back_propagated``): a frozen unit's flat
    parameter is already in the param dtype, so ``pre_unshard`` copies its shard (``flat_param_to``) and, with
    ``use_orig_params=True``, the original parameters stay views of it until the unit reshards (the module
    docstring), whether or not the trained layers above have a ``MixedPrecision`` low-precision shard:
    :math:`\\lceil layer16 / N \\rceil` (simulate: FSDP1, Llama-3.1-70B freeze with CPU offload and
    checkpointing, at the lowest trained layer's gradient ``cat``); 0 without offload, for
    ``use_orig_params=False`` (freed once gathered) and for other methods."""
    setup = run.setup
    if setup.method != "freeze" or setup.offload == "none" or run.profile.fsdp_flat_params_only:
        return 0
    return ceil_div(layer16, setup.world_size)


def freed_shard_copies(run: Run) -> int:
    """Bytes the pre-unshard stream keeps cached for the device copies of host shards that a
    ``use_orig_params=False`` run frees once gathered (the module docstring): ``_unshard`` runs
    ``pre_unshard`` on its own ``pre_unshard_stream`` (torch/distributed/fsdp/_runtime_utils.py), so each copy
    is a block of that stream's pool, which no other stream reuses (CUDACachingAllocator.cpp: a free block
    serves only its own stream). The copies of one size reuse one segment: the root's shard and a layer's
    (an adapter unit's shard is a small-pool block); 0 for every other run."""
    setup = run.setup
    if (setup.offload == "none" or not run.profile.fsdp_flat_params_only or setup.fsdp_version != 1
            or (setup.method == "full" and fsdp1_param_mixed_precision(setup, run.profile))):
        return 0
    world_size, segment = setup.world_size, ROUND_LARGE
    rooted = setup.method in run.profile.fsdp_root_embeddings
    root = run.model.params_non_block * run.dtypes.compute if rooted else 0
    return sum(ceil_div(ceil_div(unit, world_size), segment) * segment
               for unit in (root, layer_gathered_bytes(run)))


def gathered_shard_transient(run: Run, unit: int) -> int:
    """The shard an all-gather of a ``unit``-byte unit reads, alive beside its output while it runs and
    freed after, where no held copy counts it: with ``use_orig_params=False`` (``fsdp_flat_params_only``)
    ``_unshard`` all-gathers from the device copy of the host shard that ``pre_unshard`` made
    (``flat_param_to``) or from the low-precision shard ``_use_low_precision_shard`` allocated (train.py's
    fp32 ``MixedPrecision`` over bf16-stored 4-bit codes), and ``post_unshard`` /
    ``_use_unsharded_flat_param`` drop it once gathered: ``ceil(unit / N)`` at the moment a unit is
    gathered (simulate: fsdp_qlora, Llama-2-70B LoRA with CPU offload); 0 when the copies are held
    (counted by :func:`held_shard_copies`) or there is no such shard."""
    from tuneplan.estimator.wrappers.fp32_gathers import gather_upcast

    setup = run.setup
    if not run.profile.fsdp_flat_params_only or setup.fsdp_version != 1:
        return 0
    # a low-precision shard only where the flat parameter's dtype is not the fp32 param dtype: the 4-bit
    # codes stored in bf16 (train.py loads every unquantized model in fp32 under its autocast precisions)
    low_precision_shard = setup.method == "qlora" and gather_upcast(run) > 1
    if setup.offload == "none" and not low_precision_shard:
        return 0
    return ceil_div(unit, setup.world_size)


def root_pre_backward_copy(run: Run, root16: int) -> int:
    """The device copy of the root unit's host shard made again at its pre-backward, beside the root's
    unsharded ``root16`` bytes, with ``use_orig_params=False`` under CPU offload: the root's post-forward
    ``_reshard`` keeps its unsharded flat parameter (``_post_forward_reshard``: not freed for the root) but
    ``FlatParamHandle.reshard`` points ``flat_param`` back at the host shard (``_use_sharded_flat_param``), so
    ``_pre_backward_hook``'s ``_unshard`` runs ``pre_unshard``, whose ``flat_param_to(self.device)`` copies
    the shard before ``unshard`` finds the unsharded storage still allocated and uses it, dropping the copy:
    :math:`\\lceil root16 / N \\rceil` (simulate: fsdp_qlora, Meta-Llama-3-8B QLoRA with CPU offload, at the
    start of the backward). 0 where the copy is held (:func:`held_shard_copies`) or nothing is offloaded."""
    setup = run.setup
    if (setup.offload == "none" or not run.profile.fsdp_flat_params_only or setup.fsdp_version != 1
            or not root16):
        return 0
    return ceil_div(root16, setup.world_size)


def root_pre_backward_gathered(run: Run, root16: int, layer16: int, at_loss: int) -> int:
    """What FSDP1's root pre-backward gathers at its largest moment (0: no instant of its own): the root
    unsharded beside the device copy of its host shard (:func:`root_pre_backward_copy`), or, next, the top
    layer the hook prefetches (``_pre_backward_hook`` -> ``_prefetch_handle``, BACKWARD_PRE) beside the root,
    ``at_loss``, while its all-gather reads the shard :func:`gathered_shard_transient` counts, before the
    loss's backward has made any gradient (simulate: fsdp_qlora, Llama-3.1-405B QLoRA under fp32
    MixedPrecision, 1,593,901,056 B of low-precision shard beside the root and the top layer)."""
    root_copy = root_pre_backward_copy(run, root16)
    prefetch = gathered_shard_transient(run, layer16) if run.setup.fsdp_version == 1 else 0
    return max(root16 + root_copy if root_copy else 0, at_loss + prefetch if prefetch else 0)


def root_forward_unshard(run: Run, root16: int) -> int:
    """The root unit's unshard at the start of the forward (its ``_pre_forward``), before anything is saved:
    the root unsharded beside the shard its all-gather reads (:func:`gathered_shard_transient`: the device
    copy of the offloaded host shard, or fsdp_qlora's low-precision shard under fp32 MixedPrecision), 0
    where there is no such shard (simulate: fsdp_qlora, DeepSeek-R1-Distill-Llama-8B QLoRA fp16-mixed, the
    first step's peak there: the 4,202,708,992-byte fp32 root beside its 2,101,354,496-byte fp32 shard)."""
    transient = gathered_shard_transient(run, root16) if root16 else 0
    return root16 + transient if transient else 0
