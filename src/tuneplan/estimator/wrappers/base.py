"""The protocol of a data-parallel wrapper: what it holds resident on each GPU, what it gathers, which
gradient buckets it keeps, and what it communicates, at each instant of a training step.

A wrapper is chosen once, when the run is resolved (``estimator/run.py``, from the table in
``estimator/wrappers/__init__.py``); the memory model (``estimator/memory.py``) asks it for a
:class:`WrapperMemory` once per run, and the time model (``estimator/throughput.py``) for its collectives and
the part of them that cannot hide behind compute. A wrapper holds no state: every answer is read off the
resolved run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from tuneplan.estimator.links import ring_factor
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.estimator.links import Link
    from tuneplan.estimator.optimizer import OptimizerPlan
    from tuneplan.estimator.run import Run

NCCL_BYTES = 512 * 1024**2  # NCCL buffers + communicator state per process (order of NCCL_BUFFSIZE=4 MiB
#                             x channels x peers); outside PyTorch's allocator


@dataclass(frozen=True)
class Resident:
    """Bytes every instant of the step holds on one GPU (and on the host), as the wrapper places them."""

    weights: int  # the base model's parameters on this GPU (a shard when parameters are sharded)
    adapters: int  # the LoRA adapters on this GPU
    states: int  # optimizer states (ZeRO: with the fp32 master partition)
    optimizer_temp: int  # the optimizer step's temporaries
    gradients: int  # gradients that exist once the backward has run (beside the buckets)
    host: int  # bytes offloaded to the host (CPU offload)
    nccl: int  # NCCL buffers and communicator state, outside PyTorch's allocator


@dataclass(frozen=True)
class Buckets:
    """Gradient buffers beside the gradients themselves."""

    persistent: int = 0  # kept for the run (DDP's buckets, ZeRO-3's flat partition and IPG bucket)
    in_layers: int = 0  # alive only while a layer is back-propagated (FSDP's reduce-scatter input, ZeRO-1/2's
    #                     bucket)
    # also through the forward and the loss of a micro-batch that follows an accumulating one (ZeRO-1)
    through_forward: int = 0
    missing_at_bottom: int = 0  # sharded gradients not made yet near the bottom of the backward (FSDP2)
    missing_at_bottom_layer: int = 0  # those not made yet at the bottom layer's backward (FSDP2)
    # accumulated unsharded gradients already reduce-scattered at the top layer's backward (FSDP2)
    missing_at_top: int = 0


@dataclass(frozen=True)
class Gathered:
    """Unsharded parameters in flight (ZeRO-3 / FSDP), by instant."""

    in_layers: int = 0  # while a layer runs (the current and the prefetched units)
    at_loss: int = 0  # at the loss backward
    at_forward_end: int = 0  # at the end of the forward, where the loss is computed
    # FSDP2: at the bottom layer's, the top layer's and the untied head's copy-out in the forward; FSDP1: at
    # the root's unshard beside the shard its all-gather reads, in bottom_layer_forward (0: no instant there)
    bottom_layer_forward: int = 0
    top_layer_forward: int = 0
    head_forward: int = 0
    # ZeRO-3: at the untied head's backward, where its whole gradient is made (0: no instant there)
    head_backward: int = 0
    # at the end of a layer's backward, its scratch freed, beside the next layer it prefetched when that is
    # later than the layer's heavy part (0: no instant there; wrappers/fsdp.fsdp_layers_gathered)
    layer_end: int = 0
    # of it, the shard the next layer's all-gather reads, freed once gathered (fsdp1_offload.
    # gathered_shard_transient): not beside what the layer's backward makes after the prefetch
    layer_end_transient: int = 0
    # FSDP1: at the root unit's pre-backward, beside the device copy of its host shard, or the top layer it
    # prefetches beside its all-gather's shard (0: no instant there; fsdp1_offload.root_pre_backward_gathered)
    root_pre_backward: int = 0
    # FSDP2: at the bottom layer's backward beside the prefetched embedding group (0: no instant there), and
    # of it the embedding's host shard copied to the device for the all-gather (CPUOffloadPolicy)
    bottom_layer_backward: int = 0
    bottom_layer_copy: int = 0
    # ZeRO-3: at the first gradient reduction of the backward, and the layers above it, back-propagated,
    # their activations released (0: no instant there; zero3_flush.py)
    flush: int = 0
    flush_layers_above: int = 0
    flush_past_mlp: bool = False  # the reduction's layer has back-propagated its MLP block by then
    # past its MLP or from its first gradient hook, that layer's scratch then, bytes a token
    # (zero3_flush.zero3_flush_mlp_done_scratch; 0: not derived, the layer's backward scratch counted)
    flush_scratch_per_token: int = 0
    # ZeRO-3: at the largest later reduction in a layer below the top, what is gathered there and the
    # reduction's scratch (0: no instant there), and the layer's scratch then, bytes a token (0: not
    # derived, the layer's backward scratch counted; zero3_lower_flush.py)
    lower_flush: tuple[int, int] = (0, 0)
    # ZeRO-3, LoRA / QLoRA: in the forward once the prefetcher popped the untied head, and the decoder
    # layers whose forward ran before (their activations saved), whether the running layer is past its
    # attention block ((0, 0, False): no instant there; zero3_head_pop.py)
    head_popped: tuple[int, int, bool] = (0, 0, False)
    # ZeRO-3, LoRA / QLoRA without checkpointing: the most in the top decoder layer's forward past its
    # attention, before or in its MLP block (0: no instant there; zero3_plain_trace.py)
    top_layer_past_attention: int = 0
    # ZeRO-3's trace-recording pass: at the top layer's backward fetch of its fused experts, before any of
    # its scratch (wrappers/zero3_expert_round.py; 0: no instant there)
    top_layer_backward_fetch: int = 0
    # the optimizer's states on this GPU, not yet made at that fetch when it is the recording pass's (the
    # first step's first micro-batch, before the optimizer's first step() makes them)
    states_unmade: int = 0
    # the same at the untied head's forward when the round held there is the first pass's with a complete
    # trace, the first step's later micro-batch (wrappers/zero3_first_pass.head_round_before_first_step)
    head_forward_states_unmade: int = 0


@dataclass(frozen=True)
class TopLayer:
    """The top layer's backward, whose unsharded gradients are made as its activations are released."""

    counted: int  # its unsharded gradients as counted in ``Buckets.in_layers``
    gradients_at_end: int  # the gradient bytes live at its end
    gathered: int  # unsharded parameters then
    keeps_scratch: bool  # whether its last op's scratch is live at its end
    # beyond the row's other gradients (``G - counted``), the gradient bytes live when its attention core is
    # back-propagated (wrappers/fsdp1_bottom.attention_moment_gradients, the layer's MLP and o_proj
    # weight gradients and what waits beside them); 0: not counted
    gradients_at_attention: int = 0
    # FSDP2 (wrappers/fully_shard_attention.py): that moment's scratch is the attention's own (net of the MLP
    # block's released saved tensors), and the layer below's activations (one layer's more than the row
    # counts) are saved beside it or not
    attention_scratch_only: bool = False
    attention_below_saved: bool = False
    # FSDP1's per-adapter units: what is unsharded when its attention core is back-propagated, where an
    # eager core's scores' gradients are the layer's largest scratch (wrappers/fsdp1_adapter_units.py);
    # 0: ``gathered``
    gathered_at_attention: int = 0
    # beyond ``G - counted``, the gradient bytes live when its MLP's input RMSNorm is back-propagated (the
    # MLP block's weight gradients: estimator/mlp_norm_moment.py); 0: not counted
    gradients_at_mlp_norm: int = 0
    # whether the row is folded: "always", or "never" (FSDP2 with the layer below saved beside it)
    fold: Literal["always", "never"] = "always"


