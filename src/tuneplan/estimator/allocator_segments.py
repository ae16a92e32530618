"""What the CUDA caching allocator keeps reserved at the loss beyond the allocated blocks: free segments the
loss chain's larger blocks cannot reuse.

The rules, from c10/cuda/CUDACachingAllocator.cpp in its default configuration (``simulate/allocator.py``
replays the same rules over a traced step):
- a request over 1 MiB (``kSmallSize``) is served from the large pool; from 10 MiB (``kMinLargeAlloc``) a
  new segment is the request rounded up to 2 MiB (``kRoundLarge``);
- ``get_free_block`` hands out the smallest cached free block of the pool that is at least the request
  (splitting it when more than 1 MiB remains); a free block is never merged across segments;
- segments are returned to CUDA only when a ``cudaMalloc`` fails (``release_cached_blocks``, then retry):
  with memory to spare, reserved never goes down during a step.

So the blocks each decoder layer's forward frees stay cached in segments of their own size, and the loss
chain, whose fp32 blocks are ``tokens x vocabulary x 4`` bytes (larger than any layer tensor), gets new
segments beside them: at the loss the reserved figure is the allocated total plus those free segments.
From the first layer's backward on they are reused by the same layer tensors (recomputed or not), so the
reserved peak is the larger of the allocated peak (with the tails of split segments:
``overhead.FRAGMENTATION``) and the loss instants' totals plus the free segments (:func:`reserved_figures`).

The free segments modelled (``tokens`` = micro-batch x sequence on one GPU, ``c`` the compute dtype's bytes):
- a gated MLP, ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` in transformers: the activation output, the
  up projection and their product are live together (3 blocks of tokens x intermediate x c); PEFT's
  ``LoraLayer.forward`` on up_proj (``result = result + lora_B(lora_A(dropout(x))) * scaling``) keeps the
  base output and the scaled adapter output beside them (4). A checkpointed layer saves none of them
  (each is a free segment at the loss); without checkpointing autograd saves the SiLU input and both
  operands of the product, and frees the product itself unless down_proj reads it for a gradient, and the
  base output of a LoRA-wrapped projection;
- the MLP's blocks are in the dtype its projections return (16 bits under autocast; bitsandbytes' Linear4bit
  casts its 16-bit matmul output back to the input's dtype: the 16-bit output is one more free block);
- RMSNorm in transformers (``hidden_states.to(torch.float32)``, ``* torch.rsqrt(variance + eps)``): an fp32
  tokens x hidden block freed once the normalized value is cast back to the input dtype;
- the loss chain's own 16-bit logits (``logits.py``'s ``hf`` and ``torchtune_legacy`` chains): freed by
  the fp32 cast before the loss backward makes its fp32 gradients, which cannot reuse the segment;
- the checkpoints' packing (:func:`checkpoint_packing_bytes`): under gradient checkpointing each layer keeps
  its input, a tokens x hidden block made at the end of the layer before it. The free blocks it is carved from
  (best fit) are the previous layer's MLP blocks, so a tokens x intermediate segment ends up holding
  ``k = intermediate segment // checkpoint`` checkpoints and a tail too short for the next layer's
  intermediate blocks, which get a new segment: the forward grows reserved by one intermediate segment every
  ``k`` layers, not by the checkpoints' own bytes (simulate: Llama-2-7B QLoRA on 2 GPUs, b4 x 2048, one
  172 MiB segment every second layer, 64 MiB checkpoints).
Every block strands less than its own bytes plus one large segment (``ceil(x / R) x R < x + R``), so with
``W`` the bytes per token of the blocks counted and ``n`` their number the free segments are below
``tokens x W + n x R`` (no checkpoint packing); where that leaves both loss instants under the allocated
peak's tails, the tails decide the reserved peak and no block is rounded (:func:`reserved_figures`).
Not modelled: MoE expert blocks, eager attention's score blocks (larger than the loss chain's blocks when
the sequence is long: those the chain can reuse), the smaller tokens x hidden blocks of the attention.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tuneplan.estimator.overhead import FRAGMENTATION, SEGMENT, cross_stream_reserve
from tuneplan.estimator.xp import ceil_div, maximum, to_int

MIB = 1024**2
ROUND_LARGE = 2 * MIB  # kRoundLarge: a large segment is the request rounded up to 2 MiB
# kMinLargeAlloc: a smaller request is carved from a shared 20 MiB segment (kLargeBuffer), where the
# checkpoints share segments with every other mid-sized block and no packing is modelled
MIN_LARGE_ALLOC = 10 * MIB
MIN_BLOCK = 512  # kMinBlockSize: every block is rounded up to 512 B
# the instants at which the loss chain is live and every layer's forward has run (memory.instants)
LOSS_INSTANTS = ("forward", "backward_start")
# the reserved figures' rounding up to whole 2 MiB segments, ``ceil(x / SEGMENT) x SEGMENT``, written
# ``(x + SEGMENT - 1) & -SEGMENT`` (SEGMENT a power of two: the same integer for any int, or int64 array;
# two bit operations in place of a long division and a product); and the tails' factor
SEGMENT_UP, SEGMENT_DOWN = SEGMENT - 1, -SEGMENT
TAILS = 1 + FRAGMENTATION
# logits.py chains whose 16-bit logits die before the fp32 loss-backward blocks are made
UPCASTING_CHAINS = ("hf", "torchtune_legacy")


def _segment(nbytes: Any) -> Any:
    """``nbytes`` rounded up to whole large segments: ``ceil(nbytes / ROUND_LARGE) x ROUND_LARGE``."""
    return -(-nbytes // ROUND_LARGE) * ROUND_LARGE


class StrandedTerms(NamedTuple):
    """What :func:`stranded_bytes` and :func:`reserved_figures` need besides the tokens and the allocated
    totals, resolved once per run (nothing in it depends on the micro-batch, the sequence length or the
    accumulation): bytes per token of each block counted, the bound on what they strand, the bytes cached
    per CUDA stream."""

    mlp_blocks: int  # tokens x intermediate blocks an MLP's forward leaves free (_mlp_free_blocks)
    intermediate: int  # one of them, per token, in the dtype the projections return
    quant_out: int  # a 4-bit MLP's 16-bit matmul output beside it (0: none)
    packed_layers: int  # the layers whose checkpoints pack into intermediate segments (0: none)
    checkpoint: int  # one checkpoint, per token
    norm: int  # RMSNorm's fp32 block (0: no RMSNorm)
    logits: int  # the 16-bit logits the fp32 cast frees (0: no such chain)
    # the blocks' bytes per token (W) and n x ROUND_LARGE: stranded < tokens x W + n x R (module docstring;
    # None with checkpoint packing, which has no such bound)
    bound_per_token: int | None
    bound_segments: int
    cross_stream: int  # overhead.cross_stream_reserve, the same at every shape


def _mlp_free_blocks(run: Any) -> int:
    """tokens x intermediate blocks one dense gated MLP's forward leaves free (module docstring)."""
    model, setup, targets = run.model, run.setup, run.targets
    if model.is_moe or model.mlp_kind != "swiglu" or not model.intermediate:
        return 0
    lora_up = "up_proj" in targets
    if setup.gradient_checkpointing:
        return 4 if lora_up else 3
    down_reads = setup.method in ("full", "freeze") or "down_proj" in targets
    return (0 if down_reads else 1) + (2 if lora_up else 0)