@dataclass(frozen=True)
class EndOfBackward:
    """The end of the backward, the unit holding the token embedding back-propagated and reduce-scattered
    (FSDP1's root unit, FSDP2's embedding or tied tail group)."""

    gradients: int  # gradient bytes beyond the sharded ones
    gathered: int  # unsharded parameters
    scratch: int = 0  # the unit's unsharded gradients and their copies in the reduce-scatter


@dataclass(frozen=True)
class Epilogue:
    """The backward's epilogue, every activation released: its last gradient reduction (ZeRO-1/2/3)."""

    gradients: int  # gradient bytes and their buffers
    reduction_copy: int  # the reduction's temporary copy of what it reduces
    gathered: int = 0  # parameters still gathered (ZeRO-3: wrappers/zero3_flush.zero3_epilogue)


@dataclass(frozen=True)
class EmbeddingGradients:
    """Gradient bytes alive while the token embedding is back-propagated (DeepSpeed ZeRO-1/2)."""

    gradients: int  # its own gradient excluded, buffers included
    layers_hold_it: bool  # whether the layers' gradient rows already count the embedding's gradient


@dataclass(frozen=True)
class NoSyncGradients:
    """Gradient bytes under FSDP's ``no_sync`` accumulation (``fsdp.no_sync_gradients``)."""

    accumulating: int  # live on one GPU during an accumulating micro-batch
    synced: int  # on one GPU after the reduce-scatter (the optimizer step)


NO_GATHERS = Gathered()  # nothing gathered anywhere (one GPU, DDP): a wrapper that adds no rows of its own


# hashable, not frozen (read-only by convention): made for every new setup, and a frozen dataclass's
# __init__ sets each field through object.__setattr__
@dataclass(unsafe_hash=True)
class WrapperMemory:
    """What the wrapper keeps on each GPU at each instant of the step; ``None``: the instant follows the
    single-GPU rule."""

    resident: Resident
    buckets: Buckets = Buckets()
    gathered: Gathered = NO_GATHERS
    top_layer: TopLayer | None = None
    # the lowest trained layer's backward alike (FSDP1: wrappers/fsdp1_bottom.py); None: the bottom row
    # counts its activations, scratch and gradients together beside ``Gathered.in_layers``
    bottom_layer: TopLayer | None = None
    end_of_backward: EndOfBackward | None = None
    # FSDP2: an untied trained tail group's reduce-scatter before the top layer's backward
    tail_reduce: EndOfBackward | None = None
    embedding: EmbeddingGradients | None = None
    no_sync: NoSyncGradients | None = None
    step_gradients: int | None = None  # gradient bytes at the optimizer step; None: ``resident.gradients``
    epilogue: Epilogue | None = None
    # gradient and buffer bytes at the largest moment of ZeRO-2's reductions in the layers' backward
    # (wrappers/zero2_partition.py), beside the bottom layer's activations; 0: no instant there
    layers_backward: int = 0
    # that moment over the head's gradients alone, before any layer's backward: beside every saved activation
    head_backward: int = 0
    # ZeRO-2: the layers' record moments (zero2_partition.LayersBackward records: G as ``layers_backward``,
    # the trained layers above, whether past the layer's MLP block), each beside what is saved then
    reduction_moments: tuple[tuple[int, int, bool], ...] = ()
    # their scratch per token past a layer's MLP block (zero2_partition.past_mlp_scratch_per_token)
    past_mlp_scratch: int = 0
    # ZeRO-2: the partition a reduction past the bottom layer's MLP block makes, which the bottom row lacks
    # (``Buckets.missing_at_bottom``): beside the layer's activations less its MLP block's; 0: none
    partition_at_bottom: int = 0
    bottom_layer_trains: bool = True  # FSDP2's bottom layer row: its own gradients made, activations freed
    # ZeRO-1/2: the IPG bucket the backward's first gradient hook allocates (setup_buckets), counted in the
    # layers' rows but absent at the top layer's fused expert stack where no trained tensor precedes it
    first_hook_bucket: int = 0
    # LoRA: whether that hook comes after the top layer's fused expert stacks
    # (reduce_buckets.first_hook_after_stacks)
    first_hook_after_stacks: bool = False
    # bytes on this GPU at the peak of DeepSpeed's initialize, before the first step (ZeRO-1/2's 16-bit cast
    # of the module: wrappers/zero12_initialize.py; the flat group beside the module: zero12_flatten.py); 0:
    # no instant there
    initialize: int = 0
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Collectives:
    """Seconds of collectives per GPU: those compute can hide, per micro-batch and per step, and the serial
    ones, with what they are."""

    per_micro_batch: float = 0.0
    per_step: float = 0.0
    serial: float = 0.0
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Wrapper:
    """A data-parallel wrapper. Subclasses say when they apply (:meth:`applies`), what they keep
    (:meth:`memory`) and what they communicate (:meth:`ring_collectives`); the flags say which terms of the
    time model they shard."""

    name: ClassVar[str]
    shards_parameters: ClassVar[bool] = False  # every parameter 1/N, gathered unit by unit (ZeRO-3, FSDP)
    shards_optimizer: ClassVar[bool] = False  # the optimizer steps a 1/N partition (ZeRO, FSDP)

    @classmethod
    def applies(cls, setup: TrainSetup) -> bool:
        """Whether this wrapper runs ``setup`` (the table's first that applies is chosen)."""
        raise NotImplementedError

    def memory(self, run: Run, optimizer: OptimizerPlan) -> WrapperMemory:
        raise NotImplementedError

    def collectives(self, run: Run, *, grad_bytes: int, gathered_bytes: int, link: Link) -> Collectives:
        """The collectives of one step over ``link``; none on one GPU."""
        if run.setup.world_size == 1:
            return Collectives()
        return self.ring_collectives(run, grad_bytes=grad_bytes, gathered_bytes=gathered_bytes, link=link)

    def ring_collectives(self, run: Run, *, grad_bytes: int, gathered_bytes: int, link: Link) -> Collectives:
        raise NotImplementedError

    def gradient_wire_bytes(self, run: Run) -> int:
        """Bytes per gradient element on the wire."""
        return run.param_plan.trainable_bytes

    def last_bucket_bytes(self, run: Run, grad_bytes: int) -> float:
        """The last bucket of a collective, which cannot hide behind compute."""
        raise NotImplementedError