def packed_layers(run: Any) -> int:
    """The layers whose inputs are checkpointed into intermediate segments (activations.activation_terms: a
    freeze run's trainable ones); 0 without checkpointing, with the checkpoints in host memory, or below two
    layers."""
    model, setup = run.model, run.setup
    layers: int = model.n_layers
    if setup.method == "freeze":
        layers = min(setup.freeze_trainable_layers, layers)
    offloaded = run.profile.gc_offload or setup.activation_offload  # the checkpoints go to host memory
    if not setup.gradient_checkpointing or offloaded or layers < 2:
        return 0
    return layers


def checkpoint_packing_bytes(layers: int, checkpoint_per_token: int, tokens: Any,
                             intermediate_segment: Any) -> Any:
    """Reserved beyond the checkpoints' own bytes once each of the ``layers`` (:func:`packed_layers`, > 0)
    has kept its input: ``ceil(L / k)`` tokens x intermediate segments hold the ``L`` checkpoints, ``k`` to a
    segment (module docstring; ints, or arrays of a grid). 0 with blocks under ``MIN_LARGE_ALLOC``."""
    checkpoint = ceil_div(tokens * checkpoint_per_token, MIN_BLOCK) * MIN_BLOCK
    per_segment = maximum(intermediate_segment // checkpoint, 1)
    packed = ceil_div(layers, per_segment) * intermediate_segment - layers * checkpoint
    return (intermediate_segment >= MIN_LARGE_ALLOC) * maximum(packed, 0)


def stranded_terms(run: Any) -> StrandedTerms:
    """The run's :class:`StrandedTerms`, computed once and kept on it (``run.memo["stranded"]``)."""
    kept: StrandedTerms | None = run.memo.get("stranded")
    if kept is not None:
        return kept
    model, dt = run.model, run.dtypes
    c = dt.compute
    quantized = run.setup.quant_bits is not None
    n_mlp = _mlp_free_blocks(run)
    # the MLP's tensors are its projections' outputs: bitsandbytes' Linear4bit casts its 16-bit matmul output
    # back to the input's dtype (quant_out), which leaves that 16-bit output free as well
    width = dt.quant_out if quantized else dt.linear_out
    upcasting = run.loss in UPCASTING_CHAINS and c < 4 and not run.setup.num_labels
    intermediate = model.intermediate * width
    quant_out = model.intermediate * c if n_mlp and quantized and dt.quant_out != c else 0
    packed = packed_layers(run) if n_mlp else 0
    norm = model.hidden * 4 if model.norm_kind == "rms" else 0
    logits = model.head_width * c if upcasting else 0
    blocks = ((n_mlp, intermediate), (1, quant_out), (1, norm), (1, logits))
    terms = StrandedTerms(
        n_mlp, intermediate, quant_out, packed, model.hidden * dt.residual, norm, logits,
        None if packed else sum(n * width for n, width in blocks),
        sum(n for n, width in blocks if width) * ROUND_LARGE,
        # only FSDP caches per stream (cross_stream_reserve): the other runs skip the call
        cross_stream_reserve(run) if run.setup.fsdp else 0)
    run.memo["stranded"] = terms
    return terms


def stranded_bytes(run: Any, batch: Any, seq: Any) -> tuple[Any, Any]:
    """Bytes of free segments at the ``forward`` and ``backward_start`` instants that the loss chain cannot
    reuse (ints, or arrays of a grid); a block of no bytes strands no segment. Each block is rounded up to
    whole large segments as :func:`_segment` does, written out: every estimate asks."""
    return stranded_at(run.memo.get("stranded") or stranded_terms(run), batch * seq)


def stranded_at(terms: StrandedTerms, tokens: Any) -> tuple[Any, Any]:
    """:func:`stranded_bytes` from the run's terms at ``tokens`` = micro-batch x sequence."""
    # the terms unpacked once: a named tuple's field read costs as much as the arithmetic on it
    mlp_blocks, intermediate_width, quant_out, packed, checkpoint, norm, logits = terms[:7]
    layers = 0
    if mlp_blocks:
        intermediate = -(-(tokens * intermediate_width) // ROUND_LARGE) * ROUND_LARGE
        layers = mlp_blocks * intermediate
        if packed:
            layers = layers + checkpoint_packing_bytes(packed, checkpoint, tokens, intermediate)
        if quant_out:
            layers = layers - (-(tokens * quant_out) // ROUND_LARGE) * ROUND_LARGE
    if norm:
        layers = layers - (-(tokens * norm) // ROUND_LARGE) * ROUND_LARGE
    if logits:
        return layers, layers - (-(tokens * logits) // ROUND_LARGE) * ROUND_LARGE
    return layers, layers


def reserved_figures(run: Any, allocated: Any, at_forward: Any, at_backward_start: Any,
                     tokens: Any) -> tuple[Any, Any]:
    """(reserved peak, reserved needed) at ``tokens`` = micro-batch x sequence, each in whole 2 MiB segments
    plus what the run caches per CUDA stream (``StrandedTerms.cross_stream``; ints, or arrays of a grid),
    with ``tails`` = allocated x (1 + FRAGMENTATION) truncated to bytes (the allocated peak with its segment
    tails):
    - the peak: ``max(tails, at_forward + stranded_forward, at_backward_start + stranded_backward)``
      (``at_forward``, ``at_backward_start``: the allocated totals of ``LOSS_INSTANTS``; the stranded
      segments of :func:`stranded_bytes`), rounded up to whole segments;
    - needed: ``tails`` rounded up the same way, once a failed cudaMalloc has released every free cached
      segment (``release_cached_blocks``) and retried, without the stranded segments: what out of memory is
      judged on.
    At one shape, where ``tokens x W + n x R`` (``StrandedTerms``' bound) keeps both loss instants at or
    under ``tails``, the maximum is ``tails``: the blocks are not rounded one by one and the two figures
    are one."""
    terms = run.memo.get("stranded") or stranded_terms(run)
    scaled = allocated * TAILS
    if scaled.__class__ is float:  # one shape: Python numbers (a grid's allocated figures are an array)
        tails = int(scaled)
        bound = terms.bound_per_token
        loss = at_forward if at_forward > at_backward_start else at_backward_start
        if bound is not None and tokens * bound + terms.bound_segments <= tails - loss:
            needed = ((tails + SEGMENT_UP) & SEGMENT_DOWN) + terms.cross_stream
            return needed, needed
        stranded_forward, stranded_backward = stranded_at(terms, tokens)
        forward, backward = at_forward + stranded_forward, at_backward_start + stranded_backward
        top = forward if forward > tails else tails
        top = backward if backward > top else top
    else:  # a grid's arrays
        tails = to_int(scaled)
        stranded_forward, stranded_backward = stranded_at(terms, tokens)
        top = maximum(maximum(at_forward + stranded_forward, at_backward_start + stranded_backward), tails)
    cross_stream = terms.cross_stream
    return (((top + SEGMENT_UP) & SEGMENT_DOWN) + cross_stream,
            ((tails + SEGMENT_UP) & SEGMENT_DOWN) + cross_stream)