class ShardingWrapper(Wrapper):
    """ZeRO-3 and FSDP: every parameter sharded 1/N and gathered unit by unit, the optimizer stepping its
    partition; 16-bit gradients on the wire when the compute dtype is."""

    shards_parameters = True
    shards_optimizer = True

    def ring_collectives(self, run: Run, *, grad_bytes: int, gathered_bytes: int, link: Link) -> Collectives:
        """Parameters gathered for the forward and again for the backward, gradients reduce-scattered, every
        micro-batch."""
        world_size = run.setup.world_size
        grads = run.param_plan.trainable_params * grad_bytes
        wire = (2 * gathered_bytes * ring_factor("all_gather", world_size)
                + grads * ring_factor("reduce_scatter", world_size))
        return Collectives(per_micro_batch=wire / (link.gbs * 1e9),
                           notes=("ZeRO-3/FSDP: all-gather parameters in forward and backward, "
                                  "reduce-scatter gradients, every micro-batch; prefetch overlaps them with "
                                  "compute",))

    def gradient_wire_bytes(self, run: Run) -> int:
        return sixteen_bit_wire(run)

    def last_bucket_bytes(self, run: Run, grad_bytes: int) -> float:
        return max(run.model.largest_layer_params * 2, 1)  # one unit = one decoder layer


def sixteen_bit_wire(run: Run) -> int:
    """Bytes per gradient element a sharding optimizer (ZeRO, FSDP) reduces: 2 when the compute dtype is
    16-bit, else the trainable dtype's."""
    return 2 if run.dtypes.compute == 2 else run.param_plan.trainable_bytes


def layer_gathered_bytes(run: Run) -> int:
    """One decoder layer unsharded as a sharding wrapper gathers it: in 16 bits, or, for a quantized base,
    as stored (packed 4/8-bit codes and their metadata: bitsandbytes ``bnb_4bit_quant_storage``, torchao NF4
    shards), which is what is sharded, flattened and gathered."""
    params = run.param_plan
    layer16 = run.model.largest_layer_params * run.dtypes.compute
    if run.setup.quant_bits is not None and params.largest_layer_bytes:
        layer16 = min(layer16, params.largest_layer_bytes)
    return layer16


def nccl_bytes(setup: TrainSetup) -> int:
    """NCCL's buffers on each GPU: none on one GPU."""
    return NCCL_BYTES if setup.world_size > 1 else 0
